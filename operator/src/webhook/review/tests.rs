use serde_json::{json, Value};

use super::*;

fn job(spec: Value, phase: Option<&str>) -> Value {
    let mut j = json!({
        "apiVersion": "heterotrain.dev/v1alpha1",
        "kind": "HeteroTrainingJob",
        "metadata": {"name": "job", "namespace": "ns", "uid": "u1"},
        "spec": spec,
    });
    if let Some(p) = phase {
        j["status"] = json!({"phase": p});
    }
    j
}

fn spec(batch: u32) -> Value {
    json!({
        "workers": [{"name": "cpu", "replicas": 4}],
        "model": {"name": "mlp"},
        "dataset": {"name": "synthetic_image"},
        "training": {"globalBatchSize": batch, "maxSteps": 5},
        "loadBalancing": {"minLocalBatch": 8}
    })
}

fn request(operation: &str, object: Value, old: Option<Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "req-1",
            "kind": {"group": "heterotrain.dev", "version": "v1alpha1", "kind": "HeteroTrainingJob"},
            "resource": {"group": "heterotrain.dev", "version": "v1alpha1", "resource": "heterotrainingjobs"},
            "name": "job",
            "namespace": "ns",
            "operation": operation,
            "userInfo": {"username": "alice"},
            "object": object,
            "oldObject": old,
        }
    }))
    .unwrap()
}

fn answer(body: &[u8], admission: Admission<'_>) -> Value {
    let v = serde_json::to_value(review(body, admission, &[])).unwrap();
    assert_eq!(v["response"]["uid"], "req-1", "{v}");
    v["response"].clone()
}

#[test]
fn a_valid_job_is_admitted() {
    let r = answer(
        &request("CREATE", job(spec(64), None), None),
        Admission::default(),
    );
    assert_eq!(r["allowed"], true, "{r}");
}

#[test]
fn every_problem_is_refused_with_its_field() {
    let mut s = spec(16);
    s["workers"] = json!([{"name": "cpu", "replicas": 2}, {"name": "cpu", "replicas": 2}]);
    let r = answer(&request("CREATE", job(s, None), None), Admission::default());
    assert_eq!(r["allowed"], false, "{r}");
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(msg.starts_with("2 problems"), "{msg}");
    assert!(msg.contains("spec.workers[1].name"), "{msg}");
    assert!(msg.contains("spec.training.globalBatchSize"), "{msg}");
}

#[test]
fn the_allow_lists_are_applied() {
    let mut s = spec(64);
    s["image"] = json!("evil.example/miner:1");
    let images = vec!["ghcr.io/heterotrain".to_string()];
    let adm = Admission {
        images: &images,
        ..Admission::default()
    };
    let r = answer(&request("CREATE", job(s, None), None), adm);
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.image"),
        "{r}"
    );
}

#[test]
fn a_running_jobs_fixed_sections_are_refused_and_others_pass() {
    let old = job(spec(64), Some("Running"));
    let r = answer(
        &request("UPDATE", job(spec(128), None), Some(old.clone())),
        Admission::default(),
    );
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("spec.training: cannot change while the job runs"),
        "{r}"
    );

    // The same change before the gang runs, or a change of a section a
    // running gang reads live, passes.
    let pending = job(spec(64), Some("Pending"));
    let r = answer(
        &request("UPDATE", job(spec(128), None), Some(pending)),
        Admission::default(),
    );
    assert_eq!(r["allowed"], true, "{r}");
    let mut s = spec(64);
    s["loadBalancing"]["minLocalBatch"] = json!(4);
    let r = answer(
        &request("UPDATE", job(s, None), Some(old)),
        Admission::default(),
    );
    assert_eq!(r["allowed"], true, "{r}");
}

#[test]
fn metadata_updates_of_an_invalid_job_pass() {
    // Admitted before the webhook existed: its finalizers and labels can
    // still change, so it can be cleaned up.
    let bad = job(spec(16), Some("Failed"));
    let mut relabelled = bad.clone();
    relabelled["metadata"]["labels"] = json!({"team": "a"});
    let r = answer(
        &request("UPDATE", relabelled, Some(bad.clone())),
        Admission::default(),
    );
    assert_eq!(r["allowed"], true, "{r}");
    // A spec change that leaves it invalid does not.
    let mut s = spec(16);
    s["training"]["maxSteps"] = json!(6);
    let r = answer(
        &request("UPDATE", job(s, None), Some(bad)),
        Admission::default(),
    );
    assert_eq!(r["allowed"], false, "{r}");
}

#[test]
fn a_generated_name_is_judged_with_its_suffix() {
    let mut j = job(spec(64), None);
    j["metadata"] = json!({"generateName": format!("{}-", "a".repeat(57)), "namespace": "ns"});
    let r = answer(&request("CREATE", j, None), Admission::default());
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("metadata.name"),
        "{r}"
    );
}

#[test]
fn what_is_not_a_review_is_answered_invalid() {
    for body in [
        &b"{"[..],
        b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}",
    ] {
        let v = serde_json::to_value(review(body, Admission::default(), &[])).unwrap();
        assert_eq!(v["response"]["allowed"], false, "{v}");
    }
}

#[test]
fn a_spec_of_the_wrong_shape_is_refused_not_panicked_on() {
    let mut s = spec(64);
    s["workers"] = json!("four");
    let r = answer(&request("CREATE", job(s, None), None), Admission::default());
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("does not read as a HeteroTrainingJob"),
        "{r}"
    );
}

#[test]
fn a_job_in_a_namespace_the_operator_does_not_watch_is_left_to_its_own_release() {
    let body = request("CREATE", job(spec(16), None), None);
    let judged = |watched: &[String]| {
        serde_json::to_value(review(&body, Admission::default(), watched)).unwrap()["response"]
            ["allowed"]
            .clone()
    };
    assert_eq!(judged(&["ns".to_string()]), false);
    assert_eq!(judged(&[]), false, "watching every namespace");
    assert_eq!(judged(&["team-b".to_string()]), true);
}
