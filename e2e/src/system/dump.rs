//! What the test bed shows when something fails: a namespace's jobs,
//! pods with their log tails, events, and the operator's log tail.

use heterotrain_crds::HeteroTrainingJob;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::System;

/// Everything useful when a test fails: pods, events, pod logs, operator log tail.
pub async fn dump(system: &System, ns: &str) -> String {
    let mut out = String::new();
    let Ok(client) = system.client().await else {
        return "no client".into();
    };
    for j in list::<HeteroTrainingJob>(&client, ns).await {
        out += &format!(
            "job {}: {}\n",
            j.metadata.name.unwrap_or_default(),
            serde_json::to_string(&j.status).unwrap_or_default()
        );
    }
    let pods = list::<Pod>(&client, ns).await;
    let unscheduled = pods
        .iter()
        .any(|p| p.spec.as_ref().is_none_or(|s| s.node_name.is_none()));
    for p in pods {
        let name = p.metadata.name.clone().unwrap_or_default();
        let st = p.status.as_ref();
        out += &format!(
            "pod {name} node={:?} phase={:?}\n",
            p.spec.as_ref().and_then(|s| s.node_name.clone()),
            st.and_then(|s| s.phase.clone())
        );
        let log =
            std::fs::read_to_string(crate::nodesim::log_path(system.sim.state_dir(), ns, &name))
                .unwrap_or_default();
        out += &tail(&log, 15);
    }
    for e in list::<Event>(&client, ns).await {
        out += &format!(
            "event {:?} {:?}: {:?}\n",
            e.reason,
            e.regarding.and_then(|r| r.name),
            e.note
        );
    }
    if unscheduled {
        out += "kube-scheduler log (tail; a pod has no node):\n";
        out += &tail(&system.cluster.component_log_tail("kube-scheduler"), 15);
    }
    let log = system.operator_log();
    out += "operator log (tail):\n";
    out += &tail(&log, 30);
    out
}

/// Every `K` in `ns` (none when the list fails).
async fn list<K>(client: &Client, ns: &str) -> Vec<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// The last `n` lines of `text`, indented and marked.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("    | {l}\n"))
        .collect()
}
