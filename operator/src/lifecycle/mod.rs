//! Lifecycle stage (pure): from the job, its status and its observed pods,
//! decide what happens to the gang next — create, wait, restart after a
//! failure, give up, finish, suspend, expire — and which conditions and
//! Events say so. No client, no clock (the caller passes `now`).

mod decision;
mod outcome;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

pub use decision::{Decision, JobPhase, StartTime};

use crate::build::hash::changed_sections;
use crate::conditions::{self as cond, reasons, types, Desired};
use crate::fetch::{names_where, Observed, Phase, RankPod};
use crate::names;
use crate::validate::ValidatedJob;

fn seconds_between(from: &Time, now: &Timestamp) -> f64 {
    (now.as_millisecond() - from.0.as_millisecond()) as f64 / 1000.0
}

/// How long past its grace period a deleted pod of a previous gang may stay
/// before it is force-deleted: its node is gone (a kubelet would have
/// finished the delete), and the next gang reuses its name.
pub const FORCE_DELETE_AFTER: Duration = Duration::from_secs(30);

fn live(p: &RankPod) -> bool {
    !p.deleting && matches!(p.phase, Phase::Pending | Phase::Running | Phase::Unknown)
}

/// Decide the next step for a job whose spec passed validation.
pub fn decide(v: &ValidatedJob, obs: &Observed, now: &Timestamp) -> Decision {
    let status = v.status();
    let conds = &status.conditions;
    let spec = v.spec();
    let rp = &spec.run_policy;
    let restarts = status.restarts;
    let disruptions = status.disruptions;
    let world = v.world_size;
    let all_names = names_where(&obs.pods, |p| !p.deleting);
    let live_names = names_where(&obs.pods, live);

    // Finished jobs stay finished; only clean-up and TTL remain.
    let succeeded = cond::is_true(conds, types::SUCCEEDED);
    let failed_for_good = cond::get(conds, types::FAILED)
        .is_some_and(|c| c.status == "True" && c.reason != reasons::INVALID);
    if succeeded || failed_for_good {
        let mut d = Decision::new(
            if succeeded {
                JobPhase::Succeeded
            } else {
                JobPhase::Failed
            },
            restarts,
            disruptions,
        );
        d.delete_pods = live_names;
        d.complete = true;
        if let Some(ttl) = rp.ttl_seconds_after_finished {
            let done = status.completion_time.as_ref();
            let elapsed = done.map_or(0.0, |t| seconds_between(t, now));
            let left = f64::from(ttl) - elapsed;
            if left <= 0.0 {
                d.delete_job = true;
                d.event(
                    false,
                    reasons::TTL_EXPIRED,
                    format!("deleting the job {ttl}s after it finished"),
                );
            } else {
                d.requeue(Duration::from_secs_f64(left.max(0.1)));
            }
        }
        return d;
    }

    let mut d = Decision::new(JobPhase::Pending, restarts, disruptions);
    d.conditions.push(Desired::no(
        types::FAILED,
        reasons::SPEC_ACCEPTED,
        "the spec is valid",
    ));

    // Suspension: stop the pods, keep plan and checkpoints.
    let was_suspended = cond::is_true(conds, types::SUSPENDED);
    if rp.suspend {
        d.phase = JobPhase::Suspended;
        d.delete_pods = all_names;
        d.start_time = StartTime::Clear;
        let msg = "runPolicy.suspend is true: pods stopped; the plan and checkpoints are kept";
        d.conditions
            .push(Desired::yes(types::SUSPENDED, reasons::SUSPENDED, msg));
        d.conditions
            .push(Desired::no(types::RUNNING, reasons::SUSPENDED, "suspended"));
        if !was_suspended {
            d.event(false, reasons::SUSPENDED, msg);
        }
        return d;
    }
    if was_suspended {
        let msg = "runPolicy.suspend is false: recreating the gang from the latest checkpoint";
        d.conditions
            .push(Desired::no(types::SUSPENDED, reasons::RESUMED, msg));
        d.event(false, reasons::RESUMED, msg);
    }

    // Deadline.
    if let (Some(limit), Some(start)) = (rp.active_deadline_seconds, status.start_time.as_ref()) {
        let left = limit as f64 - seconds_between(start, now);
        if left <= 0.0 {
            let msg = format!("the job ran longer than activeDeadlineSeconds {limit}");
            d.fail(reasons::DEADLINE_EXCEEDED, msg, all_names);
            return d;
        }
        d.requeue(Duration::from_secs_f64(left.max(0.1)));
    }

    // Pods of an older gang go first; their names are reused.
    let (current, old): (Vec<&RankPod>, Vec<&RankPod>) =
        obs.pods.iter().partition(|p| p.restart == Some(restarts));
    if !old.is_empty() {
        d.take_down(
            &old,
            format!(
                "waiting for {} pod(s) of the previous gang to go away",
                old.len()
            ),
        );
        d.requeue(Duration::from_secs(1));
        // A pod still Terminating long after its grace period sits on a
        // lost node: no kubelet will finish its delete, and its name
        // blocks the next gang. Delete it from the API now.
        let after = FORCE_DELETE_AFTER.as_secs_f64();
        let stuck: Vec<String> = old
            .iter()
            .filter(|p| {
                p.deletion_deadline
                    .as_ref()
                    .is_some_and(|t| seconds_between(t, now) >= after)
            })
            .map(|p| p.name.clone())
            .collect();
        if !stuck.is_empty() {
            d.event(
                true,
                reasons::FORCE_DELETED,
                format!(
                    "pod(s) {} still Terminating {}s past the grace period (their node is unreachable?): deleted from the API so the next gang can start",
                    stuck.join(", "),
                    FORCE_DELETE_AFTER.as_secs()
                ),
            );
            d.force_delete_pods = stuck;
        }
        return d;
    }

    // Immutable fields changed under a running gang: say so, keep running.
    let changed: Vec<&str> = current
        .iter()
        .filter_map(|p| p.spec_hash.as_deref())
        .flat_map(|h| changed_sections(h, spec))
        .fold(Vec::new(), |mut acc, s| {
            if !acc.contains(&s) {
                acc.push(s);
            }
            acc
        });
    if !changed.is_empty() {
        d.conditions.push(Desired::yes(
            types::SPEC_CHANGE_REJECTED,
            reasons::IMMUTABLE_FIELD_CHANGED,
            format!(
                "spec.{} changed while the gang runs; the running pods keep the old values. Revert the change, or delete and recreate the job to apply it",
                changed.join(", spec.")
            ),
        ));
    } else if cond::get(conds, types::SPEC_CHANGE_REJECTED).is_some() {
        d.conditions.push(Desired::no(
            types::SPEC_CHANGE_REJECTED,
            reasons::SPEC_ACCEPTED,
            "the running gang matches the spec",
        ));
    }

    // A rejected change of `spec.workers` leaves the gang as it was
    // created: its world is the ranks it has, not the new spec's, so a rank
    // the new spec adds is neither created into it nor taken for lost (a
    // restart counted toward backoffLimit), and no plan of the new shape is
    // balanced onto it.
    let workers_changed = changed.contains(&"workers");
    let world = if workers_changed {
        current
            .iter()
            .filter_map(|p| p.rank)
            .max()
            .map_or(world, |r| r.saturating_add(1))
    } else {
        world
    };
    let by_rank = |r: u32| current.iter().find(|p| p.rank == Some(r));
    let missing: Vec<u32> = (0..world).filter(|&r| by_rank(r).is_none()).collect();
    let started = current
        .iter()
        .any(|p| matches!(p.phase, Phase::Running | Phase::Succeeded | Phase::Failed));
    let lost = missing.first().filter(|_| started).map(|&r| {
        format!(
            "rank {r} (pod {}) was lost (deleted or gone with its node)",
            names::pod_name(&v.name, r)
        )
    });
    let (cause, wait) = outcome::cause(rp, &current, lost, now);
    if let Some(cause) = cause {
        outcome::apply(&mut d, rp, &current, cause);
        return d;
    }
    if let Some(w) = wait {
        d.requeue(w);
    }

    if !missing.is_empty() {
        d.create_ranks = missing;
        if status.start_time.is_none() {
            d.start_time = StartTime::SetNow;
        }
        let msg = format!("created the Service, the plan and {world} rank pod(s)");
        if !cond::is_true(conds, types::CREATED) {
            d.event(false, reasons::GANG_CREATED, msg.clone());
            // Said once, with the first gang: the condition keeps saying it.
            if spec.checkpoint.claim_name.is_none() && status.restarts == 0 {
                d.event(
                    true,
                    reasons::EPHEMERAL_STORAGE,
                    crate::conditions::EPHEMERAL_MESSAGE,
                );
            }
        }
        d.conditions
            .push(Desired::yes(types::CREATED, reasons::GANG_CREATED, msg));
        d.conditions.push(Desired::no(
            types::RUNNING,
            reasons::PODS_PENDING,
            format!("0 of {world} ranks running"),
        ));
        return d;
    }

    let done = current
        .iter()
        .filter(|p| p.phase == Phase::Succeeded)
        .count() as u32;
    if done == world {
        let msg = format!("all {world} ranks exited 0");
        d.phase = JobPhase::Succeeded;
        d.complete = true;
        d.conditions.push(Desired::yes(
            types::SUCCEEDED,
            reasons::ALL_RANKS_SUCCEEDED,
            msg.clone(),
        ));
        d.conditions.push(Desired::no(
            types::RUNNING,
            reasons::ALL_RANKS_SUCCEEDED,
            msg.clone(),
        ));
        d.event(false, reasons::ALL_RANKS_SUCCEEDED, msg);
        if let Some(ttl) = rp.ttl_seconds_after_finished {
            d.requeue(Duration::from_secs(u64::from(ttl).max(1)));
        }
        return d;
    }
    if status.start_time.is_none() {
        d.start_time = StartTime::SetNow;
    }
    d.conditions.push(Desired::yes(
        types::CREATED,
        reasons::GANG_CREATED,
        format!("created the Service, the plan and {world} rank pod(s)"),
    ));
    let running = current
        .iter()
        .filter(|p| {
            matches!(p.phase, Phase::Running | Phase::Succeeded)
                && (p.phase == Phase::Succeeded || p.pod_ip.is_some())
        })
        .count() as u32;
    // When the current gang's pods were created (the newest of them).
    let gang_created = current
        .iter()
        .filter_map(|p| p.created.as_ref())
        .max_by_key(|t| t.0);
    if running == world {
        // The watchdog: every rank runs but the step stands still.
        if let Some(limit) = rp.progress_deadline_seconds {
            let moved = status
                .progress
                .as_ref()
                .and_then(|p| p.last_update_time.as_ref());
            let since = [moved, gang_created]
                .into_iter()
                .flatten()
                .max_by_key(|t| t.0);
            if let Some(since) = since {
                let idle = seconds_between(since, now);
                if idle >= f64::from(limit) {
                    let why = format!(
                        "no training step for {idle:.0}s with all {world} ranks running (progressDeadlineSeconds {limit}): a rank is hung or stopped"
                    );
                    outcome::apply(&mut d, rp, &current, outcome::Cause::Failure(why));
                    return d;
                }
                d.requeue(Duration::from_secs_f64((f64::from(limit) - idle).max(1.0)));
            }
        }
        d.phase = JobPhase::Running;
        d.balance = !workers_changed;
        d.conditions.push(Desired::yes(
            types::RUNNING,
            reasons::PODS_RUNNING,
            format!("all {world} ranks running"),
        ));
        return d;
    }
    // Not all running: name what the waiting ranks wait for.
    let mut ranked: Vec<&&RankPod> = current.iter().collect();
    ranked.sort_by_key(|p| p.rank);
    let stuck: Vec<(String, String)> = ranked
        .iter()
        .filter(|p| !matches!(p.phase, Phase::Running | Phase::Succeeded))
        .filter_map(|p| {
            let w = p.waiting.as_ref()?;
            // A kubelet's or scheduler's reason, kept to what a condition
            // reason may hold.
            let reason: String = w
                .split(':')
                .next()
                .unwrap_or(w)
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .take(64)
                .collect();
            let r = p.rank.map_or_else(|| "?".into(), |r| r.to_string());
            Some((reason, format!("rank {r} (pod {}): {w}", p.name)))
        })
        .collect();
    let mut msg = format!("{running} of {world} ranks running");
    for (_, s) in &stuck {
        msg.push_str("; ");
        msg.push_str(s);
    }
    // The pods-ready clock: from the gang's creation or, when later, from
    // when its last pod was scheduled (a gang a queue held back, such as
    // Kueue's admission gate, is measured from its admission); stopped
    // while any rank is still held by a scheduling gate.
    let gated = current.iter().any(|p| p.gated);
    let since = [
        gang_created,
        current
            .iter()
            .filter_map(|p| p.scheduled_at.as_ref())
            .max_by_key(|t| t.0),
    ]
    .into_iter()
    .flatten()
    .max_by_key(|t| t.0);
    if let (Some(limit), Some(created), false) = (rp.pods_ready_timeout_seconds, since, gated) {
        let waited = seconds_between(created, now);
        if waited >= f64::from(limit) {
            let why = format!(
                "{msg} {waited:.0}s after the gang's pods were created (podsReadyTimeoutSeconds {limit})"
            );
            d.fail(reasons::PODS_NOT_READY, why, names_where(&obs.pods, live));
            return d;
        }
        d.requeue(Duration::from_secs_f64(
            (f64::from(limit) - waited).max(1.0),
        ));
    }
    let reason = stuck
        .first()
        .map(|(r, _)| r.clone())
        .filter(|r| r.starts_with(|c: char| c.is_ascii_alphabetic()))
        .unwrap_or_else(|| reasons::PODS_PENDING.to_string());
    let was = cond::get(conds, types::RUNNING).map(|c| c.reason.clone());
    if let Some((_, first)) = stuck.first() {
        if was.as_deref() != Some(reason.as_str()) {
            d.event(true, &reason, first.clone());
        }
    }
    d.conditions.push(Desired::no(types::RUNNING, &reason, msg));
    d
}

#[cfg(test)]
mod tests;
