//! `heterotrain-bench` (`make bench`): policies × scenarios × models on the
//! local control plane with simulated nodes, every rank also alone (the
//! ideal), plan propagation latency, trainer vs PyTorch DDP, and operator
//! scale; results as JSON, CSV, a markdown table and PNG plots.

pub mod analysis;
pub mod chart;
pub mod ddp;
pub mod ideal;
pub mod plots;
pub mod propagation;
pub mod report;
pub mod runner;
pub mod scale;
pub mod session;
pub mod spec;
pub mod split;
pub mod state;
pub mod targets;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use analysis::{Recovery, RunSummary};
pub use split::{Paired, Spread};

/// A node of a scenario: its name in the bench cluster and its speed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BenchNode {
    pub name: String,
    pub speed: f64,
}

/// A node slowing down mid-run and recovering.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Throttle {
    /// Index of the node in the scenario.
    pub node: usize,
    /// Speed while throttled.
    pub speed: f64,
    /// When (share of the run's steps) it slows down and recovers.
    pub at: f64,
    pub restore: f64,
}

/// One cluster to train on.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Scenario {
    pub name: String,
    pub title: String,
    pub nodes: Vec<BenchNode>,
    pub throttle: Option<Throttle>,
    /// Nodes (indices) of the scenario's best subset, measured alone with
    /// the whole global batch; the cluster runs are compared with it.
    /// Empty: none. A scenario with a best subset skips `static` (the
    /// equal split on a node too slow to help takes many times as long and
    /// says nothing new).
    #[serde(default)]
    pub best_subset: Vec<usize>,
}

impl Scenario {
    pub fn speeds(&self) -> Vec<f64> {
        self.nodes.iter().map(|n| n.speed).collect()
    }
}

fn node(name: &str, speed: f64) -> BenchNode {
    BenchNode {
        name: name.into(),
        speed,
    }
}

/// The five scenarios. Node names are unique across scenarios so
/// that one cluster holds them all (the throttle scenario reuses the 2-node
/// scenario's nodes).
pub fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            name: "two-node".into(),
            title: "2 nodes, speeds 1.0 / 0.33".into(),
            nodes: vec![node("two-fast", 1.0), node("two-slow", 0.33)],
            throttle: None,
            best_subset: Vec::new(),
        },
        Scenario {
            name: "four-node".into(),
            title: "4 nodes, speeds 1.0 / 0.7 / 0.4 / 0.25".into(),
            nodes: vec![
                node("four-a", 1.0),
                node("four-b", 0.7),
                node("four-c", 0.4),
                node("four-d", 0.25),
            ],
            throttle: None,
            best_subset: Vec::new(),
        },
        Scenario {
            name: "throttle".into(),
            title: "2 nodes 1.0 / 0.33; the fast one throttled to 0.4 for the middle third".into(),
            nodes: vec![node("two-fast", 1.0), node("two-slow", 0.33)],
            throttle: Some(Throttle {
                node: 0,
                speed: 0.4,
                at: 1.0 / 3.0,
                restore: 2.0 / 3.0,
            }),
            best_subset: Vec::new(),
        },
        Scenario {
            name: "homogeneous".into(),
            title: "2 nodes, speeds 1.0 / 1.0 (control)".into(),
            nodes: vec![node("same-a", 1.0), node("same-b", 1.0)],
            throttle: None,
            best_subset: Vec::new(),
        },
        Scenario {
            name: "slow-node".into(),
            title: "2 nodes, speeds 1.0 / 0.05 (one too slow to help)".into(),
            nodes: vec![node("crawl-fast", 1.0), node("crawl-slow", 0.05)],
            throttle: None,
            // The fast node alone: what the job must not fall below.
            best_subset: vec![0],
        },
    ]
}

/// The five policies, as job specs spell them.
pub const POLICIES: [&str; 5] = [
    "static",
    "proportional",
    "dynamic",
    "hybrid",
    "seed-formula",
];

/// Policy variants the bench can also run (`--policies`):
/// `dynamic-uncapped` is `dynamic` with `capQuotaBoundRanks: false`, run in
/// every round beside `dynamic` to measure what the cap on ranks that spent
/// their CPU quota does.
pub const VARIANTS: [&str; 1] = ["dynamic-uncapped"];

/// The job spec's policy and `capQuotaBoundRanks` for a bench policy name.
pub fn spec_policy(name: &str) -> (&str, bool) {
    match name {
        "dynamic-uncapped" => ("dynamic", false),
        p => (p, true),
    }
}

/// A model and the run length used for it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ModelRun {
    pub model: String,
    pub global_batch: u32,
    /// Steps of a cluster run (the throttle scenario runs 1.5× as many).
    pub steps: u64,
    /// Steps of a standalone (ideal) run.
    pub standalone_steps: u64,
    pub learning_rate: String,
    /// The cached real dataset it trains on (`crate::datasets`), offered
    /// to the bench's jobs as a claim of the same name.
    pub dataset: String,
    /// Scenarios run with this model.
    pub scenarios: Vec<String>,
}

/// Default model runs, sized so the whole bench takes about 20 minutes on
/// a 2-core machine. `scale` shortens every run (`--quick`). Both conv nets
/// train on scikit-learn's digits in the CIFAR-10 layout (1,497 train and
/// 300 held-out images, 3×32×32) from `make setup`'s cache; the mlp on the
/// same digits as 8×8 MNIST IDX files.
pub fn model_runs(scale: f64) -> Vec<ModelRun> {
    let s = |n: u64| ((n as f64 * scale).round() as u64).max(20);
    vec![
        ModelRun {
            model: "simple_cnn".into(),
            global_batch: 128,
            steps: s(240),
            standalone_steps: s(80),
            // 0.05 leaves this net dead at chance level on the digits;
            // 0.02 reaches ~96% held-out within 100 steps.
            learning_rate: "0.02".into(),
            dataset: crate::datasets::DIGITS_CIFAR10.into(),
            scenarios: scenarios().into_iter().map(|s| s.name).collect(),
        },
        ModelRun {
            // No BatchNorm and no convolution: the cheapest model, where
            // exactness shows as the same held-out accuracy under every
            // policy (8×8 digits as MNIST IDX).
            model: "mlp".into(),
            global_batch: 128,
            steps: s(240),
            standalone_steps: s(80),
            learning_rate: "0.05".into(),
            dataset: crate::datasets::DIGITS_MNIST.into(),
            scenarios: vec!["two-node".into()],
        },
        ModelRun {
            model: "resnet18".into(),
            global_batch: 32,
            steps: s(50),
            standalone_steps: s(20),
            learning_rate: "0.01".into(),
            dataset: crate::datasets::DIGITS_CIFAR10.into(),
            scenarios: vec!["two-node".into()],
        },
    ]
}

/// One rank without communication on its node: the ideals' building
/// block. Alone one after another (the sequential ideal), or every rank of
/// the scenario at the same time (`together`: the concurrent ideal, under
/// the same CPU contention as a cluster run).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Standalone {
    pub model: String,
    pub node: String,
    pub speed: f64,
    pub batch: u32,
    pub samples_per_second: f64,
    #[serde(default)]
    pub together: bool,
    /// Round of the scenario's interleaved runs (concurrent ideal and best
    /// subset).
    #[serde(default)]
    pub round: u32,
    /// A measurement of the scenario's best subset (in round `round`).
    #[serde(default)]
    pub best_subset: bool,
}

/// Per-step series of a run, for plots (times relative to the first step).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Series {
    /// End of each step, seconds since the first step started.
    pub t: Vec<f64>,
    /// Step number of each step.
    #[serde(default)]
    pub step: Vec<u64>,
    /// Wall time of each step (slowest rank).
    #[serde(default)]
    pub step_seconds: Vec<f64>,
    /// Per rank, per step.
    pub batches: Vec<Vec<u32>>,
    /// Local work, optimizer update included.
    pub compute_seconds: Vec<Vec<f64>>,
    /// Exposed communication: time blocked in the all-reduce.
    #[serde(default)]
    pub allreduce_seconds: Vec<Vec<f64>>,
    #[serde(default)]
    pub optimizer_seconds: Vec<Vec<f64>>,
    /// 10-step rolling samples/s (0 until 10 steps).
    pub rolling_rate: Vec<f64>,
}

/// One cluster run.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RunResult {
    pub model: String,
    pub scenario: String,
    pub policy: String,
    pub nodes: Vec<String>,
    pub speeds: Vec<f64>,
    pub global_batch: u32,
    /// Round of the scenario's interleaved runs (0 for the first).
    #[serde(default)]
    pub round: u32,
    pub summary: RunSummary,
    /// Σ standalone samples/s of the ranks, each alone in turn.
    pub ideal: f64,
    /// samples/s over `ideal`.
    pub efficiency: f64,
    /// Σ samples/s of the ranks training alone but all at the same time:
    /// the mean of the measurements just before and just after the round
    /// (`ideal_concurrent_bracket`), else the one before it.
    #[serde(default)]
    pub ideal_concurrent: Option<f64>,
    /// The concurrent ideal measured just before and just after the
    /// round's runs, when both were; `ideal_concurrent` is then their mean.
    #[serde(default)]
    pub ideal_concurrent_bracket: Option<(f64, f64)>,
    /// samples/s over `ideal_concurrent`.
    #[serde(default)]
    pub efficiency_concurrent: Option<f64>,
    /// Against static in the same round.
    pub speedup_vs_static: Option<f64>,
    /// samples/s of the scenario's best subset alone with the whole
    /// global batch (scenarios with one).
    #[serde(default)]
    pub best_subset: Option<f64>,
    /// Parameter elements each rank's optimizer updated at the last step.
    #[serde(default)]
    pub optimizer_elements: Vec<i64>,
    pub recovery: Option<Recovery>,
    /// Throttle and restore times, seconds since the first step.
    pub throttle_window: Option<(f64, f64)>,
    /// Plan write → all ranks stepping on it, seconds, per plan change.
    pub propagation_seconds: Vec<f64>,
    /// The plans the operator wrote (its last 20), with their reasons.
    #[serde(default)]
    pub plans: Vec<PlanChange>,
    pub wall_seconds: f64,
    pub series: Series,
}

/// One plan the operator wrote for a run's job (from its
/// `status.planHistory`): why, and what it predicted.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PlanChange {
    pub generation: u64,
    pub batches: Vec<u32>,
    pub reason: String,
    pub predicted_gain_percent: f64,
    pub predicted_step_seconds: Option<f64>,
}

impl From<&heterotrain_crds::RebalanceStatus> for PlanChange {
    fn from(r: &heterotrain_crds::RebalanceStatus) -> Self {
        PlanChange {
            generation: r.generation,
            batches: r.batch_sizes.clone(),
            reason: r.reason.clone(),
            predicted_gain_percent: r.predicted_gain_percent,
            predicted_step_seconds: r.predicted_step_seconds,
        }
    }
}

/// Trainer vs PyTorch DDP, one model.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DdpRow {
    pub model: String,
    pub ours: f64,
    pub ddp: f64,
    pub ratio: f64,
}

/// Operator scale at one job count.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ScalePoint {
    pub jobs: u32,
    pub pods: u32,
    /// Reconciles while holding this many jobs, all pods Running.
    pub reconciles: u64,
    pub reconcile_p50_seconds: Option<f64>,
    pub reconcile_p99_seconds: Option<f64>,
    /// Reconciles from creating the new jobs until all their pods ran.
    #[serde(default)]
    pub burst_reconciles: u64,
    #[serde(default)]
    pub burst_p50_seconds: Option<f64>,
    #[serde(default)]
    pub burst_p99_seconds: Option<f64>,
    pub rss_mib: Option<f64>,
    /// p99 of each reconcile stage (fetch, apply, balance, status) while
    /// creating, seconds.
    #[serde(default)]
    pub burst_stage_p99_seconds: BTreeMap<String, f64>,
    /// The API server's own p99 latency while creating, per request kind
    /// (`POST pods`, `PATCH heterotrainingjobs/status`, …) with at least
    /// 50 requests: where reconciles wait.
    #[serde(default)]
    pub burst_api_p99_seconds: BTreeMap<String, (u64, f64)>,
    /// Seconds from creating the jobs until every pod ran and the operator
    /// reported every job Running.
    pub seconds_to_running: f64,
}

impl ScalePoint {
    /// Reconcile latency quantiles in milliseconds: p50 and p99 holding the
    /// jobs, then p50 and p99 while creating them.
    /// The `n` request kinds with the highest API server p99 while
    /// creating, slowest first: (kind, (requests, p99 seconds)).
    pub fn slowest_api(&self, n: usize) -> Vec<(&String, &(u64, f64))> {
        let mut v: Vec<_> = self.burst_api_p99_seconds.iter().collect();
        v.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        v.truncate(n);
        v
    }

    pub fn latencies_ms(&self) -> [Option<f64>; 4] {
        [
            self.reconcile_p50_seconds,
            self.reconcile_p99_seconds,
            self.burst_p50_seconds,
            self.burst_p99_seconds,
        ]
        .map(|v| v.map(|s| s * 1000.0))
    }
}

/// A target from the issue and whether this run met it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TargetCheck {
    pub target: String,
    pub measured: String,
    pub met: Option<bool>,
}

/// Everything the bench measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Results {
    pub started: String,
    pub machine: String,
    pub settings: serde_json::Value,
    pub standalone: Vec<Standalone>,
    pub runs: Vec<RunResult>,
    /// Paired ratios of the interleaved runs, per model and scenario.
    #[serde(default)]
    pub paired: Vec<Paired>,
    pub propagation_p50_seconds: Option<f64>,
    pub propagation_max_seconds: Option<f64>,
    pub propagation_samples: usize,
    pub ddp: Vec<DdpRow>,
    pub scale: Vec<ScalePoint>,
    pub targets: Vec<TargetCheck>,
    /// What failed (a run, a measurement).
    pub notes: Vec<String>,
    /// Measurements that do not fail but ask for care in reading them
    /// (a concurrent ideal above the sequential one).
    #[serde(default)]
    pub cautions: Vec<String>,
    pub total_seconds: f64,
}

/// Local batch of each rank in the split proportional to `speeds`
/// (largest remainder), the batch a rank runs alone for the ideal.
pub fn ideal_split(global: u32, speeds: &[f64]) -> Vec<u32> {
    let total: f64 = speeds.iter().sum();
    if speeds.is_empty() || total <= 0.0 {
        return Vec::new();
    }
    let exact: Vec<f64> = speeds
        .iter()
        .map(|s| f64::from(global) * s / total)
        .collect();
    let mut b: Vec<u32> = exact.iter().map(|x| (x.floor() as u32).max(1)).collect();
    let mut sum: u32 = b.iter().sum();
    let mut order: Vec<usize> = (0..speeds.len()).collect();
    order.sort_by(|&i, &j| (exact[j] - exact[j].floor()).total_cmp(&(exact[i] - exact[i].floor())));
    let mut k = 0;
    while sum < global {
        b[order[k % order.len()]] += 1;
        sum += 1;
        k += 1;
    }
    while sum > global {
        if let Some(i) = (0..b.len()).filter(|&i| b[i] > 1).max_by_key(|&i| b[i]) {
            b[i] -= 1;
            sum -= 1;
        } else {
            break;
        }
    }
    b
}

#[cfg(test)]
#[path = "tests/mod.rs"]
mod tests;
