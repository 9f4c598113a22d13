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
    install(client, &crd).await
}

/// A namespaced CRD `<plural>.<group>` of `kind` whose objects are kept as
/// given (no schema): the API of a gang scheduler that is not installed
/// here, so the operator finds it in discovery and can write its objects.
pub fn schemaless_crd(
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Result<CustomResourceDefinition> {
    let yaml = format!(
        r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: {plural}.{group}}}
spec:
  group: {group}
  scope: Namespaced
  names: {{kind: {kind}, plural: {plural}, singular: {singular}, listKind: {kind}List}}
  versions:
    - name: {version}
      served: true
      storage: true
      schema:
        openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}
"#,
        singular = kind.to_lowercase()
    );
    Ok(serde_yaml::from_str(&yaml)?)
}

/// Volcano's PodGroup API (`scheduling.volcano.sh/v1beta1`), without Volcano.
pub fn volcano_pod_group_crd() -> Result<CustomResourceDefinition> {
    schemaless_crd("scheduling.volcano.sh", "v1beta1", "PodGroup", "podgroups")
}

/// Kueue's LocalQueue API at `kueue.x-k8s.io/v1beta2` (a version newer than
/// the first the operator knew), without Kueue.
pub fn kueue_local_queue_crd() -> Result<CustomResourceDefinition> {
    schemaless_crd("kueue.x-k8s.io", "v1beta2", "LocalQueue", "localqueues")
}

/// Server-side apply `crd` and wait for its `Established` condition.
pub async fn install(client: &Client, crd: &CustomResourceDefinition) -> Result<()> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply("heterotrain-e2e").force(),
        &Patch::Apply(crd),
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
