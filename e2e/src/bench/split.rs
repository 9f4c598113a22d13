//! What the report derives from the runs beyond throughput: each rank's
//! time per step split into compute, exposed communication and the
//! optimizer update, and the paired ratios of a scenario's interleaved
//! runs (median and range over the rounds).

use serde::{Deserialize, Serialize};

use super::analysis::STEADY_FRACTION;
use super::RunResult;

/// Median and range of a few ratios.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Spread {
    /// None when `xs` holds no finite value.
    pub fn of(xs: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Spread {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }

    /// `1.23 (1.10–1.30, n=3)`.
    pub fn show(s: &Option<Spread>) -> String {
        match s {
            Some(s) if s.n > 1 => {
                format!("{:.2} ({:.2}–{:.2}, n={})", s.median, s.min, s.max, s.n)
            }
            Some(s) => format!("{:.2} (n=1)", s.median),
            None => "-".into(),
        }
    }
}

/// Paired ratios of one model and scenario: round k's dynamic run against
/// round k's static run, round k's concurrent ideal and (where measured)
/// round k's best subset.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Paired {
    pub model: String,
    pub scenario: String,
    pub rounds: u32,
    pub dynamic_vs_static: Option<Spread>,
    pub dynamic_vs_concurrent: Option<Spread>,
    pub static_vs_concurrent: Option<Spread>,
    /// Round k's dynamic run against round k's best subset (scenarios
    /// measured against one).
    #[serde(default)]
    pub dynamic_vs_best_subset: Option<Spread>,
    /// Round k's `dynamic-uncapped` run against round k's dynamic run.
    #[serde(default)]
    pub uncapped_vs_dynamic: Option<Spread>,
    /// `dynamic-uncapped` against the concurrent ideal.
    #[serde(default)]
    pub uncapped_vs_concurrent: Option<Spread>,
}

/// The paired ratios of `model` on `scenario` from `runs`.
pub fn paired(runs: &[RunResult], model: &str, scenario: &str) -> Paired {
    let of = |policy: &str| -> Vec<&RunResult> {
        runs.iter()
            .filter(|x| x.model == model && x.scenario == scenario && x.policy == policy)
            .collect()
    };
    let (dynamic, stat, uncapped) = (of("dynamic"), of("static"), of("dynamic-uncapped"));
    // Each run of `xs` over the same round's run of `base`.
    let same_round = |xs: &[&RunResult], base: &[&RunResult]| -> Vec<f64> {
        xs.iter()
            .filter_map(|d| {
                let s = base.iter().find(|s| s.round == d.round)?;
                (s.summary.samples_per_second > 0.0)
                    .then(|| d.summary.samples_per_second / s.summary.samples_per_second)
            })
            .collect()
    };
    let vs_static = same_round(&dynamic, &stat);
    let vs_conc = |xs: &[&RunResult]| -> Vec<f64> {
        xs.iter().filter_map(|x| x.efficiency_concurrent).collect()
    };
    let rounds = dynamic
        .iter()
        .chain(&stat)
        .chain(&uncapped)
        .map(|x| x.round + 1)
        .max()
        .unwrap_or(0);
    Paired {
        model: model.into(),
        scenario: scenario.into(),
        rounds,
        dynamic_vs_static: Spread::of(&vs_static),
        dynamic_vs_concurrent: Spread::of(&vs_conc(&dynamic)),
        static_vs_concurrent: Spread::of(&vs_conc(&stat)),
        uncapped_vs_dynamic: Spread::of(&same_round(&uncapped, &dynamic)),
        uncapped_vs_concurrent: Spread::of(&vs_conc(&uncapped)),
        dynamic_vs_best_subset: Spread::of(
            &dynamic
                .iter()
                .filter_map(|d| {
                    d.best_subset
                        .filter(|b| *b > 0.0)
                        .map(|b| d.summary.samples_per_second / b)
                })
                .collect::<Vec<f64>>(),
        ),
    }
}

/// One rank's mean time per step over the steady state, in ms.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankSplit {
    pub rank: usize,
    pub node: String,
    /// Local batch at the last step.
    pub batch: u32,
    /// The step's wall time (slowest rank).
    pub step_ms: f64,
    /// Data, forward and backward.
    pub compute_ms: f64,
    /// Blocked in the all-reduce: communication not hidden behind backward,
    /// and waiting there for a slower rank.
    pub comm_ms: f64,
    pub optimizer_ms: f64,
    /// The rest of the step: waiting for the others, plan agreement.
    pub other_ms: f64,
    pub optimizer_elements: i64,
}

/// Each rank's steady-state time split; empty for runs logged before the
/// step records carried the all-reduce and optimizer times.
pub fn rank_splits(x: &RunResult) -> Vec<RankSplit> {
    let s = &x.series;
    let n = s.t.len();
    let ranks = s.compute_seconds.len();
    let complete = s.step_seconds.len() == n
        && s.allreduce_seconds.len() == ranks
        && s.optimizer_seconds.len() == ranks
        && s.batches.len() == ranks
        && s.compute_seconds.iter().all(|c| c.len() == n)
        && s.allreduce_seconds.iter().all(|c| c.len() == n)
        && s.optimizer_seconds.iter().all(|c| c.len() == n);
    if n == 0 || !complete {
        return Vec::new();
    }
    let from = n - ((n as f64) * STEADY_FRACTION).ceil() as usize;
    let mean = |v: &[f64]| 1000.0 * v[from..].iter().sum::<f64>() / (n - from) as f64;
    let step_ms = mean(&s.step_seconds);
    (0..ranks)
        .map(|r| {
            let optimizer_ms = mean(&s.optimizer_seconds[r]);
            let work_ms = mean(&s.compute_seconds[r]);
            let comm_ms = mean(&s.allreduce_seconds[r]);
            RankSplit {
                rank: r,
                node: x.nodes.get(r).cloned().unwrap_or_default(),
                batch: s.batches[r].last().copied().unwrap_or(0),
                step_ms,
                compute_ms: (work_ms - optimizer_ms).max(0.0),
                comm_ms,
                optimizer_ms,
                other_ms: (step_ms - work_ms - comm_ms).max(0.0),
                optimizer_elements: x.optimizer_elements.get(r).copied().unwrap_or(0),
            }
        })
        .collect()
}

/// (step ms, slowest rank's compute ms) over the steady state: the step
/// from the steady rate, the compute as the mean over steps of the largest
/// rank's compute time. The difference is all-reduce and synchronisation.
/// None for the throttle scenario, whose rate spans its phases.
pub fn step_split(x: &RunResult) -> Option<(f64, f64)> {
    if x.recovery.is_some() || x.summary.samples_per_second <= 0.0 {
        return None;
    }
    let n = x.series.t.len();
    let from = n - ((n as f64) * STEADY_FRACTION).ceil() as usize;
    let maxes: Vec<f64> = (from..n)
        .map(|i| {
            x.series
                .compute_seconds
                .iter()
                .filter_map(|c| c.get(i).copied())
                .fold(0.0, f64::max)
        })
        .collect();
    if maxes.is_empty() {
        return None;
    }
    let compute = maxes.iter().sum::<f64>() / maxes.len() as f64;
    let step = f64::from(x.global_batch) / x.summary.samples_per_second;
    Some((step * 1000.0, compute * 1000.0))
}

#[cfg(test)]
#[path = "tests/split.rs"]
mod tests;
