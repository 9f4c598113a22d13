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
    let mut sim = Sim::start(sc, cfg, seed)?;
    let interval = sc.interval.max(1);
    let mut totals = Sums::default();
    let mut window = Window::default();
    for step in 0..sc.steps {
        sim.apply_events(step)?;
        let out = sim.step();
        sim.feed(&out);
        totals.add(&out);
        window.sums.add(&out);
        if (step + 1) % interval == 0 || step + 1 == sc.steps {
            sim.report.intervals.push(window.report(step));
            sim.decide()?;
            window = Window {
                start: step + 1,
                changes_before: sim.plan_changes,
                sums: Sums::default(),
            };
        }
    }
    let samples = f64::from(sc.global_batch) * sc.steps as f64;
    sim.report.finish(
        samples,
        totals.time,
        totals.ideal,
        totals.cv / sc.steps.max(1) as f64,
        sim.plan_changes,
        sim.plan,
    );
    Ok(sim.report)
}

/// A run in progress: the simulated ranks, the balancer they feed, the
/// plan it decided last and the report so far.
struct Sim<'a> {
    sc: &'a Scenario,
    cfg: BalancerConfig,
    rng: Rng,
    ranks: Vec<Live>,
    bal: Balancer,
    /// The plan the ranks run.
    plan: Vec<u32>,
    /// Per-rank compute time of the oracle split ([`oracle_times`]).
    oracle: Vec<f64>,
    report: RunReport,
    /// Decisions that changed the plan so far.
    plan_changes: u64,
    /// Per-rank compute time of the step just simulated.
    compute: Vec<f64>,
}

/// What one simulated step took.
struct StepOutcome {
    /// The step: the slowest rank's compute plus the exchange.
    step_time: f64,
    /// The oracle split's step under the same noise.
    ideal_step: f64,
    /// Coefficient of variation of the training ranks' compute, percent.
    cv: f64,
}

/// Running sums of step time, ideal step time and CV.
#[derive(Default)]
struct Sums {
    time: f64,
    ideal: f64,
    cv: f64,
}

impl Sums {
    fn add(&mut self, out: &StepOutcome) {
        self.time += out.step_time;
        self.ideal += out.ideal_step;
        self.cv += out.cv;
    }
}

/// The decision interval in progress.
#[derive(Default)]
struct Window {
    /// Its first step.
    start: u64,
    /// Plan changes before it began.
    changes_before: u64,
    sums: Sums,
}

impl Window {
    /// Its report, closed after `step`.
    fn report(&self, step: u64) -> IntervalReport {
        let steps_in = step + 1 - self.start;
        IntervalReport {
            start_step: self.start,
            steps: steps_in,
            efficiency: self.sums.ideal / self.sums.time,
            seconds: self.sums.time,
            ideal_seconds: self.sums.ideal,
            cv_percent: self.sums.cv / steps_in as f64,
            rebalances_before: self.changes_before,
        }
    }
}

impl<'a> Sim<'a> {
    /// Profiles every rank of `sc` and takes the balancer's first plan.
    fn start(sc: &'a Scenario, cfg: BalancerConfig, seed: u64) -> Result<Self, BalancerError> {
        let mut rng = Rng::new(seed);
        let ranks: Vec<Live> = sc
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
        let plan = bal.decide(&[])?.plan.unwrap_or_default();
        let oracle = oracle_times(&ranks, &cfg)?;
        let report = RunReport::new(cfg.policy);
        let compute = Vec::with_capacity(ranks.len());
        Ok(Sim {
            sc,
            cfg,
            rng,
            ranks,
            bal,
            plan,
            oracle,
            report,
            plan_changes: 0,
            compute,
        })
    }

    /// Applies the events scripted before `step` (the oracle follows).
    fn apply_events(&mut self, step: u64) -> Result<(), BalancerError> {
        let sc = self.sc;
        let mut changed = false;
        for ev in sc.events.iter().filter(|e| e.step == step) {
            self.apply(&ev.kind)?;
            changed = true;
        }
        if changed {
            self.oracle = oracle_times(&self.ranks, &self.cfg)?;
        }
        Ok(())
    }

    fn apply(&mut self, kind: &EventKind) -> Result<(), BalancerError> {
        match kind {
            EventKind::Slowdown { rank, factor } => {
                if let Some(r) = self.ranks.get_mut(*rank) {
                    r.slowdown = if factor.is_finite() && *factor > 0.0 {
                        *factor
                    } else {
                        1.0
                    };
                }
            }
            EventKind::Join { rank } => {
                let idx = self.bal.add_rank();
                self.ranks.push(Live {
                    rank: rank.clone(),
                    slowdown: 1.0,
                });
                profile(&mut self.bal, idx, &self.ranks[idx], &mut self.rng, self.sc)?;
                self.decide()?;
            }
        }
        Ok(())
    }

    /// A balancing decision on the plan the ranks run.
    fn decide(&mut self) -> Result<(), BalancerError> {
        let d = self.bal.decide(&self.plan)?;
        if let Some(p) = d.plan {
            self.plan = p;
            self.plan_changes += 1;
        }
        self.report.last_reason = d.reason;
        Ok(())
    }

    /// Simulates one step of the plan (its per-rank compute in
    /// `self.compute`).
    fn step(&mut self) -> StepOutcome {
        let sc = self.sc;
        self.compute.clear();
        let mut slowest: f64 = 0.0;
        let mut ideal_slowest: f64 = 0.0;
        for (i, r) in self.ranks.iter().enumerate() {
            let f = noise_factor(&mut self.rng, sc.noise, sc.outlier_rate);
            let b = self.plan.get(i).copied().unwrap_or(0);
            // A left-out rank (batch 0) trains nothing this step.
            let t = if b > 0 { r.truth().predict(b) * f } else { 0.0 };
            self.compute.push(t);
            slowest = slowest.max(t);
            ideal_slowest = ideal_slowest.max(self.oracle.get(i).copied().unwrap_or(0.0) * f);
        }
        let step_time = slowest + sc.allreduce_seconds + exchange_of(&self.ranks, &self.compute);
        let ideal_step =
            ideal_slowest + sc.allreduce_seconds + exchange_of(&self.ranks, &self.oracle);
        let trained: Vec<f64> = self.compute.iter().copied().filter(|&t| t > 0.0).collect();
        let cv = balance_quality(&trained).cv_percent;
        StepOutcome {
            step_time,
            ideal_step,
            cv,
        }
    }

    /// Feeds the balancer what the operator would after the step just
    /// simulated.
    fn feed(&mut self, out: &StepOutcome) {
        let step_time = out.step_time;
        for (i, &t) in self.compute.iter().enumerate() {
            let b = self.plan.get(i).copied().unwrap_or(0);
            if b == 0 {
                continue; // left out: nothing to report
            }
            // Simulated ranks always report valid samples; ignore rejections.
            let _ = self.bal.observe_step(i, b, t);
            let _ = self.bal.observe_step_time(i, b, step_time);
            let _ = self.bal.observe_communication(i, step_time - t);
            let mem = f64::from(b) / f64::from(self.ranks[i].rank.max_batch.max(1));
            let _ = self.bal.observe_utilisation(i, t / step_time, mem);
        }
    }
}
