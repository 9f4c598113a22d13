//! PersistentVolumeClaims on the local control plane: a pre-bound
//! PersistentVolume + claim pair, so the real scheduler accepts pods that use
//! the claim; the node simulator backs it with a host directory
//! ([`crate::nodesim::mounts::claim_dir`]).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::json;

/// Create claim `ns/name` bound to a new hostPath volume, and wait until Bound.
pub async fn create_claim(client: &Client, state_dir: &Path, ns: &str, name: &str) -> Result<()> {
    let dir = crate::nodesim::mounts::claim_dir(state_dir, ns, name);
    std::fs::create_dir_all(&dir)?;
    let pv_name = format!("{ns}-{name}");
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": dir.display().to_string()},
            "claimRef": {"namespace": ns, "name": name}
        }
    }))?;
    pvs.create(&PostParams::default(), &pv).await?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "10Gi"}}
        }
    }))?;
    pvcs.create(&PostParams::default(), &pvc).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = pvcs.get(name).await?;
        if got.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("claim {ns}/{name} not Bound after 60s");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
