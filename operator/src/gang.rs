//! Gang scheduling: which gang schedulers the cluster serves (asked of the
//! API server's discovery, remembered for [`DISCOVERY_TTL`]), which one a
//! job's `runPolicy.schedulingPolicy` gets, and — pure — the PodGroup and
//! the pod fields that wire a gang to it.
//!
//! Nothing here runs for a job without a `schedulingPolicy`, and a cluster
//! that serves none of the APIs gets pods exactly as without one (plus the
//! policy's `schedulerName` and `priorityClass`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use heterotrain_crds::{GangScheduler, SchedulingPolicy};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject};
use kube::core::ObjectMeta;
use kube::Client;

use crate::error::Result;
use crate::names::common_labels;
use crate::validate::ValidatedJob;

/// How long a discovery answer is trusted: a gang scheduler installed
/// while the operator runs is used from its next gang on, at most this
/// much later.
pub const DISCOVERY_TTL: Duration = Duration::from_secs(30);

/// Volcano's PodGroup API.
pub const VOLCANO_API: &str = "scheduling.volcano.sh/v1beta1";
/// scheduler-plugins' (coscheduling) PodGroup API.
pub const SCHEDULER_PLUGINS_API: &str = "scheduling.x-k8s.io/v1alpha1";
/// Kueue's API group (its LocalQueues admit plain-pod groups).
pub const KUEUE_API: &str = "kueue.x-k8s.io";
/// The Kueue versions that serve LocalQueues, newest first: any of them
/// means Kueue runs (plain-pod groups need only labels and an annotation,
/// the same in every version).
pub const KUEUE_VERSIONS: [&str; 3] = ["v1", "v1beta2", "v1beta1"];

/// Volcano's pod annotation naming the pod's PodGroup.
pub const VOLCANO_GROUP_ANNOTATION: &str = "scheduling.k8s.io/group-name";
/// The scheduler Volcano runs as.
pub const VOLCANO_SCHEDULER: &str = "volcano";
/// scheduler-plugins' pod label naming the pod's PodGroup.
pub const SCHEDULER_PLUGINS_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";
/// Kueue: the LocalQueue a pod is submitted to.
pub const KUEUE_QUEUE_LABEL: &str = "kueue.x-k8s.io/queue-name";
/// Kueue: the pod group a pod belongs to.
pub const KUEUE_GROUP_LABEL: &str = "kueue.x-k8s.io/pod-group-name";
/// Kueue: how many pods make the group.
pub const KUEUE_TOTAL_ANNOTATION: &str = "kueue.x-k8s.io/pod-group-total-count";

/// Which gang-scheduling APIs the cluster serves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Served {
    pub volcano: bool,
    pub scheduler_plugins: bool,
    pub kueue: bool,
}

/// How a gang is wired to a gang scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wiring {
    Volcano,
    SchedulerPlugins,
    Kueue,
}

/// The wiring `policy` gets where `served` is what the cluster serves:
/// `Ok(None)` when the policy asks for none (`gangScheduler: None`), and
/// `Err(why)` when it asks for one the cluster does not serve (the gang
/// is then created without wiring and `why` is a warning Event).
pub fn choose(
    policy: &SchedulingPolicy,
    served: Served,
) -> std::result::Result<Option<Wiring>, String> {
    let kueue_ok = served.kueue && policy.queue.is_some();
    let missing = |what: &str, api: &str| {
        Err(format!(
            "runPolicy.schedulingPolicy asks for {what}, but the cluster does not serve {api}; the gang is scheduled pod by pod (install it, or set gangScheduler: None)"
        ))
    };
    match policy.gang_scheduler {
        GangScheduler::None => Ok(None),
        GangScheduler::Volcano if served.volcano => Ok(Some(Wiring::Volcano)),
        GangScheduler::Volcano => missing("Volcano", &format!("{VOLCANO_API} podgroups")),
        GangScheduler::SchedulerPlugins if served.scheduler_plugins => {
            Ok(Some(Wiring::SchedulerPlugins))
        }
        GangScheduler::SchedulerPlugins => missing(
            "scheduler-plugins",
            &format!("{SCHEDULER_PLUGINS_API} podgroups"),
        ),
        GangScheduler::Kueue if kueue_ok => Ok(Some(Wiring::Kueue)),
        GangScheduler::Kueue => missing("Kueue", &format!("{KUEUE_API} localqueues")),
        GangScheduler::Auto if served.volcano => Ok(Some(Wiring::Volcano)),
        GangScheduler::Auto if served.scheduler_plugins => Ok(Some(Wiring::SchedulerPlugins)),
        GangScheduler::Auto if kueue_ok => Ok(Some(Wiring::Kueue)),
        GangScheduler::Auto => Err(format!(
            "runPolicy.schedulingPolicy is set, but the cluster serves no gang scheduler ({VOLCANO_API} or {SCHEDULER_PLUGINS_API} podgroups, or {KUEUE_API} localqueues with a queue set); the gang is scheduled pod by pod"
        )),
    }
}

/// The PodGroup's name: the job's.
pub fn pod_group_name(v: &ValidatedJob) -> String {
    v.name.clone()
}

/// `minAvailable`, or every rank.
pub fn min_member(v: &ValidatedJob, policy: &SchedulingPolicy) -> u32 {
    policy.min_available.unwrap_or(v.world_size)
}

/// The PodGroup API of `wiring` (none for Kueue, which needs no object).
pub fn pod_group_api(wiring: Wiring) -> Option<ApiResource> {
    let (group, version) = match wiring {
        Wiring::Volcano => ("scheduling.volcano.sh", "v1beta1"),
        Wiring::SchedulerPlugins => ("scheduling.x-k8s.io", "v1alpha1"),
        Wiring::Kueue => return None,
    };
    Some(ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: format!("{group}/{version}"),
        kind: "PodGroup".into(),
        plural: "podgroups".into(),
    })
}

/// The job's PodGroup under `wiring`, owned by the job (none for Kueue).
pub fn pod_group(
    v: &ValidatedJob,
    policy: &SchedulingPolicy,
    wiring: Wiring,
) -> Option<(ApiResource, DynamicObject)> {
    let api = pod_group_api(wiring)?;
    let mut spec = serde_json::Map::new();
    spec.insert("minMember".into(), min_member(v, policy).into());
    if wiring == Wiring::Volcano {
        if let Some(q) = &policy.queue {
            spec.insert("queue".into(), q.clone().into());
        }
        if let Some(p) = &policy.priority_class {
            spec.insert("priorityClassName".into(), p.clone().into());
        }
    }
    let mut obj = DynamicObject::new(&pod_group_name(v), &api).within(&v.namespace);
    obj.metadata = ObjectMeta {
        labels: Some(common_labels(&v.name)),
        owner_references: Some(vec![v.owner.clone()]),
        ..obj.metadata
    };
    obj.data = serde_json::json!({ "spec": spec });
    Some((api, obj))
}

/// Wire `pod` (a rank of `v`) to the gang scheduler: scheduler name,
/// priority class (where its group set none), and the group label or
/// annotation of `wiring`.
pub fn wire_pod(
    v: &ValidatedJob,
    policy: &SchedulingPolicy,
    wiring: Option<Wiring>,
    pod: &mut Pod,
) {
    let scheduler = policy
        .scheduler_name
        .clone()
        .or_else(|| (wiring == Some(Wiring::Volcano)).then(|| VOLCANO_SCHEDULER.to_string()));
    if let Some(spec) = pod.spec.as_mut() {
        if scheduler.is_some() {
            spec.scheduler_name = scheduler;
        }
        if spec.priority_class_name.is_none() {
            spec.priority_class_name = policy.priority_class.clone();
        }
    }
    let group = pod_group_name(v);
    let mut labels = BTreeMap::new();
    let mut annotations = BTreeMap::new();
    match wiring {
        None => {}
        Some(Wiring::Volcano) => {
            annotations.insert(VOLCANO_GROUP_ANNOTATION.to_string(), group);
        }
        Some(Wiring::SchedulerPlugins) => {
            labels.insert(SCHEDULER_PLUGINS_GROUP_LABEL.to_string(), group);
        }
        Some(Wiring::Kueue) => {
            if let Some(q) = &policy.queue {
                labels.insert(KUEUE_QUEUE_LABEL.to_string(), q.clone());
            }
            labels.insert(KUEUE_GROUP_LABEL.to_string(), group);
            annotations.insert(KUEUE_TOTAL_ANNOTATION.to_string(), v.world_size.to_string());
        }
    }
    let meta = &mut pod.metadata;
    if !labels.is_empty() {
        meta.labels.get_or_insert_with(BTreeMap::new).extend(labels);
    }
    if !annotations.is_empty() {
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(annotations);
    }
}

/// The cluster's gang-scheduling APIs, asked of discovery at most once per
/// [`DISCOVERY_TTL`].
#[derive(Default)]
pub struct Discovery {
    last: Mutex<Option<(Served, Instant)>>,
}

impl Discovery {
    /// What the cluster serves now (or at most [`DISCOVERY_TTL`] ago).
    pub async fn served(&self, client: &Client) -> Result<Served> {
        if let Ok(last) = self.last.lock() {
            if let Some((s, at)) = *last {
                if at.elapsed() < DISCOVERY_TTL {
                    return Ok(s);
                }
            }
        }
        let (volcano, scheduler_plugins, kueue) = futures::try_join!(
            serves(client, VOLCANO_API, "podgroups"),
            serves(client, SCHEDULER_PLUGINS_API, "podgroups"),
            serves_any_kueue(client),
        )?;
        let s = Served {
            volcano,
            scheduler_plugins,
            kueue,
        };
        if let Ok(mut last) = self.last.lock() {
            *last = Some((s, Instant::now()));
        }
        Ok(s)
    }
}

/// Whether some version of Kueue's API serves LocalQueues.
async fn serves_any_kueue(client: &Client) -> Result<bool> {
    for version in KUEUE_VERSIONS {
        if serves(client, &format!("{KUEUE_API}/{version}"), "localqueues").await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Whether `api_version` is served with `resource` in it.
async fn serves(client: &Client, api_version: &str, resource: &str) -> Result<bool> {
    match client.list_api_group_resources(api_version).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == resource)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;
