//! Profile cache: each rank's hardware profile, keyed by (the job's
//! namespace, hardware class, device, threads per rank, model config),
//! kept in the ConfigMap `heterotrain-profile-cache` in the operator's
//! namespace, so the next job on the same hardware starts from a balanced
//! plan at generation 0. A namespace's jobs read only profiles its own jobs
//! measured: one tenant's figures never shape another's plans. The cache
//! keeps the [`MAX_ENTRIES`] most recently stored profiles.
//!
//! The hardware is told apart by node labels, the first present of
//! [`hardware_class`]'s list: an administrator's `heterotrain.dev/node-type`,
//! the cloud's `node.kubernetes.io/instance-type`, the GPU product (NVIDIA
//! GPU feature discovery) for CUDA ranks, the CPU vendor/family/model of
//! Node Feature Discovery for CPU ranks, or a `heterotrain.dev/accelerator`
//! other than the generic `cpu`/`gpu`. A node with none of them is not
//! cached: two CPU nodes of different speed must not share a profile. A
//! rank's class comes from the node it ran on (else its group's
//! nodeSelector); a new job's ranks are looked up by their group's
//! nodeSelector, so jobs that pin groups to a hardware type benefit.

use std::collections::BTreeMap;

use heterotrain_crds::labels;
use heterotrain_crds::{Device, HeteroTrainingJobSpec, ModelSpec, WorkerGroup};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::names;
use crate::rank_pod::group_threads;
use crate::scrape::RankProfile;

/// Name of the cache ConfigMap.
pub const CACHE_CONFIGMAP: &str = "heterotrain-profile-cache";

/// Most profiles the cache keeps; storing more drops the oldest.
pub const MAX_ENTRIES: usize = 512;

/// One cached profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedProfile {
    pub points: Vec<(u32, f64)>,
    pub max_batch: u32,
    /// When it was stored (Unix seconds; 0 in entries written before).
    #[serde(default)]
    pub stored_at: u64,
}

impl From<&RankProfile> for CachedProfile {
    fn from(p: &RankProfile) -> Self {
        CachedProfile {
            points: p.points.clone(),
            max_batch: p.max_batch,
            stored_at: 0,
        }
    }
}

impl From<CachedProfile> for RankProfile {
    fn from(c: CachedProfile) -> Self {
        RankProfile {
            points: c.points,
            max_batch: c.max_batch,
            fixed_seconds: None,
            per_sample_seconds: None,
        }
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The model part of the key, e.g. `mlp.h128.l2`; a TorchScript model's
/// file is part of it (`torchscript.f/data/m.pt`), since the name alone
/// says nothing of the network.
pub fn model_key(m: Option<&ModelSpec>) -> String {
    // A job of your own commands that names no model.
    let Some(m) = m else {
        return "command".to_string();
    };
    let mut k = m.name.as_str().to_string();
    for (p, v) in [
        ("h", m.hidden),
        ("l", m.layers),
        ("a", m.heads),
        ("c", m.context),
        ("v", m.vocab),
    ] {
        if let Some(v) = v {
            k.push_str(&format!(".{p}{v}"));
        }
    }
    if let Some(f) = &m.file {
        k.push_str(&format!(".f{f}"));
    }
    k
}

/// ConfigMap key of a profile (a valid data key: `[-._a-zA-Z0-9]+`): the
/// job's namespace, the hardware class ([`hardware_class`]), the group's
/// device and threads per rank, and the model.
pub fn key(namespace: &str, hardware: &str, g: &WorkerGroup, model: Option<&ModelSpec>) -> String {
    let dev = match g.device {
        Device::Cpu => "cpu",
        Device::Cuda => "cuda",
    };
    let k = format!(
        "{}.{}_{dev}_t{}_{}",
        sanitize(namespace),
        sanitize(hardware),
        group_threads(g),
        sanitize(&model_key(model))
    );
    k.chars().take(253).collect()
}

/// The keys to drop so that `merged` (key → when stored) keeps at most
/// [`MAX_ENTRIES`]: the oldest, ties by key.
fn evictions(merged: &BTreeMap<String, u64>) -> Vec<String> {
    let extra = merged.len().saturating_sub(MAX_ENTRIES);
    let mut by_age: Vec<(&u64, &String)> = merged.iter().map(|(k, t)| (t, k)).collect();
    by_age.sort();
    by_age
        .into_iter()
        .take(extra)
        .map(|(_, k)| k.clone())
        .collect()
}

/// The hardware class that node `labels` name for a rank on `device`
/// (see the module docs), e.g. `type-a100-80g`, `gpu-NVIDIA-H100`,
/// `cpu-GenuineIntel-6-143`; `None` when the labels do not tell the
/// hardware apart.
pub fn hardware_class(labels: &BTreeMap<String, String>, device: Device) -> Option<String> {
    let get = |k: &str| labels.get(k).filter(|v| !v.is_empty());
    if let Some(t) = get(labels::NODE_TYPE) {
        return Some(format!("type-{t}"));
    }
    if let Some(t) = get(labels::INSTANCE_TYPE) {
        return Some(format!("inst-{t}"));
    }
    match device {
        Device::Cuda => {
            if let Some(p) = get(labels::GPU_PRODUCT) {
                return Some(format!("gpu-{p}"));
            }
        }
        Device::Cpu => {
            let cpu: Option<Vec<&String>> = labels::NFD_CPU_MODEL.iter().map(|k| get(k)).collect();
            if let Some(parts) = cpu {
                let parts: Vec<&str> = parts.into_iter().map(String::as_str).collect();
                return Some(format!("cpu-{}", parts.join("-")));
            }
        }
    }
    get(labels::ACCELERATOR)
        .filter(|a| *a != "cpu" && *a != "gpu")
        .map(|a| format!("acc-{a}"))
}

/// The hardware class a group is pinned to by its nodeSelector, if any.
pub fn group_hardware(g: &WorkerGroup) -> Option<String> {
    hardware_class(&g.node_selector, g.device)
}

/// Read every cached profile.
pub async fn load(client: &Client, ns: &str) -> Result<BTreeMap<String, CachedProfile>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = api.get_opt(CACHE_CONFIGMAP).await?;
    Ok(cm
        .and_then(|c| c.data)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(k, v)| Some((k, serde_json::from_str(&v).ok()?)))
        .collect())
}

/// Cached profiles for every rank of `spec` in `namespace` (by group
/// nodeSelector), or `None` unless every rank has one.
pub fn lookup(
    namespace: &str,
    spec: &HeteroTrainingJobSpec,
    cache: &BTreeMap<String, CachedProfile>,
) -> Option<Vec<Option<RankProfile>>> {
    spec.rank_layout()
        .into_iter()
        .map(|(gi, _)| {
            let g = spec.workers.get(gi)?;
            let k = key(namespace, &group_hardware(g)?, g, spec.model.as_ref());
            cache.get(&k).cloned().map(|c| Some(c.into()))
        })
        .collect()
}

/// The hardware class of the node a rank ran on, else its group's pin.
pub async fn hardware_of(client: &Client, node: Option<&str>, g: &WorkerGroup) -> Option<String> {
    if let Some(n) = node {
        let nodes: Api<Node> = Api::all(client.clone());
        if let Ok(Some(node)) = nodes.get_opt(n).await {
            if let Some(class) = node
                .metadata
                .labels
                .as_ref()
                .and_then(|l| hardware_class(l, g.device))
            {
                return Some(class);
            }
        }
    }
    group_hardware(g)
}

/// Store `entries` (key → profile) in the cache, stamped now, creating it
/// when missing; past [`MAX_ENTRIES`] the oldest are dropped.
pub async fn store(
    client: &Client,
    ns: &str,
    entries: &BTreeMap<String, CachedProfile>,
) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let data: BTreeMap<String, String> = entries
        .iter()
        .filter_map(|(k, v)| {
            let v = CachedProfile {
                stored_at: now,
                ..v.clone()
            };
            Some((k.clone(), serde_json::to_string(&v).ok()?))
        })
        .collect();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let existing = api.get_opt(CACHE_CONFIGMAP).await?;
    if existing.is_none() {
        let cm = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(CACHE_CONFIGMAP.into()),
                namespace: Some(ns.into()),
                labels: Some(BTreeMap::from([(
                    labels::MANAGED_BY.to_string(),
                    labels::MANAGER.to_string(),
                )])),
                ..Default::default()
            },
            data: Some(data.clone()),
            ..Default::default()
        };
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut merged: BTreeMap<String, u64> = existing
        .and_then(|c| c.data)
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            let at = serde_json::from_str::<CachedProfile>(&v).map_or(0, |c| c.stored_at);
            (k, at)
        })
        .collect();
    merged.extend(data.keys().map(|k| (k.clone(), now)));
    let mut patch_data: serde_json::Map<String, serde_json::Value> = data
        .into_iter()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    for k in evictions(&merged) {
        patch_data.insert(k, serde_json::Value::Null);
    }
    let patch = serde_json::json!({ "data": patch_data });
    api.patch(
        CACHE_CONFIGMAP,
        &PatchParams {
            field_manager: Some(names::FIELD_MANAGER.into()),
            ..Default::default()
        },
        &Patch::Merge(patch),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests;
