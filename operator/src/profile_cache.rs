//! Profile cache: each rank's hardware profile, keyed by (accelerator model,
//! device, model config), kept in the ConfigMap `heterotrain-profile-cache`
//! in the operator's namespace, so the next job on the same hardware starts
//! from a balanced plan at generation 0.
//!
//! The accelerator is the node label `heterotrain.dev/accelerator` of the
//! node a rank ran on (or, when the node has none, the group's nodeSelector
//! for that label); a new job's ranks are looked up by their group's
//! nodeSelector, so jobs that pin groups to accelerators benefit.

use std::collections::BTreeMap;

use heterotrain_crds::labels;
use heterotrain_crds::{Device, HeteroTrainingJobSpec, ModelSpec, WorkerGroup};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::names;
use crate::scrape::RankProfile;

/// Name of the cache ConfigMap.
pub const CACHE_CONFIGMAP: &str = "heterotrain-profile-cache";

/// One cached profile.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedProfile {
    pub points: Vec<(u32, f64)>,
    pub max_batch: u32,
}

impl From<&RankProfile> for CachedProfile {
    fn from(p: &RankProfile) -> Self {
        CachedProfile {
            points: p.points.clone(),
            max_batch: p.max_batch,
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
pub fn model_key(m: &ModelSpec) -> String {
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

/// ConfigMap key of a profile (a valid data key: `[-._a-zA-Z0-9]+`).
pub fn key(accelerator: &str, device: Device, model: &ModelSpec) -> String {
    let dev = match device {
        Device::Cpu => "cpu",
        Device::Cuda => "cuda",
    };
    let k = format!(
        "{}_{dev}_{}",
        sanitize(accelerator),
        sanitize(&model_key(model))
    );
    k.chars().take(253).collect()
}

/// The accelerator a group is pinned to by its nodeSelector, if any.
pub fn group_accelerator(g: &WorkerGroup) -> Option<&str> {
    g.node_selector.get(labels::ACCELERATOR).map(String::as_str)
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

/// Cached profiles for every rank of `spec` (by group nodeSelector), or
/// `None` unless every rank has one.
pub fn lookup(
    spec: &HeteroTrainingJobSpec,
    cache: &BTreeMap<String, CachedProfile>,
) -> Option<Vec<Option<RankProfile>>> {
    spec.rank_layout()
        .into_iter()
        .map(|(gi, _)| {
            let g = spec.workers.get(gi)?;
            let k = key(group_accelerator(g)?, g.device, &spec.model);
            cache.get(&k).cloned().map(|c| Some(c.into()))
        })
        .collect()
}

/// The accelerator of the node a rank ran on, else its group's pin.
pub async fn accelerator_of(
    client: &Client,
    node: Option<&str>,
    g: &WorkerGroup,
) -> Option<String> {
    if let Some(n) = node {
        let nodes: Api<Node> = Api::all(client.clone());
        if let Ok(Some(node)) = nodes.get_opt(n).await {
            if let Some(a) = node
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::ACCELERATOR))
            {
                return Some(a.clone());
            }
        }
    }
    group_accelerator(g).map(str::to_string)
}

/// Store `entries` (key → profile) in the cache, creating it when missing.
pub async fn store(
    client: &Client,
    ns: &str,
    entries: &BTreeMap<String, CachedProfile>,
) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let data: BTreeMap<String, String> = entries
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), serde_json::to_string(v).ok()?)))
        .collect();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    if api.get_opt(CACHE_CONFIGMAP).await?.is_none() {
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
    let patch = serde_json::json!({ "data": data });
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
mod tests {
    use super::*;

    #[test]
    fn a_torchscript_key_names_its_file() {
        let mut m: ModelSpec = serde_json::from_value(
            serde_json::json!({"name": "torchscript", "file": "/data/a.pt"}),
        )
        .expect("model");
        let a = key("H100", Device::Cuda, &m);
        assert_eq!(a, "H100_cuda_torchscript.f_data_a.pt");
        m.file = Some("/data/b.pt".into());
        assert_ne!(key("H100", Device::Cuda, &m), a);
    }
}
