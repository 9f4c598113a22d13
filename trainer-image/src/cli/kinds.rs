//! The enumerated choices of the command line.

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

/// Where plans come from when no operator writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum BalancerMode {
    /// Plans come only from --plan-file or the plan ConfigMap.
    None,
    /// Rank 0 runs the balancer on all-gathered measurements (bare metal).
    Local,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum ModelKind {
    Mlp,
    SimpleCnn,
    Resnet18,
    Resnet50,
    Gpt,
}

impl ModelKind {
    /// Whether the architecture has BatchNorm layers.
    pub fn has_batch_norm(self) -> bool {
        matches!(self, ModelKind::Resnet18 | ModelKind::Resnet50)
    }
}

/// Who runs the optimizer update (see `--optimizer-sharding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum OptimizerSharding {
    /// Each rank updates a contiguous range of the parameters sized in
    /// proportion to its local batch, then broadcasts it.
    Proportional,
    /// Every rank updates every parameter.
    Replicated,
}

/// How BatchNorm layers compute batch statistics in training.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum BatchNormMode {
    /// Statistics of the whole global batch, all-reduced in forward and
    /// backward: exactly one process with batch B, whatever the split.
    Sync,
    /// Per-rank statistics (no extra collectives; results depend on the
    /// split, and every local batch must be at least 2). Running statistics
    /// are averaged across ranks, weighted by local batch, before
    /// evaluation and checkpoints.
    Local,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum DatasetKind {
    SyntheticImage,
    SyntheticText,
    Cifar10,
    Mnist,
    /// CIFAR-100 binary `train.bin`/`test.bin`, trained on the 100 fine labels.
    Cifar100,
    /// Flat little-endian uint16 token files `train.bin`/`val.bin` (gpt).
    Tokens,
}

impl DatasetKind {
    /// Read from files in --data-dir (not generated).
    pub fn from_files(self) -> bool {
        !matches!(
            self,
            DatasetKind::SyntheticImage | DatasetKind::SyntheticText
        )
    }

    /// Token sequences (for gpt) rather than images.
    pub fn is_text(self) -> bool {
        matches!(self, DatasetKind::SyntheticText | DatasetKind::Tokens)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum OptimizerKind {
    Sgd,
    Adamw,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum ScheduleKind {
    Constant,
    Cosine,
    Step,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum BackendKind {
    /// NCCL when every rank is CUDA (and built with it), else Gloo.
    Auto,
    Gloo,
    Nccl,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum DeviceArg {
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum ResumeMode {
    /// Load the newest checkpoint of this run in --checkpoint-dir that loads, if any.
    Auto,
    /// Start from scratch.
    Never,
}
