//! Lifecycle stage (pure): from the job, its status and its observed pods,
//! decide what happens to the gang next — create, wait, restart after a
//! failure, give up, finish, suspend, expire — and which conditions and
//! Events say so. No client, no clock (the caller passes `now`).

mod decision;
mod gang;
mod gates;
mod outcome;

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::ops::ControlFlow;

use heterotrain_crds::{HeteroTrainingJobSpec, HeteroTrainingJobStatus, RunPolicy};
use k8s_openapi::jiff::Timestamp;

pub use decision::{Decision, JobPhase, StartTime};

use crate::conditions::{reasons, types, Desired};
use crate::fetch::{Observed, Phase, RankPod};
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

/// What every stage of a decision reads.
struct Ctx<'a> {
    v: &'a ValidatedJob<'a>,
    obs: &'a Observed,
    now: &'a Timestamp,
    status: HeteroTrainingJobStatus,
    spec: &'a HeteroTrainingJobSpec,
    rp: &'a RunPolicy,
}

/// The pods of the current gang, by how the spec changed under them.
struct Gang<'a> {
    current: Vec<&'a RankPod>,
    /// The ranks the gang has: the spec's, or — while a change of
    /// `spec.workers` is rejected — the ranks it was created with.
    world: u32,
    /// `spec.workers` changed under the gang (rejected).
    workers_changed: bool,
}

/// Decide the next step for a job whose spec passed validation: a
/// finished job's clean-up, else the stages in order — suspension, the
/// deadline, an older gang's pods, spec changes, failures, creation,
/// success, running, waiting — until one decides.
pub fn decide(v: &ValidatedJob, obs: &Observed, now: &Timestamp) -> Decision {
    let spec = v.spec();
    let ctx = Ctx {
        v,
        obs,
        now,
        status: v.status(),
        spec,
        rp: &spec.run_policy,
    };
    if let Some(d) = gates::finished(&ctx) {
        return d;
    }
    let mut d = Decision::new(
        JobPhase::Pending,
        ctx.status.restarts,
        ctx.status.disruptions,
    );
    d.conditions.push(Desired::no(
        types::FAILED,
        reasons::SPEC_ACCEPTED,
        "the spec is valid",
    ));
    let _ = stages(&ctx, &mut d);
    d
}

/// The stages after the finished check; `Break` once one has decided.
fn stages(ctx: &Ctx, d: &mut Decision) -> ControlFlow<()> {
    gates::suspension(ctx, d)?;
    gates::deadline(ctx, d)?;
    let (current, old): (Vec<&RankPod>, Vec<&RankPod>) = ctx
        .obs
        .pods
        .iter()
        .partition(|p| p.restart == Some(ctx.status.restarts));
    gates::old_gang(ctx, &old, d)?;
    let gang = gates::spec_changes(ctx, current, d);
    gang::failures_and_creation(ctx, &gang, d)?;
    gang::succeeded(ctx, &gang, d)?;
    gang::running(ctx, &gang, d)?;
    gang::waiting(ctx, &gang, d);
    ControlFlow::Continue(())
}

#[cfg(test)]
mod tests;
