//! Command line (clap derive): the subcommands around the settings type
//! the operator writes, [`TrainerArgs`] (in `heterotrain-crds`, one group
//! per subsystem). Flags mirror the prototype's (`--model --dataset
//! --batch-size --epochs --lr --backend ...`); torchrun's env vars give the
//! rank layout.

use clap::{Parser, Subcommand};

pub use heterotrain_crds::trainer::{
    BalancerMode, DataArgs, DistArgs, ModelArgs, ObsArgs, OptimArgs, OutputArgs, PlanArgs,
    ResumeMode, TrainerArgs,
};
pub use heterotrain_crds::{
    Backend, BatchNormMode, DatasetName, Device as DeviceArg, ModelName,
    Optimizer as OptimizerKind, OptimizerSharding, Schedule,
};

/// HeteroTrain trainer: data-parallel training across unlike machines, each
/// rank with a local batch sized to its speed while the global batch stays B.
#[derive(Debug, Parser)]
#[command(name = "heterotrain-trainer", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train a model (one process per rank; torchrun env vars give the layout).
    Train(Box<TrainerArgs>),
    /// Measure this machine with the configured model and print its
    /// hardware profile as JSON (the `HardwareProfile` wire type).
    Profile(Box<TrainerArgs>),
}

/// `train` arguments parsed from `args` (for unit tests).
#[cfg(test)]
pub(crate) fn train_args(args: &[&str]) -> TrainerArgs {
    use clap::Parser;
    let mut v = vec!["heterotrain-trainer", "train"];
    v.extend_from_slice(args);
    match Cli::parse_from(v).command {
        Command::Train(c) | Command::Profile(c) => *c,
    }
}

/// Check cross-flag invariants before anything starts.
pub fn validate(cfg: &TrainerArgs) -> Result<(), String> {
    if cfg.dist.world_size == 0 {
        return Err("WORLD_SIZE must be at least 1".into());
    }
    if cfg.dist.rank >= cfg.dist.world_size {
        return Err(format!(
            "RANK {} is out of range for WORLD_SIZE {}",
            cfg.dist.rank, cfg.dist.world_size
        ));
    }
    if (cfg.optim.batch_size as usize) < cfg.dist.world_size {
        return Err(format!(
            "--batch-size {} is smaller than WORLD_SIZE {}: every rank needs at least one sample",
            cfg.optim.batch_size, cfg.dist.world_size
        ));
    }
    if !(cfg.optim.lr.is_finite() && cfg.optim.lr > 0.0) {
        return Err(format!(
            "--lr must be a positive number, got {}",
            cfg.optim.lr
        ));
    }
    if !(0.0..1.0).contains(&cfg.data.eval_fraction) {
        return Err(format!(
            "--eval-fraction must be in [0, 1), got {}",
            cfg.data.eval_fraction
        ));
    }
    if cfg.model.arch == ModelName::Gpt && !cfg.data.dataset.is_text() {
        return Err("--model gpt trains on --dataset synthetic_text or tokens".into());
    }
    if cfg.data.dataset.is_text() && cfg.model.arch != ModelName::Gpt {
        return Err("--dataset synthetic_text and tokens need --model gpt".into());
    }
    match (cfg.model.arch, &cfg.model.model_file) {
        (ModelName::Torchscript, None) => {
            return Err(
                "--model torchscript needs --model-file (a module saved by torch.jit.save)".into(),
            )
        }
        (ModelName::Torchscript, Some(_)) => {}
        (m, Some(_)) => {
            return Err(format!(
                "--model-file is only for --model torchscript, not {}",
                m.as_str()
            ))
        }
        (_, None) => {}
    }
    if cfg.model.arch == ModelName::Gpt
        && (cfg.model.heads <= 0 || cfg.model.hidden % cfg.model.heads != 0)
    {
        return Err(format!(
            "--hidden (embedding width) {} must be a positive multiple of --heads {}",
            cfg.model.hidden, cfg.model.heads
        ));
    }
    if cfg.plan.balancer == BalancerMode::Local {
        cfg.plan
            .policy
            .parse::<heterotrain_balancer::Policy>()
            .map_err(|e| format!("--policy: {e}"))?;
        if cfg.plan.balance_every == 0 {
            return Err("--balance-every must be at least 1".into());
        }
    }
    if cfg.obs.profile_batch_sizes.is_empty() || cfg.obs.profile_batch_sizes.contains(&0) {
        return Err("--profile-batch-sizes needs positive sizes".into());
    }
    if !(cfg.obs.profile_seconds.is_finite() && cfg.obs.profile_seconds > 0.0) {
        return Err(format!(
            "--profile-seconds must be positive, got {}",
            cfg.obs.profile_seconds
        ));
    }
    if cfg.data.dataset.from_files() && cfg.data.data_dir.is_none() {
        return Err(
            "--data-dir is required for cifar10, cifar100, mnist, tokens and tensors".into(),
        );
    }
    if cfg.model.arch.has_batch_norm() {
        if cfg.model.resnet_width <= 0 {
            return Err(format!(
                "--resnet-width must be positive, got {}",
                cfg.model.resnet_width
            ));
        }
        if cfg.optim.batch_size < 2 {
            return Err(format!(
                "--batch-size {} is too small for {:?}: BatchNorm needs at least 2 samples per step",
                cfg.optim.batch_size, cfg.model.arch
            ));
        }
        if cfg.model.batch_norm == BatchNormMode::Local {
            let min = cfg.model.min_local_batch();
            if (cfg.optim.batch_size as usize) < 2 * cfg.dist.world_size {
                return Err(format!(
                    "--batch-norm local needs a local batch of at least {min} on every rank, but --batch-size {} over WORLD_SIZE {} cannot give that; use --batch-norm sync or raise --batch-size",
                    cfg.optim.batch_size, cfg.dist.world_size
                ));
            }
        }
    }
    if cfg.model.hidden <= 0
        || cfg.model.layers <= 0
        || cfg.model.context <= 1
        || cfg.model.vocab <= 1
    {
        return Err("model size flags must be positive (context and vocab > 1)".into());
    }
    Ok(())
}
