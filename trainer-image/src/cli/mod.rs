//! Command line and typed configuration (clap derive + serde). Flags mirror
//! the prototype's (`--model --dataset --batch-size --epochs --lr
//! --backend ...`); torchrun's env vars give the rank layout.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use serde::{Deserialize, Serialize};

mod kinds;

pub use kinds::*;

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
    Train(Box<TrainConfig>),
    /// Measure this machine with the configured model and print its
    /// hardware profile as JSON (the `HardwareProfile` wire type).
    Profile(Box<TrainConfig>),
}

/// Everything a training run is configured by.
#[derive(Clone, Debug, Args, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Model architecture.
    #[arg(long, value_enum, default_value = "mlp", env = "HT_MODEL")]
    pub model: ModelKind,
    /// Hidden width of mlp / simple_cnn's dense layer; embedding width of
    /// gpt (alias `--width`).
    #[arg(long, alias = "width", default_value_t = 128)]
    pub hidden: i64,
    /// Base width of resnet18/resnet50 (64 is the standard model).
    #[arg(long, default_value_t = 64)]
    pub resnet_width: i64,
    /// BatchNorm statistics in training (resnet18/resnet50): `sync` over the
    /// global batch (exact under any split) or `local` per rank.
    #[arg(long, value_enum, default_value = "sync", env = "HT_BATCH_NORM")]
    pub batch_norm: BatchNormMode,
    /// Transformer blocks (gpt).
    #[arg(long, default_value_t = 2)]
    pub layers: i64,
    /// Attention heads (gpt).
    #[arg(long, default_value_t = 4)]
    pub heads: i64,
    /// Context length in tokens (gpt, synthetic_text, tokens).
    #[arg(long, default_value_t = 64)]
    pub context: i64,
    /// Vocabulary size (gpt, synthetic_text, tokens: every token in the
    /// files must be below it; 256 fits byte-level text).
    #[arg(long, default_value_t = 256)]
    pub vocab: i64,

    /// Dataset.
    #[arg(
        long,
        value_enum,
        default_value = "synthetic_image",
        env = "HT_DATASET"
    )]
    pub dataset: DatasetKind,
    /// Directory with the dataset files (cifar10: data_batch_*.bin, test_batch.bin;
    /// cifar100: train.bin, test.bin; mnist: train-images-idx3-ubyte etc.,
    /// not gzipped; tokens: train.bin, val.bin as little-endian uint16, cut
    /// into non-overlapping windows of --context + 1 tokens).
    #[arg(long, env = "HT_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Number of samples for the synthetic datasets.
    #[arg(long, default_value_t = 4096)]
    pub synthetic_samples: usize,
    /// Fraction held out for evaluation when the dataset has no test split.
    #[arg(long, default_value_t = 0.1)]
    pub eval_fraction: f64,

    /// Global batch size B (sum of all ranks' local batches).
    #[arg(
        long,
        alias = "global-batch-size",
        default_value_t = 64,
        env = "HT_BATCH_SIZE"
    )]
    pub batch_size: u32,
    /// Epochs to train (an epoch = floor(N/B) steps); default 1 unless
    /// --max-steps is given, which then alone decides the length.
    #[arg(long)]
    pub epochs: Option<u64>,
    /// Stop after this many steps in total (with --epochs too: whichever comes first).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// Peak learning rate.
    #[arg(long, default_value_t = 0.05)]
    pub lr: f64,
    /// Optimizer.
    #[arg(long, value_enum, default_value = "sgd")]
    pub optimizer: OptimizerKind,
    /// Who runs the optimizer update: `proportional` shards it (and its
    /// state) across ranks in proportion to their local batches, so a slow
    /// rank updates little; `replicated` updates everything on every rank.
    /// The result is the same either way.
    #[arg(
        long,
        value_enum,
        default_value = "proportional",
        env = "HT_OPTIMIZER_SHARDING"
    )]
    pub optimizer_sharding: OptimizerSharding,
    /// SGD momentum.
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,
    /// Weight decay (L2 for sgd, decoupled for adamw).
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Learning-rate schedule after warmup.
    #[arg(long, value_enum, default_value = "constant")]
    pub schedule: ScheduleKind,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: u64,
    /// Steps between decays (schedule step).
    #[arg(long, default_value_t = 1000)]
    pub step_size: u64,
    /// Decay factor (schedule step).
    #[arg(long, default_value_t = 0.1)]
    pub gamma: f64,
    /// Seed for model init, data and shuffling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Take samples in order instead of a seeded permutation per epoch.
    #[arg(long)]
    pub no_shuffle: bool,
    /// Deterministic algorithms (bit-identical reruns and resumes on CPU with --threads 1).
    #[arg(long)]
    pub deterministic: bool,

    /// Collective backend.
    #[arg(long, value_enum, default_value = "auto", env = "HT_BACKEND")]
    pub backend: BackendKind,
    /// Compute device.
    #[arg(long, value_enum, default_value = "cpu", env = "HT_DEVICE")]
    pub device: DeviceArg,
    /// Intra-op threads for this rank (0: libtorch's default).
    #[arg(long, default_value_t = 0, env = "HT_THREADS")]
    pub threads: usize,

    /// Directory for this rank's JSON-lines log `rank-<r>.jsonl` and, on
    /// rank 0, the final weights `model.safetensors`.
    #[arg(long, default_value = "heterotrain-out", env = "HT_OUTPUT_DIR")]
    pub output_dir: PathBuf,
    /// Directory for checkpoints (written by rank 0); none: no checkpoints.
    #[arg(long, env = "HT_CHECKPOINT_DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every N steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every: u64,
    /// Resume from the newest checkpoint of this run that loads (`auto`) or
    /// not. Checkpoints whose fingerprint (model and shape flags, batch size,
    /// dataset and its size, optimizer, world size, job UID) differs are
    /// skipped with a warning.
    #[arg(long, value_enum, default_value = "never", env = "HT_RESUME")]
    pub resume: ResumeMode,
    /// UID of the HeteroTrainingJob (set by the operator): part of the run
    /// fingerprint, so `--resume auto` never takes another job's checkpoints.
    #[arg(long, env = "HT_JOB_UID")]
    pub job_uid: Option<String>,
    /// JSON batch plan (format: docs/design.md "Contracts"); rank 0 re-reads it when it changes
    /// and all ranks switch at the same step. Without it: an equal split.
    #[arg(long, env = "HT_PLAN_FILE")]
    pub plan_file: Option<PathBuf>,

    /// Plan ConfigMap to watch for `plan.json` (set by the operator); rank 0
    /// watches it and all ranks switch at the same step.
    #[arg(long, env = "HETEROTRAIN_PLAN_CONFIGMAP")]
    pub plan_configmap: Option<String>,
    /// Namespace of the plan ConfigMap (default: the kube client's).
    #[arg(long, env = "HETEROTRAIN_NAMESPACE")]
    pub namespace: Option<String>,
    /// `local`: rank 0 balances from all-gathered measurements (no operator).
    #[arg(long, value_enum, default_value = "none", env = "HT_BALANCER")]
    pub balancer: BalancerMode,
    /// Balancing policy for `--balancer local`: static, proportional,
    /// dynamic, hybrid.
    #[arg(long, default_value = "dynamic", env = "HT_POLICY")]
    pub policy: String,
    /// Steps between local balancing rounds.
    #[arg(long, default_value_t = 20)]
    pub balance_every: u64,
    /// Hysteresis of the local balancer: minimum predicted gain, percent.
    #[arg(long, default_value_t = 5)]
    pub min_gain_percent: u32,
    /// Rank 0 prints a one-line status every N steps (0: never).
    #[arg(long, default_value_t = 50)]
    pub status_every: u64,

    /// Port of the Prometheus `/metrics` endpoint (0: no endpoint).
    #[arg(long, default_value_t = heterotrain_crds::metrics::DEFAULT_METRICS_PORT, env = "HT_METRICS_PORT")]
    pub metrics_port: u16,
    /// Address the metrics endpoint binds (default: `POD_IP`, else 0.0.0.0).
    #[arg(long, env = "POD_IP")]
    pub metrics_addr: Option<String>,
    /// Local batch sizes the start-up profile measures.
    #[arg(long, value_delimiter = ',', default_value = "8,16,32")]
    pub profile_batch_sizes: Vec<u32>,
    /// Skip the start-up hardware profile.
    #[arg(long)]
    pub no_profile: bool,
    /// Time budget of the profile's measurements, seconds.
    #[arg(long, default_value_t = 3.0)]
    pub profile_seconds: f64,

    /// Seconds to wait for all ranks to join.
    #[arg(long, default_value_t = 300)]
    pub rendezvous_timeout_secs: u64,
    /// Seconds a collective may take before the run fails.
    #[arg(long, default_value_t = 300)]
    pub collective_timeout_secs: u64,
    /// Gradient bucket size in MiB: PyTorch's Reducer all-reduces each
    /// bucket as soon as its gradients are ready during backward (the first
    /// bucket is 1 MiB, as in DDP, so communication starts early).
    #[arg(long, default_value_t = 25)]
    pub bucket_mib: usize,

    /// This rank (torchrun `RANK`).
    #[arg(long, env = "RANK", default_value_t = 0)]
    pub rank: usize,
    /// Number of ranks (torchrun `WORLD_SIZE`).
    #[arg(long, env = "WORLD_SIZE", default_value_t = 1)]
    pub world_size: usize,
    /// Rank on this host; picks the CUDA device (torchrun `LOCAL_RANK`).
    #[arg(long, env = "LOCAL_RANK", default_value_t = 0)]
    pub local_rank: usize,
    /// Rank 0's address (torchrun `MASTER_ADDR`).
    #[arg(long, env = "MASTER_ADDR", default_value = "127.0.0.1")]
    pub master_addr: String,
    /// Rank 0's TCPStore port (torchrun `MASTER_PORT`).
    #[arg(long, env = "MASTER_PORT", default_value_t = 29500)]
    pub master_port: u16,
    /// Address the Gloo transport binds (default: 127.0.0.1 when MASTER_ADDR
    /// is loopback, else the host's resolved address).
    #[arg(long, env = "HT_BIND_ADDR")]
    pub bind_addr: Option<String>,
    /// Network interface for Gloo.
    #[arg(long, env = "GLOO_SOCKET_IFNAME")]
    pub gloo_socket_ifname: Option<String>,

    /// Sleep this long after every step (demos and tests of live plan changes).
    #[arg(long, default_value_t = 0, hide = true)]
    pub step_sleep_ms: u64,
}

impl TrainConfig {
    /// The smallest local batch a plan may give a rank: 2 for per-rank
    /// BatchNorm (one sample has no variance), else 1.
    pub fn min_local_batch(&self) -> u32 {
        if self.model.has_batch_norm() && self.batch_norm == BatchNormMode::Local {
            2
        } else {
            1
        }
    }

    /// Check cross-flag invariants before anything starts.
    pub fn validate(&self) -> Result<(), String> {
        if self.world_size == 0 {
            return Err("WORLD_SIZE must be at least 1".into());
        }
        if self.rank >= self.world_size {
            return Err(format!(
                "RANK {} is out of range for WORLD_SIZE {}",
                self.rank, self.world_size
            ));
        }
        if (self.batch_size as usize) < self.world_size {
            return Err(format!(
                "--batch-size {} is smaller than WORLD_SIZE {}: every rank needs at least one sample",
                self.batch_size, self.world_size
            ));
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(format!("--lr must be a positive number, got {}", self.lr));
        }
        if !(0.0..1.0).contains(&self.eval_fraction) {
            return Err(format!(
                "--eval-fraction must be in [0, 1), got {}",
                self.eval_fraction
            ));
        }
        if self.model == ModelKind::Gpt && !self.dataset.is_text() {
            return Err("--model gpt trains on --dataset synthetic_text or tokens".into());
        }
        if self.dataset.is_text() && self.model != ModelKind::Gpt {
            return Err("--dataset synthetic_text and tokens need --model gpt".into());
        }
        if self.model == ModelKind::Gpt && (self.heads <= 0 || self.hidden % self.heads != 0) {
            return Err(format!(
                "--hidden (embedding width) {} must be a positive multiple of --heads {}",
                self.hidden, self.heads
            ));
        }
        if self.balancer == BalancerMode::Local {
            self.policy
                .parse::<heterotrain_balancer::Policy>()
                .map_err(|e| format!("--policy: {e}"))?;
            if self.balance_every == 0 {
                return Err("--balance-every must be at least 1".into());
            }
        }
        if self.profile_batch_sizes.is_empty() || self.profile_batch_sizes.contains(&0) {
            return Err("--profile-batch-sizes needs positive sizes".into());
        }
        if !(self.profile_seconds.is_finite() && self.profile_seconds > 0.0) {
            return Err(format!(
                "--profile-seconds must be positive, got {}",
                self.profile_seconds
            ));
        }
        if self.dataset.from_files() && self.data_dir.is_none() {
            return Err("--data-dir is required for cifar10, cifar100, mnist and tokens".into());
        }
        if self.model.has_batch_norm() {
            if self.resnet_width <= 0 {
                return Err(format!(
                    "--resnet-width must be positive, got {}",
                    self.resnet_width
                ));
            }
            if self.batch_size < 2 {
                return Err(format!(
                    "--batch-size {} is too small for {:?}: BatchNorm needs at least 2 samples per step",
                    self.batch_size, self.model
                ));
            }
            if self.batch_norm == BatchNormMode::Local {
                let min = self.min_local_batch();
                if (self.batch_size as usize) < 2 * self.world_size {
                    return Err(format!(
                        "--batch-norm local needs a local batch of at least {min} on every rank, but --batch-size {} over WORLD_SIZE {} cannot give that; use --batch-norm sync or raise --batch-size",
                        self.batch_size, self.world_size
                    ));
                }
            }
        }
        if self.hidden <= 0 || self.layers <= 0 || self.context <= 1 || self.vocab <= 1 {
            return Err("model size flags must be positive (context and vocab > 1)".into());
        }
        Ok(())
    }
}
