//! The balancing loop of one running job: every scrape interval read each
//! rank's metrics, feed the balancer; once the job has trained
//! `loadBalancing.rebalanceIntervalSteps` steps since the last decision and
//! at least `--rebalance-interval` has passed ([`decision_due`]) decide, and
//! when a new plan comes out write generation+1, emit `Rebalanced` and
//! record the decision and balance quality for status.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use heterotrain_crds::{
    BalanceStatus, BatchPlan, HeteroTrainingJob, MetricsSource, RebalanceStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tracing::{info, warn};

use crate::balance::JobBalancer;
use crate::conditions::{reasons, types, Desired};
use crate::config::MetricsSourceMode;
use crate::controller::Context;
use crate::error::{Error, Result};
use crate::fetch::Observed;
use crate::lifecycle::EventSpec;
use crate::metrics::PolicyLabel;
use crate::scrape::RankMetrics;
use crate::status::Extras;
use crate::{apply, profile_cache};

/// Balancing state of one job's current gang.
pub struct JobState {
    uid: String,
    gang: u32,
    balancer: JobBalancer,
    last_scrape: Option<Instant>,
    last_decision: DecisionClock,
    last_samples: Vec<Option<(f64, Instant)>>,
    /// Plan written and not yet reported by every rank: (generation, when).
    pending: Option<(u64, Instant)>,
    cached: Vec<bool>,
    extras: Extras,
}

impl JobState {
    /// Last measured figures, over `base` (whose plan wins).
    pub fn carry(&self, base: Extras) -> Extras {
        Extras {
            plan: base.plan.or_else(|| self.extras.plan.clone()),
            ..self.extras.clone()
        }
    }
}

fn state_key(job: &HeteroTrainingJob) -> String {
    format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any())
}

/// One balancing round for a job whose ranks all run. Never fails: problems
/// are logged and counted, and the figures from before are kept.
pub async fn round(ctx: &Context, job: &HeteroTrainingJob, obs: &Observed, base: Extras) -> Extras {
    let key = state_key(job);
    let uid = job.uid().unwrap_or_default();
    let gang = job.status.as_ref().map_or(0, |s| s.restarts);
    let taken = ctx.jobs.lock().ok().and_then(|mut j| j.remove(&key));
    let mut state = match taken {
        Some(s) if s.uid == uid && s.gang == gang => s,
        _ => match JobBalancer::new(&job.spec, ctx.config.balancer_window) {
            Ok(balancer) => {
                let world = job.spec.world_size() as usize;
                JobState {
                    uid,
                    gang,
                    balancer,
                    last_scrape: None,
                    // The first decision waits one interval for live data.
                    last_decision: DecisionClock::new(Instant::now()),
                    last_samples: vec![None; world],
                    pending: None,
                    cached: vec![false; world],
                    extras: Extras::default(),
                }
            }
            Err(e) => {
                warn!(error = %e, "balancer refused the job's settings");
                ctx.metrics.error("balancer");
                return base;
            }
        },
    };
    let out = step(ctx, job, obs, base, &mut state).await;
    state.extras = out.clone();
    if let Ok(mut j) = ctx.jobs.lock() {
        j.insert(key, state);
    }
    out
}

async fn read_metrics(
    ctx: &Context,
    job: &HeteroTrainingJob,
    obs: &Observed,
) -> Vec<Result<RankMetrics>> {
    let spec = &job.spec;
    let world = spec.world_size() as usize;
    let gang = job.status.as_ref().map_or(0, |s| s.restarts);
    let use_prometheus = match ctx.config.metrics_source {
        MetricsSourceMode::Job => spec.load_balancing.metrics_source == MetricsSource::Prometheus,
        MetricsSourceMode::Pods => false,
        MetricsSourceMode::Prometheus => true,
    };
    if use_prometheus {
        let url = spec
            .load_balancing
            .prometheus_url
            .clone()
            .or_else(|| ctx.config.prometheus_url.clone());
        let Some(url) = url else {
            return (0..world)
                .map(|_| Err(Error::Invalid("no Prometheus URL".into())))
                .collect();
        };
        let ns = job.namespace().unwrap_or_default();
        return match ctx
            .scraper
            .query_prometheus(&url, &ns, &job.name_any(), world)
            .await
        {
            Ok(v) => v,
            Err(e) => {
                let msg = e.to_string();
                (0..world)
                    .map(|_| {
                        Err(Error::Scrape {
                            target: url.clone(),
                            message: msg.clone(),
                        })
                    })
                    .collect()
            }
        };
    }
    let targets: Vec<Option<String>> = (0..world as u32)
        .map(|r| {
            obs.pods
                .iter()
                .find(|p| p.rank == Some(r) && p.restart == Some(gang) && !p.deleting)
                .and_then(|p| p.pod_ip.clone())
        })
        .collect();
    ctx.scraper.scrape_pods(&targets, spec.metrics_port).await
}

async fn step(
    ctx: &Context,
    job: &HeteroTrainingJob,
    obs: &Observed,
    base: Extras,
    st: &mut JobState,
) -> Extras {
    let mut x = st.carry(base);
    let cfg = &ctx.config;
    let due = st
        .last_scrape
        .is_none_or(|t| t.elapsed() >= cfg.scrape_interval.mul_f64(0.8));
    if !due {
        return x;
    }
    st.last_scrape = Some(Instant::now());
    let spec = &job.spec;
    let world = spec.world_size() as usize;
    let results = read_metrics(ctx, job, obs).await;
    let mut sps: Vec<Option<f64>> = vec![None; world];
    let mut gens: Vec<Option<u64>> = vec![None; world];
    let mut new_profiles = BTreeMap::new();
    let mut sampled = 0usize;
    // The job's step: the ranks' `heterotrain_step` (the global step, the
    // same on every rank; the highest one read wins when some lag a scrape).
    let mut job_step: Option<u64> = None;
    for (r, res) in results.iter().enumerate().take(world) {
        match res {
            Ok(m) => {
                job_step = job_step.max(m.step);
                let had_profile = st.balancer.profiles().get(r).is_some_and(Option::is_some);
                sampled += usize::from(st.balancer.observe(r, m));
                gens[r] = m.plan_generation;
                if r == 0 {
                    x.step = m.step.or(x.step);
                    x.epoch = m.epoch.or(x.epoch);
                }
                if let Some(total) = m.samples_total {
                    if let Some((prev, t)) = st.last_samples[r] {
                        let dt = t.elapsed().as_secs_f64();
                        if total >= prev && dt > 0.0 {
                            sps[r] = Some((total - prev) / dt);
                        }
                    }
                    st.last_samples[r] = Some((total, Instant::now()));
                }
                if !had_profile && cfg.profile_cache && !st.cached[r] {
                    if let Some(p) = st.balancer.profiles().get(r).cloned().flatten() {
                        new_profiles.insert(r, p);
                    }
                }
            }
            Err(e) => {
                ctx.metrics.scrape_failures.inc();
                tracing::debug!(rank = r, error = %e, "metrics not read");
                st.balancer.missing(r);
            }
        }
    }
    if sps.iter().any(Option::is_some) {
        x.rank_samples_per_second = sps.clone();
        x.cluster_samples_per_second = Some(sps.iter().flatten().sum());
    }
    let q = st.balancer.quality();
    if sampled > 0 {
        x.balance = Some(BalanceStatus {
            cv_percent: q.cv_percent,
            class: q.class.as_str().into(),
        });
    }
    if let Some((g, t)) = st.pending {
        if gens.iter().all(|v| v.is_some_and(|v| v >= g)) {
            ctx.metrics
                .plan_propagation
                .observe(t.elapsed().as_secs_f64());
            st.pending = None;
        }
    }
    store_profiles(ctx, job, obs, st, new_profiles).await;

    x.conditions.clear();
    if spec.profiling.enabled {
        let n = st
            .balancer
            .profiles()
            .iter()
            .filter(|p| p.is_some())
            .count();
        x.conditions.push(if n == world {
            Desired::yes(
                types::PROFILED,
                reasons::PROFILES_REPORTED,
                format!("all {world} ranks reported their profile"),
            )
        } else {
            Desired::no(
                types::PROFILED,
                reasons::AWAITING_PROFILES,
                format!("{n} of {world} ranks reported their profile"),
            )
        });
    }

    let now = Instant::now();
    let interval_steps = spec.load_balancing.rebalance_interval_steps;
    let Some(decision_step) =
        st.last_decision
            .due(job_step, now, interval_steps, cfg.rebalance_interval)
    else {
        return x;
    };
    // A failed write keeps the previous mark, so the next scrape retries.
    let previous_decision = st.last_decision;
    st.last_decision.mark(decision_step, now);
    let current = x
        .plan
        .clone()
        .unwrap_or_else(|| BatchPlan::equal(0, spec.training.global_batch_size, world));
    let round = match st.balancer.decide(&current) {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "balancer could not decide");
            ctx.metrics.error(Error::from(e).metric_label());
            return x;
        }
    };
    let Some(new) = round.plan else {
        tracing::debug!(reason = %round.reason, "keeping the plan");
        return x;
    };
    let gain = new.gain_percent;
    let policy = new.policy;
    let plan = new.into_plan(&current);
    if let Err(e) = plan.validate_for(world, spec.training.global_batch_size) {
        warn!(error = %e, "balancer produced an invalid plan; not writing it");
        ctx.metrics.error("invalid_plan");
        return x;
    }
    if let Err(e) = apply::write_plan(&ctx.client, job, &plan).await {
        warn!(error = %e, "writing the plan failed");
        ctx.metrics.error(e.metric_label());
        st.last_decision = previous_decision;
        return x;
    }
    ctx.metrics
        .rebalances
        .get_or_create(&PolicyLabel {
            policy: policy.into(),
        })
        .inc();
    st.pending = Some((plan.generation, Instant::now()));
    let note = format!(
        "plan generation {}: batches {:?}; predicted gain {gain:.1}%; {}",
        plan.generation, plan.batch_sizes, plan.reason
    );
    info!(job = %job.name_any(), "{note}");
    ctx.event(
        job,
        &EventSpec {
            warning: false,
            reason: reasons::REBALANCED.into(),
            note: note.clone(),
        },
    )
    .await;
    x.conditions.push(Desired::yes(
        types::REBALANCED,
        reasons::REBALANCED,
        format!(
            "plan generation {} written: {:?}",
            plan.generation, plan.batch_sizes
        ),
    ));
    x.last_rebalance = Some(RebalanceStatus {
        generation: plan.generation,
        time: Some(Time(Timestamp::now())),
        reason: plan.reason.clone(),
        predicted_gain_percent: crate::status::round3(gain),
        batch_sizes: plan.batch_sizes.clone(),
    });
    x.plan = Some(plan);
    x
}

/// Wall-clock slack on the minimum interval: decisions are only checked at
/// scrapes, so a floor that is a multiple of the scrape interval must not be
/// missed by a few milliseconds of timer jitter (and so cost a whole scrape).
const FLOOR_SLACK: f64 = 0.95;

/// Whether a job's plan is due to be reconsidered: the job has trained at
/// least `interval_steps` steps (at least 1) since the decision at
/// `last_step`, AND at least `min_interval` (the operator's
/// `--rebalance-interval`, less 5% slack) has passed since then (`elapsed`).
///
/// The operator asks at every metrics read (`--scrape-interval`), so the
/// effective decision period is about
/// max(`interval_steps` × step time, `min_interval`), rounded up to the next
/// scrape. A step count below `last_step` is never due (see
/// [`DecisionClock::due`], which re-bases then).
pub fn decision_due(
    last_step: u64,
    step: u64,
    elapsed: Duration,
    interval_steps: u32,
    min_interval: Duration,
) -> bool {
    let advanced = step.saturating_sub(last_step);
    advanced >= u64::from(interval_steps.max(1)) && elapsed >= min_interval.mul_f64(FLOOR_SLACK)
}

/// When (step and time) the plan of a job's gang was last considered; the
/// step is learnt from the first scrape that reports one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecisionClock {
    step: Option<u64>,
    at: Instant,
}

impl DecisionClock {
    /// A gang starting balancing at `now`: its first decision waits one
    /// interval from the first step read.
    pub fn new(now: Instant) -> DecisionClock {
        DecisionClock {
            step: None,
            at: now,
        }
    }

    /// Given the job's step read at this scrape (`None`: no rank reported
    /// one), the step to decide at now, or `None` to wait. The first step
    /// read is the baseline; a step below the last decision's (a trainer
    /// restarted from an older checkpoint without a gang change) becomes the
    /// new baseline rather than stalling decisions until the old step returns.
    pub fn due(
        &mut self,
        step: Option<u64>,
        now: Instant,
        interval_steps: u32,
        min_interval: Duration,
    ) -> Option<u64> {
        let step = step?;
        match self.step {
            Some(last) if step >= last => decision_due(
                last,
                step,
                now.saturating_duration_since(self.at),
                interval_steps,
                min_interval,
            )
            .then_some(step),
            _ => {
                self.step = Some(step);
                None
            }
        }
    }

    /// A decision was taken at `step`, `now`.
    pub fn mark(&mut self, step: u64, now: Instant) {
        *self = DecisionClock {
            step: Some(step),
            at: now,
        };
    }
}

async fn store_profiles(
    ctx: &Context,
    job: &HeteroTrainingJob,
    obs: &Observed,
    st: &mut JobState,
    new: BTreeMap<usize, crate::scrape::RankProfile>,
) {
    if new.is_empty() {
        return;
    }
    let layout = job.spec.rank_layout();
    let mut entries = BTreeMap::new();
    for (r, p) in &new {
        let Some(g) = layout.get(*r).and_then(|(gi, _)| job.spec.workers.get(*gi)) else {
            continue;
        };
        let node = obs
            .pods
            .iter()
            .find(|x| x.rank == Some(*r as u32))
            .and_then(|x| x.node_name.as_deref());
        if let Some(acc) = profile_cache::accelerator_of(&ctx.client, node, g).await {
            entries.insert(
                profile_cache::key(&acc, g.device, &job.spec.model),
                p.into(),
            );
        }
        st.cached[*r] = true;
    }
    if let Err(e) =
        profile_cache::store(&ctx.client, &ctx.config.operator_namespace, &entries).await
    {
        warn!(error = %e, "storing profiles in the cache failed");
        ctx.metrics.error(e.metric_label());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn needs_both_the_steps_and_the_floor() {
        // 20 steps since step 100, and 30 s since then: due.
        assert!(decision_due(100, 120, 30 * S, 20, 30 * S));
        assert!(decision_due(100, 500, 31 * S, 20, 30 * S));
        // Enough time, too few steps (slow steps): wait for the steps.
        assert!(!decision_due(100, 119, 300 * S, 20, 30 * S));
        // Enough steps, too little time (fast steps): the floor holds.
        assert!(!decision_due(100, 10_000, 20 * S, 20, 30 * S));
        // No floor: the steps alone decide.
        assert!(decision_due(0, 5, Duration::ZERO, 5, Duration::ZERO));
        assert!(!decision_due(0, 4, Duration::ZERO, 5, Duration::ZERO));
    }

    #[test]
    fn floor_has_slack_for_scrape_jitter() {
        // A 2 s floor checked at 1 s scrapes that fire a little early.
        assert!(decision_due(0, 10, Duration::from_millis(1950), 10, 2 * S));
        assert!(!decision_due(0, 10, Duration::from_millis(1850), 10, 2 * S));
    }

    #[test]
    fn zero_steps_means_one_and_going_back_is_never_due() {
        assert!(!decision_due(7, 7, 60 * S, 0, S));
        assert!(decision_due(7, 8, 60 * S, 0, S));
        assert!(!decision_due(50, 10, 60 * S, 1, S));
    }

    #[test]
    fn clock_learns_its_baseline_then_counts_from_each_decision() {
        let t0 = Instant::now();
        let mut c = DecisionClock::new(t0);
        // No step read yet: never due, however late.
        assert_eq!(c.due(None, t0 + 100 * S, 10, S), None);
        // The first step read is the baseline, not a decision.
        assert_eq!(c.due(Some(40), t0 + 100 * S, 10, S), None);
        assert_eq!(c.due(Some(49), t0 + 101 * S, 10, S), None);
        assert_eq!(c.due(Some(50), t0 + 101 * S, 10, S), Some(50));
        c.mark(50, t0 + 101 * S);
        // The next one counts from the decision: steps and time again.
        assert_eq!(c.due(Some(59), t0 + 200 * S, 10, S), None);
        assert_eq!(c.due(Some(60), t0 + 101 * S, 10, S), None);
        assert_eq!(c.due(Some(60), t0 + 102 * S, 10, S), Some(60));
    }

    #[test]
    fn clock_rebases_when_the_step_goes_back() {
        let t0 = Instant::now();
        let mut c = DecisionClock::new(t0);
        c.mark(500, t0);
        // A trainer back at step 100: 100 is the new baseline...
        assert_eq!(c.due(Some(100), t0 + 60 * S, 10, S), None);
        // ...so ten steps later it is due, not 410 steps later.
        assert_eq!(c.due(Some(110), t0 + 61 * S, 10, S), Some(110));
    }

    #[test]
    fn unmarked_clock_stays_due_for_a_retry() {
        let t0 = Instant::now();
        let mut c = DecisionClock::new(t0);
        assert_eq!(c.due(Some(0), t0, 5, S), None);
        assert_eq!(c.due(Some(5), t0 + 2 * S, 5, S), Some(5));
        // The write failed and the mark was not moved: due at the next scrape.
        assert_eq!(c.due(Some(6), t0 + 3 * S, 5, S), Some(6));
    }
}
