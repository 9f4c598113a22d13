//! One reconcile of one job, as a pipeline of stages: guard → validate →
//! fetch → lifecycle → apply (build, plan, deletes, Events) → balance →
//! status. Each stage lives in its own module; this file only wires them,
//! and the effects they need beyond their modules are in `effects.rs`.

mod effects;

use std::sync::Arc;
use std::time::{Duration, Instant};

use heterotrain_crds::{BatchPlan, HeteroTrainingJob};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::DynamicObject;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use tracing::{instrument, warn};

use effects::{
    apply_decision, refuse, refused, remember, remove_foreign, report_refusal, restore_plan,
};

use crate::conditions::reasons;
use crate::context::Context;
use crate::error::Result;
use crate::events::{self, EventSpec};
use crate::fetch::Observed;
use crate::lifecycle::{self, Decision};
use crate::metrics::stages;
use crate::rebalance::JobKey;
use crate::status::{self, Extras};
use crate::validate::{self, Checked, ValidatedJob};
use crate::{guard, plan};

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
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let fresher = fresher(ctx, job, &uid);
    let job = fresher.as_ref().unwrap_or(job);
    let v = match validate::check(job, ctx.config.admission())? {
        Checked::Valid(v) => v,
        Checked::Invalid {
            namespace,
            problems,
        } => return refuse(ctx, job, &namespace, &problems, &now).await,
    };
    let run = Run {
        ctx,
        key: JobKey::of(&v),
        v: &v,
        uid: &uid,
        now,
    };
    let mut status = status::Writer::new(&ctx.client, job, &v.namespace);
    let mut clock = StageClock::start();
    let obs = ctx.children.observe(&v.namespace, &v.name, v.uid()).await?;
    let mut d = lifecycle::decide(&v, &obs, &now);
    remove_foreign(ctx, &v, &obs, &mut d).await?;
    clock.lap(stages::FETCH);
    let plan_now = match plan::current(&v, &obs.plan) {
        Some(p) => Some(p),
        None => restore_plan(ctx, &v, &obs, &d).await?,
    };
    let extras = ctx
        .rebalancer
        .carry(&run.key, Extras::with_plan(plan_now.clone()));
    let phase_counted = run
        .record_before_apply(&d, &obs, &extras, &mut status)
        .await?;
    let written = run.apply(&mut d, &obs, plan_now.as_ref()).await?;
    if d.delete_job {
        ctx.rebalancer.forget(&run.key);
        ctx.collector.forget(&run.key);
        return Ok(Action::await_change());
    }
    clock.lap(stages::APPLY);
    let extras = run.balance(&d, &obs, extras, written, plan_now).await;
    clock.lap(stages::BALANCE);
    let patched = status
        .write(status::next(&v, &d, &obs, &extras, &Time(now)))
        .await?;
    if patched {
        remember(ctx, &run.key, &uid, &status);
    }
    let was = v.job.status.as_ref().and_then(|s| s.phase.as_deref());
    if was != Some(d.phase.as_str()) && !phase_counted {
        ctx.metrics.entered(&v.namespace, d.phase.as_str());
    }
    clock.lap(stages::STATUS);
    clock.report(ctx, patched);
    Ok(requeue(ctx, &d))
}

/// The job with the status this replica last wrote, when the watched copy
/// has not caught up with it yet (decide from the newer one).
fn fresher(ctx: &Context, job: &HeteroTrainingJob, uid: &str) -> Option<HeteroTrainingJob> {
    let s = ctx.status_ahead_of(&JobKey::of_job(job), uid, job.status.as_ref())?;
    let mut j = job.clone();
    j.status = Some(s);
    Some(j)
}

/// One reconcile of a valid job: what its stages share.
struct Run<'a> {
    ctx: &'a Context,
    v: &'a ValidatedJob<'a>,
    key: JobKey,
    uid: &'a str,
    now: Timestamp,
}

impl Run<'_> {
    /// A restart is counted, and an end (Failed, Succeeded) recorded,
    /// before the pods go: a retry, or a reconcile woken by their deletion,
    /// then never takes the deletion for a disruption. Returns whether the
    /// new phase was counted (as soon as it is written: whoever reads the
    /// new phase also finds it counted).
    async fn record_before_apply(
        &self,
        d: &Decision,
        obs: &Observed,
        extras: &Extras,
        status: &mut status::Writer<'_>,
    ) -> Result<bool> {
        let (ctx, v) = (self.ctx, self.v);
        if !(d.restarts != v.gang() || (d.complete && !d.delete_pods.is_empty())) {
            return Ok(false);
        }
        if status
            .write(status::next(v, d, obs, extras, &Time(self.now)))
            .await?
        {
            remember(ctx, &self.key, self.uid, status);
        }
        let was = v.job.status.as_ref().and_then(|s| s.phase.as_deref());
        let counted = was != Some(d.phase.as_str());
        if counted {
            ctx.metrics.entered(&v.namespace, d.phase.as_str());
        }
        if d.restarts != v.gang() {
            ctx.metrics
                .restarted(&v.namespace, d.restarts.saturating_sub(v.gang()));
        }
        Ok(counted)
    }

    /// Carries out the decision ([`apply_decision`]); returns the plan it
    /// wrote. The API server refusing the job's objects (a ResourceQuota, a
    /// LimitRange, an admission policy) is not an error: retrying at once
    /// cannot help, so the status says why and the job is tried again in a
    /// minute.
    async fn apply(
        &self,
        d: &mut Decision,
        obs: &Observed,
        plan_now: Option<&BatchPlan>,
    ) -> Result<Option<BatchPlan>> {
        match apply_decision(self.ctx, self.v, d, obs, plan_now).await {
            Ok(w) => {
                self.ctx.accepted(&self.key);
                Ok(w)
            }
            Err(e) => match refused(&e) {
                Some(why) => {
                    report_refusal(self.ctx, self.v, &self.key, d, why).await;
                    Ok(None)
                }
                None => Err(e),
            },
        }
    }

    /// A balancing round when the lifecycle asks for one; else the figures
    /// carried, with the plan just written.
    async fn balance(
        &self,
        d: &Decision,
        obs: &Observed,
        mut extras: Extras,
        written: Option<BatchPlan>,
        plan_now: Option<BatchPlan>,
    ) -> Extras {
        if d.balance {
            let base = Extras::with_plan(written.or(plan_now));
            let deps = self.ctx.rebalance_deps();
            return self.ctx.rebalancer.round(&deps, self.v, obs, base).await;
        }
        if written.is_some() {
            extras.plan = written;
        }
        extras
    }
}

/// How long each stage of one reconcile took.
struct StageClock {
    start: Instant,
    last: Duration,
    laps: Vec<(&'static str, Duration)>,
}

impl StageClock {
    fn start() -> Self {
        Self {
            start: Instant::now(),
            last: Duration::ZERO,
            laps: Vec::new(),
        }
    }

    /// Ends the stage `name`.
    fn lap(&mut self, name: &'static str) {
        let now = self.start.elapsed();
        self.laps.push((name, now - self.last));
        self.last = now;
    }

    /// The stages' durations as metrics and one debug line.
    fn report(&self, ctx: &Context, patched: bool) {
        for &(name, d) in &self.laps {
            ctx.metrics.stage(name, d.as_secs_f64());
        }
        let ms = |name: &str| {
            self.laps
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(0, |(_, d)| d.as_millis() as u64)
        };
        tracing::debug!(
            fetch_ms = ms(stages::FETCH),
            apply_ms = ms(stages::APPLY),
            balance_ms = ms(stages::BALANCE),
            status_ms = ms(stages::STATUS),
            patched,
            "reconcile timing"
        );
    }
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
