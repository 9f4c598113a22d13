//! Every pod HeteroTrain renders passes Pod Security `restricted`, checked
//! field by field with the upstream rules (`heterotrain_e2e::pod_security`;
//! the local 1.20 API server has no PodSecurity admission): the rank pods
//! the operator builds for every example job, for a job using every pod
//! customisation field, and for a later gang. The chart's operator pod is
//! checked in `tests/helm.rs`, the pods the API server admitted during a
//! run in `tests/system.rs`.

use heterotrain_crds::HeteroTrainingJob;
use heterotrain_e2e::pod_security::restricted;
use heterotrain_operator::build::{desired, BuildInputs};
use heterotrain_operator::validate::{self, Checked};

fn rendered_pods(
    job: &HeteroTrainingJob,
    restart_count: u32,
) -> Vec<k8s_openapi::api::core::v1::Pod> {
    let v = match validate::check(job, Default::default()).expect("namespace and uid") {
        Checked::Valid(v) => v,
        Checked::Invalid { problems, .. } => panic!("invalid job: {problems:?}"),
    };
    let inputs = BuildInputs {
        default_image: "registry.example/heterotrain-trainer:1".into(),
        restart_count,
        metrics_from: vec!["heterotrain-system".into()],
        gang: None,
    };
    desired(&v, &inputs).expect("build").pods
}

fn with_identity(mut job: serde_yaml::Value, n: usize) -> HeteroTrainingJob {
    job["metadata"]["namespace"] = "research".into();
    job["metadata"]["uid"] = format!("6f1c2a9e-0000-4000-8000-{n:012}").into();
    serde_yaml::from_value(job).expect("a HeteroTrainingJob")
}

#[test]
fn every_rendered_rank_pod_is_restricted() {
    let mut jobs: Vec<(String, HeteroTrainingJob)> = heterotrain_e2e::paths::example_jobs()
        .expect("examples/")
        .into_iter()
        .enumerate()
        .map(|(i, (path, job))| (path.display().to_string(), with_identity(job, i)))
        .collect();
    let custom = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../operator/tests/fixtures/custom.yaml"
    );
    let text = std::fs::read_to_string(custom).expect("custom fixture");
    jobs.push((
        custom.into(),
        serde_yaml::from_str(&text).expect("custom job"),
    ));
    assert!(jobs.len() >= 4, "examples missing: {}", jobs.len());
    let mut checked = 0;
    for (what, job) in &jobs {
        for restart in [0, 3] {
            let pods = rendered_pods(job, restart);
            assert!(!pods.is_empty(), "{what}: no pods");
            for pod in pods {
                let v = restricted(&pod);
                assert!(
                    v.is_empty(),
                    "{what}: pod {:?} breaks restricted: {v:?}",
                    pod.metadata.name
                );
                checked += 1;
            }
        }
    }
    eprintln!("{checked} rendered rank pods pass restricted");
}
