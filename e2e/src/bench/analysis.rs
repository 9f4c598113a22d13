//! What a benchmark run measured, computed from the trainers' per-rank
//! JSON-lines logs (`rank-<r>.jsonl`, one record per step) and the
//! operator's log. Pure functions, unit-tested.
//!
//! Throughput is training throughput: the global batch over the step's wall
//! time (`step_seconds`, which includes the plan agreement and the
//! all-reduce but not evaluation or checkpoint pauses between steps).

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
    pub compute_seconds: f64,
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
    /// Wall time of the step (max over ranks of `step_seconds`).
    pub seconds: f64,
    pub global_batch: u32,
    pub generation: u64,
    /// Per rank, in rank order.
    pub batches: Vec<u32>,
    pub compute_seconds: Vec<f64>,
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
        out.push(ClusterStep {
            step: s0.step,
            start: recs.iter().map(|r| r.start()).fold(f64::INFINITY, f64::min),
            end: recs.iter().map(|r| r.unix_seconds).fold(0.0, f64::max),
            seconds: recs.iter().map(|r| r.step_seconds).fold(0.0, f64::max),
            global_batch: s0.global_batch_size,
            generation: recs.iter().map(|r| r.generation).max().unwrap_or(0),
            batches: recs.iter().map(|r| r.batch_size).collect(),
            compute_seconds: recs.iter().map(|r| r.compute_seconds).collect(),
            loss: s0.global_loss,
        });
    }
    out
}

/// Samples per second over `steps`: total samples over total step time.
pub fn rate_over(steps: &[ClusterStep]) -> f64 {
    let t: f64 = steps.iter().map(|s| s.seconds).sum();
    let n: f64 = steps.iter().map(|s| f64::from(s.global_batch)).sum();
    if t > 0.0 {
        n / t
    } else {
        0.0
    }
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

/// Seconds from each plan's write (operator log) to the start of the first
/// step every rank ran on it. `patches`: (generation, Unix time written).
pub fn propagation_latencies(ranks: &[Vec<StepRec>], patches: &[(u64, f64)]) -> Vec<f64> {
    let mut out = Vec::new();
    for &(gen, at) in patches {
        let starts: Vec<Option<f64>> = ranks
            .iter()
            .map(|r| r.iter().find(|s| s.generation >= gen).map(|s| s.start()))
            .collect();
        if ranks.is_empty() || starts.iter().any(|s| s.is_none()) {
            continue;
        }
        let last = starts.into_iter().flatten().fold(0.0, f64::max);
        if last >= at {
            out.push(last - at);
        }
    }
    out
}

/// Plan writes for `job` in the operator's log: (generation, Unix time).
/// Lines look like `2026-11-22T23:40:01.123456Z  INFO …: plan generation 3:
/// batches [..]; … job=<name>` (ANSI colour codes allowed).
pub fn plan_writes(operator_log: &str, job: &str) -> Vec<(u64, f64)> {
    let mut out = Vec::new();
    for raw in operator_log.lines() {
        let line = strip_ansi(raw);
        let names_job = line.split_whitespace().any(|w| {
            w.strip_prefix("job=")
                .map(|v| v.trim_matches('"').trim_end_matches([',', '}']) == job)
                .unwrap_or(false)
        });
        if !names_job {
            continue;
        }
        let Some(rest) = line.split("plan generation ").nth(1) else {
            continue;
        };
        let Some(gen) = rest.split(':').next().and_then(|g| g.trim().parse().ok()) else {
            continue;
        };
        let Some(t) = line.split_whitespace().next().and_then(parse_rfc3339) else {
            continue;
        };
        out.push((gen, t));
    }
    out
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `YYYY-MM-DDTHH:MM:SS(.frac)Z` → Unix seconds (UTC only).
pub fn parse_rfc3339(s: &str) -> Option<f64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':');
    let h: i64 = t.next()?.parse().ok()?;
    let mi: i64 = t.next()?.parse().ok()?;
    let sec: f64 = t.next()?.parse().ok()?;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&da) || h > 23 || mi > 59 {
        return None;
    }
    // Days from the civil date (proleptic Gregorian).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + da - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + h * 3600 + mi * 60) as f64 + sec)
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
mod tests {
    use super::*;

    fn rec(rank: usize, step: u64, gen: u64, b: u32, compute: f64, secs: f64, end: f64) -> StepRec {
        StepRec {
            rank,
            step,
            generation: gen,
            batch_size: b,
            global_batch_size: 64,
            global_loss: 1.0 / step as f64,
            compute_seconds: compute,
            step_seconds: secs,
            unix_seconds: end,
        }
    }

    /// Two ranks; the first 10 steps take 1 s (equal split, rank 1 slow),
    /// then a new plan makes steps take 0.5 s.
    fn run() -> Vec<Vec<StepRec>> {
        let mut r0 = Vec::new();
        let mut r1 = Vec::new();
        let mut t = 1000.0;
        for step in 1..=30u64 {
            let (gen, secs, b0, c0, c1) = if step <= 10 {
                (0, 1.0, 32, 0.3, 0.9)
            } else {
                (1, 0.5, 48, 0.45, 0.45)
            };
            t += secs;
            r0.push(rec(0, step, gen, b0, c0, secs, t));
            r1.push(rec(1, step, gen, 64 - b0, c1, secs, t));
        }
        vec![r0, r1]
    }

    #[test]
    fn parses_logs_skipping_noise_and_keeping_restarted_steps_once() {
        let text = concat!(
            r#"{"event":"step","rank":0,"step":1,"generation":0,"batch_size":32,"global_batch_size":64,"loss":1,"global_loss":2.0,"lr":0.1,"compute_seconds":0.1,"step_seconds":0.2,"unix_seconds":10.0}"#,
            "\nnot json\n",
            r#"{"event":"profile","x":1}"#,
            "\n",
            r#"{"event":"step","rank":0,"step":1,"generation":1,"batch_size":40,"global_batch_size":64,"global_loss":1.5,"compute_seconds":0.1,"step_seconds":0.2,"unix_seconds":20.0}"#,
            "\n",
            r#"{"event":"eval","rank":0,"step":1,"epoch":0,"eval_loss":0.5,"eval_accuracy":0.75,"eval_samples":10}"#,
        );
        let (steps, evals) = parse_rank_log(text);
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].batch_size, 40, "the later record of a step wins");
        assert_eq!(
            evals,
            vec![EvalRec {
                step: 1,
                eval_loss: 0.5,
                eval_accuracy: 0.75
            }]
        );
    }

    #[test]
    fn summary_measures_steady_rate_convergence_and_balance() {
        let steps = cluster_steps(&run());
        assert_eq!(steps.len(), 30);
        let s = summarise(&steps, &[]);
        // Steady state = steps 16..=30, 0.5 s each → 128 samples/s.
        assert!((s.samples_per_second - 128.0).abs() < 1e-9, "{s:?}");
        // Rolling 10-step rate first ≥ 0.95 × 128 when the window holds ≤ 0 slow steps
        // beyond what 121.6 allows: window rate = 640 / (k·1 + (10−k)·0.5) ≥ 121.6 → k = 0.
        assert_eq!(s.steps_to_95, Some(20));
        assert_eq!(s.plan_changes, 1);
        assert_eq!(s.final_plan, vec![48, 16]);
        assert!(s.balance_cv_percent.abs() < 1e-9);
        let early = summarise(&steps[..10], &[]);
        // CV of (0.3, 0.9): sd 0.3 / mean 0.6 = 50%.
        assert!((early.balance_cv_percent - 50.0).abs() < 1e-6);
    }

    #[test]
    fn recovery_splits_phases_and_times_the_return() {
        let steps = cluster_steps(&run());
        // "Throttle" at the end of step 5 (t = 1005), restore at t = 1012.5
        // (end of step 15). Throttled-phase steps: 6..=15.
        let r = recovery(&steps, 1005.0, 1012.5, 120.0);
        assert!((r.before_samples_per_second - 64.0).abs() < 1e-9);
        assert!((r.throttled_samples_per_second - 128.0).abs() < 1e-9);
        assert!((r.restored_samples_per_second - 128.0).abs() < 1e-9);
        // Rolling 10 over steps 6..=15 (5 × 1 s + 5 × 0.5 s): 640 / 7.5 = 85 < 114.
        assert_eq!(r.seconds_to_ideal_95, None);
        assert_eq!(r.plan_changes_throttled, 1);
        // A lower ideal is reached once the window is all fast steps... the
        // window is the whole phase here, so reached at its last step.
        let low = recovery(&steps, 1005.0, 1012.5, 80.0);
        assert_eq!(low.seconds_to_ideal_95, Some(7.5));
    }

    #[test]
    fn propagation_latency_is_write_to_first_step_of_all_ranks() {
        let mut ranks = run();
        // Rank 1 only switched one step later.
        ranks[1][10].generation = 0;
        // Step 11 starts at 1010.0 on rank 0 and step 12 at 1010.5 on rank 1.
        let l = propagation_latencies(&ranks, &[(1, 1009.8), (2, 1020.0)]);
        assert_eq!(l.len(), 1, "generation 2 was never run");
        assert!((l[0] - 0.7).abs() < 1e-9, "{l:?}");
    }

    #[test]
    fn operator_log_plan_writes() {
        let log = "2026-11-22T23:40:01.500000Z  INFO heterotrain_operator::rebalance: plan generation 3: batches [40, 24]; predicted gain 12.0%; x job=bench-a\n\
                   \x1b[2m2026-11-22T23:40:02.000000Z\x1b[0m \x1b[32m INFO\x1b[0m plan generation 4: batches [1]; job=other\n\
                   2026-11-22T23:40:03Z INFO something else job=bench-a\n";
        let w = plan_writes(log, "bench-a");
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].0, 3);
        assert!((w[0].1 - parse_rfc3339("2026-11-22T23:40:01.5Z").unwrap()).abs() < 1e-6);
        assert!(
            plan_writes(log, "bench").is_empty(),
            "a prefix is not the job"
        );
        let coloured = plan_writes(log, "other");
        assert_eq!(coloured.len(), 1);
        assert_eq!(parse_rfc3339("1970-01-02T00:00:01Z"), Some(86_401.0));
        assert_eq!(parse_rfc3339("2000-03-01T00:00:00Z"), Some(951_868_800.0));
        assert_eq!(parse_rfc3339("2000-13-01T00:00:00Z"), None);
    }

    #[test]
    fn quantiles_and_cv() {
        let xs: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&xs, 0.5), Some(50.0));
        assert_eq!(quantile(&xs, 0.99), Some(99.0));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(cv(&[1.0, 1.0]), 0.0);
    }
}
