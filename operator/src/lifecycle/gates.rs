//! The stages of a decision before the current gang is looked at: a
//! finished job's clean-up and TTL, suspension, the deadline, the pods of
//! an older gang, and spec changes under the running gang.

use std::ops::ControlFlow;
use std::time::Duration;

use super::{live, seconds_between, Ctx, Decision, Gang, JobPhase, StartTime, FORCE_DELETE_AFTER};
use crate::build::hash::changed_sections;
use crate::conditions::{self as cond, reasons, types, Desired};
use crate::fetch::{names_where, RankPod};

/// Finished jobs stay finished: their live pods go, and the job itself
/// once `ttlSecondsAfterFinished` has passed. `None` for a job not done.
pub(super) fn finished(ctx: &Ctx) -> Option<Decision> {
    let (status, rp) = (&ctx.status, ctx.rp);
    let conds = &status.conditions;
    let succeeded = cond::is_true(conds, types::SUCCEEDED);
    let failed_for_good = cond::get(conds, types::FAILED)
        .is_some_and(|c| c.status == "True" && c.reason != reasons::INVALID);
    if !(succeeded || failed_for_good) {
        return None;
    }
    let phase = if succeeded {
        JobPhase::Succeeded
    } else {
        JobPhase::Failed
    };
    let mut d = Decision::new(phase, status.restarts, status.disruptions);
    d.delete_pods = names_where(&ctx.obs.pods, live);
    d.complete = true;
    if let Some(ttl) = rp.ttl_seconds_after_finished {
        let done = status.completion_time.as_ref();
        let elapsed = done.map_or(0.0, |t| seconds_between(t, ctx.now));
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
    Some(d)
}

/// Suspension: stop the pods, keep plan and checkpoints; resuming says so.
pub(super) fn suspension(ctx: &Ctx, d: &mut Decision) -> ControlFlow<()> {
    let was_suspended = cond::is_true(&ctx.status.conditions, types::SUSPENDED);
    if ctx.rp.suspend {
        d.phase = JobPhase::Suspended;
        d.delete_pods = names_where(&ctx.obs.pods, |p| !p.deleting);
        d.start_time = StartTime::Clear;
        let msg = "runPolicy.suspend is true: pods stopped; the plan and checkpoints are kept";
        d.conditions
            .push(Desired::yes(types::SUSPENDED, reasons::SUSPENDED, msg));
        d.conditions
            .push(Desired::no(types::RUNNING, reasons::SUSPENDED, "suspended"));
        if !was_suspended {
            d.event(false, reasons::SUSPENDED, msg);
        }
        return ControlFlow::Break(());
    }
    if was_suspended {
        let msg = "runPolicy.suspend is false: recreating the gang from the latest checkpoint";
        d.conditions
            .push(Desired::no(types::SUSPENDED, reasons::RESUMED, msg));
        d.event(false, reasons::RESUMED, msg);
    }
    ControlFlow::Continue(())
}

/// `activeDeadlineSeconds`: fail once it has passed, else look again then.
pub(super) fn deadline(ctx: &Ctx, d: &mut Decision) -> ControlFlow<()> {
    let (Some(limit), Some(start)) = (
        ctx.rp.active_deadline_seconds,
        ctx.status.start_time.as_ref(),
    ) else {
        return ControlFlow::Continue(());
    };
    let left = limit as f64 - seconds_between(start, ctx.now);
    if left <= 0.0 {
        let msg = format!("the job ran longer than activeDeadlineSeconds {limit}");
        d.fail(
            reasons::DEADLINE_EXCEEDED,
            msg,
            names_where(&ctx.obs.pods, |p| !p.deleting),
        );
        return ControlFlow::Break(());
    }
    d.requeue(Duration::from_secs_f64(left.max(0.1)));
    ControlFlow::Continue(())
}

/// Pods of an older gang go first; their names are reused. A pod still
/// Terminating long after its grace period sits on a lost node: no kubelet
/// will finish its delete, and its name blocks the next gang. Delete it
/// from the API now.
pub(super) fn old_gang(ctx: &Ctx, old: &[&RankPod], d: &mut Decision) -> ControlFlow<()> {
    if old.is_empty() {
        return ControlFlow::Continue(());
    }
    d.take_down(
        old,
        format!(
            "waiting for {} pod(s) of the previous gang to go away",
            old.len()
        ),
    );
    d.requeue(Duration::from_secs(1));
    let after = FORCE_DELETE_AFTER.as_secs_f64();
    let stuck: Vec<String> = old
        .iter()
        .filter(|p| {
            p.deletion_deadline
                .as_ref()
                .is_some_and(|t| seconds_between(t, ctx.now) >= after)
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
    ControlFlow::Break(())
}

/// Immutable fields changed under a running gang: say so, keep running.
/// A rejected change of `spec.workers` leaves the gang as it was created:
/// its world is the ranks it has, not the new spec's, so a rank the new
/// spec adds is neither created into it nor taken for lost (a restart
/// counted toward backoffLimit), and no plan of the new shape is balanced
/// onto it.
pub(super) fn spec_changes<'a>(ctx: &Ctx, current: Vec<&'a RankPod>, d: &mut Decision) -> Gang<'a> {
    let changed: Vec<&str> = current
        .iter()
        .filter_map(|p| p.spec_hash.as_deref())
        .flat_map(|h| changed_sections(h, ctx.spec))
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
    } else if cond::get(&ctx.status.conditions, types::SPEC_CHANGE_REJECTED).is_some() {
        d.conditions.push(Desired::no(
            types::SPEC_CHANGE_REJECTED,
            reasons::SPEC_ACCEPTED,
            "the running gang matches the spec",
        ));
    }
    let workers_changed = changed.contains(&"workers");
    let world = if workers_changed {
        current
            .iter()
            .filter_map(|p| p.rank)
            .max()
            .map_or(ctx.v.world_size, |r| r.saturating_add(1))
    } else {
        ctx.v.world_size
    };
    Gang {
        current,
        world,
        workers_changed,
    }
}
