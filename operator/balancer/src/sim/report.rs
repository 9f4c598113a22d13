//! What a simulation run reports, as JSON (for machines) and as a table
//! (for people).

use std::fmt::Write as _;

use serde::Serialize;

use crate::{Policy, QualityClass};

/// Efficiency an interval must reach to count as "at ideal".
pub const NEAR_IDEAL: f64 = 0.95;

/// One rebalance interval of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IntervalReport {
    /// First step of the interval.
    pub start_step: u64,
    /// Steps in it.
    pub steps: u64,
    /// Ideal time / actual time over the interval.
    pub efficiency: f64,
    /// Simulated seconds the interval took.
    pub seconds: f64,
    /// Seconds the oracle split would have taken.
    pub ideal_seconds: f64,
    /// Mean per-step CV of compute time, percent.
    pub cv_percent: f64,
    /// Plan changes made before the interval started.
    pub rebalances_before: u64,
}

/// Result of running one policy on one scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunReport {
    /// The policy.
    pub policy: Policy,
    /// Samples per second achieved.
    pub throughput: f64,
    /// Samples per second of the oracle (true models, every rank finishing
    /// together, same noise).
    pub ideal_throughput: f64,
    /// `throughput / ideal_throughput`.
    pub efficiency: f64,
    /// Efficiency over the second half of the run (steady state, after
    /// the policy had time to converge).
    pub steady_efficiency: f64,
    /// Start step of the first interval at ≥ 95% of ideal (`None`: never).
    pub steps_to_95: Option<u64>,
    /// Plan changes made before that interval.
    pub rebalances_to_95: Option<u64>,
    /// Plan changes over the run (the initial plan not counted).
    pub plan_changes: u64,
    /// Mean per-step CV of per-rank compute time, percent.
    pub cv_percent: f64,
    /// Class of that CV.
    pub quality: QualityClass,
    /// The plan at the end (omitted from JSON for more than 64 ranks).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub final_plan: Vec<u32>,
    /// Reason of the last decision.
    pub last_reason: String,
    /// Per-interval figures.
    pub intervals: Vec<IntervalReport>,
}

impl RunReport {
    pub(crate) fn new(policy: Policy) -> Self {
        RunReport {
            policy,
            throughput: 0.0,
            ideal_throughput: 0.0,
            efficiency: 0.0,
            steady_efficiency: 0.0,
            steps_to_95: None,
            rebalances_to_95: None,
            plan_changes: 0,
            cv_percent: 0.0,
            quality: QualityClass::Excellent,
            final_plan: Vec::new(),
            last_reason: String::new(),
            intervals: Vec::new(),
        }
    }

    pub(crate) fn finish(
        &mut self,
        samples: f64,
        time: f64,
        ideal_time: f64,
        cv: f64,
        changes: u64,
        plan: Vec<u32>,
    ) {
        self.throughput = if time > 0.0 { samples / time } else { 0.0 };
        self.ideal_throughput = if ideal_time > 0.0 {
            samples / ideal_time
        } else {
            0.0
        };
        self.efficiency = if time > 0.0 { ideal_time / time } else { 0.0 };
        let half = self
            .intervals
            .last()
            .map_or(0, |i| (i.start_step + i.steps) / 2);
        let (ideal, actual) = self
            .intervals
            .iter()
            .filter(|i| i.start_step >= half)
            .fold((0.0, 0.0), |(a, b), i| (a + i.ideal_seconds, b + i.seconds));
        self.steady_efficiency = if actual > 0.0 { ideal / actual } else { 0.0 };
        let first = self.intervals.iter().find(|i| i.efficiency >= NEAR_IDEAL);
        self.steps_to_95 = first.map(|i| i.start_step);
        self.rebalances_to_95 = first.map(|i| i.rebalances_before);
        self.plan_changes = changes;
        self.cv_percent = cv;
        self.quality = QualityClass::from_cv_percent(cv);
        self.final_plan = if plan.len() <= 64 { plan } else { Vec::new() };
    }

    /// Plan changes during intervals `from..to` (by interval index).
    pub fn changes_between(&self, from: usize, to: usize) -> u64 {
        let at = |i: usize| {
            self.intervals
                .get(i)
                .map_or(self.plan_changes, |iv| iv.rebalances_before)
        };
        at(to).saturating_sub(at(from))
    }
}

/// All policies on one scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScenarioReport {
    /// The scenario (settings after command-line overrides).
    pub scenario: super::Scenario,
    /// Ranks at the start.
    pub world_size: usize,
    /// Noise seed.
    pub seed: u64,
    /// One entry per policy run.
    pub runs: Vec<RunReport>,
}

impl ScenarioReport {
    /// A fixed-width table for people.
    pub fn table(&self) -> String {
        let s = &self.scenario;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "scenario {}: {} ({} ranks, B={}, {} steps, interval {}, noise {:.0}%, all-reduce {:.3}s, seed {})",
            s.name,
            s.description,
            self.world_size,
            s.global_batch,
            s.steps,
            s.interval,
            s.noise * 100.0,
            s.allreduce_seconds,
            self.seed
        );
        let _ = writeln!(
            out,
            "{:<13} {:>12} {:>12} {:>10} {:>8} {:>10} {:>10} {:>8} {:>8}  quality",
            "policy",
            "samples/s",
            "ideal",
            "efficiency",
            "steady",
            "steps→95%",
            "rebal→95%",
            "changes",
            "CV%"
        );
        for r in &self.runs {
            let opt = |v: Option<u64>| v.map_or("never".to_string(), |x| x.to_string());
            let _ = writeln!(
                out,
                "{:<13} {:>12.1} {:>12.1} {:>9.1}% {:>7.1}% {:>10} {:>10} {:>8} {:>8.1}  {}",
                r.policy.to_string(),
                r.throughput,
                r.ideal_throughput,
                r.efficiency * 100.0,
                r.steady_efficiency * 100.0,
                opt(r.steps_to_95),
                opt(r.rebalances_to_95),
                r.plan_changes,
                r.cv_percent,
                r.quality
            );
        }
        // Who ends up left out, when some policy leaves a rank out.
        if self.runs.iter().any(|r| r.final_plan.contains(&0)) {
            for r in &self.runs {
                let left: Vec<String> = (0..r.final_plan.len())
                    .filter(|&i| r.final_plan[i] == 0)
                    .map(|i| i.to_string())
                    .collect();
                let _ = writeln!(
                    out,
                    "{:<13} final plan {:?}, left out: {}",
                    r.policy.to_string(),
                    r.final_plan,
                    if left.is_empty() {
                        "none".to_string()
                    } else {
                        left.join(", ")
                    }
                );
            }
        }
        out
    }
}
