//! The effects of a reconcile beyond its stages' modules: refusals,
//! carrying out the lifecycle's decision, foreign pods, a restored plan.

use std::time::Duration;

use heterotrain_crds::{labels, BatchPlan, HeteroTrainingJob};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::ResourceExt;

use crate::build::{self, BuildInputs};
use crate::conditions::{reasons, types, Desired};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::events::EventSpec;
use crate::fetch::{self, Observed};
use crate::lifecycle::Decision;
use crate::names;
use crate::rebalance::JobKey;
use crate::status;
use crate::validate::{self, ValidatedJob};
use crate::{apply, gang, plan};

/// Record what `status` just wrote on job `key`.
pub(super) fn remember(ctx: &Context, key: &JobKey, uid: &str, status: &status::Writer<'_>) {
    if let Some(s) = status.current() {
        ctx.wrote_status(key, uid, s);
    }
}

/// `HTTP <code>: <message>` when `e` is the API server refusing a write
/// for a reason a retry cannot fix (400, 403, 422).
pub(super) fn refused(e: &Error) -> Option<String> {
    match e {
        Error::Kube(kube::Error::Api(s)) if matches!(s.code, 400 | 403 | 422) => {
            Some(format!("HTTP {} {}: {}", s.code, s.reason, s.message))
        }
        _ => None,
    }
}

/// Record a refused create: `Created=False` (`CreateRefused`) with the API
/// server's words and what to check, a warning Event when that is new, and
/// a retry in 60 s.
pub(super) async fn report_refusal(
    ctx: &Context,
    v: &ValidatedJob<'_>,
    key: &JobKey,
    d: &mut Decision,
    why: String,
) {
    let msg = format!(
        "the API server refused the job's pods or objects ({why}); check the namespace's ResourceQuota, LimitRange and admission policies and the operator's RBAC; retrying every 60s"
    );
    let was = v
        .status()
        .conditions
        .iter()
        .find(|c| c.type_ == types::CREATED)
        .map(|c| (c.reason.clone(), c.message.clone()));
    d.conditions.retain(|c| c.type_ != types::CREATED);
    d.conditions.push(Desired::no(
        types::CREATED,
        reasons::CREATE_REFUSED,
        msg.clone(),
    ));
    d.events.retain(|e| e.reason != reasons::GANG_CREATED);
    let news = ctx.refused(key, &msg);
    if news && was != Some((reasons::CREATE_REFUSED.to_string(), msg.clone())) {
        let e = EventSpec {
            warning: true,
            reason: reasons::CREATE_REFUSED.into(),
            note: msg,
        };
        ctx.event(v.job, &e).await;
    }
    ctx.metrics.error("create_refused");
    d.requeue_after = Some(Duration::from_secs(60));
}

/// An invalid spec: `Failed` with reason `Invalid`, an Event when that is
/// new, and nothing else until the spec changes.
pub(super) async fn refuse(
    ctx: &Context,
    job: &HeteroTrainingJob,
    namespace: &str,
    problems: &[validate::Problem],
    now: &Timestamp,
) -> Result<Action> {
    let msg = validate::summary(problems);
    let next = status::invalid(job, &msg, &Time(*now));
    if status::Writer::new(&ctx.client, job, namespace)
        .write(next)
        .await?
    {
        let e = EventSpec {
            warning: true,
            reason: reasons::INVALID.into(),
            note: msg,
        };
        ctx.event(job, &e).await;
    }
    ctx.metrics.error("invalid");
    Ok(Action::await_change())
}

/// Carry out the lifecycle decision: delete pods, create the missing ranks
/// (with the Service and, when there is no usable one, a new plan), publish
/// the Events, delete the job past its TTL. Returns the plan it wrote.
pub(super) async fn apply_decision(
    ctx: &Context,
    v: &ValidatedJob<'_>,
    d: &Decision,
    obs: &Observed,
    plan_now: Option<&BatchPlan>,
) -> Result<Option<BatchPlan>> {
    let client = &ctx.client;
    apply::delete_pods(client, &v.namespace, &d.delete_pods).await?;
    apply::force_delete_pods(client, &v.namespace, &d.force_delete_pods).await?;
    let mut written = None;
    if !d.create_ranks.is_empty() {
        let inputs = BuildInputs {
            default_image: ctx.config.trainer_image.clone(),
            restart_count: d.restarts,
            metrics_from: ctx.config.metrics_from(),
            gang: gang_wiring(ctx, v).await?,
        };
        let desired = build::desired(v, &inputs)?;
        let first_plan = async {
            if plan_now.is_some() {
                return Ok(None);
            }
            let initial = plan::initial(client, &ctx.config, v, &obs.plan).await;
            plan::write(client, v, &initial).await?;
            Ok::<_, Error>(Some(initial))
        };
        let ((), initial) =
            futures::try_join!(apply::children(client, &v.namespace, &desired), first_plan)?;
        written = initial;
        // All missing ranks at once: one round trip of latency, not one per rank.
        let creates = desired
            .pods
            .iter()
            .filter(|p| {
                p.labels()
                    .get(labels::RANK)
                    .and_then(|r| r.parse::<u32>().ok())
                    .is_some_and(|r| d.create_ranks.contains(&r))
            })
            .map(|pod| apply::pod(client, &v.namespace, pod));
        // The first failure in rank order (not in time), so a refusal reads
        // the same at every retry.
        futures::future::join_all(creates)
            .await
            .into_iter()
            .collect::<Result<Vec<()>>>()?;
    }
    futures::future::join_all(d.events.iter().map(|e| ctx.event(v.job, e))).await;
    if d.delete_job {
        apply::delete_job(client, &v.namespace, &v.name).await?;
    }
    Ok(written)
}

/// The gang scheduler this gang's pods are wired to: none without a
/// `schedulingPolicy`; where the policy asks for one the cluster does not
/// serve, none and a `GangSchedulerMissing` warning Event.
async fn gang_wiring(ctx: &Context, v: &ValidatedJob<'_>) -> Result<Option<gang::Wiring>> {
    let Some(policy) = v.spec().run_policy.scheduling_policy.as_ref() else {
        return Ok(None);
    };
    let served = ctx.gang.served(&ctx.client).await?;
    match gang::choose(policy, served) {
        Ok(w) => Ok(w),
        Err(why) => {
            let e = EventSpec {
                warning: true,
                reason: reasons::GANG_SCHEDULER_MISSING.into(),
                note: why,
            };
            ctx.event(v.job, &e).await;
            Ok(None)
        }
    }
}

/// Pods with the job's labels that another job (an earlier one of the same
/// name, deleted with `--cascade=orphan`) controls are deleted, never
/// adopted; a rank whose name such a pod still holds is created once it
/// is gone.
pub(super) async fn remove_foreign(
    ctx: &Context,
    v: &ValidatedJob<'_>,
    obs: &Observed,
    d: &mut Decision,
) -> Result<()> {
    if obs.foreign.is_empty() {
        return Ok(());
    }
    let taken: Vec<&str> = obs.foreign.iter().map(|p| p.name.as_str()).collect();
    let before = d.create_ranks.len();
    d.create_ranks
        .retain(|&r| !taken.contains(&names::pod_name(&v.name, r).as_str()));
    if d.create_ranks.len() != before {
        d.requeue(Duration::from_secs(1));
    }
    let stale = fetch::names_where(&obs.foreign, |p| !p.deleting);
    if stale.is_empty() {
        return Ok(());
    }
    apply::delete_pods(&ctx.client, &v.namespace, &stale).await?;
    let e = EventSpec {
        warning: true,
        reason: reasons::FOREIGN_PODS.into(),
        note: format!(
            "deleted pod(s) {} carrying this job's labels but not created by it (an earlier job of the same name?)",
            stale.join(", ")
        ),
    };
    ctx.event(v.job, &e).await;
    Ok(())
}

/// A gang that is still there whose plan ConfigMap was deleted or
/// overwritten with something unusable: the plan the job's status records
/// is written back at its own generation (the trainers hold it already, so
/// nothing switches), with a warning Event; later plans number on from it.
pub(super) async fn restore_plan(
    ctx: &Context,
    v: &ValidatedJob<'_>,
    obs: &Observed,
    d: &Decision,
) -> Result<Option<BatchPlan>> {
    if d.delete_job || d.complete || obs.pods.is_empty() {
        return Ok(None);
    }
    let Some(p) = plan::from_status(v) else {
        return Ok(None);
    };
    plan::write(&ctx.client, v, &p).await?;
    let e = EventSpec {
        warning: true,
        reason: reasons::PLAN_RESTORED.into(),
        note: format!(
            "the plan ConfigMap {}-plan was {}; restored generation {} {:?} from the job's status",
            v.name,
            if obs.plan.exists {
                "unusable"
            } else {
                "missing"
            },
            p.generation,
            p.batch_sizes
        ),
    };
    ctx.event(v.job, &e).await;
    Ok(Some(p))
}
