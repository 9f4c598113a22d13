//! Apply stage: server-side apply of the desired children under one field
//! manager, and the deletes the lifecycle stage asked for. Objects come in
//! built; nothing here decides what they contain.

use heterotrain_crds::HeteroTrainingJob;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PropagationPolicy};
use kube::Client;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::names::FIELD_MANAGER;

/// Server-side apply parameters (forced: the operator owns these fields).
pub fn ssa() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

async fn apply<K>(api: &Api<K>, obj: &K, what: &'static str) -> Result<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let name = obj
        .meta()
        .name
        .clone()
        .ok_or(Error::MissingField("metadata.name"))?;
    let mut value =
        serde_json::to_value(obj).map_err(|source| Error::Serialize { what, source })?;
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), K::api_version(&()).into());
        map.insert("kind".into(), K::kind(&()).into());
    }
    Ok(api.patch(&name, &ssa(), &Patch::Apply(value)).await?)
}

/// Apply the headless Service.
pub async fn service(client: &Client, ns: &str, svc: &Service) -> Result<()> {
    apply(
        &Api::<Service>::namespaced(client.clone(), ns),
        svc,
        "Service",
    )
    .await?;
    Ok(())
}

/// Apply a ConfigMap.
pub async fn configmap(client: &Client, ns: &str, cm: &ConfigMap) -> Result<()> {
    apply(
        &Api::<ConfigMap>::namespaced(client.clone(), ns),
        cm,
        "ConfigMap",
    )
    .await?;
    Ok(())
}

/// Create (apply) a rank pod.
pub async fn pod(client: &Client, ns: &str, pod: &Pod) -> Result<()> {
    apply(&Api::<Pod>::namespaced(client.clone(), ns), pod, "Pod").await?;
    Ok(())
}

/// Delete pods by name; already-gone pods are fine.
pub async fn delete_pods(client: &Client, ns: &str, names: &[String]) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deletes = names.iter().map(|name| {
        let api = api.clone();
        async move {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => Ok::<(), Error>(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => Err(e.into()),
            }
        }
    });
    futures::future::try_join_all(deletes).await?;
    Ok(())
}

/// Delete the job `name` (its children follow by garbage collection).
pub async fn delete_job(client: &Client, ns: &str, name: &str) -> Result<()> {
    let api: Api<HeteroTrainingJob> = Api::namespaced(client.clone(), ns);
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
