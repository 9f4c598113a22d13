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
    if running == world {
        d.phase = JobPhase::Running;
        d.balance = true;
        d.conditions.push(Desired::yes(
            types::RUNNING,
            reasons::PODS_RUNNING,
            format!("all {world} ranks running"),
        ));
    } else {
        d.conditions.push(Desired::no(
            types::RUNNING,
            reasons::PODS_PENDING,
            format!("{running} of {world} ranks running"),
        ));
    }
    d
}

#[cfg(test)]
mod tests;
