//! The operator → trainer contract: the trainer's command line as one type.
//!
//! The operator builds a [`TrainerArgs`] from a job's spec and turns it into
//! arguments with [`TrainerArgs::to_args`]; `heterotrain-trainer train`
//! parses the same type back (clap). Flags the launcher sets through the
//! environment instead (the rank layout, the plan ConfigMap, the job UID,
//! the pod IP) are read from the variables named in [`env`] and never
//! written as flags. The enumerations are the CRD's own.

use clap::{Args, CommandFactory, FromArgMatches, Parser, ValueEnum};
use serde::Serialize;
use serde_json::Value;

mod groups;

pub use groups::{
    DataArgs, DistArgs, ModelArgs, ObsArgs, OptimArgs, OutputArgs, PlanArgs, DEFAULT_CONTEXT,
};

/// Environment variables of the contract: those the operator sets on rank
/// pods (torchrun's layout and HeteroTrain's own), and those a user may set
/// instead of a flag when launching by hand.
pub mod env {
    /// Global rank (torchrun).
    pub const RANK: &str = "RANK";
    /// Number of ranks (torchrun).
    pub const WORLD_SIZE: &str = "WORLD_SIZE";
    /// Rank on this host (torchrun).
    pub const LOCAL_RANK: &str = "LOCAL_RANK";
    /// Rank 0's address (torchrun).
    pub const MASTER_ADDR: &str = "MASTER_ADDR";
    /// Rank 0's TCPStore port (torchrun).
    pub const MASTER_PORT: &str = "MASTER_PORT";
    /// The pod's IP (downward API): where `/metrics` binds.
    pub const POD_IP: &str = "POD_IP";
    /// The pod's namespace (downward API): where the plan ConfigMap lives.
    pub const NAMESPACE: &str = "HETEROTRAIN_NAMESPACE";
    /// The plan ConfigMap rank 0 watches.
    pub const PLAN_CONFIGMAP: &str = "HETEROTRAIN_PLAN_CONFIGMAP";
    /// The gang generation (the job's restart count when it was created).
    pub const RESTART_COUNT: &str = "HETEROTRAIN_RESTART_COUNT";
    /// The job's `metadata.uid`; the trainer's `--job-uid`, part of the
    /// checkpoint fingerprint.
    pub const JOB_UID: &str = "HT_JOB_UID";
    /// Gloo's network interface.
    pub const GLOO_SOCKET_IFNAME: &str = "GLOO_SOCKET_IFNAME";
    /// Address the Gloo transport and rank 0's TCPStore bind.
    pub const BIND_ADDR: &str = "HT_BIND_ADDR";

    /// Variables a user may set in place of a flag.
    pub const MODEL: &str = "HT_MODEL";
    pub const MODEL_FILE: &str = "HT_MODEL_FILE";
    pub const BATCH_NORM: &str = "HT_BATCH_NORM";
    pub const DATASET: &str = "HT_DATASET";
    pub const DATA_DIR: &str = "HT_DATA_DIR";
    pub const BATCH_SIZE: &str = "HT_BATCH_SIZE";
    pub const OPTIMIZER_SHARDING: &str = "HT_OPTIMIZER_SHARDING";
    pub const BACKEND: &str = "HT_BACKEND";
    pub const DEVICE: &str = "HT_DEVICE";
    pub const THREADS: &str = "HT_THREADS";
    pub const OUTPUT_DIR: &str = "HT_OUTPUT_DIR";
    pub const CHECKPOINT_DIR: &str = "HT_CHECKPOINT_DIR";
    pub const RESUME: &str = "HT_RESUME";
    /// An earlier run's checkpoint directory to continue from when this
    /// run has none of its own.
    pub const RESUME_FROM: &str = "HT_RESUME_FROM";
    pub const PLAN_FILE: &str = "HT_PLAN_FILE";
    pub const BALANCER: &str = "HT_BALANCER";
    pub const POLICY: &str = "HT_POLICY";
    pub const METRICS_PORT: &str = "HT_METRICS_PORT";
    /// A job's own command (`command`) gets the training fields that mean
    /// something to any script, so the length of a run is written once:
    /// `training.maxSteps`, `training.epochs`, `training.seed`, and where and
    /// how often to checkpoint (`checkpoint.path`, `checkpoint.everySteps`).
    pub const MAX_STEPS: &str = "HT_MAX_STEPS";
    pub const EPOCHS: &str = "HT_EPOCHS";
    pub const SEED: &str = "HT_SEED";
    pub const CHECKPOINT_EVERY: &str = "HT_CHECKPOINT_EVERY";
    /// `--step-sleep-ms`: a pause after every step (tests and demos that
    /// need a job to last a known least time, whatever the machine's speed).
    pub const STEP_SLEEP_MS: &str = "HT_STEP_SLEEP_MS";
}

/// Where plans come from when no operator writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum BalancerMode {
    /// Plans come only from --plan-file or the plan ConfigMap.
    None,
    /// Rank 0 runs the balancer on all-gathered measurements (bare metal).
    Local,
}

/// Whether a run starts from its newest checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum ResumeMode {
    /// Load the newest checkpoint of this run in --checkpoint-dir that loads, if any.
    Auto,
    /// Start from scratch.
    Never,
}

/// Everything a training run is configured by, one group per subsystem.
#[derive(Clone, Debug, PartialEq, Args, Serialize)]
pub struct TrainerArgs {
    #[command(flatten)]
    #[serde(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub data: DataArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub optim: OptimArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub dist: DistArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub plan: PlanArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub obs: ObsArgs,
}

/// Why [`TrainerArgs`] could not be built or written as arguments.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error("trainer arguments: {0}")]
    Parse(#[from] clap::Error),
    #[error("trainer arguments: {0}")]
    Json(#[from] serde_json::Error),
    #[error("trainer argument --{0}: a value of this shape cannot be written as a flag")]
    Shape(String),
}

/// The `train` subcommand's arguments alone, for [`TrainerArgs::defaults`].
#[derive(Parser)]
#[command(name = "heterotrain-trainer")]
struct Bare {
    #[command(flatten)]
    args: TrainerArgs,
}

impl TrainerArgs {
    /// Every flag at its default, whatever the environment holds.
    pub fn defaults() -> Result<TrainerArgs, ArgsError> {
        Self::parse_flags(std::iter::empty::<String>())
    }

    /// Parse flags as the trainer does, but with no environment: what a
    /// launcher's arguments alone say (for checking what it writes).
    pub fn parse_flags<I, S>(flags: I) -> Result<TrainerArgs, ArgsError>
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString> + Clone,
    {
        let cmd = Bare::command().mut_args(|a| a.env(None::<&str>));
        let argv = std::iter::once(std::ffi::OsString::from("heterotrain-trainer"))
            .chain(flags.into_iter().map(Into::into));
        Ok(Bare::from_arg_matches(&cmd.try_get_matches_from(argv)?)?.args)
    }

    /// The flags that give these settings, in declaration order. Settings
    /// the launcher passes through the environment ([`env`]) are left out,
    /// as are unset options and false switches.
    pub fn to_args(&self) -> Result<Vec<String>, ArgsError> {
        let Value::Object(values) = serde_json::to_value(self)? else {
            return Err(ArgsError::Shape("(all)".into()));
        };
        let cmd = Bare::command();
        let mut out = Vec::new();
        for arg in cmd.get_arguments() {
            let (Some(long), Some(value)) = (arg.get_long(), values.get(arg.get_id().as_str()))
            else {
                continue;
            };
            let flag = format!("--{long}");
            match value {
                Value::Null | Value::Bool(false) => {}
                Value::Bool(true) => out.push(flag),
                Value::Array(items) => {
                    let items: Option<Vec<String>> = items.iter().map(scalar).collect();
                    let items = items.ok_or_else(|| ArgsError::Shape(long.into()))?;
                    out.extend([flag, items.join(",")]);
                }
                v => {
                    let v = scalar(v).ok_or_else(|| ArgsError::Shape(long.into()))?;
                    out.extend([flag, v]);
                }
            }
        }
        Ok(out)
    }
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
