//! One reconcile of one job, as a pipeline of stages: guard → validate →
//! fetch → lifecycle → apply (build, plan, deletes, Events) → balance →
//! status. Each stage lives in its own module; this file only wires them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use heterotrain_crds::{labels, BatchPlan, HeteroTrainingJob};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::{instrument, warn};

use crate::build::{self, BuildInputs};
use crate::conditions::{reasons, types, Desired};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::events::{self, EventSpec};
use crate::fetch::{self, Observed};
use crate::lifecycle::{self, Decision};
use crate::metrics::stages;
use crate::names;
use crate::rebalance::JobKey;
use crate::status::{self, Extras};
use crate::validate::{self, Checked, ValidatedJob};
use crate::{apply, gang, guard, plan};

/// Reconcile one watched object.
#[instrument(skip_all, fields(job = %obj.name_any(), ns = obj.namespace().unwrap_or_default()))]
pub async fn reconcile(obj: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_timer();
    let job = match guard::typed(&obj) {
        Ok(j) => j,
        Err(e) => {
            warn!(error = %e, "skipping malformed object");
            ctx.metrics.error(e.metric_label());
            let ev = events::event(&EventSpec {
                warning: true,
                reason: reasons::MALFORMED.into(),
                note: e.to_string(),
            });
            let _ = ctx
                .recorder
                .publish(&ev, &obj.object_ref(&guard::api_resource()))
                .await;
            return Ok(Action::await_change());
        }
    };
    let key = JobKey::of_job(&job);
    if job.metadata.deletion_timestamp.is_some() {
        ctx.rebalancer.forget(&key);
        ctx.collector.forget(&key);
        return Ok(Action::await_change());
    }
    let action = reconcile_job(&job, &ctx).await?;
    ctx.succeeded(&key);
    Ok(action)
}

/// The pipeline. Status is patched once, at the end, except that a gang
/// restart is counted in status before its pods are deleted (so a retry
/// never counts it twice); the final write then only patches what changed
/// since.
async fn reconcile_job(job: &HeteroTrainingJob, ctx: &Context) -> Result<Action> {
    let now = Timestamp::now();
    // Decide from the status this replica last wrote when the watched copy
    // has not caught up with it yet.
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let fresher;
    let job = match ctx.status_ahead_of(&JobKey::of_job(job), &uid, job.status.as_ref()) {
        Some(s) => {
            let mut j = job.clone();
            j.status = Some(s);
            fresher = j;
            &fresher
        }
        None => job,
    };
    let admission = ctx.config.admission();
    let v = match validate::check(job, admission)? {
        Checked::Valid(v) => v,
        Checked::Invalid {
            namespace,
            problems,
        } => return refuse(ctx, job, &namespace, &problems, &now).await,
    };
    let mut status = status::Writer::new(&ctx.client, job, &v.namespace);
    let t0 = Instant::now();
    let obs = ctx.children.observe(&v.namespace, &v.name, v.uid()).await?;
    let mut d = lifecycle::decide(&v, &obs, &now);
    remove_foreign(ctx, &v, &obs, &mut d).await?;
    let t_fetch = t0.elapsed();

    let key = JobKey::of(&v);
    let plan_now = match plan::current(&v, &obs.plan) {
        Some(p) => Some(p),
        None => restore_plan(ctx, &v, &obs, &d).await?,
    };
    let mut extras = ctx
        .rebalancer
        .carry(&key, Extras::with_plan(plan_now.clone()));
    // A restart is counted, and an end (Failed, Succeeded) recorded, before
    // the pods go: a retry, or a reconcile woken by their deletion, then
    // never takes the deletion for a disruption.
    let was = v.job.status.as_ref().and_then(|s| s.phase.as_deref());
    let mut phase_counted = false;
    if d.restarts != v.gang() || (d.complete && !d.delete_pods.is_empty()) {
        if status
            .write(status::next(&v, &d, &obs, &extras, &Time(now)))
            .await?
        {
            remember(ctx, &key, &uid, &status);
        }
        // Counted as soon as it is written: whoever reads the new phase
        // also finds it counted.
        if was != Some(d.phase.as_str()) {
            ctx.metrics.entered(&v.namespace, d.phase.as_str());
            phase_counted = true;
        }
        if d.restarts != v.gang() {
            ctx.metrics
                .restarted(&v.namespace, d.restarts.saturating_sub(v.gang()));
        }
    }
    let written = match apply_decision(ctx, &v, &d, &obs, plan_now.as_ref()).await {
        Ok(w) => {
            ctx.accepted(&key);
            w
        }
        Err(e) => match refused(&e) {
            // The API server refuses the job's objects (a ResourceQuota, a
            // LimitRange, an admission policy): retrying at once cannot
            // help; say why in the status and try again in a minute.
            Some(why) => {
                report_refusal(ctx, &v, &key, &mut d, why).await;
                None
            }
            None => return Err(e),
        },
    };
    if d.delete_job {
        ctx.rebalancer.forget(&key);
        ctx.collector.forget(&key);
        return Ok(Action::await_change());
    }
    let t_apply = t0.elapsed();

    if d.balance {
        let base = Extras::with_plan(written.or(plan_now));
        extras = ctx
            .rebalancer
            .round(&ctx.rebalance_deps(), &v, &obs, base)
            .await;
    } else if written.is_some() {
        extras.plan = written;
    }
    let t_balance = t0.elapsed();

    let patched = status
        .write(status::next(&v, &d, &obs, &extras, &Time(now)))
        .await?;
    if patched {
        remember(ctx, &key, &uid, &status);
    }
    if was != Some(d.phase.as_str()) && !phase_counted {
        ctx.metrics.entered(&v.namespace, d.phase.as_str());
    }
    let m = &ctx.metrics;
    m.stage(stages::FETCH, t_fetch.as_secs_f64());
    m.stage(stages::APPLY, (t_apply - t_fetch).as_secs_f64());
    m.stage(stages::BALANCE, (t_balance - t_apply).as_secs_f64());
    m.stage(stages::STATUS, (t0.elapsed() - t_balance).as_secs_f64());
    tracing::debug!(
        fetch_ms = t_fetch.as_millis() as u64,
        apply_ms = (t_apply - t_fetch).as_millis() as u64,
        balance_ms = (t_balance - t_apply).as_millis() as u64,
        status_ms = (t0.elapsed() - t_balance).as_millis() as u64,
        patched,
        "reconcile timing"
    );
    Ok(requeue(ctx, &d))
}

/// Record what `status` just wrote on job `key`.
fn remember(ctx: &Context, key: &JobKey, uid: &str, status: &status::Writer<'_>) {
    if let Some(s) = status.current() {
        ctx.wrote_status(key, uid, s);
    }
}

/// `HTTP <code>: <message>` when `e` is the API server refusing a write
/// for a reason a retry cannot fix (400, 403, 422).
fn refused(e: &Error) -> Option<String> {
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
async fn report_refusal(
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
async fn refuse(
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
async fn apply_decision(
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
async fn remove_foreign(
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
async fn restore_plan(
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

/// When to reconcile again: what the lifecycle asked for (5 minutes at the
/// latest), and every scrape interval while balancing.
fn requeue(ctx: &Context, d: &Decision) -> Action {
    let mut after = d.requeue_after.unwrap_or(Duration::from_secs(300));
    if d.balance {
        after = after.min(ctx.config.scrape_interval);
    }
    Action::requeue(after)
}
