//! The kube-runtime controller: watches `HeteroTrainingJob`s (through the
//! deserialise [`guard`](crate::guard)), owns Pods, the Service and the plan
//! ConfigMap, and runs the reconcile pipeline. [`run`] waits for the CRD,
//! takes part in leader election and reconciles only while leading.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use heterotrain_crds::HeteroTrainingJob;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch;
use tracing::{info, instrument, warn, Instrument};

use crate::balance::split_from_profiles;
use crate::build::{self, BuildInputs};
use crate::config::OperatorConfig;
use crate::error::{Error, Result};
use crate::leader::LeaderElector;
use crate::lifecycle::{self, EventSpec};
use crate::metrics::Metrics;
use crate::names::labels;
use crate::rebalance::{self, JobState};
use crate::scrape::Scraper;
use crate::status::{self, Extras};
use crate::validate;
use crate::{apply, fetch, guard, profile_cache};

/// Shared state of one operator replica.
pub struct Context {
    pub client: Client,
    pub config: OperatorConfig,
    pub metrics: Metrics,
    pub recorder: Recorder,
    pub scraper: Scraper,
    /// Balancing state per job (`namespace/name`).
    pub(crate) jobs: Mutex<HashMap<String, JobState>>,
    failures: Mutex<HashMap<String, u32>>,
    /// The CRD was found (for `/readyz`).
    pub ready: AtomicBool,
}

impl Context {
    /// A context for `client` (whose identity the operator acts as).
    pub fn new(client: Client, config: OperatorConfig, metrics: Metrics) -> Arc<Context> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: labels::MANAGER.into(),
                instance: Some(config.identity.clone()),
            },
        );
        Arc::new(Context {
            scraper: Scraper::new(config.scrape_timeout),
            client,
            config,
            metrics,
            recorder,
            jobs: Mutex::new(HashMap::new()),
            failures: Mutex::new(HashMap::new()),
            ready: AtomicBool::new(false),
        })
    }

    /// Publish an Event on `job` (failures are logged, never fatal).
    pub async fn event(&self, job: &HeteroTrainingJob, e: &EventSpec) {
        let ev = Event {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.clone(),
            note: Some(e.note.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&ev, &job.object_ref(&())).await {
            warn!(job = %job.name_any(), error = %err, "publishing event failed");
        }
    }
}

fn key(job: &HeteroTrainingJob) -> String {
    format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any())
}

/// Reconcile one watched object.
#[instrument(skip_all, fields(job = %obj.name_any(), ns = obj.namespace().unwrap_or_default()))]
pub async fn reconcile(obj: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_timer();
    let job = match guard::typed(&obj) {
        Ok(j) => j,
        Err(e) => {
            warn!(error = %e, "skipping malformed object");
            ctx.metrics.error(e.metric_label());
            let ev = Event {
                type_: EventType::Warning,
                reason: crate::conditions::reasons::MALFORMED.into(),
                note: Some(e.to_string().chars().take(1000).collect()),
                action: "Reconcile".into(),
                secondary: None,
            };
            let _ = ctx
                .recorder
                .publish(&ev, &obj.object_ref(&guard::api_resource()))
                .await;
            return Ok(Action::await_change());
        }
    };
    if job.metadata.deletion_timestamp.is_some() {
        ctx.jobs.lock().map(|mut j| j.remove(&key(&job))).ok();
        return Ok(Action::await_change());
    }
    let action = reconcile_job(&job, &ctx).await?;
    ctx.failures.lock().map(|mut f| f.remove(&key(&job))).ok();
    Ok(action)
}

async fn reconcile_job(job: &HeteroTrainingJob, ctx: &Context) -> Result<Action> {
    let client = &ctx.client;
    let now = Timestamp::now();
    let now_t = Time(now);
    let name = job.name_any();
    let ns = job
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;

    // Validate.
    if let Err(problems) =
        validate::validate(&name, &job.spec, ctx.config.prometheus_url.as_deref())
    {
        let msg = validate::summary(&problems);
        let next = status::invalid(job, &msg, &now_t);
        if status::patch_if_changed(client, job, &next).await? {
            ctx.event(
                job,
                &EventSpec {
                    warning: true,
                    reason: "Invalid".into(),
                    note: msg,
                },
            )
            .await;
        }
        ctx.metrics.error("invalid");
        return Ok(Action::await_change());
    }

    // Fetch and decide.
    let t_start = std::time::Instant::now();
    let obs = fetch::fetch(client, &ns, &name).await?;
    let t_fetch = t_start.elapsed();
    let d = lifecycle::decide(job, &obs, &now);
    let plan_now = obs.plan.clone().filter(|p| {
        p.validate_for(
            job.spec.world_size() as usize,
            job.spec.training.global_batch_size,
        )
        .is_ok()
    });
    let base = Extras {
        plan: plan_now.clone(),
        ..Default::default()
    };
    if d.restarts != job.status.as_ref().map_or(0, |s| s.restarts) {
        // Count the restart before touching pods, so a retry never counts twice.
        status::patch_if_changed(client, job, &status::next(job, &d, &obs, &base, &now_t)).await?;
    }

    // Apply.
    apply::delete_pods(client, &ns, &d.delete_pods).await?;
    let mut plan_written = None;
    if !d.create_ranks.is_empty() {
        let initial = initial_plan(ctx, job, plan_now.as_ref(), obs.plan_generation).await;
        let desired = build::desired(
            job,
            &BuildInputs {
                default_image: ctx.config.trainer_image.clone(),
                restart_count: d.restarts,
                initial_plan: initial.clone(),
            },
        )?;
        apply::service(client, &ns, &desired.service).await?;
        if plan_now.is_none() {
            apply::plan(client, &ns, &desired.plan).await?;
            plan_written = Some(initial);
        }
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
            .map(|pod| apply::pod(client, &ns, pod));
        futures::future::try_join_all(creates).await?;
    }
    for e in &d.events {
        ctx.event(job, e).await;
    }
    if d.delete_job {
        apply::delete_job(client, job).await?;
        ctx.jobs.lock().map(|mut j| j.remove(&key(job))).ok();
        return Ok(Action::await_change());
    }

    let t_apply = t_start.elapsed();
    // Balance.
    let mut extras = Extras {
        plan: plan_written.or(plan_now),
        ..Default::default()
    };
    if d.balance {
        extras = rebalance::round(ctx, job, &obs, extras).await;
    } else if let Ok(jobs) = ctx.jobs.lock() {
        if let Some(s) = jobs.get(&key(job)) {
            extras = s.carry(extras);
        }
    }

    let t_balance = t_start.elapsed();
    // Status.
    let next = status::next(job, &d, &obs, &extras, &now_t);
    let patched = status::patch_if_changed(client, job, &next).await?;
    tracing::debug!(
        fetch_ms = t_fetch.as_millis() as u64,
        apply_ms = (t_apply - t_fetch).as_millis() as u64,
        balance_ms = (t_balance - t_apply).as_millis() as u64,
        status_ms = (t_start.elapsed() - t_balance).as_millis() as u64,
        patched,
        "reconcile timing"
    );

    let mut requeue = d.requeue_after.unwrap_or(Duration::from_secs(300));
    if d.balance {
        requeue = requeue.min(ctx.config.scrape_interval);
    }
    Ok(Action::requeue(requeue))
}

/// Plan generation 0 (or the next generation after an unusable stored
/// plan): a split of cached profiles when every rank has one, else equal.
async fn initial_plan(
    ctx: &Context,
    job: &HeteroTrainingJob,
    current: Option<&heterotrain_crds::BatchPlan>,
    stored_generation: Option<u64>,
) -> heterotrain_crds::BatchPlan {
    if let Some(p) = current {
        return p.clone();
    }
    let spec = &job.spec;
    let generation = stored_generation.map_or(0, |g| g + 1);
    let mut plan = heterotrain_crds::BatchPlan::equal(
        generation,
        spec.training.global_batch_size,
        spec.world_size() as usize,
    );
    if ctx.config.profile_cache
        && spec.load_balancing.policy != heterotrain_crds::BalancePolicy::Static
    {
        if let Ok(cache) = profile_cache::load(&ctx.client, &ctx.config.operator_namespace).await {
            if let Some(profiles) = profile_cache::lookup(spec, &cache) {
                if let Some((batches, reason)) = split_from_profiles(spec, &profiles) {
                    plan.batch_sizes = batches;
                    plan.policy = "proportional".into();
                    plan.reason = format!("cached profiles: {reason}");
                }
            }
        }
    }
    plan
}

/// Requeue with exponential backoff (1 s … 60 s) on transient errors.
pub fn error_policy(obj: Arc<DynamicObject>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(err.metric_label());
    warn!(job = %obj.name_any(), error = %err, "reconcile failed");
    if !err.is_transient() {
        return Action::await_change();
    }
    let k = format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any());
    let n = ctx
        .failures
        .lock()
        .map(|mut f| {
            let n = f.entry(k).or_insert(0);
            *n = n.saturating_add(1);
            *n
        })
        .unwrap_or(1);
    Action::requeue(Duration::from_secs(1u64 << n.min(6).saturating_sub(1)))
}

/// Wait until the CRD is installed and established, with a clear hint.
pub async fn wait_for_crd(client: &Client, timeout: Duration) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + timeout;
    let mut hinted = false;
    loop {
        match api.get_opt("heterotrainingjobs.heterotrain.dev").await {
            Ok(Some(crd)) if established(&crd) => return Ok(()),
            Ok(_) => {
                if !hinted {
                    warn!("{}", Error::CrdMissing);
                    hinted = true;
                }
            }
            Err(e) => warn!(error = %e, "reading the CRD failed"),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::CrdMissing);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn established(crd: &CustomResourceDefinition) -> bool {
    crd.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        })
}

/// Run the controller until `stop` resolves.
pub async fn run_controller(
    ctx: Arc<Context>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let ar = guard::api_resource();
    let jobs: Api<DynamicObject> = match &ctx.config.watch_namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let owned =
        watcher::Config::default().labels(&format!("{}={}", labels::MANAGED_BY, labels::MANAGER));
    macro_rules! api {
        ($t:ty) => {
            match &ctx.config.watch_namespace {
                Some(ns) => Api::<$t>::namespaced(client.clone(), ns),
                None => Api::<$t>::all(client.clone()),
            }
        };
    }
    Controller::new_with(jobs, watcher::Config::default(), ar)
        .with_config(
            kube::runtime::controller::Config::default().concurrency(ctx.config.concurrency),
        )
        .owns(api!(Pod), owned.clone())
        .owns(api!(Service), owned.clone())
        .owns(api!(ConfigMap), owned)
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await;
}

/// Run the operator: wait for the CRD, then reconcile while holding the
/// leader Lease, until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    wait_for_crd(&ctx.client, ctx.config.crd_wait).await?;
    ctx.ready.store(true, Ordering::SeqCst);
    info!(identity = %ctx.config.identity, "CRD found; joining leader election");
    let elector = LeaderElector::new(&ctx.client, &ctx.config);
    let mut stop = stop_rx.clone();
    while !*stop.borrow() {
        if !elector.wait_until_leader(stop_rx.clone()).await {
            break;
        }
        ctx.metrics.leader.set(1);
        info!(identity = %ctx.config.identity, "leading: starting the controller");
        let (lost_tx, lost_rx) = watch::channel(false);
        let renew = elector.keep_leading(stop_rx.clone(), lost_tx);
        let ctl_stop = {
            let mut lost = lost_rx.clone();
            let mut s = stop_rx.clone();
            async move {
                tokio::select! {
                    _ = lost.wait_for(|v| *v) => {},
                    _ = s.wait_for(|v| *v) => {},
                }
            }
        };
        let ctl = tokio::spawn(
            run_controller(ctx.clone(), ctl_stop).instrument(tracing::info_span!("controller")),
        );
        renew.await;
        let _ = ctl.await;
        ctx.metrics.leader.set(0);
        ctx.jobs.lock().map(|mut j| j.clear()).ok();
        if *stop.borrow_and_update() {
            elector.release().await;
            break;
        }
        warn!(identity = %ctx.config.identity, "lost the leader Lease; standing by");
    }
    Ok(())
}
