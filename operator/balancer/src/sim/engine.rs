//! The discrete-event loop: N synchronous ranks, each step lasting as long
//! as the slowest rank's compute plus a fixed all-reduce (and the largest
//! non-compute cost of a rank that takes part), with per-step noise and
//! scripted events, driven by a [`Balancer`] fed what the operator feeds
//! it: compute times, exposed communication and whole step times.

use super::report::{IntervalReport, RunReport};
use super::rng::Rng;
use super::scenario::{EventKind, Scenario, SimRank};
use crate::{
    balance_quality, continuous_split, Balancer, BalancerConfig, BalancerError, Policy, StepModel,
};

/// Multiplier of a wild outlier step.
const OUTLIER_FACTOR: f64 = 5.0;
/// Smallest noise multiplier (noise never makes a step free or negative).
const MIN_NOISE_FACTOR: f64 = 0.05;
/// Profile probe batch sizes (capped at each rank's memory cap).
const PROBES: [u32; 6] = [1, 2, 4, 8, 16, 32];
/// Repetitions of each profile probe.
const PROBE_REPS: usize = 3;

/// A simulated rank: its true model and its current slowdown.
struct Live {
    rank: SimRank,
    slowdown: f64,
}

impl Live {
    fn truth(&self) -> StepModel {
        StepModel {
            fixed_seconds: self.rank.fixed_seconds * self.slowdown,
            per_sample_seconds: self.rank.per_sample_seconds * self.slowdown,
        }
    }
}

/// The largest non-compute cost among the ranks that train (time > 0).
fn exchange_of(ranks: &[Live], times: &[f64]) -> f64 {
    ranks
        .iter()
        .zip(times)
        .filter(|(_, &t)| t > 0.0)
        .map(|(r, _)| r.rank.exchange_seconds)
        .fold(0.0, f64::max)
}

/// The oracle: per-rank compute time when every rank that trains finishes
/// together under the true models (continuous water-filling), over the
/// best membership — every rank, or without the slowest ranks other than
/// rank 0 when they only slow the step down, by their compute or by their
/// non-compute cost (their time is then 0).
fn oracle_times(ranks: &[Live], cfg: &BalancerConfig) -> Result<Vec<f64>, BalancerError> {
    let models: Vec<StepModel> = ranks.iter().map(Live::truth).collect();
    let global = cfg.global_batch_size;
    let mut lower = vec![cfg.min_local_batch; ranks.len()];
    let mut upper: Vec<u32> = ranks.iter().map(|r| r.rank.max_batch).collect();
    let times = |x: &[f64]| -> Vec<f64> {
        models
            .iter()
            .zip(x)
            .map(|(m, &b)| {
                if b > 0.0 {
                    m.fixed_seconds + m.per_sample_seconds * b
                } else {
                    0.0
                }
            })
            .collect()
    };
    let slowest = |t: &[f64]| t.iter().copied().fold(0.0, f64::max) + exchange_of(ranks, t);
    let (x, level) = continuous_split(&models, global, &lower, &upper)?;
    let mut best = times(&x);
    let smallest =
        |r: usize| models[r].predict(cfg.min_local_batch.max(1)) + ranks[r].rank.exchange_seconds;
    let mut slow: Vec<usize> = (1..ranks.len())
        .filter(|&r| smallest(r) > level || ranks[r].rank.exchange_seconds > 0.0)
        .collect();
    slow.sort_by(|&p, &q| smallest(q).total_cmp(&smallest(p)));
    for r in slow {
        (lower[r], upper[r]) = (0, 0);
        match continuous_split(&models, global, &lower, &upper) {
            Ok((y, _)) => {
                let t = times(&y);
                if slowest(&t) < slowest(&best) {
                    best = t;
                }
            }
            Err(_) => break,
        }
    }
    Ok(best)
}

fn noise_factor(rng: &mut Rng, noise: f64, outlier_rate: f64) -> f64 {
    let mut f = (1.0 + noise * rng.normal()).max(MIN_NOISE_FACTOR);
    if outlier_rate > 0.0 && rng.uniform() < outlier_rate {
        f *= OUTLIER_FACTOR;
    }
    f
}

fn profile(
    bal: &mut Balancer,
    idx: usize,
    live: &Live,
    rng: &mut Rng,
    sc: &Scenario,
) -> Result<(), BalancerError> {
    let truth = live.truth();
    let mut points = Vec::new();
    for &b in PROBES.iter().filter(|&&b| b <= live.rank.max_batch) {
        for _ in 0..PROBE_REPS {
            points.push((
                b,
                truth.predict(b) * noise_factor(rng, sc.noise, sc.outlier_rate),
            ));
        }
    }
    bal.observe_profile(idx, &points, live.rank.max_batch)?;
    bal.observe_compute_score(idx, live.rank.compute_score)?;
    Ok(())
}

/// Balancer settings the simulator uses for `policy` on `scenario`
/// (defaults otherwise).
pub fn sim_config(scenario: &Scenario, policy: Policy) -> BalancerConfig {
    BalancerConfig {
        policy,
        global_batch_size: scenario.global_batch,
        ..BalancerConfig::default()
    }
}

/// Runs `policy` on `scenario` with the default balancer settings.
pub fn run(scenario: &Scenario, policy: Policy, seed: u64) -> Result<RunReport, BalancerError> {
    run_with(scenario, sim_config(scenario, policy), seed)
}

/// Runs one policy on a scenario with explicit balancer settings.
pub fn run_with(
    scenario: &Scenario,
    cfg: BalancerConfig,
    seed: u64,
) -> Result<RunReport, BalancerError> {
    let sc = scenario;
    let mut rng = Rng::new(seed);
    let mut ranks: Vec<Live> = sc
        .ranks
        .iter()
        .cloned()
        .map(|rank| Live {
            rank,
            slowdown: 1.0,
        })
        .collect();
    let mut bal = Balancer::new(cfg.clone(), ranks.len())?;
    for (i, r) in ranks.iter().enumerate() {
        profile(&mut bal, i, r, &mut rng, sc)?;
    }
    let mut plan = bal.decide(&[])?.plan.unwrap_or_default();
    let mut oracle = oracle_times(&ranks, &cfg)?;
    let interval = sc.interval.max(1);

    let mut report = RunReport::new(cfg.policy);
    let mut plan_changes = 0u64;
    let (mut total_time, mut ideal_time, mut cv_sum) = (0.0, 0.0, 0.0);
    let (mut iv_time, mut iv_ideal, mut iv_cv, mut iv_start, mut iv_changes_before) =
        (0.0, 0.0, 0.0, 0u64, 0u64);
    let mut compute = Vec::with_capacity(ranks.len());

    for step in 0..sc.steps {
        let mut changed = false;
        for ev in sc.events.iter().filter(|e| e.step == step) {
            match &ev.kind {
                EventKind::Slowdown { rank, factor } => {
                    if let Some(r) = ranks.get_mut(*rank) {
                        r.slowdown = if factor.is_finite() && *factor > 0.0 {
                            *factor
                        } else {
                            1.0
                        };
                    }
                }
                EventKind::Join { rank } => {
                    let idx = bal.add_rank();
                    ranks.push(Live {
                        rank: rank.clone(),
                        slowdown: 1.0,
                    });
                    profile(&mut bal, idx, &ranks[idx], &mut rng, sc)?;
                    let d = bal.decide(&plan)?;
                    if let Some(p) = d.plan {
                        plan = p;
                        plan_changes += 1;
                    }
                    report.last_reason = d.reason;
                }
            }
            changed = true;
        }
        if changed {
            oracle = oracle_times(&ranks, &cfg)?;
        }

        compute.clear();
        let mut slowest: f64 = 0.0;
        let mut ideal_slowest: f64 = 0.0;
        for (i, r) in ranks.iter().enumerate() {
            let f = noise_factor(&mut rng, sc.noise, sc.outlier_rate);
            let b = plan.get(i).copied().unwrap_or(0);
            // A left-out rank (batch 0) trains nothing this step.
            let t = if b > 0 { r.truth().predict(b) * f } else { 0.0 };
            compute.push(t);
            slowest = slowest.max(t);
            ideal_slowest = ideal_slowest.max(oracle.get(i).copied().unwrap_or(0.0) * f);
        }
        let step_time = slowest + sc.allreduce_seconds + exchange_of(&ranks, &compute);
        let ideal_step = ideal_slowest + sc.allreduce_seconds + exchange_of(&ranks, &oracle);
        let trained: Vec<f64> = compute.iter().copied().filter(|&t| t > 0.0).collect();
        let cv = balance_quality(&trained).cv_percent;
        for (i, &t) in compute.iter().enumerate() {
            let b = plan.get(i).copied().unwrap_or(0);
            if b == 0 {
                continue; // left out: nothing to report
            }
            // Simulated ranks always report valid samples; ignore rejections.
            let _ = bal.observe_step(i, b, t);
            let _ = bal.observe_step_time(i, b, step_time);
            let _ = bal.observe_communication(i, step_time - t);
            let mem = f64::from(b) / f64::from(ranks[i].rank.max_batch.max(1));
            let _ = bal.observe_utilisation(i, t / step_time, mem);
        }
        total_time += step_time;
        ideal_time += ideal_step;
        cv_sum += cv;
        iv_time += step_time;
        iv_ideal += ideal_step;
        iv_cv += cv;

        if (step + 1) % interval == 0 || step + 1 == sc.steps {
            let steps_in = step + 1 - iv_start;
            report.intervals.push(IntervalReport {
                start_step: iv_start,
                steps: steps_in,
                efficiency: iv_ideal / iv_time,
                seconds: iv_time,
                ideal_seconds: iv_ideal,
                cv_percent: iv_cv / steps_in as f64,
                rebalances_before: iv_changes_before,
            });
            let d = bal.decide(&plan)?;
            if let Some(p) = d.plan {
                plan = p;
                plan_changes += 1;
            }
            report.last_reason = d.reason;
            iv_start = step + 1;
            iv_changes_before = plan_changes;
            (iv_time, iv_ideal, iv_cv) = (0.0, 0.0, 0.0);
        }
    }
    let samples = f64::from(sc.global_batch) * sc.steps as f64;
    report.finish(
        samples,
        total_time,
        ideal_time,
        cv_sum / sc.steps.max(1) as f64,
        plan_changes,
        plan,
    );
    Ok(report)
}
