//! A run's fingerprint: what a checkpoint must share with the run that
//! resumes it, and the manifest that records it.

use std::fmt;

use heterotrain_crds::BatchPlan;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cli::{ModelName, TrainerArgs};
use crate::sampler::SamplerPosition;

use super::FileEntry;

/// What a run's meaning depends on: a checkpoint is resumed only by a run
/// with the same fingerprint. Shape flags a model does not use are `None`,
/// so changing them does not orphan its checkpoints.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Fingerprint {
    /// `--model` (snake_case name).
    pub model: String,
    /// `--hidden` (mlp, simple_cnn, gpt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<i64>,
    /// `--resnet-width` (resnet18, resnet50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resnet_width: Option<i64>,
    /// `--layers` (gpt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<i64>,
    /// `--heads` (gpt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<i64>,
    /// `--context` (gpt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<i64>,
    /// `--vocab` (gpt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<i64>,
    /// SHA-256 (first 16 hex digits) of the `--model-file` module (torchscript).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_file: Option<String>,
    /// Global batch B (`--batch-size`).
    pub batch_size: u32,
    /// `--dataset` (snake_case name).
    pub dataset: String,
    /// Samples in the train split.
    pub train_samples: u64,
    /// `--optimizer` (snake_case name).
    pub optimizer: String,
    /// `WORLD_SIZE`.
    pub world_size: u64,
    /// The HeteroTrainingJob's UID (`--job-uid`, set by the operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_uid: Option<String>,
}

/// A clap/serde enum's snake_case name.
fn enum_name<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl Fingerprint {
    /// The fingerprint of a run configured by `cfg` whose train split has
    /// `train_samples` samples (a TorchScript model's digest is added by
    /// the caller, which has read the file).
    pub fn of(cfg: &TrainerArgs, train_samples: usize) -> Fingerprint {
        let (hidden, gpt) = match cfg.model.arch {
            ModelName::Mlp | ModelName::SimpleCnn => (true, false),
            ModelName::Resnet18 | ModelName::Resnet50 => (false, false),
            ModelName::Gpt => (true, true),
            ModelName::Torchscript => (false, false),
        };
        let gpt_flag = |v: i64| gpt.then_some(v);
        Fingerprint {
            model: enum_name(&cfg.model.arch),
            hidden: hidden.then_some(cfg.model.hidden),
            resnet_width: cfg
                .model
                .arch
                .has_batch_norm()
                .then_some(cfg.model.resnet_width),
            layers: gpt_flag(cfg.model.layers),
            heads: gpt_flag(cfg.model.heads),
            context: gpt_flag(cfg.model.context),
            vocab: gpt_flag(cfg.model.vocab),
            model_file: None,
            batch_size: cfg.optim.batch_size,
            dataset: enum_name(&cfg.data.dataset),
            train_samples: train_samples as u64,
            optimizer: enum_name(&cfg.optim.optimizer),
            world_size: cfg.dist.world_size as u64,
            job_uid: cfg.output.job_uid.clone().filter(|u| !u.is_empty()),
        }
    }

    /// First 16 hex digits of the SHA-256 of the fingerprint's JSON (for
    /// logs and a quick look; comparisons use the fields).
    pub fn hash(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_default();
        Sha256::digest(json.as_bytes())
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Fields of a checkpoint's fingerprint (`self`) that differ from the
    /// run's, in a fixed order; empty when they match.
    pub fn differences(&self, run: &Fingerprint) -> Vec<Difference> {
        fn opt<T: ToString>(v: &Option<T>) -> String {
            v.as_ref().map_or_else(|| "none".into(), T::to_string)
        }
        let mut out = Vec::new();
        let mut cmp = |field: &'static str, ckpt: String, now: String| {
            if ckpt != now {
                out.push(Difference {
                    field,
                    checkpoint: ckpt,
                    run: now,
                });
            }
        };
        cmp("model", self.model.clone(), run.model.clone());
        cmp("hidden width", opt(&self.hidden), opt(&run.hidden));
        cmp(
            "resnet width",
            opt(&self.resnet_width),
            opt(&run.resnet_width),
        );
        cmp("layers", opt(&self.layers), opt(&run.layers));
        cmp("heads", opt(&self.heads), opt(&run.heads));
        cmp("context", opt(&self.context), opt(&run.context));
        cmp("vocab", opt(&self.vocab), opt(&run.vocab));
        cmp("model file", opt(&self.model_file), opt(&run.model_file));
        cmp(
            "batch size",
            self.batch_size.to_string(),
            run.batch_size.to_string(),
        );
        cmp("dataset", self.dataset.clone(), run.dataset.clone());
        cmp(
            "train samples",
            self.train_samples.to_string(),
            run.train_samples.to_string(),
        );
        cmp("optimizer", self.optimizer.clone(), run.optimizer.clone());
        cmp(
            "world size",
            self.world_size.to_string(),
            run.world_size.to_string(),
        );
        cmp("job UID", opt(&self.job_uid), opt(&run.job_uid));
        out
    }
}

/// One field in which a checkpoint differs from the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    pub field: &'static str,
    /// The checkpoint's value.
    pub checkpoint: String,
    /// This run's value.
    pub run: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ≠ {}", self.field, self.checkpoint, self.run)
    }
}

/// Whether a checkpoint belongs to the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Belongs {
    /// Same fingerprint.
    Yes,
    /// A version-1 manifest without a fingerprint whose model, batch size
    /// and world size (from its plan) match: accepted, the other fields
    /// cannot be checked (weights still have to load into the model).
    Unchecked,
    /// Differs in these fields.
    No(Vec<Difference>),
}

/// The manifest `ckpt-<step>.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub version: u32,
    /// Global steps completed.
    pub step: u64,
    /// Where the sampler continues (its RNG is a pure function of seed and epoch).
    pub position: SamplerPosition,
    pub seed: u64,
    pub shuffle: bool,
    pub optimizer_steps: u64,
    pub plan: BatchPlan,
    pub model: String,
    /// The run this checkpoint belongs to (absent in version 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<Fingerprint>,
    /// [`Fingerprint::hash`] of `fingerprint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint_hash: Option<String>,
    pub weights: FileEntry,
    pub optimizer: FileEntry,
}

impl Manifest {
    /// Whether this checkpoint belongs to a run with fingerprint `run`.
    pub fn belongs_to(&self, run: &Fingerprint) -> Belongs {
        if let Some(fp) = &self.fingerprint {
            let d = fp.differences(run);
            return if d.is_empty() {
                Belongs::Yes
            } else {
                Belongs::No(d)
            };
        }
        // Version 1: what the manifest does record.
        let legacy = Fingerprint {
            model: self.model.clone(),
            batch_size: self.plan.global_batch_size,
            world_size: self.plan.batch_sizes.len() as u64,
            ..run.clone()
        };
        let d = legacy.differences(run);
        if d.is_empty() {
            Belongs::Unchecked
        } else {
            Belongs::No(d)
        }
    }
}
