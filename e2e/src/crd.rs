//! Install the HeteroTrainingJob CRD into a cluster and wait until the API
//! server serves it.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;

/// Server-side apply `crds/heterotrainingjob.yaml` (as generated from the
/// Rust types) and wait for the `Established` condition.
pub async fn install_crd(client: &Client) -> Result<()> {
    let crd: CustomResourceDefinition = serde_yaml::from_str(&heterotrain_crds::crd_yaml()?)?;
    let name = crd.metadata.name.clone().unwrap_or_default();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply("heterotrain-e2e").force(),
        &Patch::Apply(&crd),
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = api.get(&name).await?;
        let established = got
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            // Discovery caches may lag a moment behind the condition.
            tokio::time::sleep(Duration::from_millis(500)).await;
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("CRD {name} not established after 30s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
