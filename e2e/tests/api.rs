//! The HeteroTrainingJob API against a real kube-apiserver: the generated
//! CRD installs, every example is accepted, and nonsense is refused by the
//! API server itself with a message naming the bad field.

mod support;

use heterotrain_crds::HeteroTrainingJob;
use heterotrain_e2e::system::SystemOptions;
use kube::api::{Api, PostParams};
use kube::core::{DynamicObject, GroupVersionKind};
use kube::discovery::ApiResource;
use support::*;

const VALID: &str = r#"
apiVersion: heterotrain.dev/v1alpha1
kind: HeteroTrainingJob
metadata: {name: PLACEHOLDER}
spec:
  workers: [{name: cpu, replicas: 2}]
  model: {name: mlp}
  dataset: {name: synthetic_image}
  training: {globalBatchSize: 32, maxSteps: 10}
"#;

/// (what is wrong, a JSON-pointer-ish path into the valid job, the bad value,
/// text the API server's message must contain).
fn invalid_cases() -> Vec<(&'static str, serde_json::Value, &'static str)> {
    use serde_json::json;
    vec![
        (
            "no-workers",
            json!({"spec": {"workers": []}}),
            "spec.workers",
        ),
        (
            "zero-replicas",
            json!({"spec": {"workers": [{"name": "cpu", "replicas": 0}]}}),
            "spec.workers.replicas",
        ),
        (
            "bad-device",
            json!({"spec": {"workers": [{"name": "cpu", "replicas": 1, "device": "tpu"}]}}),
            "spec.workers.device",
        ),
        (
            "bad-group-name",
            json!({"spec": {"workers": [{"name": "GPU_A", "replicas": 1}]}}),
            "spec.workers.name",
        ),
        (
            "bad-model",
            json!({"spec": {"model": {"name": "vgg"}}}),
            "spec.model.name",
        ),
        (
            "zero-batch",
            json!({"spec": {"training": {"globalBatchSize": 0}}}),
            "spec.training.globalBatchSize",
        ),
        (
            "bad-lr",
            json!({"spec": {"training": {"globalBatchSize": 32, "learningRate": "fast"}}}),
            "spec.training.learningRate",
        ),
        (
            "bad-policy",
            json!({"spec": {"loadBalancing": {"policy": "greedy"}}}),
            "spec.loadBalancing.policy",
        ),
        (
            "gain-over-100",
            json!({"spec": {"loadBalancing": {"minGainPercent": 150}}}),
            "spec.loadBalancing.minGainPercent",
        ),
        (
            "straggler-below-100",
            json!({"spec": {"loadBalancing": {"stragglerThresholdPercent": 50}}}),
            "spec.loadBalancing.stragglerThresholdPercent",
        ),
        (
            "bad-backend",
            json!({"spec": {"backend": "mpi"}}),
            "spec.backend",
        ),
        (
            "bad-metrics-source",
            json!({"spec": {"loadBalancing": {"metricsSource": "statsd"}}}),
            "spec.loadBalancing.metricsSource",
        ),
        (
            "bad-prometheus-url",
            json!({"spec": {"loadBalancing": {"prometheusUrl": "prom:9090"}}}),
            "spec.loadBalancing.prometheusUrl",
        ),
        (
            "privileged-port",
            json!({"spec": {"metricsPort": 80}}),
            "spec.metricsPort",
        ),
        (
            "no-training",
            json!({"spec": {"training": null}}),
            "spec.training",
        ),
        (
            "bad-dataset",
            json!({"spec": {"dataset": {"name": "imagenet"}}}),
            "spec.dataset.name",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_examples_and_invalid_jobs() {
    // The control plane and the CRD: no nodes, no operator.
    let mut bed = test_bed(SystemOptions {
        crd: true,
        ..SystemOptions::bare("api-test", nodes("nodes: []\n"))
    })
    .await;
    let client = bed.client().await.unwrap();

    let gvk = GroupVersionKind::gvk("heterotrain.dev", "v1alpha1", "HeteroTrainingJob");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "heterotrainingjobs");
    let dynamic: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);

    // Every example is accepted, and reads back as the typed resource.
    let typed: Api<HeteroTrainingJob> = Api::namespaced(client.clone(), "default");
    let examples = heterotrain_e2e::paths::example_jobs().expect("examples");
    assert!(examples.len() >= 6, "{} example jobs", examples.len());
    for (path, job) in examples {
        let obj: DynamicObject = serde_yaml::from_value(job).unwrap();
        let name = obj.metadata.name.clone().expect("named example");
        dynamic
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("example {} refused: {e:?}", path.display()));
        let back = typed.get(&name).await.expect("read back");
        assert!(
            back.spec.world_size() >= 2,
            "{name}: {:?}",
            back.spec.workers
        );
    }
    // Defaults from the schema are applied by the API server.
    let qs = typed.get("quickstart").await.unwrap();
    assert_eq!(qs.spec.run_policy.backoff_limit, 3);
    assert_eq!(qs.spec.metrics_port, 9400);
    assert_eq!(qs.spec.profiling.probe_batch_sizes, vec![8, 16, 32]);

    // The baseline valid job is accepted, so each refusal below is caused by its one change.
    let base: serde_json::Value = serde_yaml::from_str(VALID).unwrap();
    let mut ok = base.clone();
    ok["metadata"]["name"] = "baseline".into();
    dynamic
        .create(&PostParams::default(), &serde_json::from_value(ok).unwrap())
        .await
        .expect("baseline job accepted");

    let cases = invalid_cases();
    assert!(cases.len() >= 10);
    for (name, patch, field) in cases {
        let mut job = base.clone();
        merge(&mut job, &patch);
        job["metadata"]["name"] = name.into();
        let obj: DynamicObject = serde_json::from_value(job).unwrap();
        match dynamic.create(&PostParams::default(), &obj).await {
            Ok(_) => panic!("invalid job {name} was accepted"),
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422, "{name}: {}", s.message);
                assert!(
                    s.message.contains(field),
                    "{name}: message does not name {field}: {}",
                    s.message
                );
            }
            Err(e) => panic!("{name}: unexpected error {e}"),
        }
    }
    bed.stop().await;
}
