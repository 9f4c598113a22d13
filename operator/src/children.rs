//! The jobs' children in memory: reflector stores of the pods and plan
//! ConfigMaps the operator manages (the `managed-by` label), one pair per
//! watched scope, fed by the very watch streams that trigger reconciles
//! (so a reconcile a pod change wakes sees that change). A reconcile reads
//! its job's pods and plan from here, with no request to the API server.
//!
//! Pods are kept slim ([`slim_pod`]): only what [`RankPod`] reads, so
//! thousands of pods cost little memory.

use std::sync::RwLock;
use std::time::Duration;

use heterotrain_crds::labels;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, PodSpec};
use kube::runtime::reflector::Store;
use kube::ResourceExt;

use crate::error::{Error, Result};
use crate::fetch::{split_by_owner, Observed, RankPod};
use crate::names;
use crate::plan;

/// How long a reconcile waits for a scope's first list.
const READY_WAIT: Duration = Duration::from_secs(30);

/// The stores of one watched scope (`None`: every namespace).
#[derive(Clone)]
struct Scope {
    namespace: Option<String>,
    pods: Store<Pod>,
    configmaps: Store<ConfigMap>,
}

/// The stores of every scope this replica watches.
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
        pods: Store<Pod>,
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
            s.pods.wait_until_ready().await?;
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

/// A job's children out of the stores.
fn observed(
    pods: &Store<Pod>,
    configmaps: &Store<ConfigMap>,
    namespace: &str,
    job: &str,
    uid: &str,
) -> Observed {
    let mine = pods.state_filter(|p| {
        p.metadata.namespace.as_deref() == Some(namespace)
            && p.labels().get(labels::JOB).map(String::as_str) == Some(job)
    });
    let plan_name = names::plan_configmap(job);
    let cm = configmaps.find(|c| {
        c.metadata.namespace.as_deref() == Some(namespace)
            && c.metadata.name.as_deref() == Some(plan_name.as_str())
    });
    let (pods, foreign) = split_by_owner(mine.iter().map(|p| RankPod::from_pod(p)).collect(), uid);
    Observed {
        pods,
        foreign,
        plan: plan::read(cm.as_deref()),
    }
}

/// Drop what the operator never reads of a pod before it is cached: the
/// managed fields and the whole spec but the node name. Status, labels,
/// annotations and owner references stay.
pub fn slim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    pod.spec = Some(PodSpec {
        node_name,
        containers: Vec::new(),
        ..PodSpec::default()
    });
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
                    "kind": "HeteroTrainingJob", "name": job, "uid": uid, "controller": true}],
                "managedFields": [{"manager": "x", "operation": "Apply"}]
            },
            "spec": {"nodeName": "n1", "containers": [{"name": "trainer", "image": "i"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1"}
        }))
        .expect("pod")
    }

    #[test]
    fn a_job_sees_its_own_pods_and_plan_only() {
        let (pods, mut pw) = store::<Pod>();
        let (cms, mut cw) = store::<ConfigMap>();
        let mut all = vec![
            pod("a", "j-0", "j", "u1", 0),
            pod("a", "j-1", "j", "u1", 1),
            pod("a", "k-0", "k", "u2", 0),
            pod("b", "j-0", "j", "u3", 0),
            pod("a", "j-old", "j", "u0", 1),
        ];
        all.iter_mut().for_each(slim_pod);
        pw.apply_watcher_event(&Event::Init);
        for p in &all {
            pw.apply_watcher_event(&Event::InitApply(p.clone()));
        }
        pw.apply_watcher_event(&Event::InitDone);
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": names::plan_configmap("j"), "namespace": "a"},
            "data": {"plan.json": "{}"}
        }))
        .expect("cm");
        cw.apply_watcher_event(&Event::Apply(cm));
        let o = observed(&pods, &cms, "a", "j", "u1");
        let mut names: Vec<_> = o.pods.iter().map(|p| p.name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["j-0", "j-1"]);
        assert_eq!(o.foreign.len(), 1, "the old job's pod is foreign");
        assert_eq!(o.pods[0].node_name.as_deref(), Some("n1"));
        assert_eq!(o.pods[0].pod_ip.as_deref(), Some("10.0.0.1"));
        assert!(o.plan.exists);
        let other = observed(&pods, &cms, "b", "j", "u3");
        assert_eq!(other.pods.len(), 1);
        assert!(
            !other.plan.exists,
            "a plan in another namespace is not this job's"
        );
    }

    #[test]
    fn slim_pods_keep_what_rank_pods_read() {
        let full = pod("a", "j-0", "j", "u1", 0);
        let mut slim = full.clone();
        slim_pod(&mut slim);
        assert!(slim.metadata.managed_fields.is_none());
        assert!(slim.spec.as_ref().is_some_and(|s| s.containers.is_empty()));
        assert_eq!(RankPod::from_pod(&full), RankPod::from_pod(&slim));
    }

    #[tokio::test]
    async fn a_namespace_without_a_watch_is_an_error_not_an_empty_job() {
        let c = Children::new();
        let (pods, _pw) = store::<Pod>();
        let (cms, _cw) = store::<ConfigMap>();
        c.register(Some("a".into()), pods, cms);
        let e = c.observe("b", "j", "u").await.expect_err("no scope");
        assert!(matches!(e, Error::CacheNotReady(_)), "{e}");
        assert!(e.is_transient());
    }
}
