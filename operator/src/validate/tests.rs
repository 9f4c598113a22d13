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
fn a_generated_dataset_up_to_the_memory_limit_is_valid() {
    // 2,000,000 images: 22.9 GiB is over; 600,000: 6.9 GiB is not.
    for (n, ok) in [(600_000, true), (2_000_000, false)] {
        let mut v = base();
        merge(
            &mut v["spec"],
            &serde_json::json!({"dataset": {"name": "synthetic_image", "syntheticSamples": n}}),
        );
        let job: HeteroTrainingJob = serde_json::from_value(v).expect("job");
        assert_eq!(validate("job", &job.spec, None).is_ok(), ok, "{n}");
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
fn torchscript_trains_a_file_on_a_file_dataset() {
    let job = |patch: serde_json::Value| -> HeteroTrainingJob {
        let mut v = base();
        merge(&mut v["spec"], &patch);
        serde_json::from_value(v).expect("job")
    };
    let ok = job(serde_json::json!({
        "model": {"name": "torchscript", "file": "/data/model.pt"},
        "dataset": {"name": "tensors", "claimName": "own"}
    }));
    assert_eq!(validate("job", &ok.spec, None), Ok(()));
    let args = crate::build::args::trainer_settings(&ok.spec, &ok.spec.workers[0]).expect("args");
    assert_eq!(args.model.model_file, Some("/data/model.pt".into()));
    let example: HeteroTrainingJob =
        serde_yaml::from_str(include_str!("../../../examples/own-model/job.yaml"))
            .expect("example parses");
    assert_eq!(validate("own-model", &example.spec, None), Ok(()));
    let written =
        crate::build::args::trainer_args(&example.spec, &example.spec.workers[0]).expect("args");
    let at = |flag: &str| {
        let i = written.iter().position(|a| a == flag).expect(flag);
        written[i + 1].as_str()
    };
    assert_eq!(at("--model"), "torchscript");
    assert_eq!(at("--model-file"), "/data/own-model/model.pt");
    assert_eq!(at("--dataset"), "tensors");
    assert_eq!(at("--data-dir"), "/data/own-model");
    let problem = |patch: serde_json::Value| -> Problem {
        let p = validate("job", &job(patch).spec, None).expect_err("invalid");
        assert_eq!(p.len(), 1, "{p:?}");
        p[0].clone()
    };
    let p = problem(serde_json::json!({
        "model": {"name": "torchscript"},
        "dataset": {"name": "tensors", "path": "/data"}
    }));
    assert_eq!(p.field, "spec.model.file");
    assert!(p.message.contains("needs file"), "{p:?}");
    let p = problem(serde_json::json!({
        "model": {"name": "torchscript", "file": "model.pt"},
        "dataset": {"name": "tensors", "path": "/data"}
    }));
    assert_eq!(p.field, "spec.model.file");
    assert!(p.message.contains("absolute path"), "{p:?}");
    let p = problem(serde_json::json!({"model": {"name": "simple_cnn", "file": "/data/m.pt"}}));
    assert_eq!(p.field, "spec.model.file");
    assert!(p.message.contains("only for model torchscript"), "{p:?}");
    let p = problem(serde_json::json!({"model": {"name": "torchscript", "file": "/data/m.pt"}}));
    assert_eq!(p.field, "spec.dataset.name");
    assert!(p.message.contains("synthetic_image"), "{p:?}");
    let p = problem(serde_json::json!({
        "model": {"name": "torchscript", "file": "/data/m.pt"},
        "dataset": {"name": "tokens", "path": "/data"}
    }));
    assert_eq!(p.field, "spec.dataset.name");
    assert!(p.message.contains("image or tensors"), "{p:?}");
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
    match check(&job, Default::default()).expect("namespace set") {
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
    let err = check(&no_ns, Default::default()).expect_err("no namespace");
    assert_eq!(err.to_string(), "object is missing metadata.namespace");
}

/// `spec.workers[0]` of the base job with `group` merged in, validated.
fn group_problems(group: serde_json::Value) -> Result<(), Vec<Problem>> {
    let mut v = base();
    let mut g = serde_json::json!({"name": "cpu", "replicas": 4});
    merge(&mut g, &group);
    v["spec"]["workers"] = serde_json::json!([g]);
    let job: HeteroTrainingJob = serde_json::from_value(v).expect("schema-valid job");
    validate("job", &job.spec, None)
}

#[test]
fn pod_customisation_that_fits_is_valid() {
    let ok = group_problems(serde_json::json!({
        "volumes": [
            {"name": "cfg", "configMap": {"name": "c"}},
            {"name": "cache", "persistentVolumeClaim": {"claimName": "hf-cache"}},
            {"name": "tmp", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}}
        ],
        "volumeMounts": [
            {"name": "cfg", "mountPath": "/etc/cfg"},
            {"name": "cache", "mountPath": "/cache/"},
            {"name": "tmp", "mountPath": "/dev/shm"}
        ],
        "imagePullSecrets": [{"name": "regcred"}],
        "priorityClassName": "high",
        "runtimeClassName": "nvidia",
        "podLabels": {"team": "a", "example.org/tier": "gold"},
        "podAnnotations": {"example.org/note": "anything: goes here"},
        "envFrom": [{"configMapRef": {"name": "settings"}}]
    }));
    // Without shmSize, a group may mount its own volume at /dev/shm.
    assert_eq!(ok, Ok(()));
    assert_eq!(
        group_problems(serde_json::json!({"shmSize": "512Mi"})),
        Ok(())
    );
    // The fixture with every field set is valid too.
    let job = crate::testing::fixture("custom.yaml");
    assert_eq!(validate("custom", &job.spec, None), Ok(()));
}

#[test]
fn pod_customisation_problems_name_their_field() {
    let cfg = serde_json::json!({"name": "cfg", "configMap": {"name": "c"}});
    let cases = [
        (
            serde_json::json!({"volumes": [{"name": "scratch", "emptyDir": {}}]}),
            "spec.workers[0].volumes[0].name",
            "volume name \"scratch\" is one the operator adds",
        ),
        (
            serde_json::json!({"volumes": [cfg, {"name": "cfg", "secret": {"secretName": "s"}}]}),
            "spec.workers[0].volumes[1].name",
            "is used twice",
        ),
        (
            serde_json::json!({"volumes": [{"name": "host", "hostPath": {"path": "/var/lib"}}]}),
            "spec.workers[0].volumes[0].hostPath",
            "hostPath volume, which rank pods may not use",
        ),
        (
            serde_json::json!({"volumes": [{"name": "n", "nfs": {"server": "s", "path": "/x"}}]}),
            "spec.workers[0].volumes[0].nfs",
            "of kind nfs, which PodSecurity restricted refuses",
        ),
        (
            serde_json::json!({"volumes": [cfg], "volumeMounts": [{"name": "cfg", "mountPath": "/scratch/"}]}),
            "spec.workers[0].volumeMounts[0].mountPath",
            "where the operator mounts its \"scratch\" volume",
        ),
        (
            serde_json::json!({"volumes": [cfg], "volumeMounts": [{"name": "cfg", "mountPath": "/checkpoints"}]}),
            "spec.workers[0].volumeMounts[0].mountPath",
            "its \"checkpoints\" volume",
        ),
        (
            serde_json::json!({"shmSize": "1Gi", "volumes": [cfg], "volumeMounts": [{"name": "cfg", "mountPath": "/dev/shm"}]}),
            "spec.workers[0].volumeMounts[0].mountPath",
            "shmSize already mounts /dev/shm",
        ),
        (
            serde_json::json!({"volumes": [cfg], "volumeMounts": [{"name": "cfg", "mountPath": "etc/cfg"}]}),
            "spec.workers[0].volumeMounts[0].mountPath",
            "must be an absolute path",
        ),
        (
            serde_json::json!({"volumes": [cfg], "volumeMounts": [{"name": "cfg", "mountPath": "/a"}, {"name": "cfg", "mountPath": "/a/"}]}),
            "spec.workers[0].volumeMounts[1].mountPath",
            "is mounted twice",
        ),
        (
            serde_json::json!({"volumeMounts": [{"name": "missing", "mountPath": "/m"}]}),
            "spec.workers[0].volumeMounts[0].name",
            "\"missing\", which is not among spec.workers[0].volumes",
        ),
        (
            serde_json::json!({"podLabels": {"heterotrain.dev/rank": "0"}}),
            "spec.workers[0].podLabels",
            "label \"heterotrain.dev/rank\" is set by the operator",
        ),
        (
            serde_json::json!({"podLabels": {"app.kubernetes.io/managed-by": "me"}}),
            "spec.workers[0].podLabels",
            "\"app.kubernetes.io/managed-by\" is set by the operator",
        ),
        (
            serde_json::json!({"podLabels": {"team": "not a value"}}),
            "spec.workers[0].podLabels",
            "not a valid label value",
        ),
        (
            serde_json::json!({"podAnnotations": {"heterotrain.dev/spec-hash": "x"}}),
            "spec.workers[0].podAnnotations",
            "annotation \"heterotrain.dev/spec-hash\" is set by the operator",
        ),
        (
            serde_json::json!({"shmSize": "2GB"}),
            "spec.workers[0].shmSize",
            "shmSize \"2GB\" is not a positive Kubernetes quantity",
        ),
        (
            serde_json::json!({"shmSize": "0"}),
            "spec.workers[0].shmSize",
            "not a positive Kubernetes quantity",
        ),
        (
            serde_json::json!({"priorityClassName": "High_Prio"}),
            "spec.workers[0].priorityClassName",
            "\"High_Prio\" is not a valid object name",
        ),
        (
            serde_json::json!({"runtimeClassName": "Nvidia"}),
            "spec.workers[0].runtimeClassName",
            "\"Nvidia\" is not a valid object name",
        ),
        (
            serde_json::json!({"imagePullSecrets": [{"name": "Bad Name"}]}),
            "spec.workers[0].imagePullSecrets[0].name",
            "is not a valid Secret name",
        ),
    ];
    for (group, field, phrase) in cases {
        let problems = group_problems(group.clone()).expect_err(phrase);
        assert_eq!(problems.len(), 1, "{group}: {problems:?}");
        assert_eq!(problems[0].field, field, "{group}");
        assert!(
            problems[0].message.contains(phrase),
            "expected {phrase:?} in {:?}",
            problems[0].message
        );
    }
}

#[test]
fn a_dataset_claim_path_is_the_operators() {
    let mut v = base();
    merge(
        &mut v["spec"],
        &serde_json::json!({
            "dataset": {"name": "mnist", "path": "/data/mnist", "claimName": "mnist"},
            "workers": [{"name": "cpu", "replicas": 4,
                "volumes": [{"name": "cfg", "configMap": {"name": "c"}}],
                "volumeMounts": [{"name": "cfg", "mountPath": "/data/mnist"}]}]
        }),
    );
    let job: HeteroTrainingJob = serde_json::from_value(v).expect("job");
    let p = validate("job", &job.spec, None).expect_err("collides with the data mount");
    assert_eq!(p[0].field, "spec.workers[0].volumeMounts[0].mountPath");
    assert!(p[0].message.contains("its \"data\" volume"), "{p:?}");
}

#[test]
fn pod_customisation_example_is_valid() {
    let text = include_str!("../../../examples/pod-customisation.yaml");
    let job: HeteroTrainingJob = serde_yaml::from_str(text).expect("example parses");
    let g = &job.spec.workers[0];
    assert_eq!(g.shm_size.as_ref().map(|q| q.0.as_str()), Some("4Gi"));
    assert_eq!(g.volumes.len(), 2);
    assert_eq!(g.env_from.len(), 2);
    assert_eq!(validate("pod-customisation", &job.spec, None), Ok(()));
}

#[test]
fn own_commands_need_no_model_or_dataset_and_refuse_the_built_in_trainers_fields() {
    let problems = |patch: serde_json::Value| {
        let mut v = base();
        merge(&mut v["spec"], &patch);
        let job: HeteroTrainingJob = serde_json::from_value(v).expect("schema-valid job");
        validate("job", &job.spec, None)
    };
    // Every group runs a command: model and dataset may go.
    let own =
        serde_json::json!({"command": ["python", "/app/train.py"], "model": null, "dataset": null});
    assert_eq!(problems(own.clone()), Ok(()));
    // A dataset's claim is still theirs to mount; a model names the cache entry.
    let mut with_claim = own.clone();
    with_claim["dataset"] =
        serde_json::json!({"name": "tensors", "claimName": "data", "path": "/data"});
    with_claim["model"] = serde_json::json!({"name": "mlp"});
    assert_eq!(problems(with_claim), Ok(()));

    // The built-in trainer (no command, or one group without) needs both.
    let err = problems(serde_json::json!({"model": null, "dataset": null})).expect_err("built-in");
    let fields: Vec<&str> = err.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(fields, ["spec.model", "spec.dataset"]);
    assert!(
        err[0].message.contains("give every group a command"),
        "{}",
        err[0].message
    );
    let err = problems(serde_json::json!({
        "model": null,
        "workers": [{"name": "own", "replicas": 2, "command": ["python", "t.py"]}, {"name": "cpu", "replicas": 2}],
    }))
    .expect_err("one group on the built-in trainer");
    assert_eq!(err[0].field, "spec.model");

    // Fields only the built-in trainer reads are refused, each by its path.
    let mut set = own.clone();
    set["model"] = serde_json::json!({"name": "mlp", "hidden": 64});
    set["training"] =
        serde_json::json!({"learningRate": "0.2", "momentum": "0.9", "optimizer": "adamw"});
    let err = problems(set).expect_err("built-in-only fields");
    let fields: Vec<&str> = err.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.model.hidden",
            "spec.training.optimizer",
            "spec.training.learningRate",
            "spec.training.momentum"
        ]
    );
    assert!(
        err[0]
            .message
            .contains("only the built-in trainer reads it"),
        "{}",
        err[0].message
    );
    // The same fields are fine when some group runs the built-in trainer.
    assert_eq!(
        problems(serde_json::json!({"training": {"learningRate": "0.05", "momentum": "0.9"}})),
        Ok(())
    );
}

#[test]
fn own_commands_are_checked() {
    // A group's own command with its args is valid, as is a job-wide one.
    assert_eq!(
        group_problems(
            serde_json::json!({"command": ["python", "/app/train.py"], "args": ["--steps", "5"]})
        ),
        Ok(())
    );
    let mut v = base();
    v["spec"]["command"] = serde_json::json!(["python", "/app/train.py"]);
    v["spec"]["args"] = serde_json::json!(["--steps", "5"]);
    let job: HeteroTrainingJob = serde_json::from_value(v).expect("job");
    assert_eq!(validate("job", &job.spec, None), Ok(()));

    // Args with no command to run them, an empty command entry.
    let err =
        group_problems(serde_json::json!({"args": ["--bucket-mib", "8"]})).expect_err("args alone");
    assert_eq!(err[0].field, "spec.workers[0].args");
    assert!(err[0].message.contains("set command"), "{}", err[0].message);
    let err =
        group_problems(serde_json::json!({"command": ["python", " "]})).expect_err("empty entry");
    assert_eq!(err[0].field, "spec.workers[0].command");
    let mut v = base();
    v["spec"]["args"] = serde_json::json!(["--x"]);
    let job: HeteroTrainingJob = serde_json::from_value(v).expect("job");
    let err = validate("job", &job.spec, None).expect_err("job args alone");
    assert_eq!(err[0].field, "spec.args");

    // The environment the contract hands over cannot be overridden.
    let err = group_problems(serde_json::json!({"env": [{"name": "HT_BATCH_SIZE", "value": "8"}]}))
        .expect_err("reserved env");
    assert_eq!(err[0].field, "spec.workers[0].env");
}

#[test]
fn a_jobs_prometheus_must_be_the_operators_or_allowed() {
    let with_url = |url: &str| {
        let mut v = base();
        merge(
            &mut v["spec"],
            &serde_json::json!({"loadBalancing": {"metricsSource": "prometheus", "prometheusUrl": url}}),
        );
        let mut job: HeteroTrainingJob = serde_json::from_value(v).expect("job");
        job.metadata.namespace = Some("ml".into());
        job.metadata.uid = Some("u-1".into());
        job
    };
    let allowed = vec!["http://prom.monitoring:9090".to_string()];
    let policy = PrometheusPolicy {
        default_url: Some("https://thanos.monitoring:443/"),
        allowed: &allowed,
    };
    let verdict = |url: &str, policy: PrometheusPolicy<'_>| -> Option<String> {
        match check(
            &with_url(url),
            Admission {
                prometheus: policy,
                ..Default::default()
            },
        )
        .expect("identity")
        {
            Checked::Valid(_) => None,
            Checked::Invalid { problems, .. } => {
                assert_eq!(problems.len(), 1, "{problems:?}");
                assert_eq!(problems[0].field, "spec.loadBalancing.prometheusUrl");
                Some(problems[0].message.clone())
            }
        }
    };
    // The operator's own and the allowed origins, any path.
    for ok in [
        "https://thanos.monitoring:443",
        "http://prom.monitoring:9090/",
        "http://PROM.monitoring:9090/prometheus",
    ] {
        assert_eq!(verdict(ok, policy), None, "{ok}");
    }
    // Anything else, look-alikes included, is refused with what to do.
    for bad in [
        "http://169.254.169.254/latest/meta-data",
        "http://prom.monitoring:9090.evil.example",
        "http://prom.monitoring:9091",
        "https://prom.monitoring:9090",
    ] {
        let msg = verdict(bad, policy).unwrap_or_else(|| panic!("{bad} allowed"));
        assert!(msg.contains("--allow-prometheus-url"), "{msg}");
        assert!(msg.contains("http://prom.monitoring:9090"), "{msg}");
    }
    let msg = verdict("http://attacker@prom.monitoring:9090", policy).expect("refused");
    assert!(msg.contains("user information"), "{msg}");
    // No operator URL and no allow-list: a job may name none.
    let msg = verdict("http://prom.monitoring:9090", PrometheusPolicy::default()).expect("refused");
    assert!(msg.contains("allows none"), "{msg}");
}

#[test]
fn service_accounts_and_images_are_what_the_operator_allows() {
    let job_with = |patch: serde_json::Value| {
        let mut v = base();
        merge(&mut v["spec"], &patch);
        let mut job: HeteroTrainingJob = serde_json::from_value(v).expect("job");
        job.metadata.namespace = Some("ml".into());
        job.metadata.uid = Some("u-1".into());
        job
    };
    let sas = vec!["heterotrain-trainer".to_string(), "team-runner".to_string()];
    let images = vec![
        "ghcr.io/heterotrain/".to_string(),
        "registry.example.org/ml".to_string(),
    ];
    let admission = Admission {
        service_accounts: &sas,
        images: &images,
        ..Default::default()
    };
    let fields = |patch: serde_json::Value, a: Admission<'_>| -> Vec<String> {
        match check(&job_with(patch), a).expect("identity") {
            Checked::Valid(_) => vec![],
            Checked::Invalid { problems, .. } => {
                for p in &problems {
                    assert!(p.message.contains("--allow-"), "{p:?}");
                }
                problems.into_iter().map(|p| p.field).collect()
            }
        }
    };
    let none: Vec<String> = vec![];
    // Allowed: no choice made, an allowed account, images under allowed prefixes.
    assert_eq!(fields(serde_json::json!({}), admission), none);
    assert_eq!(
        fields(
            serde_json::json!({
                "serviceAccountName": "team-runner",
                "image": "ghcr.io/heterotrain/heterotrain-trainer:1",
                "workers": [{"name": "cpu", "replicas": 2, "image": "registry.example.org/ml/t@sha256:ab"}]
            }),
            admission
        ),
        none
    );
    // Refused: another account; look-alike images, per field.
    assert_eq!(
        fields(
            serde_json::json!({
                "serviceAccountName": "namespace-admin",
                "image": "ghcr.io/heterotrain-evil/trainer:1",
                "workers": [{"name": "cpu", "replicas": 2, "image": "registry.example.org/mlx/t:1"}]
            }),
            admission
        ),
        [
            "spec.serviceAccountName",
            "spec.image",
            "spec.workers[0].image"
        ]
    );
    // `*` allows any account; empty lists allow anything.
    let any = vec!["*".to_string()];
    let a = Admission {
        service_accounts: &any,
        ..Default::default()
    };
    assert_eq!(
        fields(
            serde_json::json!({"serviceAccountName": "namespace-admin"}),
            a
        ),
        none
    );
    assert_eq!(
        fields(
            serde_json::json!({"serviceAccountName": "x", "image": "anything:1"}),
            Admission::default()
        ),
        none
    );
}

#[test]
fn model_sizes_below_the_schemas_minimums_are_refused_without_panicking() {
    // The API server's schema refuses these; validation must too (a spec
    // can reach it without the schema), and 0 heads must not divide.
    for (patch, field) in [
        (
            serde_json::json!({"name": "gpt", "hidden": 64, "heads": 0}),
            "spec.model.heads",
        ),
        (
            serde_json::json!({"name": "mlp", "hidden": 0}),
            "spec.model.hidden",
        ),
        (
            serde_json::json!({"name": "gpt", "layers": 0}),
            "spec.model.layers",
        ),
        (
            serde_json::json!({"name": "gpt", "context": 0}),
            "spec.model.context",
        ),
        (
            serde_json::json!({"name": "gpt", "vocab": 1}),
            "spec.model.vocab",
        ),
    ] {
        let mut v = base();
        merge(
            &mut v["spec"],
            &serde_json::json!({"model": patch, "dataset": {"name": "tokens", "claimName": "text"}}),
        );
        if patch["name"] == "mlp" {
            v["spec"]["dataset"] = serde_json::json!({"name": "synthetic_image"});
        }
        let job: HeteroTrainingJob = serde_json::from_value(v).expect("job");
        let problems = validate("job", &job.spec, None).expect_err(field);
        let text = summary(&problems);
        assert!(
            text.contains(field) && text.contains("below the smallest allowed value"),
            "{field}: {text}"
        );
    }
}

#[test]
fn secrets_read_and_commands_are_what_the_operator_allows() {
    let spec = |patch: serde_json::Value| {
        let mut v = base();
        merge(&mut v["spec"], &patch);
        serde_json::from_value::<HeteroTrainingJob>(v)
            .expect("job")
            .spec
    };
    let reads_secrets = spec(serde_json::json!({
        "workers": [{"name": "cpu", "replicas": 4,
            "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "k"}}},
                    {"name": "B", "value": "plain"}],
            "envFrom": [{"secretRef": {"name": "wandb"}}, {"configMapRef": {"name": "cm"}}],
            "volumes": [{"name": "v", "secret": {"secretName": "db-admin"}},
                        {"name": "p", "projected": {"sources": [{"secret": {"name": "kubeconfig"}}]}}],
            "imagePullSecrets": [{"name": "regcred"}]}]
    }));
    let allowed = vec!["s3-creds".to_string(), "wandb".to_string()];
    let a = Admission {
        secrets: &allowed,
        ..Default::default()
    };
    let fields: Vec<String> = a
        .problems(&reads_secrets)
        .into_iter()
        .map(|p| p.field)
        .collect();
    assert_eq!(
        fields,
        [
            "spec.workers[0].volumes[0].secret.secretName",
            "spec.workers[0].volumes[1].projected.sources[0].secret.name"
        ]
    );
    let msg = &a.problems(&reads_secrets)[0].message;
    assert!(
        msg.contains("\"db-admin\"") && msg.contains("--allow-secret"),
        "{msg}"
    );
    // Unset or `*`: any Secret.
    assert!(Admission::default().problems(&reads_secrets).is_empty());
    let any = vec!["*".to_string()];
    let a = Admission {
        secrets: &any,
        ..Default::default()
    };
    assert!(a.problems(&reads_secrets).is_empty());

    // Commands: refused per field when the operator runs only its own trainer.
    let own = spec(serde_json::json!({
        "command": ["python", "/app/train.py"],
        "workers": [{"name": "cpu", "replicas": 2}, {"name": "gpu", "replicas": 2, "command": ["torchrun"]}]
    }));
    let a = Admission {
        no_custom_command: true,
        ..Default::default()
    };
    let fields: Vec<String> = a.problems(&own).into_iter().map(|p| p.field).collect();
    assert_eq!(fields, ["spec.command", "spec.workers[1].command"]);
    assert!(Admission::default().problems(&own).is_empty());
    assert!(a.problems(&spec(serde_json::json!({}))).is_empty());
}

#[test]
fn egress_rules_name_each_bad_field() {
    let mut v = base();
    merge(
        &mut v["spec"],
        &serde_json::json!({"isolation": {"egress": [
            {"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["11.0.0.0/24", "nope"]}},
                    {"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}},
                    {},
                    {"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}, {"key": "b", "operator": "Has"}]}}],
             "ports": [{"port": 0}, {"port": "BAD"}, {"port": "https", "endPort": 500}, {"endPort": 9}, {"port": 53, "protocol": "ICMP"}]},
            {"to": [{"ipBlock": {"cidr": "203.0.113.7/32"}}], "ports": [{"port": 9000, "endPort": 9010, "protocol": "TCP"}]}
        ]}}),
    );
    let job: HeteroTrainingJob = serde_json::from_value(v).expect("job");
    let problems = validate("job", &job.spec, None).expect_err("invalid egress");
    let fields: Vec<&str> = problems.iter().map(|p| p.field.as_str()).collect();
    let e = "spec.isolation.egress[0]";
    assert_eq!(
        fields,
        vec![
            format!("{e}.to[0].ipBlock.except[0]"),
            format!("{e}.to[0].ipBlock.except[1]"),
            format!("{e}.to[1]"),
            format!("{e}.to[2]"),
            format!("{e}.to[3].namespaceSelector.matchExpressions[0].values"),
            format!("{e}.to[3].namespaceSelector.matchExpressions[1].operator"),
            format!("{e}.ports[0].port"),
            format!("{e}.ports[1].port"),
            format!("{e}.ports[2].endPort"),
            format!("{e}.ports[3].endPort"),
            format!("{e}.ports[4].protocol"),
        ],
        "{problems:?}"
    );
    // The second rule alone is valid.
    let mut v = base();
    merge(
        &mut v["spec"],
        &serde_json::json!({"isolation": {"egress": [
            {"to": [{"ipBlock": {"cidr": "203.0.113.7/32"}}], "ports": [{"port": 9000, "endPort": 9010, "protocol": "TCP"}]}
        ]}}),
    );
    let job: HeteroTrainingJob = serde_json::from_value(v).expect("job");
    assert_eq!(validate("job", &job.spec, None), Ok(()));
}
