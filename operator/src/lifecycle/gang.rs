//! The stages of a decision on the current gang: failures and lost ranks,
//! creating missing ranks, success, running (with the progress watchdog),
//! and what waiting ranks wait for (with the pods-ready clock).

use std::ops::ControlFlow;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{live, outcome, seconds_between, Ctx, Decision, Gang, JobPhase, StartTime};
use crate::conditions::{self as cond, reasons, types, Desired};
use crate::fetch::{names_where, Phase, RankPod};
use crate::names;

/// A failed or lost rank restarts the gang or fails the job
/// ([`outcome`]); missing ranks of a gang not started yet are created.
pub(super) fn failures_and_creation(ctx: &Ctx, gang: &Gang, d: &mut Decision) -> ControlFlow<()> {
    let (current, world) = (&gang.current, gang.world);
    let by_rank = |r: u32| current.iter().find(|p| p.rank == Some(r));
    let missing: Vec<u32> = (0..world).filter(|&r| by_rank(r).is_none()).collect();
    let started = current
        .iter()
        .any(|p| matches!(p.phase, Phase::Running | Phase::Succeeded | Phase::Failed));
    let lost = missing.first().filter(|_| started).map(|&r| {
        format!(
            "rank {r} (pod {}) was lost (deleted or gone with its node)",
            names::pod_name(&ctx.v.name, r)
        )
    });
    let (cause, wait) = outcome::cause(ctx.rp, current, lost, ctx.now);
    if let Some(cause) = cause {
        outcome::apply(d, ctx.rp, current, cause);
        return ControlFlow::Break(());
    }
    if let Some(w) = wait {
        d.requeue(w);
    }
    if missing.is_empty() {
        return ControlFlow::Continue(());
    }
    create(ctx, world, missing, d);
    ControlFlow::Break(())
}

/// Creates the `missing` ranks; with the first gang, says so once (and
/// warns once when the checkpoints are ephemeral: the condition keeps
/// saying it).
fn create(ctx: &Ctx, world: u32, missing: Vec<u32>, d: &mut Decision) {
    let status = &ctx.status;
    d.create_ranks = missing;
    if status.start_time.is_none() {
        d.start_time = StartTime::SetNow;
    }
    let msg = format!("created the Service, the plan and {world} rank pod(s)");
    if !cond::is_true(&status.conditions, types::CREATED) {
        d.event(false, reasons::GANG_CREATED, msg.clone());
        if ctx.spec.checkpoint.claim_name.is_none() && status.restarts == 0 {
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
}

/// Every rank exited 0: the job succeeded.
pub(super) fn succeeded(ctx: &Ctx, gang: &Gang, d: &mut Decision) -> ControlFlow<()> {
    let world = gang.world;
    let done = gang
        .current
        .iter()
        .filter(|p| p.phase == Phase::Succeeded)
        .count() as u32;
    if done != world {
        if ctx.status.start_time.is_none() {
            d.start_time = StartTime::SetNow;
        }
        d.conditions.push(Desired::yes(
            types::CREATED,
            reasons::GANG_CREATED,
            format!("created the Service, the plan and {world} rank pod(s)"),
        ));
        return ControlFlow::Continue(());
    }
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
    if let Some(ttl) = ctx.rp.ttl_seconds_after_finished {
        d.requeue(Duration::from_secs(u64::from(ttl).max(1)));
    }
    ControlFlow::Break(())
}

/// Ranks running (or done), each with its pod IP.
fn running_count(gang: &Gang) -> u32 {
    gang.current
        .iter()
        .filter(|p| {
            matches!(p.phase, Phase::Running | Phase::Succeeded)
                && (p.phase == Phase::Succeeded || p.pod_ip.is_some())
        })
        .count() as u32
}

/// When the current gang's pods were created (the newest of them).
fn gang_created<'a>(gang: &Gang<'a>) -> Option<&'a Time> {
    gang.current
        .iter()
        .filter_map(|p| p.created.as_ref())
        .max_by_key(|t| t.0)
}

/// Every rank runs: the job is Running (and balanced), unless the
/// watchdog finds the step standing still for `progressDeadlineSeconds`.
pub(super) fn running(ctx: &Ctx, gang: &Gang, d: &mut Decision) -> ControlFlow<()> {
    let world = gang.world;
    if running_count(gang) != world {
        return ControlFlow::Continue(());
    }
    if let Some(limit) = ctx.rp.progress_deadline_seconds {
        let moved = ctx
            .status
            .progress
            .as_ref()
            .and_then(|p| p.last_update_time.as_ref());
        let since = [moved, gang_created(gang)]
            .into_iter()
            .flatten()
            .max_by_key(|t| t.0);
        if let Some(since) = since {
            let idle = seconds_between(since, ctx.now);
            if idle >= f64::from(limit) {
                let why = format!(
                    "no training step for {idle:.0}s with all {world} ranks running (progressDeadlineSeconds {limit}): a rank is hung or stopped"
                );
                outcome::apply(d, ctx.rp, &gang.current, outcome::Cause::Failure(why));
                return ControlFlow::Break(());
            }
            d.requeue(Duration::from_secs_f64((f64::from(limit) - idle).max(1.0)));
        }
    }
    d.phase = JobPhase::Running;
    d.balance = !gang.workers_changed;
    d.conditions.push(Desired::yes(
        types::RUNNING,
        reasons::PODS_RUNNING,
        format!("all {world} ranks running"),
    ));
    ControlFlow::Break(())
}

/// What each waiting rank waits for: `(reason, "rank r (pod p): why")`,
/// the reason being a kubelet's or scheduler's, kept to what a condition
/// reason may hold.
fn waiting_for(gang: &Gang) -> Vec<(String, String)> {
    let mut ranked: Vec<&&RankPod> = gang.current.iter().collect();
    ranked.sort_by_key(|p| p.rank);
    ranked
        .iter()
        .filter(|p| !matches!(p.phase, Phase::Running | Phase::Succeeded))
        .filter_map(|p| {
            let w = p.waiting.as_ref()?;
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
        .collect()
}

/// Not all running: name what the waiting ranks wait for, and fail the
/// job once `podsReadyTimeoutSeconds` has passed. The pods-ready clock
/// runs from the gang's creation or, when later, from when its last pod
/// was scheduled (a gang a queue held back, such as Kueue's admission
/// gate, is measured from its admission); it stops while any rank is
/// still held by a scheduling gate.
pub(super) fn waiting(ctx: &Ctx, gang: &Gang, d: &mut Decision) {
    let stuck = waiting_for(gang);
    let mut msg = format!("{} of {} ranks running", running_count(gang), gang.world);
    for (_, s) in &stuck {
        msg.push_str("; ");
        msg.push_str(s);
    }
    let gated = gang.current.iter().any(|p| p.gated);
    let scheduled = gang
        .current
        .iter()
        .filter_map(|p| p.scheduled_at.as_ref())
        .max_by_key(|t| t.0);
    let since = [gang_created(gang), scheduled]
        .into_iter()
        .flatten()
        .max_by_key(|t| t.0);
    if let (Some(limit), Some(created), false) = (ctx.rp.pods_ready_timeout_seconds, since, gated) {
        let waited = seconds_between(created, ctx.now);
        if waited >= f64::from(limit) {
            let why = format!(
                "{msg} {waited:.0}s after the gang's pods were created (podsReadyTimeoutSeconds {limit})"
            );
            d.fail(
                reasons::PODS_NOT_READY,
                why,
                names_where(&ctx.obs.pods, live),
            );
            return;
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
    let was = cond::get(&ctx.status.conditions, types::RUNNING).map(|c| c.reason.clone());
    if let Some((_, first)) = stuck.first() {
        if was.as_deref() != Some(reason.as_str()) {
            d.event(true, &reason, first.clone());
        }
    }
    d.conditions.push(Desired::no(types::RUNNING, &reason, msg));
}
