//! What a benchmark run measured, computed from the trainers' per-rank
//! JSON-lines logs (`rank-<r>.jsonl`, one record per step) and the
//! operator's log. Pure functions, unit-tested.
//!
//! Throughput is training throughput: global batches over the wall time in
//! which some rank was inside a training step (the union of the ranks'
//! step intervals, `unix_seconds − step_seconds` to `unix_seconds`). It
//! includes the plan agreement, the all-reduce and every wait for a rank
//! that started its step late; it leaves out pauses between steps in which
//! no rank trains (evaluation, checkpoints), as a rank alone (the ideals)
//! leaves them out of its own steps. See [`ClusterStep::seconds`].

use serde::{Deserialize, Serialize};

/// One `"event":"step"` record (the fields the bench uses).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct StepRec {
    pub rank: usize,
    pub step: u64,
    pub generation: u64,
    pub batch_size: u32,
    pub global_batch_size: u32,
    #[serde(default)]
    pub global_loss: f64,
    /// Local work: data, forward, backward and the optimizer update.
    pub compute_seconds: f64,
    /// Time blocked in gradient all-reduce after backward: the exposed
    /// (not overlapped) communication.
    #[serde(default)]
    pub allreduce_seconds: f64,
    /// The optimizer update (part of `compute_seconds`).
    #[serde(default)]
    pub optimizer_seconds: f64,
    /// Parameter elements this rank's optimizer updated (its shard).
    #[serde(default)]
    pub optimizer_elements: i64,
    pub step_seconds: f64,
    pub unix_seconds: f64,
}

impl StepRec {
    /// Wall-clock time the step started (Unix seconds).
    pub fn start(&self) -> f64 {
        self.unix_seconds - self.step_seconds
    }
}

/// One `"event":"eval"` record.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct EvalRec {
    pub step: u64,
    pub eval_loss: f64,
    pub eval_accuracy: f64,
}

/// Step and eval records of one rank's log; other events and lines that
/// don't parse are skipped.
pub fn parse_rank_log(text: &str) -> (Vec<StepRec>, Vec<EvalRec>) {
    let mut steps = Vec::new();
    let mut evals = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        match v.get("event").and_then(|e| e.as_str()) {
            Some("step") => {
                if let Ok(s) = serde_json::from_value::<StepRec>(v) {
                    steps.push(s);
                }
            }
            Some("eval") => {
                if let Ok(e) = serde_json::from_value::<EvalRec>(v) {
                    evals.push(e);
                }
            }
            _ => {}
        }
    }
    // A restarted rank appends; keep the last record of each step.
    steps.sort_by_key(|s| s.step);
    steps.dedup_by(|later, earlier| {
        if later.step == earlier.step {
            std::mem::swap(later, earlier);
            true
        } else {
            false
        }
    });
    (steps, evals)
}

/// The cluster's view of one step: all ranks' records for it.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterStep {
    pub step: u64,
    /// Start (earliest over ranks), Unix seconds.
    pub start: f64,
    /// End (latest over ranks), Unix seconds.
    pub end: f64,
    /// Wall time the step added to the union of the ranks' step intervals:
    /// from the later of its first start and the end of the steps before it
    /// to its end. With every rank stepping in lockstep this is the period
    /// between consecutive ends; after a pause in which no rank trained it
    /// starts at the first rank's start. The longest rank's `step_seconds`
    /// (the measure before) counts twice a rank's late start: in its own
    /// previous step's end and in the others' waits in this step, so on 4
    /// quota-bound ranks Σ of it came out above the whole run's wall time,
    /// evaluation pauses included (52.9 against 52.4 ms a step).
    pub seconds: f64,
    /// The longest rank's `step_seconds`, the measure used before
    /// `seconds`; kept to compare.
    pub longest_rank_seconds: f64,
    pub global_batch: u32,
    pub generation: u64,
    /// Per rank, in rank order.
    pub batches: Vec<u32>,
    pub compute_seconds: Vec<f64>,
    pub allreduce_seconds: Vec<f64>,
    pub optimizer_seconds: Vec<f64>,
    pub optimizer_elements: Vec<i64>,
    pub loss: f64,
}

impl ClusterStep {
    /// Global samples per second of this step.
    pub fn rate(&self) -> f64 {
        f64::from(self.global_batch) / self.seconds.max(1e-9)
    }

    /// Coefficient of variation of the ranks' compute times (0 = balanced).
    pub fn cv(&self) -> f64 {
        cv(&self.compute_seconds)
    }
}

/// Coefficient of variation (standard deviation / mean) of `xs`.
pub fn cv(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    if mean <= 0.0 {
        return 0.0;
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    var.sqrt() / mean
}

/// Join the ranks' records by step; steps some rank lacks are dropped.
pub fn cluster_steps(ranks: &[Vec<StepRec>]) -> Vec<ClusterStep> {
    let Some(first) = ranks.first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    // The end of the union of the step intervals so far.
    let mut covered = f64::NEG_INFINITY;
    for s0 in first {
        let recs: Vec<&StepRec> = ranks
            .iter()
            .filter_map(|r| {
                r.binary_search_by_key(&s0.step, |s| s.step)
                    .ok()
                    .map(|i| &r[i])
            })
            .collect();
        if recs.len() != ranks.len() {
            continue;
        }
        let start = recs.iter().map(|r| r.start()).fold(f64::INFINITY, f64::min);
        let end = recs.iter().map(|r| r.unix_seconds).fold(0.0, f64::max);
        let seconds = (end - start.max(covered)).max(0.0);
        covered = covered.max(end);
        out.push(ClusterStep {
            step: s0.step,
            start,
            end,
            seconds,
            longest_rank_seconds: recs.iter().map(|r| r.step_seconds).fold(0.0, f64::max),
            global_batch: s0.global_batch_size,
            generation: recs.iter().map(|r| r.generation).max().unwrap_or(0),
            batches: recs.iter().map(|r| r.batch_size).collect(),
            compute_seconds: recs.iter().map(|r| r.compute_seconds).collect(),
            allreduce_seconds: recs.iter().map(|r| r.allreduce_seconds).collect(),
            optimizer_seconds: recs.iter().map(|r| r.optimizer_seconds).collect(),
            optimizer_elements: recs.iter().map(|r| r.optimizer_elements).collect(),
            loss: s0.global_loss,
        });
    }
    out
}

/// Samples per second over `steps`: total samples over total step time.
pub fn rate_over(steps: &[ClusterStep]) -> f64 {
    rate_by(steps, |s| s.seconds)
}

/// Samples per second over `steps` by the longest rank's step time.
pub fn rate_over_longest_rank(steps: &[ClusterStep]) -> f64 {
    rate_by(steps, |s| s.longest_rank_seconds)
}

/// Total samples over the total of `seconds` (0 without time).
fn rate_by(steps: &[ClusterStep], seconds: impl Fn(&ClusterStep) -> f64) -> f64 {
    let t: f64 = steps.iter().map(seconds).sum();
    let n: f64 = steps.iter().map(|s| f64::from(s.global_batch)).sum();
    if t > 0.0 {
        n / t
    } else {
        0.0
    }
}

/// Samples/s of each of several runs that trained at the same time, over
/// the steady part (last `STEADY_FRACTION`) of the window in which all of
/// them were stepping; a run with fewer than 3 steps in that window is
/// measured over its own steady state.
pub fn overlap_rates(runs: &[Vec<ClusterStep>]) -> Vec<f64> {
    let from = runs
        .iter()
        .filter_map(|r| r.first().map(|s| s.start))
        .fold(f64::NEG_INFINITY, f64::max);
    let to = runs
        .iter()
        .filter_map(|r| r.last().map(|s| s.end))
        .fold(f64::INFINITY, f64::min);
    runs.iter()
        .map(|r| {
            let inside: Vec<ClusterStep> = r
                .iter()
                .filter(|s| s.start >= from && s.end <= to)
                .cloned()
                .collect();
            let steady = tail(&inside, STEADY_FRACTION);
            if steady.len() >= 3 {
                rate_over(steady)
            } else {
                rate_over(tail(r, STEADY_FRACTION))
            }
        })
        .collect()
}

/// The steady-state part of a run: its last `fraction` of steps.
pub fn tail(steps: &[ClusterStep], fraction: f64) -> &[ClusterStep] {
    let keep = ((steps.len() as f64) * fraction.clamp(0.0, 1.0)).ceil() as usize;
    &steps[steps.len() - keep.min(steps.len())..]
}

/// Rate over the `window` steps ending at each index (None before that).
pub fn rolling_rates(steps: &[ClusterStep], window: usize) -> Vec<Option<f64>> {
    let w = window.max(1);
    (0..steps.len())
        .map(|i| (i + 1 >= w).then(|| rate_over(&steps[i + 1 - w..=i])))
        .collect()
}

/// First step whose `window`-step rolling rate reaches `target`.
pub fn first_reaching(steps: &[ClusterStep], window: usize, target: f64) -> Option<&ClusterStep> {
    rolling_rates(steps, window)
        .into_iter()
        .zip(steps)
        .find(|(r, _)| r.is_some_and(|r| r >= target))
        .map(|(_, s)| s)
}

/// Summary of one run.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RunSummary {
    pub steps: u64,
    /// Samples/s over the steady state (the last half of the steps).
    pub samples_per_second: f64,
    /// The same over the longest rank's step time each step (the measure
    /// before the union of step intervals), to compare.
    #[serde(default)]
    pub samples_per_second_longest_rank: f64,
    /// Steps until the 10-step rolling rate first reached 95% of the steady rate.
    pub steps_to_95: Option<u64>,
    /// Plan generations switched to during the run.
    pub plan_changes: u64,
    pub final_plan: Vec<u32>,
    /// Mean CV of the ranks' compute time per step over the steady state, in %.
    pub balance_cv_percent: f64,
    pub final_loss: Option<f64>,
    pub final_accuracy: Option<f64>,
}

/// Window of the rolling rate.
pub const ROLLING: usize = 10;
/// Share of the steps that counts as steady state.
pub const STEADY_FRACTION: f64 = 0.5;

/// Summarise a run from its cluster steps and rank 0's evals.
pub fn summarise(steps: &[ClusterStep], evals: &[EvalRec]) -> RunSummary {
    let steady = tail(steps, STEADY_FRACTION);
    let rate = rate_over(steady);
    let first_gen = steps.first().map(|s| s.generation).unwrap_or(0);
    let mut changes = 0;
    let mut gen = first_gen;
    for s in steps {
        if s.generation != gen {
            changes += 1;
            gen = s.generation;
        }
    }
    let cvs: Vec<f64> = steady.iter().map(|s| s.cv()).collect();
    RunSummary {
        steps: steps.len() as u64,
        samples_per_second: rate,
        samples_per_second_longest_rank: rate_over_longest_rank(steady),
        steps_to_95: first_reaching(steps, ROLLING, 0.95 * rate).map(|s| s.step),
        plan_changes: changes,
        final_plan: steps.last().map(|s| s.batches.clone()).unwrap_or_default(),
        balance_cv_percent: if cvs.is_empty() {
            0.0
        } else {
            100.0 * cvs.iter().sum::<f64>() / cvs.len() as f64
        },
        final_loss: steps.last().map(|s| s.loss).filter(|l| l.is_finite()),
        final_accuracy: evals.last().map(|e| e.eval_accuracy),
    }
}

/// The throttle scenario's phases and recovery.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Recovery {
    /// Steady rate before the throttle (second half of that phase).
    pub before_samples_per_second: f64,
    /// Steady rate while throttled (second half of that phase).
    pub throttled_samples_per_second: f64,
    /// Steady rate after the restore (second half of that phase).
    pub restored_samples_per_second: f64,
    /// The ideal while throttled (Σ standalone rates at the throttled speeds).
    pub throttled_ideal: f64,
    /// Seconds from the throttle until the rolling rate was within 5% of
    /// the throttled ideal; None if it never was.
    pub seconds_to_ideal_95: Option<f64>,
    /// Seconds from the throttle until the rolling rate reached 95% of the
    /// throttled phase's own steady rate.
    pub seconds_to_settle: Option<f64>,
    /// Plan changes while throttled.
    pub plan_changes_throttled: u64,
}

/// Split at the throttle (`t1`) and restore (`t2`) times and measure.
pub fn recovery(steps: &[ClusterStep], t1: f64, t2: f64, throttled_ideal: f64) -> Recovery {
    let before: Vec<ClusterStep> = steps.iter().filter(|s| s.end <= t1).cloned().collect();
    let during: Vec<ClusterStep> = steps
        .iter()
        .filter(|s| s.start >= t1 && s.end <= t2)
        .cloned()
        .collect();
    let after: Vec<ClusterStep> = steps.iter().filter(|s| s.start >= t2).cloned().collect();
    let throttled = rate_over(tail(&during, STEADY_FRACTION));
    let w = ROLLING.min(during.len().max(1));
    let gens: std::collections::BTreeSet<u64> = during.iter().map(|s| s.generation).collect();
    Recovery {
        before_samples_per_second: rate_over(tail(&before, STEADY_FRACTION)),
        throttled_samples_per_second: throttled,
        restored_samples_per_second: rate_over(tail(&after, STEADY_FRACTION)),
        throttled_ideal,
        seconds_to_ideal_95: first_reaching(&during, w, 0.95 * throttled_ideal).map(|s| s.end - t1),
        seconds_to_settle: first_reaching(&during, w, 0.95 * throttled).map(|s| s.end - t1),
        plan_changes_throttled: gens.len().saturating_sub(1) as u64,
    }
}

/// p-quantile (0..=1) of `xs` by nearest rank; None when empty.
pub fn quantile(xs: &[f64], p: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let idx = ((p.clamp(0.0, 1.0) * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[idx])
}

#[cfg(test)]
#[path = "tests/analysis.rs"]
mod tests;
