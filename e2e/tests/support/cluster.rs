//! Helpers for tests against the local control plane: the test bed, the
//! one wait, namespaces and failure dumps.

use std::time::Duration;

use heterotrain_e2e::nodesim::{NodeSimulator, NodesFile};
use heterotrain_e2e::system::{System, SystemOptions};
use heterotrain_e2e::wait::until_some;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, PostParams};
use kube::core::{DynamicObject, GroupVersionKind};
use kube::discovery::ApiResource;
use kube::Client;
use serde_json::json;

pub fn jobs_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("heterotrain.dev", "v1alpha1", "HeteroTrainingJob");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

/// Poll `f` every 300 ms until it yields a value; panics naming `what`
/// after `timeout` (the crate's one wait, [`until_some`]).
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    until_some(what, timeout, Duration::from_millis(300), f).await
}

/// The test bed (`heterotrain_e2e::system`) as `opts` asks.
pub async fn test_bed(opts: SystemOptions) -> System {
    let bed = System::start(opts).await;
    bed.expect("start the test bed (run `make setup`)")
}

/// Simulated nodes from a `nodes:` YAML list.
pub fn nodes(yaml: &str) -> NodesFile {
    NodesFile::parse(yaml).expect("nodes YAML")
}

pub async fn create_namespace(client: &Client, ns: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
    )
    .await
    .expect("create namespace");
}

/// Pods of `namespaces` with the tail of their logs, for failure messages.
pub async fn dump_namespaces(client: &Client, sim: &NodeSimulator, namespaces: &[&str]) -> String {
    let mut out = String::new();
    for &ns in namespaces {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        for p in pods
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let name = p.metadata.name.clone().unwrap_or_default();
            out.push_str(&format!(
                "pod {ns}/{name}: node={:?} status={:?}\n",
                p.spec.as_ref().and_then(|s| s.node_name.clone()),
                p.status.as_ref().map(|s| (&s.phase, &s.reason, &s.message))
            ));
            let log = std::fs::read_to_string(heterotrain_e2e::nodesim::log_path(
                sim.state_dir(),
                ns,
                &name,
            ))
            .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            for l in tail.into_iter().rev() {
                out.push_str(&format!("  | {l}\n"));
            }
        }
    }
    out
}

/// After a chart install: wait until the API server reaches the chart's
/// admission webhook and trusts its certificate (the operator writes the
/// CA, and the API server picks it up a moment later), that is until a dry
/// run of a job breaking a rule in `ns` is refused by the webhook itself
/// rather than by a failed call.
#[allow(dead_code)]
pub async fn wait_for_webhook(client: &Client, ns: &str) {
    let jobs = jobs_api(client, ns);
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "heterotrain.dev/v1alpha1",
        "kind": "HeteroTrainingJob",
        "metadata": {"name": "webhook-probe"},
        "spec": {
            "workers": [{"name": "a", "replicas": 1}, {"name": "a", "replicas": 1}],
            "model": {"name": "mlp"},
            "dataset": {"name": "synthetic_image"},
            "training": {"globalBatchSize": 64, "maxSteps": 5}
        }
    }))
    .expect("probe job");
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for(
        "the admission webhook to answer",
        Duration::from_secs(120),
        || {
            let (jobs, bad, dry) = (jobs.clone(), bad.clone(), dry.clone());
            async move {
                match jobs.create(&dry, &bad).await {
                    Err(kube::Error::Api(e)) if e.message.contains("denied the request") => {
                        Some(())
                    }
                    _ => None,
                }
            }
        },
    )
    .await;
}

/// Create the object written as `value` through `api`, panicking with
/// `what` and the API server's answer when it is refused.
pub async fn create<K>(api: &Api<K>, value: serde_json::Value, what: &str) -> K
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
{
    let object: K = serde_json::from_value(value).unwrap_or_else(|e| panic!("{what}: {e}"));
    api.create(&kube::api::PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}
