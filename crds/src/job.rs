//! The `HeteroTrainingJob` custom resource (`heterotrain.dev/v1alpha1`,
//! short name `htj`): what a user writes in `job.yaml`, and the status the
//! operator reports back. The CRD YAML is generated from these types
//! (`make crds`); `///` docs become `kubectl explain` text.

// Printer columns repeat `type_ = ...` by design; clippy reads that as a
// duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvFromSource, EnvVar, LocalObjectReference, ResourceRequirements, Toleration,
    Volume, VolumeMount,
};
use k8s_openapi::api::networking::v1::NetworkPolicyEgressRule;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::bottleneck::Bottleneck;

pub use crate::run_policy::{GangScheduler, RunPolicy, SchedulingPolicy};

/// Pattern of a decimal number written as a string, e.g. "0.1", "3e-4".
pub const DECIMAL_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$";
/// Pattern of a DNS-1123 label (worker group names become pod labels).
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// A data-parallel training job over heterogeneous workers. Each rank gets a
/// local batch sized to its speed; the global batch never changes.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "heterotrain.dev",
    version = "v1alpha1",
    kind = "HeteroTrainingJob",
    plural = "heterotrainingjobs",
    shortname = "htj",
    category = "heterotrain",
    namespaced,
    status = "HeteroTrainingJobStatus",
    printcolumn(name = "Status", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Ranks", type_ = "integer", json_path = ".status.ranks"),
    printcolumn(
        name = "Policy",
        type_ = "string",
        json_path = ".spec.loadBalancing.policy"
    ),
    printcolumn(
        name = "Samples/s",
        type_ = "number",
        json_path = ".status.clusterSamplesPerSecond"
    ),
    printcolumn(name = "Plan", type_ = "integer", json_path = ".status.planGeneration"),
    printcolumn(name = "Step", type_ = "integer", json_path = ".status.step"),
    printcolumn(
        name = "Progress",
        type_ = "string",
        json_path = ".status.progress.percentText"
    ),
    printcolumn(name = "ETA", type_ = "string", json_path = ".status.progress.eta"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct HeteroTrainingJobSpec {
    /// Worker groups. Ranks are numbered across groups in the order listed
    /// here: the first group's replicas are ranks 0..n-1, and so on.
    #[schemars(length(min = 1, max = 64))]
    pub workers: Vec<WorkerGroup>,
    /// The model to train. Required for the built-in trainer; optional when
    /// every group runs its own `command` (then, when given, it names the
    /// job's profile-cache entries, which otherwise go by the name
    /// `command`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelSpec>,
    /// The training data. Required for the built-in trainer; optional when
    /// every group runs its own `command` (then a `claimName` is still
    /// mounted at `path` for the script).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<DatasetSpec>,
    /// Optimisation settings; `globalBatchSize` is kept constant whatever the split.
    pub training: TrainingSpec,
    /// Collective backend: `auto` picks NCCL when every rank is CUDA, Gloo otherwise.
    #[serde(default)]
    pub backend: Backend,
    /// How local batches are decided and re-decided.
    #[serde(default)]
    pub load_balancing: LoadBalancingSpec,
    /// Start-up hardware/model profiling.
    #[serde(default)]
    pub profiling: ProfilingSpec,
    /// Checkpointing (needed to resume after a failure).
    #[serde(default)]
    pub checkpoint: CheckpointSpec,
    /// Restarts, deadlines, clean-up, suspension.
    #[serde(default)]
    pub run_policy: RunPolicy,
    /// Trainer image for every group without its own `image`. Defaults to the
    /// operator's `--trainer-image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Your own trainer: the container command of every group without its
    /// own `command` (e.g. `[python, /app/train.py]` with the `heterotrain`
    /// Python library, or `torchrun`-free: one process per rank). Empty: the
    /// built-in `heterotrain-trainer`, with flags from this spec. A command
    /// gets the same torchrun environment, plan ConfigMap, metrics scraping,
    /// balancing and gang restarts; it must follow the trainer contract in
    /// `docs/trainer-contract.md`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Arguments to `command` (only with a command: the built-in trainer's
    /// flags come from this spec).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// ServiceAccount the rank pods run as (needs read/watch on the plan ConfigMap).
    /// Defaults to `heterotrain-trainer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Port of rank 0's rendezvous store (`MASTER_PORT`).
    #[serde(default = "default_master_port")]
    #[schemars(range(min = 1024, max = 65535))]
    pub master_port: u16,
    /// Port each trainer serves `/metrics` on.
    #[serde(default = "default_metrics_port")]
    #[schemars(range(min = 1024, max = 65535))]
    pub metrics_port: u16,
    /// Isolation of the job's ranks from other pods.
    #[serde(default)]
    pub isolation: IsolationSpec,
}

/// Isolation of a job's ranks. PyTorch's c10d accepts any connection
/// without authentication, so by default only the job's own pods may reach
/// its ranks.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IsolationSpec {
    /// Create the job's NetworkPolicies (default true): ingress to the
    /// ranks only from the same job's pods (selected by the job-UID label)
    /// and, on the metrics port, from the operator's and Prometheus's
    /// namespaces; egress only to the job's pods, DNS and (rank 0) the API
    /// server. `false` leaves the ranks open to every pod that can reach
    /// them (the job reports a `NetworkIsolated=False` warning condition).
    #[serde(default = "default_true")]
    pub network_policy: bool,
    /// Further destinations every rank may reach, as NetworkPolicy egress
    /// rules (`to`: `ipBlock`, `namespaceSelector`, `podSelector`; `ports`),
    /// added to the job's policy: an S3 endpoint, an experiment tracker, a
    /// package mirror. An empty `to` means any destination on the listed
    /// ports. Needs `networkPolicy: true`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<NetworkPolicyEgressRule>,
}

impl Default for IsolationSpec {
    fn default() -> Self {
        IsolationSpec {
            network_policy: true,
            egress: Vec::new(),
        }
    }
}

/// A set of identical ranks placed on one kind of node.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerGroup {
    /// Group name (a DNS label), unique within the job; becomes the pod label
    /// `heterotrain.dev/group`.
    #[schemars(
        length(min = 1, max = 40),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Number of ranks in this group.
    #[schemars(range(min = 1, max = 1024))]
    pub replicas: u32,
    /// Device each rank trains on.
    #[serde(default)]
    pub device: Device,
    /// CPU threads per rank for compute (CPU ranks); default: the CPU limit, or 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub threads: Option<u32>,
    /// Node labels the group's pods must match, e.g.
    /// `nvidia.com/gpu.product: NVIDIA-A100-SXM4-40GB`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Standard pod affinity rules for the group's pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Tolerations for tainted (e.g. GPU) nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Container resources, e.g. `limits: {nvidia.com/gpu: 1}` for CUDA groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Trainer image for this group (overrides `spec.image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Container command for this group (overrides `spec.command`; see there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Arguments to this group's command (overrides `spec.args`; only with a
    /// command, the group's or the job's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment variables for this group's trainers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Environment variables taken whole from ConfigMaps or Secrets
    /// (`configMapRef` / `secretRef`, optional `prefix`), as in a container's
    /// `envFrom`. Variables the operator sets (RANK, WORLD_SIZE, MASTER_ADDR,
    /// …) always win over these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from: Vec<EnvFromSource>,
    /// Extra pod volumes, referenced by `volumeMounts`. Only the kinds the
    /// PodSecurity `restricted` profile allows: configMap, secret,
    /// persistentVolumeClaim, emptyDir, projected, downwardAPI, csi,
    /// ephemeral (no hostPath). Names `scratch`, `checkpoints`, `data` and
    /// `dshm` are the operator's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Extra mounts into the trainer container; each names one of `volumes`.
    /// A mountPath may not be one the operator uses (`/scratch`, the
    /// checkpoint path, the dataset path with `claimName`, `/dev/shm` with
    /// `shmSize`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_mounts: Vec<VolumeMount>,
    /// Secrets holding registry credentials to pull this group's image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// PriorityClass of this group's pods (scheduling priority and preemption).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// RuntimeClass of this group's pods, e.g. `nvidia` for a GPU container
    /// runtime that is not the node's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// Extra labels on this group's pods. Keys under `heterotrain.dev/` and
    /// `app.kubernetes.io/managed-by` are the operator's and are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_labels: BTreeMap<String, String>,
    /// Extra annotations on this group's pods. Keys under `heterotrain.dev/`
    /// are the operator's and are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
    /// Size of `/dev/shm` (a memory-backed emptyDir with this sizeLimit),
    /// e.g. `2Gi`; counts against the pod's memory limit. Data loaders and
    /// NCCL need more shared memory than the runtime's 64Mi default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<Quantity>,
}

/// Device a group trains on.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "snake_case")]
pub enum Device {
    /// CPU threads.
    #[default]
    Cpu,
    /// One NVIDIA GPU per rank (request `nvidia.com/gpu` in `resources`).
    Cuda,
}

/// Collective communication backend.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "snake_case")]
pub enum Backend {
    /// NCCL when every rank is CUDA, Gloo otherwise.
    #[default]
    Auto,
    /// Gloo (CPU tensors; CUDA tensors are staged through host memory).
    Gloo,
    /// NCCL (every group must be `cuda`).
    Nccl,
}

/// Model architecture and size.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSpec {
    /// Architecture.
    pub name: ModelName,
    /// Hidden width (mlp; transformer embedding width for `gpt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65536))]
    pub hidden: Option<u32>,
    /// Number of layers (mlp hidden layers; transformer blocks for `gpt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub layers: Option<u32>,
    /// Attention heads (`gpt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub heads: Option<u32>,
    /// Context length in tokens (`gpt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65536))]
    pub context: Option<u32>,
    /// Vocabulary size (`gpt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2, max = 1048576))]
    pub vocab: Option<u32>,
    /// The TorchScript module `torchscript` trains (a file saved by
    /// `torch.jit.save`, mapping a batch of inputs to class logits): an
    /// absolute path inside the pod, typically on the dataset's claim.
    /// Only with `torchscript`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// Model architectures the trainer builds.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum ModelName {
    /// Multi-layer perceptron.
    Mlp,
    /// A small convolutional network (no BatchNorm).
    SimpleCnn,
    /// ResNet-18.
    Resnet18,
    /// ResNet-50.
    Resnet50,
    /// GPT-style decoder-only transformer language model.
    Gpt,
    /// Your own model: a TorchScript module (`model.file`) mapping a batch
    /// of inputs to class logits, trained with cross-entropy.
    Torchscript,
}

impl ModelName {
    /// Whether the architecture has BatchNorm layers.
    pub fn has_batch_norm(&self) -> bool {
        matches!(self, ModelName::Resnet18 | ModelName::Resnet50)
    }

    /// The name as the trainer's `--model` flag spells it.
    pub fn as_str(&self) -> &'static str {
        match self {
            ModelName::Mlp => "mlp",
            ModelName::SimpleCnn => "simple_cnn",
            ModelName::Resnet18 => "resnet18",
            ModelName::Resnet50 => "resnet50",
            ModelName::Gpt => "gpt",
            ModelName::Torchscript => "torchscript",
        }
    }
}

/// Training data.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatasetSpec {
    /// Dataset format.
    pub name: DatasetName,
    /// Directory holding the files (`cifar10`: the binary batches; `cifar100`:
    /// `train.bin`/`test.bin`; `mnist`: IDX files; `tokens`: `train.bin`/`val.bin`;
    /// `tensors`: `train.safetensors`/`eval.safetensors`).
    /// With `claimName` the claim is mounted here (default `/data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// PersistentVolumeClaim mounted read-only at `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// Number of generated samples for synthetic datasets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000000))]
    pub synthetic_samples: Option<u32>,
}

/// Dataset formats the trainer reads.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum DatasetName {
    /// Random images, deterministic by seed.
    SyntheticImage,
    /// Random token sequences, deterministic by seed.
    SyntheticText,
    /// CIFAR-10 binary batches.
    Cifar10,
    /// MNIST IDX files.
    Mnist,
    /// CIFAR-100 binary files (`train.bin`, `test.bin`); trains on the 100 fine labels.
    Cifar100,
    /// Flat little-endian uint16 token files `train.bin` and optional `val.bin`
    /// (nanoGPT's layout) for `gpt`, cut into non-overlapping windows of
    /// `model.context` + 1 tokens; every token must be below `model.vocab`.
    Tokens,
    /// Tensors in safetensors files: `train.safetensors` and optional
    /// `eval.safetensors`, each with `x` (float, `[N, ...]`) and `y` (int64
    /// class ids, `[N]`); the classes are 0..=max(y).
    Tensors,
}

impl DatasetName {
    /// The name as the trainer's `--dataset` flag spells it.
    pub fn as_str(&self) -> &'static str {
        match self {
            DatasetName::SyntheticImage => "synthetic_image",
            DatasetName::SyntheticText => "synthetic_text",
            DatasetName::Cifar10 => "cifar10",
            DatasetName::Mnist => "mnist",
            DatasetName::Cifar100 => "cifar100",
            DatasetName::Tokens => "tokens",
            DatasetName::Tensors => "tensors",
        }
    }

    /// Read from files (`path` / `claimName`), not generated.
    pub fn from_files(&self) -> bool {
        !matches!(
            self,
            DatasetName::SyntheticImage | DatasetName::SyntheticText
        )
    }

    /// Token sequences, for `gpt`.
    pub fn is_text(&self) -> bool {
        matches!(self, DatasetName::SyntheticText | DatasetName::Tokens)
    }

    /// Bytes a generated dataset of `samples` holds in memory: 3×32×32
    /// float pixels and a label per image, `context` + 1 int64 tokens per
    /// sequence. `None` for datasets read from files, or past `u64`.
    pub fn synthetic_bytes(&self, samples: u64, context: u64) -> Option<u64> {
        let per_sample = match self {
            DatasetName::SyntheticImage => 3 * 32 * 32 * 4 + 8,
            DatasetName::SyntheticText => context.checked_add(1)?.checked_mul(8)?,
            _ => return None,
        };
        samples.checked_mul(per_sample)
    }
}

/// The most memory a generated dataset may take (8 GiB): more is a typo,
/// and would end in an out-of-memory kill rather than an error.
pub const MAX_SYNTHETIC_BYTES: u64 = 8 << 30;

/// Optimisation settings. Fractional values (learning rate, momentum, weight
/// decay) are written as decimal strings, e.g. `learningRate: "0.05"` or
/// `"3e-4"`, as Kubernetes APIs avoid floating-point fields.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingSpec {
    /// Global batch B: the sum of every rank's local batch, constant for the
    /// whole run. Must be at least the number of ranks × `minLocalBatch`.
    #[schemars(range(min = 1, max = 16777216))]
    pub global_batch_size: u32,
    /// Passes over the training set. One of `epochs` / `maxSteps` is needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub epochs: Option<u32>,
    /// Stop after this many optimizer steps (wins over `epochs` when both are set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_steps: Option<u64>,
    /// Optimizer.
    #[serde(default)]
    pub optimizer: Optimizer,
    /// Peak learning rate as a decimal string, e.g. "0.05".
    #[serde(default = "default_lr")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$"))]
    pub learning_rate: String,
    /// SGD momentum as a decimal string, e.g. "0.9".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$"))]
    pub momentum: Option<String>,
    /// Weight decay as a decimal string, e.g. "5e-4".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$"))]
    pub weight_decay: Option<String>,
    /// Learning-rate schedule after warm-up.
    #[serde(default)]
    pub schedule: Schedule,
    /// Linear warm-up steps.
    #[serde(default)]
    pub warmup_steps: u32,
    /// Seed for initialisation, shuffling and synthetic data.
    #[serde(default)]
    pub seed: u64,
    /// BatchNorm statistics in training (resnet18, resnet50). `sync`
    /// (default): each layer normalises with the whole global batch's
    /// statistics, all-reduced across ranks in forward and backward, so
    /// training equals one process with batch B under any split. `local`:
    /// per-rank statistics (no extra collectives, results depend on the
    /// split); every rank then gets at least 2 samples and running
    /// statistics are averaged across ranks, weighted by local batch.
    #[serde(default)]
    pub batch_norm: BatchNormMode,
    /// Who runs the optimizer update. `fastest` (default): the ranks whose
    /// local batch is within 10% of the largest (the fastest ranks under a
    /// balanced plan) each update (and keep optimizer state for) a
    /// contiguous share of the parameters sized in proportion to their
    /// local batches, then send it to the others; slower ranks update
    /// nothing, so none of the update's round trips waits on them.
    /// `proportional`: every rank with samples owns a share in proportion
    /// to its local batch. `replicated`: every rank updates every
    /// parameter. All three give the same parameters.
    #[serde(default)]
    pub optimizer_sharding: OptimizerSharding,
}

/// Who runs the optimizer update.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "snake_case")]
pub enum OptimizerSharding {
    /// Shares for the ranks within 10% of the largest local batch, in
    /// proportion to their batches; the others own nothing.
    #[default]
    Fastest,
    /// Shares in proportion to the local batches.
    Proportional,
    /// Every rank updates everything.
    Replicated,
}

impl OptimizerSharding {
    /// The name as the trainer's `--optimizer-sharding` flag spells it.
    pub fn as_str(&self) -> &'static str {
        match self {
            OptimizerSharding::Fastest => "fastest",
            OptimizerSharding::Proportional => "proportional",
            OptimizerSharding::Replicated => "replicated",
        }
    }
}

/// How BatchNorm layers compute batch statistics in training.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "snake_case")]
pub enum BatchNormMode {
    /// Global-batch statistics (exact under any split).
    #[default]
    Sync,
    /// Per-rank statistics (local batches of at least 2).
    Local,
}

impl BatchNormMode {
    /// The name as the trainer's `--batch-norm` flag spells it.
    pub fn as_str(&self) -> &'static str {
        match self {
            BatchNormMode::Sync => "sync",
            BatchNormMode::Local => "local",
        }
    }
}

/// Optimizer kinds.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "snake_case")]
pub enum Optimizer {
    /// SGD with optional momentum and weight decay.
    #[default]
    Sgd,
    /// AdamW.
    Adamw,
}

/// Learning-rate schedules.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
#[value(rename_all = "snake_case")]
pub enum Schedule {
    /// Constant after warm-up.
    #[default]
    Constant,
    /// Cosine decay to zero over the run.
    Cosine,
    /// Step decay.
    Step,
}

/// Load-balancing settings.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancingSpec {
    /// `static`: equal split (the baseline). `proportional`: from the
    /// start-up profile. `dynamic`: from live measurements. `hybrid`: profile
    /// first, live measurements weighted in as they accrue. `seed-formula`:
    /// the prototype's scoring formula, kept as a benchmark baseline.
    #[serde(default)]
    pub policy: BalancePolicy,
    /// Training steps between two decisions on the plan. The operator
    /// reconsiders the split only once the job's step (the ranks'
    /// `heterotrain_step` metric) has advanced this many steps since its last
    /// decision (for the first one: since the first step it read), and never
    /// sooner than its `--rebalance-interval` (a wall-clock floor) after it.
    /// Both are checked at each metrics read (`--scrape-interval`), so a plan
    /// is reconsidered about every max(this × step time, rebalance interval),
    /// rounded up to the next read.
    #[serde(default = "default_rebalance_interval")]
    #[schemars(range(min = 1, max = 1000000))]
    pub rebalance_interval_steps: u32,
    /// Hysteresis: a new plan is written only when it predicts a step time at
    /// least this many percent lower than the current plan's.
    #[serde(default = "default_min_gain")]
    #[schemars(range(min = 0, max = 100))]
    pub min_gain_percent: u32,
    /// Smallest local batch any rank may get.
    #[serde(default = "default_min_local_batch")]
    #[schemars(range(min = 1))]
    pub min_local_batch: u32,
    /// Largest local batch any rank may get (besides its measured memory cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_local_batch: Option<u32>,
    /// A rank whose step time exceeds its model's prediction by this percent
    /// (e.g. 150 = 1.5×) for several intervals is treated as a straggler and re-fitted fast.
    #[serde(default = "default_straggler")]
    #[schemars(range(min = 100, max = 1000))]
    pub straggler_threshold_percent: u32,
    /// Leave out slow ranks (default true): with the `proportional`,
    /// `dynamic` and `hybrid` policies a rank other than rank 0 whose step at
    /// its smallest local batch is longer than the step the others reach
    /// without it (a large fixed cost, or a device far slower than the rest)
    /// gets a local batch of 0: it trains on no samples and takes no part in
    /// the gradient exchange until it is re-admitted. Status lists it in
    /// `leftOutRanks`.
    #[serde(default = "default_true")]
    pub leave_out_slow_ranks: bool,
    /// Cap ranks by their CPU quota (default true): with the `dynamic` and
    /// `hybrid` policies a training rank that used at least 90% of its
    /// cgroup's CPU quota (`heterotrain_cpu_quota_used_ratio`) gets no more
    /// samples than it trains now, and one that used a share u below that
    /// at most batch / u (rounded up); either may still get fewer. Its
    /// compute is measured in bursts between throttled periods, so its model
    /// says it could take more, but it has only its idle time to run them in.
    #[serde(default = "default_true")]
    pub cap_quota_bound_ranks: bool,
    /// Leaving a rank out must predict a step at least this many percent
    /// shorter than the best plan that keeps it (default 10), on top of
    /// `minGainPercent`, so that noise never flaps membership.
    #[serde(default = "default_leave_out_margin")]
    #[schemars(range(min = 0, max = 100))]
    pub leave_out_margin_percent: u32,
    /// A left-out rank is re-admitted with its share, to be measured again,
    /// after this many balancing decisions (default 20). If the fresh
    /// measurements leave it out again the wait doubles, up to 8 times this,
    /// and resets once it stays in. It also comes back as soon as its last
    /// measurements predict that including it shortens the step.
    #[serde(default = "default_readmit_after")]
    #[schemars(range(min = 1, max = 1000000))]
    pub readmit_after_decisions: u32,
    /// Where live metrics come from.
    #[serde(default)]
    pub metrics_source: MetricsSource,
    /// Prometheus base URL, required when `metricsSource: prometheus`,
    /// e.g. `http://prometheus.monitoring:9090`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://"))]
    pub prometheus_url: Option<String>,
}

impl Default for LoadBalancingSpec {
    fn default() -> Self {
        LoadBalancingSpec {
            policy: BalancePolicy::default(),
            rebalance_interval_steps: default_rebalance_interval(),
            min_gain_percent: default_min_gain(),
            min_local_batch: default_min_local_batch(),
            max_local_batch: None,
            straggler_threshold_percent: default_straggler(),
            leave_out_slow_ranks: true,
            cap_quota_bound_ranks: true,
            leave_out_margin_percent: default_leave_out_margin(),
            readmit_after_decisions: default_readmit_after(),
            metrics_source: MetricsSource::default(),
            prometheus_url: None,
        }
    }
}

/// Balancing policies a job can ask for.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BalancePolicy {
    /// Equal split, never changed.
    Static,
    /// Split from the start-up profile only.
    Proportional,
    /// Split from live measurements.
    #[default]
    Dynamic,
    /// Profile as a prior, live measurements weighted in.
    Hybrid,
    /// The Python prototype's scoring formula (hardware score blended with
    /// inverse step time). A comparison baseline for benchmarks; it mixes
    /// units and balances poorly, so prefer `dynamic`.
    #[serde(rename = "seed-formula")]
    SeedFormula,
}

impl BalancePolicy {
    /// Lower-case name, as used in plans and flags.
    pub fn as_str(&self) -> &'static str {
        match self {
            BalancePolicy::Static => "static",
            BalancePolicy::Proportional => "proportional",
            BalancePolicy::Dynamic => "dynamic",
            BalancePolicy::Hybrid => "hybrid",
            BalancePolicy::SeedFormula => "seed-formula",
        }
    }
}

/// Where the operator reads live trainer metrics from.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MetricsSource {
    /// Scrape each rank pod's `/metrics` directly.
    #[default]
    Pods,
    /// Query a Prometheus server's HTTP API (`prometheusUrl`).
    Prometheus,
}

/// Start-up profiling.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfilingSpec {
    /// Run the hardware/model profile when a rank starts.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Local batch sizes timed during the profile.
    #[serde(default = "default_probe_batches")]
    #[schemars(length(min = 1, max = 16))]
    pub probe_batch_sizes: Vec<u32>,
}

impl Default for ProfilingSpec {
    fn default() -> Self {
        ProfilingSpec {
            enabled: true,
            probe_batch_sizes: default_probe_batches(),
        }
    }
}

/// Checkpointing.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSpec {
    /// Write a checkpoint every this many steps (0: only at the end and on SIGTERM).
    #[serde(default = "default_checkpoint_every")]
    pub every_steps: u32,
    /// Directory for checkpoints inside the pod.
    #[serde(default = "default_checkpoint_path")]
    pub path: String,
    /// PersistentVolumeClaim mounted at `path`, so checkpoints outlive pods.
    /// Without it the directory is an emptyDir and a recreated gang starts over.
    /// Each run writes to a directory of its own in the claim,
    /// `<job>/<job UID>` (`status.checkpointDir`), so a job deleted and
    /// created again under the same name never overwrites the earlier
    /// run's checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_name: Option<String>,
    /// Continue an earlier run (built-in trainer): the UID of an earlier job
    /// of this name (its directory `<job>/<UID>` in the claim), or a
    /// directory of the claim (`other-job/<UID>`). Rank 0 mounts it read
    /// only and, while this run has no checkpoint of its own, resumes from
    /// its newest checkpoint whose model, data, batch, optimizer and world
    /// size match; the earlier run's files are never changed. Needs
    /// `claimName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_from: Option<String>,
}

impl Default for CheckpointSpec {
    fn default() -> Self {
        CheckpointSpec {
            every_steps: default_checkpoint_every(),
            path: default_checkpoint_path(),
            claim_name: None,
            resume_from: None,
        }
    }
}

/// What the operator reports.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeteroTrainingJobStatus {
    /// Current state as conditions (Created, Profiled, Running, Rebalanced,
    /// Succeeded, Failed, Suspended).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Summary phase for `kubectl get`: Pending, Running, Succeeded, Failed, Suspended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// This run's directory in the checkpoint claim (`<job>/<job UID>`;
    /// `<job>` for a job an operator before per-run directories created).
    /// What `checkpoint.resumeFrom` of a later job names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_dir: Option<String>,
    /// Spec generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Total number of ranks.
    #[serde(default)]
    pub ranks: u32,
    /// Per worker group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupStatus>,
    /// Generation of the plan in `<job>-plan`.
    #[serde(default)]
    pub plan_generation: u64,
    /// Samples per second over all ranks, last measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_samples_per_second: Option<f64>,
    /// Latest step reported by rank 0.
    #[serde(default)]
    pub step: u64,
    /// Latest epoch reported by rank 0.
    #[serde(default)]
    pub epoch: u32,
    /// Balance of per-rank compute time per step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance: Option<BalanceStatus>,
    /// Times the gang was recreated, for any cause (also the gang
    /// generation in each pod's `heterotrain.dev/restart` label).
    #[serde(default)]
    pub restarts: u32,
    /// How many of `restarts` were caused by a disruption — a rank evicted,
    /// deleted, preempted, marked `DisruptionTarget`, or stopped by SIGTERM
    /// (exit 0 before training ended) — rather than a failure. They do not
    /// count toward `runPolicy.backoffLimit`: `restarts - disruptions` does.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub disruptions: u32,
    /// When the gang first started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the job finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// The most recent balancing decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rebalance: Option<RebalanceStatus>,
    /// The balancing decisions that wrote a plan, oldest first (the last
    /// [`PLAN_HISTORY_LEN`]): what `kubectl heterotrain plan` lists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plan_history: Vec<RebalanceStatus>,
    /// How far training is, and how long the rest should take.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressStatus>,
    /// Ranks the current plan leaves out (local batch 0: they train on no
    /// samples until re-admitted; see `loadBalancing.leaveOutSlowRanks`).
    /// Omitted when every rank trains.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out_ranks: Vec<u32>,
    /// What bounds each training rank's step while the job runs, from its
    /// phase times over the last measurement interval: `Data`, `Compute`,
    /// `Communication` (the exchange, waiting for slower ranks included),
    /// `Update`, or `Straggler` (compute per step over
    /// `loadBalancing.stragglerThresholdPercent` of the median of the other
    /// training ranks').
    /// Left-out ranks are not listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rank_bottlenecks: Vec<RankBottleneck>,
}

/// What bounds one rank's step, and its phase times.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RankBottleneck {
    pub rank: u32,
    pub bottleneck: Bottleneck,
    /// Seconds per step loading data.
    pub data_seconds: f64,
    /// Seconds per step in forward and backward.
    pub compute_seconds: f64,
    /// Seconds per step in the gradient exchange (waiting included).
    pub communication_seconds: f64,
    /// Seconds per step in the optimizer update.
    pub update_seconds: f64,
}

/// Training progress, from rank 0's step and the measured throughput.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProgressStatus {
    /// Steps the run trains in all (`maxSteps`, or the epochs' steps when
    /// fewer), as rank 0 reports it.
    pub total_steps: u64,
    /// Whole percent of `totalSteps` done (100 once the job Succeeded).
    pub percent: u32,
    /// `percent` as text for `kubectl get` ("45%").
    pub percent_text: String,
    /// Seconds the remaining steps should take at the last measured
    /// throughput (absent before a measurement; 0 when done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_remaining_seconds: Option<u64>,
    /// `estimatedRemainingSeconds` for `kubectl get` ("1h2m", "4m10s", "12s").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta: Option<String>,
    /// When the step last advanced (or the job finished).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
}

/// Per worker group status.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupStatus {
    /// Group name.
    pub name: String,
    /// Device of the group.
    pub device: Device,
    /// Desired ranks.
    pub replicas: u32,
    /// Ranks whose pod is running.
    pub ready: u32,
    /// Current local batch of each rank of the group, in rank order.
    #[serde(default)]
    pub batch_sizes: Vec<u32>,
    /// Samples per second of the whole group, last measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples_per_second: Option<f64>,
}

/// Balance quality: coefficient of variation of per-rank compute time.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BalanceStatus {
    /// Coefficient of variation, percent.
    pub cv_percent: f64,
    /// Excellent (<5%), Good (5–10%), Fair (10–20%), Poor (≥20%).
    pub class: String,
}

/// Decisions kept in `status.planHistory`.
pub const PLAN_HISTORY_LEN: usize = 20;

/// A balancing decision.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RebalanceStatus {
    /// Plan generation the decision produced (or kept).
    pub generation: u64,
    /// When it was decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// Why.
    pub reason: String,
    /// Predicted step-time gain over the previous plan, percent.
    #[serde(default)]
    pub predicted_gain_percent: f64,
    /// Local batches of the plan.
    #[serde(default)]
    pub batch_sizes: Vec<u32>,
    /// Step the balancer predicts for the plan (compute: the slowest
    /// rank's), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_step_seconds: Option<f64>,
    /// Communication per step it predicts on top (exposed, measured live;
    /// before that, the gradient exchange the ranks' start-up latency and
    /// link figures give), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_communication_seconds: Option<f64>,
}

impl HeteroTrainingJobSpec {
    /// The user's own trainer command and arguments for `group`: the
    /// group's command if it has one, else the job's; `None` means the
    /// built-in trainer. A group with its own command takes its own args.
    pub fn custom_command<'a>(
        &'a self,
        group: &'a WorkerGroup,
    ) -> Option<(&'a [String], &'a [String])> {
        if !group.command.is_empty() {
            Some((&group.command, &group.args))
        } else if !self.command.is_empty() {
            let args = if group.args.is_empty() {
                &self.args
            } else {
                &group.args
            };
            Some((&self.command, args))
        } else {
            None
        }
    }

    /// Whether any group runs the built-in trainer.
    pub fn runs_builtin_trainer(&self) -> bool {
        self.workers
            .iter()
            .any(|g| self.custom_command(g).is_none())
    }

    /// The smallest local batch a plan may give any rank: `minLocalBatch`,
    /// raised to 2 for per-rank (`local`) BatchNorm on a BatchNorm model
    /// (one sample has no variance).
    pub fn effective_min_local_batch(&self) -> u32 {
        let floor = if self.model.as_ref().is_some_and(|m| m.name.has_batch_norm())
            && self.training.batch_norm == BatchNormMode::Local
        {
            2
        } else {
            1
        };
        self.load_balancing.min_local_batch.max(floor)
    }

    /// Total number of ranks over all groups.
    pub fn world_size(&self) -> u32 {
        self.workers.iter().map(|g| g.replicas).sum()
    }

    /// `(group index, rank within the group)` for each global rank.
    pub fn rank_layout(&self) -> Vec<(usize, u32)> {
        self.workers
            .iter()
            .enumerate()
            .flat_map(|(gi, g)| (0..g.replicas).map(move |i| (gi, i)))
            .collect()
    }
}

fn default_true() -> bool {
    true
}
fn default_master_port() -> u16 {
    29500
}
fn default_metrics_port() -> u16 {
    9400
}
fn default_lr() -> String {
    "0.05".into()
}
fn default_rebalance_interval() -> u32 {
    20
}
fn default_min_gain() -> u32 {
    5
}
fn default_min_local_batch() -> u32 {
    1
}
fn default_straggler() -> u32 {
    150
}
fn default_leave_out_margin() -> u32 {
    10
}
fn default_readmit_after() -> u32 {
    20
}
fn default_probe_batches() -> Vec<u32> {
    vec![8, 16, 32]
}
fn default_checkpoint_every() -> u32 {
    50
}
fn default_checkpoint_path() -> String {
    "/checkpoints".into()
}
fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_round_trip_by_their_spelling() {
        for (text, p) in [
            ("static", BalancePolicy::Static),
            ("proportional", BalancePolicy::Proportional),
            ("dynamic", BalancePolicy::Dynamic),
            ("hybrid", BalancePolicy::Hybrid),
            ("seed-formula", BalancePolicy::SeedFormula),
        ] {
            let parsed: BalancePolicy = serde_json::from_value(serde_json::json!(text)).unwrap();
            assert_eq!(parsed, p);
            assert_eq!(p.as_str(), text);
            assert_eq!(serde_json::to_value(p).unwrap(), serde_json::json!(text));
        }
        assert!(serde_json::from_value::<BalancePolicy>(serde_json::json!("seedformula")).is_err());
    }

    #[test]
    fn leave_out_settings_default_and_left_out_ranks_are_omitted_when_none() {
        let lb: LoadBalancingSpec = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(lb, LoadBalancingSpec::default());
        assert!(lb.leave_out_slow_ranks);
        assert!(lb.cap_quota_bound_ranks);
        assert_eq!(lb.leave_out_margin_percent, 10);
        assert_eq!(lb.readmit_after_decisions, 20);
        let lb: LoadBalancingSpec = serde_json::from_value(serde_json::json!({
            "leaveOutSlowRanks": false,
            "capQuotaBoundRanks": false,
            "leaveOutMarginPercent": 25,
            "readmitAfterDecisions": 5
        }))
        .unwrap();
        assert!(!lb.leave_out_slow_ranks);
        assert!(!lb.cap_quota_bound_ranks);
        assert_eq!(
            (lb.leave_out_margin_percent, lb.readmit_after_decisions),
            (25, 5)
        );
        let mut s = HeteroTrainingJobStatus::default();
        assert!(serde_json::to_value(&s)
            .unwrap()
            .get("leftOutRanks")
            .is_none());
        s.left_out_ranks = vec![3];
        assert_eq!(
            serde_json::to_value(&s).unwrap()["leftOutRanks"],
            serde_json::json!([3])
        );
    }
}
