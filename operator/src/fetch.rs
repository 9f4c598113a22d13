//! Fetch stage: a job's children (pods, plan ConfigMap) as observed, each
//! pod reduced to the facts the lifecycle stage decides on. The objects
//! come from the watch caches ([`crate::children`]).

use heterotrain_crds::labels;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;

use crate::names;
use crate::plan;

/// The pod condition Kubernetes (1.26+) sets before it disrupts a pod.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// Coarse pod phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

/// What the operator needs to know about one rank pod.
#[derive(Clone, Debug, PartialEq)]
pub struct RankPod {
    pub name: String,
    pub rank: Option<u32>,
    /// Gang generation label.
    pub restart: Option<u32>,
    pub phase: Phase,
    /// Being deleted.
    pub deleting: bool,
    /// When a delete's grace period ends (`metadata.deletionTimestamp`):
    /// a pod still there long after it sits on a node that is gone.
    pub deletion_deadline: Option<Time>,
    pub pod_ip: Option<String>,
    pub node_name: Option<String>,
    /// Exit code, reason and message of the trainer container, once terminated.
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
    pub message: Option<String>,
    /// When the trainer container terminated.
    pub finished_at: Option<Time>,
    /// The pod's own `status.reason` (`Evicted` after a kubelet eviction).
    pub pod_reason: Option<String>,
    /// The reason of the pod's `DisruptionTarget` condition when it is True
    /// (Kubernetes 1.26+: `EvictionByEvictionAPI`, `PreemptionByScheduler`,
    /// `DeletionByTaintManager`, `DeletionByPodGC`, `TerminationByKubelet`).
    pub disruption_target: Option<String>,
    /// The spec-hash annotation.
    pub spec_hash: Option<String>,
    /// UID of the pod's controller (the job that created it).
    pub controller_uid: Option<String>,
    /// When the pod was created.
    pub created: Option<Time>,
    /// Why it is not running yet, as `Reason: message`: the scheduler's
    /// `Unschedulable`, or a container waiting on something other than its
    /// normal start (`ImagePullBackOff`, `CreateContainerConfigError`, …).
    pub waiting: Option<String>,
    /// Held by a scheduling gate (Kueue's admission gate, 1.26+): queued,
    /// not stuck.
    pub gated: bool,
    /// When the pod was scheduled (its `PodScheduled` condition turned True).
    pub scheduled_at: Option<Time>,
}

/// Container waiting reasons that are part of a normal start.
const NORMAL_WAITING: [&str; 2] = ["ContainerCreating", "PodInitializing"];

/// The names of the scheduling gates holding `pod`, if any.
fn gates_of(pod: &Pod) -> Option<String> {
    let gates = pod.spec.as_ref()?.scheduling_gates.as_ref()?;
    (!gates.is_empty()).then(|| {
        gates
            .iter()
            .map(|g| g.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    })
}

/// `Reason: message` of what keeps `pod` from running, if anything is wrong.
fn waiting_on(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    let text = |reason: &str, msg: Option<&String>| {
        let m: String = msg
            .map(|m| m.trim())
            .unwrap_or("")
            .chars()
            .take(200)
            .collect();
        if m.is_empty() {
            reason.to_string()
        } else {
            format!("{reason}: {m}")
        }
    };
    if let Some(gates) = gates_of(pod) {
        return Some(format!(
            "SchedulingGated: held by {gates} until a queue admits the gang (Kueue: check the LocalQueue and its ClusterQueue's quota)"
        ));
    }
    let unschedulable = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    });
    if let Some(c) = unschedulable {
        return Some(text("Unschedulable", c.message.as_ref()));
    }
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref())
        .find_map(|w| {
            let r = w.reason.as_deref()?;
            (!NORMAL_WAITING.contains(&r)).then(|| text(r, w.message.as_ref()))
        })
}

impl RankPod {
    /// Reduce a Pod to a RankPod.
    pub fn from_pod(pod: &Pod) -> RankPod {
        let labels = pod.labels();
        let status = pod.status.as_ref();
        let phase = match status.and_then(|s| s.phase.as_deref()) {
            Some("Pending") | None => Phase::Pending,
            Some("Running") => Phase::Running,
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            Some(_) => Phase::Unknown,
        };
        let terminated = status
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| {
                cs.iter()
                    .find(|c| c.name == names::CONTAINER)
                    .or(cs.first())
            })
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.as_ref());
        RankPod {
            name: pod.name_any(),
            rank: labels.get(labels::RANK).and_then(|r| r.parse().ok()),
            restart: labels.get(labels::RESTART).and_then(|r| r.parse().ok()),
            phase,
            deleting: pod.metadata.deletion_timestamp.is_some(),
            deletion_deadline: pod.metadata.deletion_timestamp.clone(),
            pod_ip: status
                .and_then(|s| s.pod_ip.clone())
                .filter(|ip| !ip.is_empty()),
            node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            exit_code: terminated.map(|t| t.exit_code),
            reason: terminated
                .and_then(|t| t.reason.clone())
                .or_else(|| status.and_then(|s| s.reason.clone())),
            message: terminated
                .and_then(|t| t.message.clone())
                .or_else(|| status.and_then(|s| s.message.clone())),
            finished_at: terminated.and_then(|t| t.finished_at.clone()),
            pod_reason: status.and_then(|s| s.reason.clone()),
            disruption_target: status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| {
                    cs.iter()
                        .find(|c| c.type_ == DISRUPTION_TARGET && c.status == "True")
                })
                .map(|c| c.reason.clone().unwrap_or_else(|| DISRUPTION_TARGET.into())),
            spec_hash: pod.annotations().get(labels::SPEC_HASH_ANNOTATION).cloned(),
            controller_uid: pod
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .map(|o| o.uid.clone()),
            created: pod.metadata.creation_timestamp.clone(),
            waiting: waiting_on(pod),
            gated: gates_of(pod).is_some(),
            scheduled_at: status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| {
                    cs.iter()
                        .find(|c| c.type_ == "PodScheduled" && c.status == "True")
                })
                .and_then(|c| c.last_transition_time.clone()),
        }
    }
}

/// A job's children as they are now.
#[derive(Clone, Debug, Default)]
pub struct Observed {
    /// The job's own rank pods (controlled by this job's UID).
    pub pods: Vec<RankPod>,
    /// Pods with the job's labels that this job does not control: left by
    /// an earlier job of the same name deleted with `--cascade=orphan`, or
    /// made by hand. Never adopted: they are deleted.
    pub foreign: Vec<RankPod>,
    /// The plan ConfigMap, as read.
    pub plan: plan::Stored,
}

/// Names of the `pods` that `keep` keeps.
pub fn names_where(pods: &[RankPod], keep: impl Fn(&RankPod) -> bool) -> Vec<String> {
    pods.iter()
        .filter(|p| keep(p))
        .map(|p| p.name.clone())
        .collect()
}

/// Split pods into those controlled by the job with `uid` and the others.
pub fn split_by_owner(pods: Vec<RankPod>, uid: &str) -> (Vec<RankPod>, Vec<RankPod>) {
    pods.into_iter()
        .partition(|p| p.controller_uid.as_deref() == Some(uid))
}
