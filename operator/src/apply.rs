//! Apply stage: server-side apply of the desired children under one field
//! manager, and the deletes the lifecycle stage asked for. Objects come in
//! built; nothing here decides what they contain.

use heterotrain_crds::HeteroTrainingJob;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PropagationPolicy,
};
use kube::Client;
use serde::Serialize;

use crate::build::Desired;
use crate::error::{Error, Result};
use crate::names::{self, FIELD_MANAGER};

/// Server-side apply parameters (forced: the operator owns these fields).
pub fn ssa() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Server-side apply `obj` in namespace `ns`.
async fn apply<K>(client: &Client, ns: &str, obj: &K) -> Result<()>
where
    K: kube::Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + k8s_openapi::Resource
        + Clone
        + Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let what = <K as k8s_openapi::Resource>::KIND;
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
    Api::<K>::namespaced(client.clone(), ns)
        .patch(&name, &ssa(), &Patch::Apply(value))
        .await?;
    Ok(())
}

/// Server-side apply `obj`, of the API `api`, in namespace `ns`.
async fn apply_dynamic(
    client: &Client,
    ns: &str,
    api: &ApiResource,
    obj: &DynamicObject,
) -> Result<()> {
    let name = obj
        .metadata
        .name
        .clone()
        .ok_or(Error::MissingField("metadata.name"))?;
    let mut value = serde_json::to_value(obj).map_err(|source| Error::Serialize {
        what: "PodGroup",
        source,
    })?;
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), api.api_version.clone().into());
        map.insert("kind".into(), api.kind.clone().into());
    }
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, api)
        .patch(&name, &ssa(), &Patch::Apply(value))
        .await?;
    Ok(())
}

/// A delete's outcome, where an object already gone counts as deleted.
fn deleted<T>(result: kube::Result<T>) -> Result<()> {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Apply what a gang needs before its pods: the Service, the trainers'
/// Role and RoleBinding, the NetworkPolicies and the PodGroup, concurrently (one round
/// trip of latency, two for the Role and then its binding). Without
/// policies in `desired` (isolation off) the job's policies are deleted.
/// The caller creates pods only after this returns, so the policies are
/// in place before any pod they guard.
pub async fn children(client: &Client, ns: &str, desired: &Desired) -> Result<()> {
    let access = async {
        apply(client, ns, &desired.access.0).await?;
        apply(client, ns, &desired.access.1).await
    };
    let policies = async {
        futures::future::try_join_all(desired.policies.iter().map(|p| apply(client, ns, p)))
            .await?;
        if desired.policies.is_empty() {
            let api: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
            let job = desired.service.metadata.name.as_deref().unwrap_or_default();
            let names = [names::network_policy(job), names::api_network_policy(job)];
            let deletes = names.iter().map(|name| {
                let api = api.clone();
                async move { deleted(api.delete(name, &DeleteParams::default()).await) }
            });
            futures::future::try_join_all(deletes).await?;
        }
        Ok(())
    };
    let pod_group = async {
        match &desired.pod_group {
            Some((api, group)) => apply_dynamic(client, ns, api, group).await,
            None => Ok(()),
        }
    };
    futures::try_join!(
        apply(client, ns, &desired.service),
        access,
        policies,
        pod_group
    )?;
    Ok(())
}

/// Apply a ConfigMap.
pub async fn configmap(client: &Client, ns: &str, cm: &ConfigMap) -> Result<()> {
    apply(client, ns, cm).await
}

/// Create (apply) a rank pod.
pub async fn pod(client: &Client, ns: &str, pod: &Pod) -> Result<()> {
    apply(client, ns, pod).await
}

/// Delete pods by name; already-gone pods are fine.
pub async fn delete_pods(client: &Client, ns: &str, names: &[String]) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deletes = names.iter().map(|name| {
        let api = api.clone();
        async move { deleted(api.delete(name, &DeleteParams::default()).await) }
    });
    futures::future::try_join_all(deletes).await?;
    Ok(())
}

/// Delete pods `names` now (grace period 0): the API object goes at once,
/// without waiting for a kubelet.
pub async fn force_delete_pods(client: &Client, ns: &str, names: &[String]) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dp = DeleteParams::default().grace_period(0);
    let deletes = names.iter().map(|name| {
        let (api, dp) = (api.clone(), dp.clone());
        async move { deleted(api.delete(name, &dp).await) }
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
    deleted(api.delete(name, &dp).await)
}
