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
