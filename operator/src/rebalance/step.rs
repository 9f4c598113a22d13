//! One balancing round of one job: read the ranks' metrics, feed the
//! balancer, report what was measured, and when a decision is due let the
//! balancer decide and write the plan it proposes.

use std::collections::BTreeMap;
use std::time::Instant;

use heterotrain_crds::bottleneck::{self, PhaseTimes};
use heterotrain_crds::{BalanceStatus, RankBottleneck, RebalanceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use tracing::{info, warn};

use super::state::JobState;
use super::{membership, profiles, source, Deps, JobKey};
use crate::conditions::{reasons, types, Desired};
use crate::error::Error;
use crate::events::{self, EventSpec};
use crate::fetch::Observed;
use crate::metrics::PolicyLabel;
use crate::plan;
use crate::status::Extras;
use crate::validate::ValidatedJob;

/// The round for `v`'s state `st`, starting from the carried figures over
/// `base`; returns the figures for status.
pub(super) async fn step(
    deps: &Deps<'_>,
    v: &ValidatedJob<'_>,
    obs: &Observed,
    base: Extras,
    st: &mut JobState,
) -> Extras {
    let mut x = st.carry(base);
    let cfg = deps.config;
    let key = JobKey::of(v);
    let tag = st.tag();
    let due = st
        .last_scrape
        .is_none_or(|t| t.elapsed() >= cfg.scrape_interval.mul_f64(0.8));
    if due {
        // The read runs in its own task and wakes the job when done.
        let request = source::request(deps, v, obs);
        if deps
            .collector
            .start(&key, &tag, request, deps.scraper)
            .is_some()
        {
            st.last_scrape = Some(Instant::now());
        }
    }
    let Some(reading) = deps.collector.take(&key, &tag) else {
        return x;
    };
    let spec = v.spec();
    let world = v.ranks();
    let results = reading.ranks;
    let mut sps: Vec<Option<f64>> = vec![None; world];
    let mut gens: Vec<Option<u64>> = vec![None; world];
    let mut new_profiles = BTreeMap::new();
    let mut phases: Vec<Option<PhaseTimes>> = vec![None; world];
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
                    x.total_steps = m.total_steps.or(x.total_steps);
                }
                if let Some(total) = m.samples_total {
                    if let Some((prev, t)) = st.last_samples[r] {
                        let dt = reading.at.saturating_duration_since(t).as_secs_f64();
                        if total >= prev && dt > 0.0 {
                            sps[r] = Some((total - prev) / dt);
                        }
                    }
                    st.last_samples[r] = Some((total, reading.at));
                }
                if let (Some(now), Some(steps)) = (m.phase_seconds_total, m.steps_total) {
                    if let Some((before, steps_before)) = st.last_phases[r] {
                        phases[r] = now.per_step_since(&before, steps - steps_before);
                    }
                    st.last_phases[r] = Some((now, steps));
                }
                if !had_profile && cfg.profile_cache && !st.cached[r] {
                    if let Some(p) = st.balancer.profiles().get(r).cloned().flatten() {
                        new_profiles.insert(r, p);
                    }
                }
            }
            Err(e) => {
                deps.metrics.scrape_failures.inc();
                tracing::debug!(rank = r, error = %e, "metrics not read");
                st.balancer.missing(r);
            }
        }
    }
    if phases.iter().any(Option::is_some) {
        x.rank_bottlenecks = Some(rank_bottlenecks(v, &phases));
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
        if gens.iter().all(|r| r.is_some_and(|r| r >= g)) {
            deps.metrics
                .plan_propagation
                .observe(t.elapsed().as_secs_f64());
            st.pending = None;
        }
    }
    profiles::store(deps, v, obs, st, new_profiles).await;

    x.conditions.clear();
    // Only the built-in trainer profiles itself.
    if spec.profiling.enabled && spec.runs_builtin_trainer() {
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
    let current = plan::current_or_equal(v, x.plan.as_ref());
    let round = match st.balancer.decide(&current) {
        Ok(r) => r,
        Err(e) => {
            warn!(error = %e, "balancer could not decide");
            let failing = failing_in(v);
            let error = e.to_string();
            deps.metrics.error(Error::from(e).metric_label());
            if let Some(c) = rebalanced(failing, current.generation, Outcome::Failed(&error)) {
                // One Warning when the trouble starts; the condition says
                // it until a decision succeeds.
                if !failing {
                    let news = EventSpec {
                        warning: true,
                        reason: reasons::BALANCER_ERROR.into(),
                        note: c.message.clone(),
                    };
                    events::publish(deps.recorder, v.job, &news).await;
                }
                x.conditions.push(c);
            }
            return x;
        }
    };
    let Some(new) = round.plan else {
        tracing::debug!(
            reason = %round.reason,
            measured_step_seconds = round.measured_step_seconds,
            "keeping the plan"
        );
        let kept = Outcome::Kept(&round.reason);
        x.conditions
            .extend(rebalanced(failing_in(v), current.generation, kept));
        return x;
    };
    let gain = new.gain_percent;
    let policy = new.policy;
    let plan = match plan::advance(v, &current, new) {
        Ok(p) => p,
        Err(e) => {
            warn!(error = %e, "balancer produced an invalid plan; not writing it");
            deps.metrics.error("invalid_plan");
            return x;
        }
    };
    if let Err(e) = plan::write(deps.client, v, &plan).await {
        warn!(error = %e, "writing the plan failed");
        deps.metrics.error(e.metric_label());
        st.last_decision = previous_decision;
        return x;
    }
    deps.metrics
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
    info!(job = %v.name, "{note}");
    let mut news = vec![EventSpec {
        warning: false,
        reason: reasons::REBALANCED.into(),
        note: note.clone(),
    }];
    news.extend(membership::events(&current, &plan));
    futures::future::join_all(
        news.iter()
            .map(|e| events::publish(deps.recorder, v.job, e)),
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
        predicted_step_seconds: plan.predicted_step_seconds.map(crate::status::round3),
        predicted_communication_seconds: plan
            .predicted_communication_seconds
            .map(crate::status::round3),
    });
    x.plan = Some(plan);
    x
}

/// How a due decision ended, short of writing a plan.
enum Outcome<'a> {
    /// The balancer returned this error.
    Failed(&'a str),
    /// It kept the plan, for this reason.
    Kept(&'a str),
}

/// The `Rebalanced` condition an outcome sets for a plan at `generation`,
/// given whether the last decision failed (`failing`): a failure is False
/// `BalancerError` with the error; a kept plan after a failure is False
/// `PlanKept`; a kept plan otherwise leaves the condition as it is (a
/// written plan sets True elsewhere).
fn rebalanced(failing: bool, generation: u64, outcome: Outcome<'_>) -> Option<Desired> {
    match outcome {
        Outcome::Failed(error) => Some(Desired::no(
            types::REBALANCED,
            reasons::BALANCER_ERROR,
            format!("the balancer could not decide: {error}; plan generation {generation} stays in force"),
        )),
        Outcome::Kept(reason) => failing.then(|| {
            Desired::no(
                types::REBALANCED,
                reasons::PLAN_KEPT,
                format!("the balancer decides again; plan generation {generation} kept: {reason}"),
            )
        }),
    }
}

/// Whether `v`'s status says the balancer's last decision failed.
fn failing_in(v: &ValidatedJob<'_>) -> bool {
    v.job
        .status
        .as_ref()
        .is_some_and(|s| failing(&s.conditions))
}

/// Whether `conditions` hold `Rebalanced` False for `BalancerError`.
fn failing(conditions: &[Condition]) -> bool {
    conditions
        .iter()
        .find(|c| c.type_ == types::REBALANCED)
        .is_some_and(|c| c.status == "False" && c.reason == reasons::BALANCER_ERROR)
}

/// What bounds each training rank's step, from its per-step phase times
/// over the last interval (`heterotrain_crds::bottleneck`), with the job's
/// straggler threshold.
fn rank_bottlenecks(v: &ValidatedJob<'_>, phases: &[Option<PhaseTimes>]) -> Vec<RankBottleneck> {
    let factor = f64::from(v.spec().load_balancing.straggler_threshold_percent) / 100.0;
    let round = |x: f64| (x * 1e5).round() / 1e5;
    bottleneck::classify(phases, factor.max(1.01))
        .into_iter()
        .zip(phases)
        .enumerate()
        .filter_map(|(rank, (b, p))| {
            let (b, p) = (b?, p.as_ref()?);
            Some(RankBottleneck {
                rank: u32::try_from(rank).ok()?,
                bottleneck: b,
                data_seconds: round(p.data),
                compute_seconds: round(p.compute),
                communication_seconds: round(p.communication),
                update_seconds: round(p.update),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(status: &str, reason: &str) -> Condition {
        Condition {
            type_: types::REBALANCED.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(Timestamp::now()),
        }
    }

    #[test]
    fn a_failed_decision_says_so_until_one_succeeds() {
        let c = rebalanced(false, 3, Outcome::Failed("global batch 32 exceeds caps"))
            .expect("a condition");
        assert_eq!(
            (c.status, c.reason.as_str()),
            (false, reasons::BALANCER_ERROR)
        );
        assert!(
            c.message.contains("global batch 32 exceeds caps")
                && c.message.contains("generation 3"),
            "{}",
            c.message
        );
        // Kept after a failure: the error is cleared.
        let c = rebalanced(true, 3, Outcome::Kept("already optimal")).expect("a condition");
        assert_eq!((c.status, c.reason.as_str()), (false, reasons::PLAN_KEPT));
        assert!(c.message.contains("already optimal"), "{}", c.message);
        // Kept with no failure before: the condition stays as it was.
        assert!(rebalanced(false, 3, Outcome::Kept("already optimal")).is_none());
    }

    #[test]
    fn failing_reads_the_rebalanced_condition() {
        assert!(failing(&[condition("False", reasons::BALANCER_ERROR)]));
        assert!(!failing(&[condition("False", reasons::PLAN_KEPT)]));
        assert!(!failing(&[condition("True", reasons::REBALANCED)]));
        assert!(!failing(&[]));
    }
}
