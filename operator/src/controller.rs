//! The kube-runtime controller: watches `HeteroTrainingJob`s (through the
//! deserialise [`guard`](crate::guard)), owns Pods, the Service and the plan
//! ConfigMap, and runs the [`reconcile`](crate::reconcile) pipeline. [`run`]
//! waits for the CRD, takes part in leader election and reconciles only
//! while leading.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tracing::{error, info, warn, Instrument};

use crate::children::PodCache;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::guard;
use crate::leader::{LeaderElector, LeaseEnd};
use crate::rebalance::JobKey;
use crate::reconcile::reconcile;
use heterotrain_crds::labels;

/// Requeue with exponential backoff (1 s … 60 s) on transient errors.
pub fn error_policy(obj: Arc<DynamicObject>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(err.metric_label());
    warn!(job = %obj.name_any(), error = %err, "reconcile failed");
    if !err.is_transient() {
        return Action::await_change();
    }
    let n = ctx.failed(JobKey::new(
        &obj.namespace().unwrap_or_default(),
        &obj.name_any(),
    ));
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

/// Run the controllers until `stop` resolves: one per watched namespace
/// (each with its own watches, so a Role per namespace is all the RBAC it
/// needs), or one over all namespaces when none is given.
pub async fn run_controller(
    ctx: Arc<Context>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopper = async move {
        stop.await;
        let _ = stop_tx.send(true);
    };
    let scopes: Vec<Option<String>> = if ctx.config.watch_namespaces.is_empty() {
        vec![None]
    } else {
        ctx.config
            .watch_namespaces
            .iter()
            .cloned()
            .map(Some)
            .collect()
    };
    let controllers = scopes.into_iter().map(|ns| {
        let mut rx = stop_rx.clone();
        let span = tracing::info_span!("watch", namespace = ns.as_deref().unwrap_or("*"));
        run_scope(ctx.clone(), ns, async move {
            let _ = rx.wait_for(|v| *v).await;
        })
        .instrument(span)
    });
    futures::future::join(stopper, futures::future::join_all(controllers)).await;
}

/// One controller over namespace `ns` (all namespaces when `None`).
async fn run_scope(
    ctx: Arc<Context>,
    ns: Option<String>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let ar = guard::api_resource();
    let jobs: Api<DynamicObject> = match &ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let owned =
        watcher::Config::default().labels(&format!("{}={}", labels::MANAGED_BY, labels::MANAGER));
    macro_rules! api {
        ($t:ty) => {
            match &ns {
                Some(ns) => Api::<$t>::namespaced(client.clone(), ns),
                None => Api::<$t>::all(client.clone()),
            }
        };
    }
    // Pods and plan ConfigMaps are cached (a reconcile reads them from
    // memory) by the same streams that wake the jobs they belong to.
    let pods = Arc::new(PodCache::default());
    let (configmaps, cm_writer) = reflector::store::<ConfigMap>();
    ctx.children.register(ns.clone(), pods.clone(), configmaps);
    let scope = ns.clone().unwrap_or_else(|| "*".into());
    let pod_events = watcher(api!(Pod), owned.clone())
        .default_backoff()
        .inspect(health(&ctx, "pods", &scope))
        .inspect_ok(move |e| pods.apply(e))
        .touched_objects();
    let cm_events = watcher(api!(ConfigMap), owned.clone())
        .default_backoff()
        .inspect(health(&ctx, "configmaps", &scope))
        .modify(crate::children::slim_configmap)
        .reflect(cm_writer)
        .touched_objects();
    // The jobs' own watch, built here (not by the Controller) so that its
    // failures are seen too.
    let job_writer = reflector::store::Writer::<DynamicObject>::new(ar.clone());
    let job_store = job_writer.as_reader();
    let job_events = watcher(jobs, watcher::Config::default())
        .default_backoff()
        .inspect(health(&ctx, "heterotrainingjobs", &scope))
        .reflect(job_writer)
        .applied_objects();
    // A finished metrics read wakes its job (`rebalance::collect`).
    let (wake_tx, wake_rx) = futures::channel::mpsc::unbounded();
    ctx.collector.register(ns.clone(), ar.clone(), wake_tx);
    Controller::for_stream_with(job_events, job_store, ar)
        .with_config(
            kube::runtime::controller::Config::default()
                .concurrency(ctx.config.concurrency)
                .debounce(ctx.config.debounce),
        )
        .owns_stream(pod_events)
        .owns_stream(cm_events)
        .owns(api!(Service), owned)
        .reconcile_on(wake_rx)
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            match r {
                // Already logged, with the job, by `error_policy`.
                Err(e @ kube::runtime::controller::Error::ReconcilerFailed(..)) => {
                    tracing::debug!(error = %e, "controller event")
                }
                // A watch that fails leaves the operator on stale data
                // until it recovers (the watchers retry with back-off).
                Err(e) => warn!(error = %e, "watch or queue failed; retrying"),
                Ok(_) => {}
            }
        })
        .await;
}

/// Note each event or error of the `resource` watch over `scope` in the
/// context's [`WatchHealth`](crate::watch_health::WatchHealth), and count
/// errors.
fn health<T>(
    ctx: &Arc<Context>,
    resource: &'static str,
    scope: &str,
) -> impl FnMut(&Result<T, watcher::Error>) {
    let (ctx, name) = (ctx.clone(), format!("{resource} ({scope})"));
    move |r| {
        ctx.watch_health
            .observe(&name, r.is_ok(), std::time::Instant::now());
        if let Err(e) = r {
            ctx.metrics
                .watch_errors
                .get_or_create(&crate::metrics::ResourceLabel { resource })
                .inc();
            warn!(watch = %name, error = %e, "watch failed; retrying with back-off");
        }
    }
}

/// Run the operator: wait for the CRD, then reconcile while holding the
/// leader Lease, until `shutdown` resolves (`Ok`) or the Lease is lost
/// ([`Error::LeaseLost`]: the controller is aborted at once, so nothing more
/// is written, and the binary exits non-zero to be restarted as a standby),
/// or the controller itself ends while leading ([`Error::ControllerStopped`]:
/// the Lease is released and the binary exits non-zero, rather than hold
/// the Lease with nothing reconciling).
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
    if !elector.wait_until_leader(stop_rx.clone()).await {
        return Ok(());
    }
    ctx.metrics.leader.set(1);
    info!(identity = %ctx.config.identity, "leading: starting the controller");
    let (lost_tx, lost_rx) = watch::channel(false);
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
    let mut ctl = tokio::spawn(
        run_controller(ctx.clone(), ctl_stop).instrument(tracing::info_span!("controller")),
    );
    let leading = elector.keep_leading(stop_rx.clone(), lost_tx, &ctx.lease);
    tokio::pin!(leading);
    let (end, ctl_done) = tokio::select! {
        end = &mut leading => (Some(end), None),
        done = &mut ctl => (None, Some(done)),
    };
    // The controller ended first: on a stop or a lost Lease (both end it)
    // the Lease loop says which; otherwise it died while leading.
    let (end, died) = match (end, &ctl_done) {
        (Some(end), _) => (end, None),
        (None, _) if *stop_rx.borrow() || *lost_rx.borrow() => (leading.await, None),
        (None, done) => {
            let why = match done {
                Some(Err(e)) if e.is_panic() => format!("it panicked: {e}"),
                Some(Err(e)) => e.to_string(),
                _ => "it returned".to_string(),
            };
            (LeaseEnd::Stopped, Some(why))
        }
    };
    let lost = match end {
        LeaseEnd::Lost(why) => {
            // Stop writing now: no graceful drain of in-flight reconciles.
            ctl.abort();
            Some(why)
        }
        LeaseEnd::Stopped => {
            if ctl_done.is_none() {
                let _ = ctl.await;
            }
            None
        }
    };
    step_down(&ctx, &elector, lost, died).await
}

/// After leading: clears the job state, then exits with the Lease `lost`,
/// or releases it (the controller having `died`, or on a stop).
async fn step_down(
    ctx: &Context,
    elector: &LeaderElector,
    lost: Option<String>,
    died: Option<String>,
) -> Result<()> {
    ctx.lease.standing_by();
    ctx.metrics.leader.set(0);
    ctx.rebalancer.clear();
    ctx.collector.clear();
    ctx.children.clear();
    match (lost, died) {
        (Some(why), _) => {
            error!(
                identity = %ctx.config.identity,
                reason = %why,
                "lost the leader Lease; exiting so that the Deployment restarts this replica"
            );
            Err(Error::LeaseLost(why))
        }
        (None, Some(why)) => {
            error!(
                identity = %ctx.config.identity,
                reason = %why,
                "the controller stopped while leading; releasing the Lease and exiting so that the Deployment restarts this replica"
            );
            elector.release().await;
            Err(Error::ControllerStopped(why))
        }
        (None, None) => {
            elector.release().await;
            Ok(())
        }
    }
}
