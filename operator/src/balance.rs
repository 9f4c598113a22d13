//! Adapter between the operator and `heterotrain-balancer`: turns a job's
//! `loadBalancing` into a balancer config, feeds it scraped [`RankMetrics`]
//! and turns its decisions into [`NewPlan`] splits. Everything balancer-specific
//! the operator touches is in this file.

use heterotrain_balancer::{Balancer, BalancerConfig, BalancerError, Policy, Quality};
use heterotrain_crds::{BatchPlan, HeteroTrainingJobSpec};

use crate::scrape::{RankLink, RankMetrics, RankProfile};
use crate::validate::ValidatedJob;

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
        cap_quota_bound_ranks: lb.cap_quota_bound_ranks,
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
    /// Wall-clock step measured over the interval that ran the current plan
    /// (seconds; 0 when not measured).
    pub measured_step_seconds: f64,
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

/// Give `b` rank `rank`'s start-up communication figures (and the
/// gradient size it exported); whether they were taken.
fn observe_link(b: &mut Balancer, rank: usize, l: &RankLink) -> bool {
    if let Some(g) = l.gradient_bytes {
        b.set_gradient_bytes(g);
    }
    b.observe_link(rank, l.latency_seconds, l.bandwidth_bytes_per_second)
        .is_ok()
}

/// Balancing state of one gang of one job.
pub struct JobBalancer {
    inner: Balancer,
    spec: HeteroTrainingJobSpec,
    policy: Policy,
    window: usize,
    profiles: Vec<Option<RankProfile>>,
    /// (plan generation, steps, compute seconds) counters at the last
    /// sample: compute per step, within one generation.
    last_counters: Vec<Option<StepCounters>>,
    /// (steps, communication seconds) counters at the last sample.
    last_communication: Vec<Option<(f64, f64)>>,
    /// (plan generation, steps, compute + communication seconds) counters
    /// at the last sample: whole step times, within one generation.
    last_step_time: Vec<Option<StepCounters>>,
    /// The generation the ranks should run after the last decision (the
    /// new plan's, else the current one's); `None` before any decision.
    expected_generation: Option<u64>,
    profile_plan_done: bool,
    /// Start-up communication figures, by rank (for the profile plan's
    /// balancer too).
    links: Vec<Option<RankLink>>,
    /// Ranks already warned about for exporting too many profile points.
    profile_warned: Vec<bool>,
}

/// A rank's plan generation, steps and seconds (compute, or compute +
/// communication).
type StepCounters = (Option<u64>, f64, f64);

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
            last_step_time: vec![None; world],
            expected_generation: None,
            profile_plan_done: false,
            links: vec![None; world],
            profile_warned: vec![false; world],
        })
    }

    /// Feed one rank's scrape. Returns whether a new step sample was taken.
    pub fn observe(&mut self, rank: usize, m: &RankMetrics) -> bool {
        if let (Some(n), Some(warned)) =
            (m.profile_points_dropped, self.profile_warned.get_mut(rank))
        {
            if !*warned {
                *warned = true;
                tracing::warn!(
                    rank,
                    points = n,
                    "rank exports {n} profile points, more than the {} the operator reads: its profile is ignored (the spec allows 16 probeBatchSizes)",
                    crate::scrape::MAX_PROFILE_POINTS
                );
            }
        }
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
        if let Some(l) = m.link {
            if observe_link(&mut self.inner, rank, &l) {
                if let Some(slot) = self.links.get_mut(rank) {
                    *slot = Some(l);
                }
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
        let counters = m
            .steps_total
            .zip(m.compute_seconds_total)
            .map(|(s, c)| (m.plan_generation, s, c));
        let prev = self.last_counters.get(rank).copied().flatten();
        // Steps of two plans between two reads (a switch in between) are
        // no sample of either: the mean would credit the new batch with
        // the old one's steps, as after a throttle, where a rank's model
        // then swung the split past the best one.
        let sample = match (prev, counters) {
            (Some((g0, s0, c0)), Some((g1, s1, c1))) if g0 == g1 && s1 > s0 && c1 > c0 => {
                Some((c1 - c0) / (s1 - s0))
            }
            (Some(_), Some(_)) => None,
            _ => m.last_step_compute_seconds.filter(|s| *s > 0.0),
        };
        if let (Some(slot), Some(c)) = (self.last_counters.get_mut(rank), counters) {
            *slot = Some(c);
        }
        self.observe_communication(rank, m);
        self.observe_step_time(rank, batch, m);
        if let Some(spread) = m.compute_spread_seconds {
            let _ = self.inner.observe_compute_spread(rank, spread);
        }
        if let Some(used) = m.cpu_quota_used {
            let _ = self.inner.observe_quota_use(rank, used);
        }
        match sample {
            Some(seconds) => self.inner.observe_step(rank, batch, seconds).is_ok(),
            None => false,
        }
    }

    fn forget_counters(&mut self, rank: usize) {
        if let Some(slot) = self.last_communication.get_mut(rank) {
            *slot = None;
        }
        for slots in [&mut self.last_counters, &mut self.last_step_time] {
            if let Some(slot) = slots.get_mut(rank) {
                *slot = None;
            }
        }
    }

    /// The whole step (compute + exposed communication) per step since the
    /// last sample, when the rank ran one plan generation all along — the
    /// one the last decision left running — so the balancer can compare
    /// measured steps between memberships.
    fn observe_step_time(&mut self, rank: usize, batch: u32, m: &RankMetrics) {
        let (Some(steps), Some(compute), Some(comm)) = (
            m.steps_total,
            m.compute_seconds_total,
            m.communication_seconds_total,
        ) else {
            return;
        };
        let expected = self.expected_generation;
        let Some(slot) = self.last_step_time.get_mut(rank) else {
            return;
        };
        let now = (m.plan_generation, steps, compute + comm);
        if let Some((g0, s0, t0)) = slot.replace(now) {
            let same = g0 == now.0 && expected.is_none_or(|e| now.0 == Some(e));
            if same && steps > s0 && now.2 > t0 {
                let _ = self
                    .inner
                    .observe_step_time(rank, batch, (now.2 - t0) / (steps - s0));
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
            for (r, l) in self.links.iter().enumerate() {
                if let Some(l) = l {
                    observe_link(&mut prior, r, l);
                }
            }
            let d = prior.decide(&current.batch_sizes)?;
            if let Some(batches) = d.plan {
                self.expected_generation = Some(current.generation.saturating_add(1));
                let reason = format!("profiles of all ranks: {}", d.reason);
                return Ok(Round {
                    plan: Some(NewPlan {
                        batch_sizes: batches,
                        reason: reason.clone(),
                        gain_percent: d.gain_percent,
                        predicted_step_seconds: d.predicted_step_seconds,
                        communication_seconds: d.communication_seconds,
                        policy: Policy::Proportional.as_str(),
                    }),
                    reason,
                    gain_percent: d.gain_percent,
                    measured_step_seconds: 0.0,
                });
            }
        }
        let d = self.inner.decide(&current.batch_sizes)?;
        self.expected_generation = Some(if d.plan.is_some() {
            current.generation.saturating_add(1)
        } else {
            current.generation
        });
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
            measured_step_seconds: d.measured_step_seconds,
        })
    }
}

#[cfg(test)]
mod tests;
