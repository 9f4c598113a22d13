//! Tests of the validation rules, partly from `operator/tests/fixtures/invalid.yaml`.

use super::*;
use heterotrain_crds::HeteroTrainingJob;

const BASE: &str = r#"
apiVersion: heterotrain.dev/v1alpha1
kind: HeteroTrainingJob
metadata: {name: job, namespace: ns}
spec:
  workers: [{name: cpu, replicas: 4}]
  model: {name: mlp}
  dataset: {name: synthetic_image}
  training: {globalBatchSize: 64, maxSteps: 5}
"#;

fn merge(base: &mut serde_json::Value, patch: &serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(k);
                } else {
                    merge(b.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

fn base() -> serde_json::Value {
    serde_yaml::from_str(BASE).expect("base")
}

#[test]
fn base_job_is_valid() {
    let job: HeteroTrainingJob = serde_json::from_value(base()).expect("job");
    assert_eq!(validate("job", &job.spec, None), Ok(()));
}

#[test]
fn every_invalid_fixture_names_its_problem() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/invalid.yaml");
    let cases: Vec<serde_json::Value> =
        serde_yaml::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("yaml");
    assert!(cases.len() >= 10);
    for case in cases {
        let expect = case["expect"].as_str().expect("expect");
        let mut v = base();
        merge(&mut v["spec"], &case["patch"]);
        let job: HeteroTrainingJob = serde_json::from_value(v).expect("schema-valid job");
        let problems = validate("job", &job.spec, None).expect_err(expect);
        let text = summary(&problems);
        assert!(text.contains(expect), "expected {expect:?} in {text:?}");
    }
}

#[test]
fn gpt_trains_on_token_files() {
    let mut v = base();
    merge(
        &mut v["spec"],
        &serde_json::json!({"model": {"name": "gpt"}, "dataset": {"name": "tokens", "claimName": "text"}}),
    );
    let job: HeteroTrainingJob = serde_json::from_value(v).expect("job");
    assert_eq!(validate("job", &job.spec, None), Ok(()));
}

#[test]
fn bad_names_are_refused() {
    let job: HeteroTrainingJob = serde_json::from_value(base()).expect("job");
    for name in ["9lives", &"x".repeat(62), "Upper"] {
        let p = validate(name, &job.spec, None).expect_err(name);
        assert_eq!(p[0].field, "metadata.name");
    }
    assert!(validate(&"x".repeat(61), &job.spec, None).is_ok());
}

#[test]
fn operator_prometheus_url_satisfies_prometheus_jobs() {
    let mut v = base();
    merge(
        &mut v["spec"],
        &serde_json::json!({"loadBalancing": {"metricsSource": "prometheus"}}),
    );
    let job: HeteroTrainingJob = serde_json::from_value(v).expect("job");
    assert!(validate("job", &job.spec, None).is_err());
    assert!(validate("job", &job.spec, Some("http://prom:9090")).is_ok());
}

#[test]
fn check_gives_identity_and_sizes_once() {
    let job = crate::testing::fixture("mixed.yaml");
    let v = crate::testing::valid(&job);
    assert_eq!(
        (v.name.as_str(), v.namespace.as_str()),
        ("mixed", "research")
    );
    assert_eq!(v.uid(), "6f1c2a9e-0000-4000-8000-000000000001");
    assert_eq!(v.owner.kind, "HeteroTrainingJob");
    assert_eq!(v.owner.controller, Some(true));
    assert_eq!(v.world_size, 3);
    assert_eq!(v.layout, [(0, 0), (1, 0), (1, 1)]);
    assert_eq!(v.global_batch, 96);
    assert_eq!(v.policy, heterotrain_balancer::Policy::Dynamic);
    assert_eq!(v.gang(), 0);
}

#[test]
fn check_separates_a_bad_spec_from_missing_metadata() {
    let mut v = base();
    merge(
        &mut v["spec"],
        &serde_json::json!({"training": {"globalBatchSize": 2}}),
    );
    v["metadata"]["uid"] = "u-1".into();
    let job: HeteroTrainingJob = serde_json::from_value(v).expect("job");
    match check(&job, None).expect("namespace set") {
        Checked::Invalid {
            namespace,
            problems,
        } => {
            assert_eq!(namespace, "ns");
            assert_eq!(problems[0].field, "spec.training.globalBatchSize");
        }
        Checked::Valid(_) => panic!("a global batch of 2 over 4 ranks is invalid"),
    }
    let mut no_ns = job.clone();
    no_ns.metadata.namespace = None;
    let err = check(&no_ns, None).expect_err("no namespace");
    assert_eq!(err.to_string(), "object is missing metadata.namespace");
}
