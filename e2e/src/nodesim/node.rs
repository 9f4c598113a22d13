//! Register simulated Nodes and keep them Ready, as a kubelet would: status
//! with capacity (incl. `nvidia.com/gpu`) and a Ready condition, the
//! admission-added `not-ready` taint removed, and heartbeats.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use heterotrain_crds::labels;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::json;

use super::config::NodeConfig;

/// Field manager of the simulator's writes.
pub const MANAGER: &str = "heterotrain-nodesim";

fn node_labels(cfg: &NodeConfig) -> BTreeMap<String, String> {
    let mut l = BTreeMap::new();
    l.insert(labels::HOSTNAME.into(), cfg.name.clone());
    l.insert(labels::OS.into(), "linux".into());
    l.insert(labels::SIMULATED.into(), "true".into());
    l.insert(labels::SPEED.into(), format!("{}", cfg.speed));
    let accel = match (&cfg.gpu_product, cfg.gpus) {
        (Some(p), _) => p.clone(),
        (None, 0) => "cpu".into(),
        (None, _) => "gpu".into(),
    };
    l.insert(labels::ACCELERATOR.into(), accel);
    if let Some(p) = &cfg.gpu_product {
        l.insert(labels::GPU_PRODUCT.into(), p.clone());
    }
    // An instance type, as a cloud sets it: simulated hardware differs by
    // CPUs and speed, so the profile cache tells such nodes apart.
    l.insert(labels::INSTANCE_TYPE.into(), instance_type(cfg));
    l.extend(cfg.labels.clone());
    l
}

/// `sim-<cpu>cpu-x<speed>` (a valid label value), e.g. `sim-4cpu-x0.33`.
pub fn instance_type(cfg: &NodeConfig) -> String {
    let v = format!("sim-{}cpu-x{}", cfg.cpu, cfg.speed);
    v.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect()
}

fn status(cfg: &NodeConfig) -> serde_json::Value {
    let now = rfc3339_now();
    let mut cap = json!({
        "cpu": cfg.cpu,
        "memory": cfg.memory,
        "pods": cfg.max_pods.to_string(),
    });
    if cfg.gpus > 0 {
        cap["nvidia.com/gpu"] = json!(cfg.gpus.to_string());
    }
    let cond = |t: &str, s: &str, reason: &str| {
        json!({"type": t, "status": s, "reason": reason, "message": "simulated by heterotrain-local",
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    json!({
        "status": {
            "capacity": cap,
            "allocatable": cap,
            "conditions": [
                cond("Ready", "True", "KubeletReady"),
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID"),
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": cfg.name}],
            "nodeInfo": {
                "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                "osImage": "heterotrain simulated node", "containerRuntimeVersion": "heterotrain-local://0",
                "kubeletVersion": "v1.20.2", "kubeProxyVersion": "v1.20.2",
                "operatingSystem": "linux", "architecture": "amd64"
            }
        }
    })
}

/// Create or update the Node and make it schedulable.
pub async fn register(client: &Client, cfg: &NodeConfig) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": cfg.name, "labels": node_labels(cfg)},
    });
    nodes
        .patch(
            &cfg.name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&node),
        )
        .await
        .with_context(|| format!("registering node {}", cfg.name))?;
    heartbeat(client, cfg).await?;
    // Admission taints new nodes not-ready; a kubelet's node controller lifts it.
    let got = nodes.get(&cfg.name).await?;
    let taints = got.spec.and_then(|s| s.taints).unwrap_or_default();
    let keep: Vec<_> = taints
        .into_iter()
        .filter(|t| {
            t.key != "node.kubernetes.io/not-ready" && t.key != "node.kubernetes.io/unreachable"
        })
        .collect();
    nodes
        .patch(
            &cfg.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": keep}})),
        )
        .await
        .with_context(|| format!("removing the not-ready taint of {}", cfg.name))?;
    Ok(())
}

/// Refresh the node's status (Ready, heartbeat time).
pub async fn heartbeat(client: &Client, cfg: &NodeConfig) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch_status(
            &cfg.name,
            &PatchParams::default(),
            &Patch::Merge(status(cfg)),
        )
        .await
        .with_context(|| format!("updating status of node {}", cfg.name))?;
    Ok(())
}

/// What the node lifecycle controller does to a node whose kubelet went
/// silent (the local control plane runs without that controller): Ready
/// turns Unknown and the `unreachable` NoSchedule taint keeps new pods off.
pub async fn mark_unreachable(client: &Client, name: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let now = rfc3339_now();
    let ready = json!({"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.", "lastHeartbeatTime": now,
        "lastTransitionTime": now});
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [ready]}})),
        )
        .await
        .with_context(|| format!("marking node {name} NotReady"))?;
    let got = nodes.get(name).await?;
    let mut taints = got.spec.and_then(|s| s.taints).unwrap_or_default();
    taints.retain(|t| t.key != "node.kubernetes.io/unreachable");
    let mut taints = serde_json::to_value(taints)?;
    if let Some(a) = taints.as_array_mut() {
        a.push(json!({"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule", "timeAdded": now}));
    }
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": taints}})),
        )
        .await
        .with_context(|| format!("tainting node {name} unreachable"))?;
    Ok(())
}

/// The current time as Kubernetes writes it (RFC 3339, seconds, UTC).
pub fn rfc3339_now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}
