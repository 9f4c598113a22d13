//! Identities in the test bed: namespaces for jobs with the trainers'
//! ServiceAccount (granted nothing), and the operator's ServiceAccount bound
//! to its documented RBAC rules.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, Context, Result};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

use super::{OPERATOR_NAMESPACE, OPERATOR_RBAC, TRAINER_SA};
use crate::wait::eventually;
use crate::LocalCluster;

async fn wait_token_secret(client: &Client, ns: &str, sa: &str) -> Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let api = &api;
    let what = format!("a token secret of serviceaccount {ns}/{sa}");
    eventually(
        &what,
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async move {
            let sa = api.get_opt(sa).await?;
            let ready = sa.and_then(|s| s.secrets).is_some_and(|s| !s.is_empty());
            Ok(ready.then_some(()))
        },
    )
    .await
}

async fn ensure_namespace(client: &Client, ns: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    api.patch(
        ns,
        &PatchParams::apply("heterotrain-e2e").force(),
        &Patch::Apply(&obj),
    )
    .await?;
    Ok(())
}

async fn apply<K>(api: &Api<K>, name: &str, value: serde_json::Value) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply("heterotrain-e2e").force(),
        &Patch::Apply(&value),
    )
    .await
    .with_context(|| format!("applying {name}"))?;
    Ok(())
}

/// Create a namespace for jobs with the trainer ServiceAccount, granted
/// nothing here: the operator gives each job's ServiceAccount read access
/// to that job's plan only (Role `<job>-trainer`), so every end-to-end run
/// proves that this is enough.
pub async fn prepare_namespace(client: &Client, ns: &str) -> Result<()> {
    let client = client.clone();
    ensure_namespace(&client, ns).await?;
    apply(
        &Api::<ServiceAccount>::namespaced(client.clone(), ns),
        TRAINER_SA,
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": TRAINER_SA}
        }),
    )
    .await?;
    wait_token_secret(&client, ns, TRAINER_SA).await?;
    wait_token_secret(&client, ns, "default").await?;
    Ok(())
}

/// The operator's ServiceAccount, its ClusterRole (`operator/rbac.yaml`)
/// and binding, and a kubeconfig at `kubeconfig` with the account's token.
pub(super) async fn setup_operator_identity(
    cluster: &LocalCluster,
    kubeconfig: &Path,
) -> Result<()> {
    let token = operator_account(cluster, "heterotrain-operator").await?;
    std::fs::write(kubeconfig, cluster.kubeconfig_yaml(&token))?;
    Ok(())
}

/// A kubeconfig for another operator replica under its own ServiceAccount
/// `account` (bound to the same ClusterRole, so the API server's audit log
/// tells the replicas apart), reaching the API server through 127.0.0.1:`port`
/// when given (a [`crate::proxy::CutProxy`]).
pub async fn replica_kubeconfig(
    cluster: &LocalCluster,
    account: &str,
    port: Option<u16>,
    kubeconfig: &Path,
) -> Result<()> {
    let token = operator_account(cluster, account).await?;
    let yaml = match port {
        Some(p) => cluster.kubeconfig_yaml_via(p, &token),
        None => cluster.kubeconfig_yaml(&token),
    };
    std::fs::write(kubeconfig, yaml)?;
    Ok(())
}

/// ServiceAccount `account` in the operator's namespace, bound to the
/// operator's ClusterRole; a token for it.
async fn operator_account(cluster: &LocalCluster, account: &str) -> Result<String> {
    let client = cluster.client().await?;
    ensure_namespace(&client, OPERATOR_NAMESPACE).await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
    apply(
        &sas,
        account,
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}
        }),
    )
    .await?;
    let mut role: serde_json::Value = serde_yaml::from_str(OPERATOR_RBAC)?;
    role["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
    role["kind"] = json!("ClusterRole");
    let role_name = role["metadata"]["name"]
        .as_str()
        .ok_or_else(|| anyhow!("operator/rbac.yaml has no name"))?
        .to_string();
    apply(&Api::<ClusterRole>::all(client.clone()), &role_name, role).await?;
    let binding = if account == "heterotrain-operator" {
        role_name.clone()
    } else {
        format!("{role_name}-{account}")
    };
    apply(&Api::<ClusterRoleBinding>::all(client.clone()), &binding, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": binding},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": OPERATOR_NAMESPACE}]
    }))
    .await?;
    let req: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 86400}
    }))?;
    let resp: TokenRequest = sas
        .create_subresource("token", account, &PostParams::default(), &req)
        .await
        .with_context(|| format!("requesting a token for {account}"))?;
    resp.status
        .and_then(|s| s.token)
        .ok_or_else(|| anyhow!("empty TokenRequest status"))
}
