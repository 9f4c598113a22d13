//! The trainer's settings, one group per subsystem. Each field is one flag
//! of `heterotrain-trainer train`; its doc comment is the flag's `--help`.

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use super::env;
use super::{BalancerMode, ResumeMode};
use crate::metrics::DEFAULT_METRICS_PORT;
use crate::{Backend, BatchNormMode, DatasetName, Device, ModelName, Optimizer};
use crate::{OptimizerSharding, Schedule};

/// The model: architecture and size.
#[derive(Clone, Debug, PartialEq, Args, Serialize)]
pub struct ModelArgs {
    /// Model architecture.
    #[arg(id = "model", long = "model", value_name = "MODEL", value_enum, default_value = "mlp", env = env::MODEL)]
    #[serde(rename = "model")]
    pub arch: ModelName,
    /// Hidden width of mlp / simple_cnn's dense layer; embedding width of
    /// gpt (alias `--width`).
    #[arg(long, alias = "width", default_value_t = 128)]
    pub hidden: i64,
    /// Base width of resnet18/resnet50 (64 is the standard model).
    #[arg(long, default_value_t = 64)]
    pub resnet_width: i64,
    /// BatchNorm statistics in training (resnet18/resnet50): `sync` over the
    /// global batch (exact under any split) or `local` per rank.
    #[arg(long, value_enum, default_value = "sync", env = env::BATCH_NORM)]
    pub batch_norm: BatchNormMode,
    /// Transformer blocks (gpt).
    #[arg(long, default_value_t = 2)]
    pub layers: i64,
    /// Attention heads (gpt).
    #[arg(long, default_value_t = 4)]
    pub heads: i64,
    /// Context length in tokens (gpt, synthetic_text, tokens).
    #[arg(long, default_value_t = DEFAULT_CONTEXT)]
    pub context: i64,
    /// Vocabulary size (gpt, synthetic_text, tokens: every token in the
    /// files must be below it; 256 fits byte-level text).
    #[arg(long, default_value_t = 256)]
    pub vocab: i64,
    /// The TorchScript module `--model torchscript` trains (saved by
    /// `torch.jit.save`; maps a batch of inputs to class logits).
    #[arg(long, env = env::MODEL_FILE)]
    pub model_file: Option<PathBuf>,
}

impl ModelArgs {
    /// The smallest local batch a plan may give a rank: 2 for per-rank
    /// BatchNorm (one sample has no variance), else 1.
    pub fn min_local_batch(&self) -> u32 {
        if self.arch.has_batch_norm() && self.batch_norm == BatchNormMode::Local {
            2
        } else {
            1
        }
    }
}

/// The data: which dataset, where, and how it is walked.
#[derive(Clone, Debug, PartialEq, Args, Serialize)]
pub struct DataArgs {
    /// Dataset.
    #[arg(long, value_enum, default_value = "synthetic_image", env = env::DATASET)]
    pub dataset: DatasetName,
    /// Directory with the dataset files (cifar10: data_batch_*.bin, test_batch.bin;
    /// cifar100: train.bin, test.bin; mnist: train-images-idx3-ubyte etc.,
    /// not gzipped; tokens: train.bin, val.bin as little-endian uint16, cut
    /// into non-overlapping windows of --context + 1 tokens; tensors:
    /// train.safetensors and optional eval.safetensors, each holding `x`
    /// (float, [N, ...]) and `y` (int64 class ids, [N])).
    #[arg(long, env = env::DATA_DIR)]
    pub data_dir: Option<PathBuf>,
    /// Number of samples for the synthetic datasets.
    #[arg(long, default_value_t = 4096)]
    pub synthetic_samples: usize,
    /// Fraction held out for evaluation when the dataset has no test split.
    #[arg(long, default_value_t = 0.1)]
    pub eval_fraction: f64,
    /// Take samples in order instead of a seeded permutation per epoch.
    #[arg(long)]
    pub no_shuffle: bool,
    /// Gather each step's batch when the step starts, instead of during the
    /// step before on a helper thread at idle CPU priority (which runs
    /// while a core would otherwise wait, e.g. in the gradient exchange).
    /// The batches are the same either way.
    #[arg(long)]
    pub no_prefetch: bool,
    /// Each step waits for its batch from the helper thread, which then runs
    /// at normal priority: the prefetch path taken at every step whatever
    /// the machine's load (tests of that path; never faster).
    #[arg(long, hide = true, conflicts_with = "no_prefetch")]
    pub prefetch_wait: bool,
}

/// The trainer's `--context` when none is given.
pub const DEFAULT_CONTEXT: i64 = 64;

/// Optimisation: the global batch, the run's length, the optimizer and its
/// schedule, the seed.
#[derive(Clone, Debug, PartialEq, Args, Serialize)]
pub struct OptimArgs {
    /// Global batch size B (sum of all ranks' local batches).
    #[arg(long, alias = "global-batch-size", default_value_t = 64, env = env::BATCH_SIZE)]
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
    pub optimizer: Optimizer,
    /// Who runs the optimizer update: `fastest` shards it (and its state)
    /// across the ranks whose local batch is within 10% of the largest, in
    /// proportion to their batches, so slow ranks update nothing;
    /// `proportional` shards it across every rank with samples in
    /// proportion to its batch; `replicated` updates everything on every
    /// rank. The result is the same either way.
    #[arg(long, value_enum, default_value = "fastest", env = env::OPTIMIZER_SHARDING)]
    pub optimizer_sharding: OptimizerSharding,
    /// Run the sharded optimizer update after backward, as one pass
    /// followed by the owners' broadcasts, instead of inside backward
    /// (where each owner updates a piece of the parameters as soon as its
    /// gradient sums arrive and sends the new values while backward goes
    /// on). The result is the same. Inside backward gains where cores are
    /// left over while backward runs (resnet18 at 4 threads per rank on a
    /// 16-core host: 1.09×); where the ranks' compute fills every core
    /// (2 ranks on 2 cores) the two are within the noise. `make
    /// bench-trainer` measures it. CPU ranks only: a gang with a CUDA rank
    /// updates after backward.
    #[arg(long)]
    pub update_after_backward: bool,
    /// SGD momentum.
    #[arg(long, default_value_t = 0.9)]
    pub momentum: f64,
    /// Weight decay (L2 for sgd, decoupled for adamw).
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Learning-rate schedule after warmup.
    #[arg(long, value_enum, default_value = "constant")]
    pub schedule: Schedule,
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
    /// Deterministic algorithms (bit-identical reruns and resumes on CPU with --threads 1).
    #[arg(long)]
    pub deterministic: bool,
}

/// Distributed execution: device, threads, the rank layout (torchrun's
/// variables) and c10d.
#[derive(Clone, Debug, PartialEq, Args, Serialize)]
pub struct DistArgs {
    /// Collective backend.
    #[arg(long, value_enum, default_value = "auto", env = env::BACKEND)]
    pub backend: Backend,
    /// Compute device.
    #[arg(long, value_enum, default_value = "cpu", env = env::DEVICE)]
    pub device: Device,
    /// Intra-op threads for this rank (0: libtorch's default).
    #[arg(long, default_value_t = 0, env = env::THREADS)]
    pub threads: usize,
    /// Seconds to wait for all ranks to join (1 to 604800, a week).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub rendezvous_timeout_secs: u64,
    /// Seconds a collective may take before the run fails (1 to 604800).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub collective_timeout_secs: u64,
    /// Gradient bucket size in MiB: PyTorch's Reducer all-reduces each
    /// bucket as soon as its gradients are ready during backward.
    #[arg(long, default_value_t = 25)]
    pub bucket_mib: usize,
    /// Size in MiB of the first bucket (the last layers' gradients, ready
    /// first). Unset: 1 MiB, as in DDP, where any training rank is on CUDA
    /// (the exchange then starts early and runs beside the GPU); on a team
    /// of CPU ranks the same as --bucket-mib, since there the exchange
    /// shares the cores with backward and a small model then goes in one
    /// message a step instead of two.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    pub first_bucket_mib: Option<u64>,
    /// Steps between starting the per-step control word (plan, stop, loss)
    /// and waiting for it while the plan leaves a rank out (rank 0's value
    /// counts): a left-out rank on a sliver of a core then never holds up
    /// the ranks that train, and plan changes and stops take effect this
    /// many steps later. While every rank trains the word is waited at the
    /// end of its own step.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub control_lag_steps: u32,
    /// About how often (ms) the ranks exchange the control word: rank 0
    /// starts one every k steps, k = this / its recent step time (1 to
    /// 64). Each word costs every rank a round of small messages (and a
    /// rank on a CPU quota a wake-up), so fast steps share one. Plan
    /// changes and stop requests take effect at the next word, and the
    /// global loss in logs and metrics is refreshed with each word (a rank
    /// whose own loss is not finite still stops at once). 0: every step.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub control_interval_ms: u32,
    /// This rank (torchrun `RANK`).
    #[arg(long, env = env::RANK, default_value_t = 0)]
    #[serde(skip)]
    pub rank: usize,
    /// Number of ranks (torchrun `WORLD_SIZE`).
    #[arg(long, env = env::WORLD_SIZE, default_value_t = 1)]
    #[serde(skip)]
    pub world_size: usize,
    /// Rank on this host; picks the CUDA device (torchrun `LOCAL_RANK`).
    #[arg(long, env = env::LOCAL_RANK, default_value_t = 0)]
    #[serde(skip)]
    pub local_rank: usize,
    /// Rank 0's address (torchrun `MASTER_ADDR`).
    #[arg(long, env = env::MASTER_ADDR, default_value = "127.0.0.1")]
    #[serde(skip)]
    pub master_addr: String,
    /// Rank 0's TCPStore port (torchrun `MASTER_PORT`).
    #[arg(long, env = env::MASTER_PORT, default_value_t = 29500)]
    #[serde(skip)]
    pub master_port: u16,
    /// Address the Gloo transport and rank 0's TCPStore bind (default:
    /// 127.0.0.1 when MASTER_ADDR is loopback; else Gloo takes the host's
    /// resolved address and the store listens on every address).
    #[arg(long, env = env::BIND_ADDR)]
    #[serde(skip)]
    pub bind_addr: Option<String>,
    /// Network interface for Gloo.
    #[arg(long, env = env::GLOO_SOCKET_IFNAME)]
    #[serde(skip)]
    pub gloo_socket_ifname: Option<String>,
}

/// Where the run writes: its log, final weights and checkpoints, and how
/// it resumes.
#[derive(Clone, Debug, PartialEq, Args, Serialize)]
pub struct OutputArgs {
    /// Directory for this rank's JSON-lines log `rank-<r>.jsonl` and, on
    /// rank 0, the final weights `model.safetensors`.
    #[arg(long, default_value = "heterotrain-out", env = env::OUTPUT_DIR)]
    pub output_dir: PathBuf,
    /// Directory for checkpoints (written by rank 0); none: no checkpoints.
    #[arg(long, env = env::CHECKPOINT_DIR)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Checkpoint every N steps (0: only at the end).
    #[arg(long, default_value_t = 0)]
    pub checkpoint_every: u64,
    /// Resume from the newest checkpoint of this run that loads (`auto`) or
    /// not. Checkpoints whose fingerprint (model and shape flags, batch size,
    /// dataset and its size, optimizer, world size, job UID) differs are
    /// skipped with a warning.
    #[arg(long, value_enum, default_value = "never", env = env::RESUME)]
    pub resume: ResumeMode,
    /// An earlier run's checkpoint directory (read only): with `--resume
    /// auto` and no checkpoint of this run in `--checkpoint-dir`, continue
    /// from its newest checkpoint whose fingerprint matches this run's
    /// apart from the job UID; none there is an error.
    #[arg(long, env = env::RESUME_FROM)]
    pub resume_from: Option<PathBuf>,
    /// UID of the HeteroTrainingJob (set by the operator): part of the run
    /// fingerprint, so `--resume auto` never takes another job's checkpoints.
    #[arg(long, env = env::JOB_UID)]
    #[serde(skip)]
    pub job_uid: Option<String>,
}

/// Where batch plans come from and, without an operator, how rank 0
/// balances.
#[derive(Clone, Debug, PartialEq, Args, Serialize)]
pub struct PlanArgs {
    /// JSON batch plan (format: docs/design.md "Contracts"); rank 0 re-reads it when it changes
    /// and all ranks switch at the same step. Without it: an equal split.
    #[arg(long, env = env::PLAN_FILE)]
    pub plan_file: Option<PathBuf>,
    /// Plan ConfigMap to watch for `plan.json` (set by the operator); rank 0
    /// watches it and all ranks switch at the same step.
    #[arg(long, env = env::PLAN_CONFIGMAP)]
    #[serde(skip)]
    pub plan_configmap: Option<String>,
    /// Namespace of the plan ConfigMap (default: the kube client's).
    #[arg(long, env = env::NAMESPACE)]
    #[serde(skip)]
    pub namespace: Option<String>,
    /// Seconds rank 0 waits at start for the plan ConfigMap's first plan
    /// before it starts on an equal split (tests on a loaded machine, where
    /// the watch may take longer than that to deliver it). Never written
    /// by the operator: its pods keep the default, whatever the image.
    #[arg(long, default_value_t = 5, hide = true)]
    #[serde(skip)]
    pub first_plan_wait_secs: u64,
    /// `local`: rank 0 balances from all-gathered measurements (no operator).
    #[arg(long, value_enum, default_value = "none", env = env::BALANCER)]
    pub balancer: BalancerMode,
    /// Balancing policy for `--balancer local`: static, proportional,
    /// dynamic, hybrid.
    #[arg(long, default_value = "dynamic", env = env::POLICY)]
    pub policy: String,
    /// Steps between local balancing rounds.
    #[arg(long, default_value_t = 20)]
    pub balance_every: u64,
    /// Hysteresis of the local balancer: minimum predicted gain, percent.
    #[arg(long, default_value_t = 5)]
    pub min_gain_percent: u32,
}

/// What the run tells the world: status lines, `/metrics`, the start-up
/// hardware profile.
#[derive(Clone, Debug, PartialEq, Args, Serialize)]
pub struct ObsArgs {
    /// Rank 0 prints a one-line status every N steps (0: never).
    #[arg(long, default_value_t = 50)]
    pub status_every: u64,
    /// Port of the Prometheus `/metrics` endpoint (0: no endpoint).
    #[arg(long, default_value_t = DEFAULT_METRICS_PORT, env = env::METRICS_PORT)]
    pub metrics_port: u16,
    /// Address the metrics endpoint binds (default: `POD_IP`, else 0.0.0.0).
    #[arg(long, env = env::POD_IP)]
    #[serde(skip)]
    pub metrics_addr: Option<String>,
    /// Local batch sizes the start-up profile measures (in `train`, those
    /// above the global batch are left out: no rank trains more a step).
    #[arg(long, value_delimiter = ',', default_value = "8,16,32")]
    pub profile_batch_sizes: Vec<u32>,
    /// Skip the start-up hardware profile.
    #[arg(long)]
    pub no_profile: bool,
    /// Time budget of the profile's measurements, seconds.
    #[arg(long, default_value_t = 3.0)]
    pub profile_seconds: f64,
    /// Sleep this long after every step (demos and tests of live plan
    /// changes; a bound on the steps per second whatever the machine).
    /// Never written by the operator when 0, so that `HT_STEP_SLEEP_MS` in
    /// a group's `env` takes effect (a flag beats its variable).
    #[arg(long, default_value_t = 0, hide = true, env = env::STEP_SLEEP_MS)]
    #[serde(skip_serializing_if = "is_zero_u64")]
    pub step_sleep_ms: u64,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}
