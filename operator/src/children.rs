//! The jobs' children in memory: a compact cache of the rank pods and a
//! reflector store of the plan ConfigMaps the operator manages (the
//! `managed-by` label), one pair per watched scope, fed by the very watch
//! streams that trigger reconciles (so a reconcile a pod change wakes sees
//! that change). A reconcile reads its job's pods and plan from here, with
//! no request to the API server.
//!
//! Pods are cached as what the operator decides on ([`RankPod`], a few
//! hundred bytes) and indexed by namespace and job, so thousands of pods
//! cost little memory and a reconcile reads only its own job's.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use heterotrain_crds::labels;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::ResourceExt;
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::fetch::{split_by_owner, Observed, RankPod};
use crate::names;
use crate::plan;

/// How long a reconcile waits for a scope's first list.
const READY_WAIT: Duration = Duration::from_secs(30);

/// `(namespace, job)`.
type JobRef = (String, String);

/// Rank pods by namespace and job label, reduced to [`RankPod`]s, kept
/// up to date by [`PodCache::apply`] from a pod watch.
pub struct PodCache {
    jobs: RwLock<HashMap<JobRef, BTreeMap<String, RankPod>>>,
    /// Pods of a (re-)list in progress, swapped in when it is done.
    relist: Mutex<HashMap<JobRef, BTreeMap<String, RankPod>>>,
    ready: watch::Sender<bool>,
}

impl Default for PodCache {
    fn default() -> PodCache {
        PodCache {
            jobs: RwLock::default(),
            relist: Mutex::default(),
            ready: watch::channel(false).0,
        }
    }
}

/// Where a pod goes in the cache: its namespace and job label.
fn job_of(pod: &Pod) -> Option<JobRef> {
    Some((
        pod.metadata.namespace.clone()?,
        pod.labels().get(labels::JOB)?.clone(),
    ))
}

impl PodCache {
    /// Fold one watch event in.
    pub fn apply(&self, event: &watcher::Event<Pod>) {
        match event {
            watcher::Event::Apply(pod) => {
                let Some(key) = job_of(pod) else { return };
                if let Ok(mut jobs) = self.jobs.write() {
                    let p = RankPod::from_pod(pod);
                    jobs.entry(key).or_default().insert(p.name.clone(), p);
                }
            }
            watcher::Event::Delete(pod) => {
                let Some(key) = job_of(pod) else { return };
                if let Ok(mut jobs) = self.jobs.write() {
                    if let Some(pods) = jobs.get_mut(&key) {
                        pods.remove(&pod.name_any());
                        if pods.is_empty() {
                            jobs.remove(&key);
                        }
                    }
                }
            }
            watcher::Event::Init => {
                self.relist.lock().map(|mut r| r.clear()).ok();
            }
            watcher::Event::InitApply(pod) => {
                let Some(key) = job_of(pod) else { return };
                if let Ok(mut r) = self.relist.lock() {
                    let p = RankPod::from_pod(pod);
                    r.entry(key).or_default().insert(p.name.clone(), p);
                }
            }
            watcher::Event::InitDone => {
                let listed = self
                    .relist
                    .lock()
                    .map(|mut r| std::mem::take(&mut *r))
                    .unwrap_or_default();
                if let Ok(mut jobs) = self.jobs.write() {
                    *jobs = listed;
                }
                self.ready.send_replace(true);
            }
        }
    }

    /// The pods of job `job` in `namespace`.
    pub fn of_job(&self, namespace: &str, job: &str) -> Vec<RankPod> {
        let key = (namespace.to_string(), job.to_string());
        self.jobs
            .read()
            .ok()
            .and_then(|j| j.get(&key).map(|p| p.values().cloned().collect()))
            .unwrap_or_default()
    }

    /// Pods cached, over all jobs.
    pub fn len(&self) -> usize {
        self.jobs
            .read()
            .map(|j| j.values().map(BTreeMap::len).sum())
            .unwrap_or(0)
    }

    /// Whether no pod is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wait until the first list is in.
    async fn wait_until_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }
}

/// The caches of one watched scope (`None`: every namespace).
#[derive(Clone)]
struct Scope {
    namespace: Option<String>,
    pods: Arc<PodCache>,
    configmaps: Store<ConfigMap>,
}

/// The caches of every scope this replica watches.
#[derive(Default)]
pub struct Children {
    scopes: RwLock<Vec<Scope>>,
}

impl Children {
    /// No scope yet.
    pub fn new() -> Children {
        Children::default()
    }

    /// Use `pods` and `configmaps` for jobs in `namespace` (all when `None`).
    pub fn register(
        &self,
        namespace: Option<String>,
        pods: Arc<PodCache>,
        configmaps: Store<ConfigMap>,
    ) {
        if let Ok(mut s) = self.scopes.write() {
            s.retain(|sc| sc.namespace != namespace);
            s.push(Scope {
                namespace,
                pods,
                configmaps,
            });
        }
    }

    /// Forget every scope (the controllers stopped).
    pub fn clear(&self) {
        self.scopes.write().map(|mut s| s.clear()).ok();
    }

    fn scope(&self, namespace: &str) -> Option<Scope> {
        let scopes = self.scopes.read().ok()?;
        scopes
            .iter()
            .find(|s| s.namespace.as_deref().is_none_or(|n| n == namespace))
            .cloned()
    }

    /// The pods (by job label) and plan ConfigMap of the job `job` with UID
    /// `uid` in `namespace`, as the watch caches hold them; waits for a
    /// scope's first list.
    pub async fn observe(&self, namespace: &str, job: &str, uid: &str) -> Result<Observed> {
        let s = self
            .scope(namespace)
            .ok_or(Error::CacheNotReady("no watch covers the namespace"))?;
        let ready = async {
            s.pods.wait_until_ready().await;
            s.configmaps.wait_until_ready().await
        };
        match tokio::time::timeout(READY_WAIT, ready).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(Error::CacheNotReady("the watch stopped")),
            Err(_) => return Err(Error::CacheNotReady("first list still running")),
        }
        Ok(observed(&s.pods, &s.configmaps, namespace, job, uid))
    }
}

/// A job's children out of the caches.
fn observed(
    pods: &PodCache,
    configmaps: &Store<ConfigMap>,
    namespace: &str,
    job: &str,
    uid: &str,
) -> Observed {
    let plan_name = names::plan_configmap(job);
    let cm = configmaps.find(|c| {
        c.metadata.namespace.as_deref() == Some(namespace)
            && c.metadata.name.as_deref() == Some(plan_name.as_str())
    });
    let (pods, foreign) = split_by_owner(pods.of_job(namespace, job), uid);
    Observed {
        pods,
        foreign,
        plan: plan::read(cm.as_deref()),
    }
}

/// Drop the managed fields of a cached ConfigMap.
pub fn slim_configmap(cm: &mut ConfigMap) {
    cm.metadata.managed_fields = None;
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector::store;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn pod(ns: &str, name: &str, job: &str, uid: &str, rank: u32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": ns,
                "labels": {labels::JOB: job, labels::RANK: rank.to_string()},
                "ownerReferences": [{"apiVersion": "heterotrain.dev/v1alpha1",
                    "kind": "HeteroTrainingJob", "name": job, "uid": uid, "controller": true}]
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "trainer", "image": "i"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1"}
        }))
        .expect("pod")
    }

    fn names(pods: &[RankPod]) -> Vec<&str> {
        pods.iter().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn a_job_sees_its_own_pods_and_plan_only() {
        let cache = PodCache::default();
        let (cms, mut cw) = store::<ConfigMap>();
        cache.apply(&Event::Init);
        for p in [
            pod("a", "j-0", "j", "u1", 0),
            pod("a", "j-1", "j", "u1", 1),
            pod("a", "k-0", "k", "u2", 0),
            pod("b", "j-0", "j", "u3", 0),
            pod("a", "j-old", "j", "u0", 1),
        ] {
            cache.apply(&Event::InitApply(p));
        }
        assert!(cache.is_empty(), "nothing shows before the list is done");
        cache.apply(&Event::InitDone);
        assert_eq!(cache.len(), 5);
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": names::plan_configmap("j"), "namespace": "a"},
            "data": {"plan.json": "{}"}
        }))
        .expect("cm");
        cw.apply_watcher_event(&Event::Apply(cm));
        let o = observed(&cache, &cms, "a", "j", "u1");
        assert_eq!(names(&o.pods), ["j-0", "j-1"]);
        assert_eq!(names(&o.foreign), ["j-old"], "the old job's pod is foreign");
        assert_eq!(o.pods[0].node_name.as_deref(), Some("n1"));
        assert_eq!(o.pods[0].pod_ip.as_deref(), Some("10.0.0.1"));
        assert_eq!(o.pods[0], RankPod::from_pod(&pod("a", "j-0", "j", "u1", 0)));
        assert!(o.plan.exists);
        let other = observed(&cache, &cms, "b", "j", "u3");
        assert_eq!(other.pods.len(), 1);
        assert!(
            !other.plan.exists,
            "a plan in another namespace is not this job's"
        );
    }

    #[test]
    fn changes_deletes_and_a_relist_are_folded_in() {
        let cache = PodCache::default();
        cache.apply(&Event::Init);
        cache.apply(&Event::InitApply(pod("a", "j-0", "j", "u", 0)));
        cache.apply(&Event::InitDone);
        let mut failed = pod("a", "j-0", "j", "u", 0);
        failed.status.as_mut().expect("status").phase = Some("Failed".into());
        cache.apply(&Event::Apply(failed));
        cache.apply(&Event::Apply(pod("a", "j-1", "j", "u", 1)));
        let now = cache.of_job("a", "j");
        assert_eq!(names(&now), ["j-0", "j-1"]);
        assert_eq!(now[0].phase, crate::fetch::Phase::Failed);
        cache.apply(&Event::Delete(pod("a", "j-0", "j", "u", 0)));
        assert_eq!(names(&cache.of_job("a", "j")), ["j-1"]);
        // A re-list (the watch restarted) replaces everything: j-1 went
        // while the watch was down, j-2 came.
        cache.apply(&Event::Init);
        cache.apply(&Event::InitApply(pod("a", "j-2", "j", "u", 2)));
        assert_eq!(
            names(&cache.of_job("a", "j")),
            ["j-1"],
            "old state until done"
        );
        cache.apply(&Event::InitDone);
        assert_eq!(names(&cache.of_job("a", "j")), ["j-2"]);
        assert_eq!(cache.len(), 1);
    }

    #[tokio::test]
    async fn a_namespace_without_a_watch_is_an_error_not_an_empty_job() {
        let c = Children::new();
        let (cms, _cw) = store::<ConfigMap>();
        c.register(Some("a".into()), Arc::new(PodCache::default()), cms);
        let e = c.observe("b", "j", "u").await.expect_err("no scope");
        assert!(matches!(e, Error::CacheNotReady(_)), "{e}");
        assert!(e.is_transient());
    }
}
