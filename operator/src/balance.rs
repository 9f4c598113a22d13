//! Adapter between the operator and `heterotrain-balancer`: turns a job's
//! `loadBalancing` into a balancer config, feeds it scraped [`RankMetrics`]
//! and turns its decisions into [`NewPlan`] splits. Everything balancer-specific
//! the operator touches is in this file.

use heterotrain_balancer::{Balancer, BalancerConfig, BalancerError, Policy, Quality};
use heterotrain_crds::{BalancePolicy, BatchPlan, HeteroTrainingJobSpec};

use crate::scrape::{RankMetrics, RankProfile};
use crate::validate::ValidatedJob;

/// The balancer policy for a job's policy.
pub fn policy_of(p: BalancePolicy) -> Policy {
    match p {
        BalancePolicy::Static => Policy::Static,
        BalancePolicy::Proportional => Policy::Proportional,
        BalancePolicy::Dynamic => Policy::Dynamic,
        BalancePolicy::Hybrid => Policy::Hybrid,
        BalancePolicy::SeedFormula => Policy::SeedFormula,
    }
}

/// Balancer config from the job spec (`window`: live samples kept per rank).
pub fn config_of(spec: &HeteroTrainingJobSpec, policy: Policy, window: usize) -> BalancerConfig {
    let lb = &spec.load_balancing;
    BalancerConfig {
        policy,
        global_batch_size: spec.training.global_batch_size,
        min_local_batch: spec.effective_min_local_batch(),
        max_local_batch: lb.max_local_batch,
        min_gain_percent: lb.min_gain_percent.min(100),
        straggler_factor: (f64::from(lb.straggler_threshold_percent) / 100.0).max(1.01),
        window: window.max(1),
        leave_out_slow_ranks: lb.leave_out_slow_ranks,
        leave_out_margin_percent: lb.leave_out_margin_percent.min(100),
        readmit_after_decisions: lb.readmit_after_decisions.max(1),
        ..BalancerConfig::default()
    }
}

/// A split the balancer wants written (`crate::plan::advance` makes it the
/// next generation).
#[derive(Clone, Debug, PartialEq)]
pub struct NewPlan {
    pub batch_sizes: Vec<u32>,
    pub reason: String,
    pub gain_percent: f64,
    pub predicted_step_seconds: f64,
    /// Measured communication per step no split removes (0: unknown).
    pub communication_seconds: f64,
    pub policy: &'static str,
}

/// Outcome of one decision round.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    /// A new plan, or `None` to keep the current one.
    pub plan: Option<NewPlan>,
    /// Why (also when keeping).
    pub reason: String,
    pub gain_percent: f64,
}

/// A split from start-up profiles alone (proportional policy), e.g. for
/// generation 0 from cached profiles. `None` when some rank has none or no
/// feasible split exists.
pub fn split_from_profiles(
    spec: &HeteroTrainingJobSpec,
    profiles: &[Option<RankProfile>],
) -> Option<(Vec<u32>, String)> {
    let world = spec.world_size() as usize;
    if profiles.len() != world || profiles.iter().any(Option::is_none) {
        return None;
    }
    let mut b = Balancer::new(config_of(spec, Policy::Proportional, 8), world).ok()?;
    for (r, p) in profiles.iter().enumerate() {
        let p = p.as_ref()?;
        b.observe_profile(r, &p.points, p.max_batch).ok()?;
    }
    let d = b.decide(&[]).ok()?;
    Some((
        d.plan?,
        "proportional split of the ranks' hardware profiles".into(),
    ))
}

/// Balancing state of one gang of one job.
pub struct JobBalancer {
    inner: Balancer,
    spec: HeteroTrainingJobSpec,
    policy: Policy,
    window: usize,
    profiles: Vec<Option<RankProfile>>,
    last_counters: Vec<Option<(f64, f64)>>,
    /// (steps, communication seconds) counters at the last sample.
    last_communication: Vec<Option<(f64, f64)>>,
    profile_plan_done: bool,
}

impl JobBalancer {
    /// A balancer for the job's policy and world size.
    pub fn new(v: &ValidatedJob, window: usize) -> Result<JobBalancer, BalancerError> {
        let world = v.ranks();
        Ok(JobBalancer {
            inner: Balancer::new(config_of(v.spec(), v.policy, window), world)?,
            spec: v.spec().clone(),
            policy: v.policy,
            window,
            profiles: vec![None; world],
            last_counters: vec![None; world],
            last_communication: vec![None; world],
            profile_plan_done: false,
        })
    }

    /// Feed one rank's scrape. Returns whether a new step sample was taken.
    pub fn observe(&mut self, rank: usize, m: &RankMetrics) -> bool {
        if let Some(p) = &m.profile {
            if self.profiles.get(rank).is_some_and(Option::is_none)
                && self
                    .inner
                    .observe_profile(rank, &p.points, p.max_batch)
                    .is_ok()
            {
                self.profiles[rank] = Some(p.clone());
            }
        }
        let Some(batch) = m.local_batch.filter(|b| *b > 0) else {
            if m.local_batch == Some(0) {
                // Left out: no samples, but it answers. Its counters restart
                // when it is re-admitted, so the idle time never counts.
                let _ = self.inner.observe_idle(rank);
                self.forget_counters(rank);
            }
            return false;
        };
        let counters = m.steps_total.zip(m.compute_seconds_total);
        let prev = self.last_counters.get(rank).copied().flatten();
        let sample = match (prev, counters) {
            (Some((s0, c0)), Some((s1, c1))) if s1 > s0 && c1 > c0 => Some((c1 - c0) / (s1 - s0)),
            (Some(_), Some(_)) => None,
            _ => m.last_step_compute_seconds.filter(|s| *s > 0.0),
        };
        if let (Some(slot), Some(c)) = (self.last_counters.get_mut(rank), counters) {
            *slot = Some(c);
        }
        self.observe_communication(rank, m);
        match sample {
            Some(seconds) => self.inner.observe_step(rank, batch, seconds).is_ok(),
            None => false,
        }
    }

    fn forget_counters(&mut self, rank: usize) {
        for slots in [&mut self.last_counters, &mut self.last_communication] {
            if let Some(slot) = slots.get_mut(rank) {
                *slot = None;
            }
        }
    }

    /// Exposed communication per step since the last sample, from the
    /// rank's step and communication counters.
    fn observe_communication(&mut self, rank: usize, m: &RankMetrics) {
        let Some(now) = m.steps_total.zip(m.communication_seconds_total) else {
            return;
        };
        let Some(slot) = self.last_communication.get_mut(rank) else {
            return;
        };
        if let Some((s0, c0)) = slot.replace(now) {
            let (s1, c1) = now;
            if s1 > s0 && c1 >= c0 {
                let _ = self
                    .inner
                    .observe_communication(rank, (c1 - c0) / (s1 - s0));
            }
        }
    }

    /// Communication per step no split removes, as measured so far.
    pub fn communication_seconds(&self) -> f64 {
        self.inner.communication_seconds()
    }

    /// The caller could not read `rank` this round.
    pub fn missing(&mut self, rank: usize) {
        let _ = self.inner.observe_missing(rank);
    }

    /// Whether every rank reported its profile.
    pub fn all_profiled(&self) -> bool {
        self.profiles.iter().all(Option::is_some)
    }

    /// Profiles reported so far, by rank.
    pub fn profiles(&self) -> &[Option<RankProfile>] {
        &self.profiles
    }

    /// Balance quality of the latest per-rank compute times.
    pub fn quality(&self) -> Quality {
        self.inner.quality()
    }

    /// Decide against the `current` plan. Profiles first: once every rank
    /// reported one, a profile-based split is offered before live data counts.
    pub fn decide(&mut self, current: &BatchPlan) -> Result<Round, BalancerError> {
        let policy = self.policy;
        if policy != Policy::Static && !self.profile_plan_done && self.all_profiled() {
            self.profile_plan_done = true;
            let mut prior = Balancer::new(
                config_of(&self.spec, Policy::Proportional, self.window),
                self.profiles.len(),
            )?;
            for (r, p) in self.profiles.iter().enumerate() {
                if let Some(p) = p {
                    prior.observe_profile(r, &p.points, p.max_batch)?;
                }
            }
            let d = prior.decide(&current.batch_sizes)?;
            if let Some(batches) = d.plan {
                let reason = format!("profiles of all ranks: {}", d.reason);
                return Ok(Round {
                    plan: Some(NewPlan {
                        batch_sizes: batches,
                        reason: reason.clone(),
                        gain_percent: d.gain_percent,
                        predicted_step_seconds: d.predicted_step_seconds,
                        communication_seconds: self.inner.communication_seconds(),
                        policy: Policy::Proportional.as_str(),
                    }),
                    reason,
                    gain_percent: d.gain_percent,
                });
            }
        }
        let d = self.inner.decide(&current.batch_sizes)?;
        Ok(Round {
            plan: d.plan.map(|batches| NewPlan {
                batch_sizes: batches,
                reason: d.reason.clone(),
                gain_percent: d.gain_percent,
                predicted_step_seconds: d.predicted_step_seconds,
                communication_seconds: d.communication_seconds,
                policy: policy.as_str(),
            }),
            reason: d.reason,
            gain_percent: d.gain_percent,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use heterotrain_crds::HeteroTrainingJob;

    fn spec(batch_norm: &str) -> HeteroTrainingJobSpec {
        let yaml = format!(
            r#"
apiVersion: heterotrain.dev/v1alpha1
kind: HeteroTrainingJob
metadata: {{name: job, namespace: ns}}
spec:
  workers: [{{name: cpu, replicas: 2}}]
  model: {{name: resnet18}}
  dataset: {{name: synthetic_image}}
  training: {{globalBatchSize: 32, maxSteps: 5, batchNorm: {batch_norm}}}
"#
        );
        let job: HeteroTrainingJob = serde_yaml::from_str(&yaml).expect("job");
        job.spec
    }

    /// Rank 1 is 200× slower: with every rank in, the best split gives it
    /// one sample, which per-rank BatchNorm cannot use; the balancer is
    /// floored at 2 then. (Left to itself, it leaves rank 1 out.)
    fn decide_with_a_very_slow_rank(batch_norm: &str, leave_out: bool) -> Vec<u32> {
        let mut s = spec(batch_norm);
        s.load_balancing.leave_out_slow_ranks = leave_out;
        let mut b = Balancer::new(config_of(&s, Policy::Dynamic, 8), 2).expect("balancer");
        for batch in [8u32, 16, 24, 8, 16, 24] {
            let n = f64::from(batch);
            b.observe_step(0, batch, 0.001 * n).expect("observe");
            b.observe_step(1, batch, 0.2 * n).expect("observe");
        }
        b.decide(&[16, 16])
            .expect("decide")
            .plan
            .expect("a new plan")
    }

    #[test]
    fn local_batch_norm_floors_the_split_at_two() {
        assert_eq!(spec("local").effective_min_local_batch(), 2);
        assert_eq!(spec("sync").effective_min_local_batch(), 1);
        let synced = decide_with_a_very_slow_rank("sync", false);
        assert_eq!(synced, vec![31, 1], "sync may give a rank one sample");
        let local = decide_with_a_very_slow_rank("local", false);
        assert_eq!(local, vec![30, 2], "local BatchNorm keeps 2 per rank");
        // One sample at 0.2 s is 6× rank 0's whole step: rank 1 is left out.
        for bn in ["sync", "local"] {
            assert_eq!(decide_with_a_very_slow_rank(bn, true), vec![32, 0], "{bn}");
        }
    }

    #[test]
    fn config_maps_the_leave_out_settings() {
        let c = config_of(&spec("sync"), Policy::Dynamic, 8);
        assert!(c.leave_out_slow_ranks);
        assert_eq!(c.leave_out_margin_percent, 10);
        assert_eq!(c.readmit_after_decisions, 20);
        let mut s = spec("sync");
        s.load_balancing.leave_out_slow_ranks = false;
        s.load_balancing.leave_out_margin_percent = 25;
        s.load_balancing.readmit_after_decisions = 7;
        let c = config_of(&s, Policy::Hybrid, 8);
        assert!(!c.leave_out_slow_ranks);
        assert_eq!(c.leave_out_margin_percent, 25);
        assert_eq!(c.readmit_after_decisions, 7);
        // Out of the schema's range (objects it never saw): still usable.
        s.load_balancing.leave_out_margin_percent = 1000;
        s.load_balancing.readmit_after_decisions = 0;
        let c = config_of(&s, Policy::Hybrid, 8);
        assert!(c.validate().is_ok(), "{c:?}");
    }

    /// A left-out rank reports local batch 0: no sample, and its counters
    /// restart, so the first sample after re-admission does not average in
    /// the time it sat idle.
    #[test]
    fn a_left_out_rank_gives_no_sample_and_its_counters_restart() {
        let job = crate::testing::fixture("mixed.yaml");
        let v = crate::testing::valid(&job);
        let mut jb = JobBalancer::new(&v, 8).expect("balancer");
        let metrics = |batch: u32, steps: f64, compute: f64| RankMetrics {
            steps_total: Some(steps),
            compute_seconds_total: Some(compute),
            local_batch: Some(batch),
            ..RankMetrics::default()
        };
        assert!(
            !jb.observe(1, &metrics(8, 10.0, 1.0)),
            "first read: baseline"
        );
        assert!(jb.observe(1, &metrics(8, 20.0, 2.0)));
        assert!(!jb.observe(1, &metrics(0, 30.0, 2.0)), "left out");
        // Back in: the counters moved on, but the baseline is gone.
        assert!(!jb.observe(1, &metrics(8, 40.0, 3.0)));
        assert!(jb.observe(1, &metrics(8, 50.0, 4.0)));
    }

    /// The operator turns the ranks' step and communication counters into
    /// per-step communication; the least of the ranks' is what no split
    /// removes.
    #[test]
    fn communication_per_step_comes_from_the_counters() {
        let job = crate::testing::fixture("mixed.yaml");
        let v = crate::testing::valid(&job);
        let world = v.ranks();
        let mut jb = JobBalancer::new(&v, 8).expect("balancer");
        let metrics = |steps: f64, compute: f64, comm: f64| RankMetrics {
            steps_total: Some(steps),
            compute_seconds_total: Some(compute),
            communication_seconds_total: Some(comm),
            local_batch: Some(8),
            ..RankMetrics::default()
        };
        assert_eq!(jb.communication_seconds(), 0.0);
        for r in 0..world {
            jb.observe(r, &metrics(10.0, 1.0, 1.0));
        }
        // 10 more steps: rank 0 waited 0.5 s (0.05 per step), the others 2 s.
        for r in 0..world {
            let comm = if r == 0 { 1.5 } else { 3.0 };
            jb.observe(r, &metrics(20.0, 2.0 + r as f64, comm));
        }
        assert!((jb.communication_seconds() - 0.05).abs() < 1e-12);
        // Counters that went backwards (a restarted rank) are not a sample.
        jb.observe(0, &metrics(5.0, 0.5, 0.1));
        assert!((jb.communication_seconds() - 0.05).abs() < 1e-12);
    }
}
