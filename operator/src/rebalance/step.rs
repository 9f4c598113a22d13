//! One balancing round of one job: read the ranks' metrics, feed the
//! balancer, report what was measured, and when a decision is due let the
//! balancer decide and write the plan it proposes.

use std::time::Instant;

use heterotrain_crds::{BatchPlan, RebalanceStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use tracing::{info, warn};

use super::state::JobState;
use super::{fold, membership, profiles, source, Deps, JobKey};
use crate::balance::NewPlan;
use crate::conditions::{reasons, types, Desired};
use crate::error::Error;
use crate::events::{self, EventSpec};
use crate::fetch::Observed;
use crate::metrics::PolicyLabel;
use crate::plan;
use crate::status::Extras;
use crate::validate::ValidatedJob;

/// The round for `v`'s state `st`, starting from the carried figures over
/// `base`; returns the figures for status. Reads the metrics (in a task of
/// their own), folds the reading in ([`fold`]), and when a decision is due,
/// lets the balancer decide ([`decide`]) and writes the plan it proposes
/// ([`write`]).
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
    let folded = fold::fold(v, cfg.profile_cache, &reading, st, &mut x);
    for _ in 0..folded.unread {
        deps.metrics.scrape_failures.inc();
    }
    if let Some((g, t)) = st.pending {
        if folded.generations.iter().all(|r| r.is_some_and(|r| r >= g)) {
            deps.metrics
                .plan_propagation
                .observe(t.elapsed().as_secs_f64());
            st.pending = None;
        }
    }
    profiles::store(deps, v, obs, st, folded.new_profiles).await;
    x.conditions.clear();
    x.conditions.extend(profiled(v, st));
    let now = Instant::now();
    let interval_steps = v.spec().load_balancing.rebalance_interval_steps;
    let Some(decision_step) =
        st.last_decision
            .due(folded.job_step, now, interval_steps, cfg.rebalance_interval)
    else {
        return x;
    };
    // A failed write keeps the previous mark, so the next scrape retries.
    let previous_decision = st.last_decision;
    st.last_decision.mark(decision_step, now);
    let current = plan::current_or_equal(v, x.plan.as_ref());
    let Some(new) = decide(deps, v, st, &current, &mut x).await else {
        return x;
    };
    if !write(deps, v, st, &current, new, &mut x).await {
        st.last_decision = previous_decision;
    }
    x
}

/// `Profiled`: whether every rank reported its profile (only the built-in
/// trainer profiles itself).
fn profiled(v: &ValidatedJob<'_>, st: &JobState) -> Option<Desired> {
    let spec = v.spec();
    if !(spec.profiling.enabled && spec.runs_builtin_trainer()) {
        return None;
    }
    let world = v.ranks();
    let n = st
        .balancer
        .profiles()
        .iter()
        .filter(|p| p.is_some())
        .count();
    Some(if n == world {
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
    })
}

/// The balancer's decision on `current`: the new plan, or `None` when it
/// keeps the plan or fails (the condition, and one Warning when a failure
/// starts, say so).
async fn decide(
    deps: &Deps<'_>,
    v: &ValidatedJob<'_>,
    st: &mut JobState,
    current: &BatchPlan,
    x: &mut Extras,
) -> Option<NewPlan> {
    let round = match st.balancer.decide(current) {
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
            return None;
        }
    };
    if round.plan.is_none() {
        tracing::debug!(
            reason = %round.reason,
            measured_step_seconds = round.measured_step_seconds,
            "keeping the plan"
        );
        let kept = Outcome::Kept(&round.reason);
        x.conditions
            .extend(rebalanced(failing_in(v), current.generation, kept));
    }
    round.plan
}

/// Writes the `new` plan after `current`, with its Events, condition and
/// status; `false` when it could not be written (to retry).
async fn write(
    deps: &Deps<'_>,
    v: &ValidatedJob<'_>,
    st: &mut JobState,
    current: &BatchPlan,
    new: NewPlan,
    x: &mut Extras,
) -> bool {
    let (gain, policy) = (new.gain_percent, new.policy);
    let plan = match plan::advance(v, current, new) {
        Ok(p) => p,
        Err(e) => {
            warn!(error = %e, "balancer produced an invalid plan; not writing it");
            deps.metrics.error("invalid_plan");
            return true;
        }
    };
    if let Err(e) = plan::write(deps.client, v, &plan).await {
        warn!(error = %e, "writing the plan failed");
        deps.metrics.error(e.metric_label());
        return false;
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
        note,
    }];
    news.extend(membership::events(current, &plan));
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
    true
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
