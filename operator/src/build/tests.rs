//! Build-stage tests from the YAML fixtures in `operator/tests/fixtures`
//! (the plan ConfigMap a new gang gets is rendered by `plan`, checked here too).

use heterotrain_crds::{labels, BatchPlan, HeteroTrainingJob, HeteroTrainingJobStatus, PLAN_KEY};
use k8s_openapi::api::core::v1::{EnvVar, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::*;
use crate::names;
use crate::plan;
use crate::testing::{fixture, valid};
use crate::validate;

fn inputs(restart: u32) -> BuildInputs {
    BuildInputs {
        default_image: "default/trainer:1".into(),
        restart_count: restart,
        metrics_from: vec!["heterotrain-system".into(), "monitoring".into()],
        gang: None,
    }
}

fn env_of<'a>(pod: &'a Pod, name: &str) -> Option<&'a EnvVar> {
    pod.spec.as_ref()?.containers[0]
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)
}

fn env_value(pod: &Pod, name: &str) -> Option<String> {
    env_of(pod, name).and_then(|e| e.value.clone())
}

fn args_of(pod: &Pod) -> Vec<String> {
    pod.spec.as_ref().expect("spec").containers[0]
        .args
        .clone()
        .expect("args")
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

#[test]
fn mixed_job_builds_one_pod_per_rank_in_group_order() {
    let job = fixture("mixed.yaml");
    let d = desired(&valid(&job), &inputs(1)).expect("build");
    assert_eq!(d.pods.len(), 3);
    let names: Vec<String> = d
        .pods
        .iter()
        .map(|p| p.metadata.name.clone().expect("name"))
        .collect();
    assert_eq!(names, ["mixed-0", "mixed-1", "mixed-2"]);
    for (rank, pod) in d.pods.iter().enumerate() {
        let l = pod.metadata.labels.as_ref().expect("labels");
        assert_eq!(l["heterotrain.dev/job"], "mixed");
        assert_eq!(l["heterotrain.dev/rank"], rank.to_string());
        assert_eq!(l["app.kubernetes.io/managed-by"], "heterotrain-operator");
        assert_eq!(l["heterotrain.dev/restart"], "1");
        assert_eq!(
            l["heterotrain.dev/group"],
            if rank == 0 { "a100" } else { "cpu" }
        );
        let owner = &pod.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(owner.kind, "HeteroTrainingJob");
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.uid, "6f1c2a9e-0000-4000-8000-000000000001");
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.hostname.as_deref(), Some(names[rank].as_str()));
        assert_eq!(spec.subdomain.as_deref(), Some("mixed"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.service_account_name.as_deref(), Some("trainer-sa"));
        assert_eq!(env_value(pod, "RANK"), Some(rank.to_string()));
        assert_eq!(env_value(pod, "WORLD_SIZE").as_deref(), Some("3"));
        assert_eq!(env_value(pod, "LOCAL_RANK").as_deref(), Some("0"));
        assert_eq!(
            env_value(pod, "MASTER_ADDR").as_deref(),
            Some("mixed-0.mixed.research.svc")
        );
        assert_eq!(env_value(pod, "MASTER_PORT").as_deref(), Some("29500"));
        assert_eq!(
            env_value(pod, "HETEROTRAIN_PLAN_CONFIGMAP").as_deref(),
            Some("mixed-plan")
        );
        assert_eq!(
            env_value(pod, "HETEROTRAIN_RESTART_COUNT").as_deref(),
            Some("1")
        );
        assert_eq!(
            env_value(pod, "HT_JOB_UID").as_deref(),
            Some("6f1c2a9e-0000-4000-8000-000000000001")
        );
        for var in ["POD_IP", "HT_BIND_ADDR"] {
            let ip = env_of(pod, var)
                .and_then(|e| e.value_from.as_ref())
                .and_then(|v| v.field_ref.as_ref());
            assert_eq!(
                ip.map(|f| f.field_path.as_str()),
                Some("status.podIP"),
                "{var}"
            );
        }
        let ns = env_of(pod, "HETEROTRAIN_NAMESPACE")
            .and_then(|e| e.value_from.as_ref())
            .and_then(|v| v.field_ref.as_ref());
        assert_eq!(
            ns.map(|f| f.field_path.as_str()),
            Some("metadata.namespace")
        );
        // Restricted security context.
        let psc = spec
            .security_context
            .as_ref()
            .expect("pod security context");
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(
            psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault")
        );
        let c = &spec.containers[0];
        let sc = c
            .security_context
            .as_ref()
            .expect("container security context");
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(
            sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_string()])
        );
        let mounts = c.volume_mounts.as_ref().expect("mounts");
        assert!(mounts
            .iter()
            .any(|m| m.mount_path == "/scratch" && m.read_only.is_none()));
        // Rank 0 mounts its run's own directory of the claim (subPath:
        // `<job>/<UID>`); the others an emptyDir, no subPath.
        let ckpt_mount = mounts
            .iter()
            .find(|m| m.mount_path == "/checkpoints")
            .expect("checkpoint mount");
        let labels = pod.metadata.labels.as_ref().expect("labels");
        let run_dir = format!(
            "{}/{}",
            labels["heterotrain.dev/job"], labels["heterotrain.dev/job-uid"]
        );
        assert_eq!(
            ckpt_mount.sub_path.as_deref(),
            (rank == 0).then_some(run_dir.as_str()),
            "rank {rank}"
        );
        assert!(mounts
            .iter()
            .any(|m| m.mount_path == "/data/cifar10" && m.read_only == Some(true)));
        let vols = spec.volumes.as_ref().expect("volumes");
        let ckpt = vols
            .iter()
            .find(|v| v.name == "checkpoints")
            .expect("checkpoint volume");
        // Only rank 0 (the one that reads and writes checkpoints) mounts
        // the claim; the others get an empty directory at the same path.
        assert_eq!(
            ckpt.persistent_volume_claim
                .as_ref()
                .map(|p| p.claim_name.as_str()),
            (rank == 0).then_some("ckpt"),
            "rank {rank}"
        );
        assert_eq!(ckpt.empty_dir.is_some(), rank != 0, "rank {rank}");
        let ports = c.ports.as_ref().expect("ports");
        assert!(ports
            .iter()
            .any(|p| p.name.as_deref() == Some("metrics") && p.container_port == 9400));
        assert_eq!(
            c.command.as_deref(),
            Some(&["heterotrain-trainer".to_string()][..])
        );
    }
    // GPU group: placement, resources, device.
    let gpu = d.pods[0].spec.as_ref().expect("spec");
    assert_eq!(
        gpu.node_selector.as_ref().expect("selector")["heterotrain.dev/accelerator"],
        "NVIDIA-A100"
    );
    assert_eq!(
        gpu.tolerations.as_ref().expect("tolerations")[0]
            .key
            .as_deref(),
        Some("nvidia.com/gpu")
    );
    let limits = gpu.containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .expect("limits");
    assert_eq!(limits["nvidia.com/gpu"].0, "1");
    assert_eq!(
        gpu.containers[0].image.as_deref(),
        Some("example.org/trainer:v1")
    );
    let a = args_of(&d.pods[0]);
    assert_eq!(a[0], "train");
    assert_eq!(flag(&a, "--device").as_deref(), Some("cuda"));
    assert_eq!(flag(&a, "--threads").as_deref(), Some("4"));
    // CPU group: affinity, own image, 1500m → 2 threads, extra env.
    let cpu = &d.pods[2];
    let cs = cpu.spec.as_ref().expect("spec");
    assert!(cs
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .is_some());
    assert!(cs.node_selector.is_none());
    assert_eq!(
        cs.containers[0].image.as_deref(),
        Some("example.org/trainer:cpu")
    );
    assert_eq!(env_value(cpu, "EXTRA").as_deref(), Some("1"));
    let a = args_of(cpu);
    for (f, v) in [
        ("--model", "resnet18"),
        ("--dataset", "cifar10"),
        ("--data-dir", "/data/cifar10"),
        ("--batch-size", "96"),
        ("--epochs", "2"),
        ("--lr", "0.1"),
        ("--momentum", "0.9"),
        ("--weight-decay", "0.0005"), // the spec's "5e-4", as a number
        ("--schedule", "cosine"),
        ("--warmup-steps", "10"),
        ("--seed", "7"),
        ("--optimizer-sharding", "fastest"),
        ("--backend", "gloo"),
        ("--device", "cpu"),
        ("--threads", "2"),
        ("--checkpoint-dir", "/checkpoints"),
        ("--checkpoint-every", "25"),
        ("--resume", "auto"),
        ("--metrics-port", "9400"),
        ("--profile-batch-sizes", "8,16,32"),
    ] {
        assert_eq!(flag(&a, f).as_deref(), Some(v), "{f} in {a:?}");
    }
    assert!(!a.contains(&"--no-profile".to_string()));
}

#[test]
fn service_and_plan() {
    let job = fixture("mixed.yaml");
    let v = valid(&job);
    let d = desired(&v, &inputs(0)).expect("build");
    let cm = plan::configmap(&v, &plan::equal(&v, 0));
    let svc = d.service.spec.as_ref().expect("spec");
    assert_eq!(d.service.metadata.name.as_deref(), Some("mixed"));
    assert_eq!(svc.cluster_ip.as_deref(), Some("None"));
    assert_eq!(svc.publish_not_ready_addresses, Some(true));
    assert_eq!(
        svc.selector.as_ref().expect("selector")["heterotrain.dev/job"],
        "mixed"
    );
    let ports: Vec<i32> = svc
        .ports
        .as_ref()
        .expect("ports")
        .iter()
        .map(|p| p.port)
        .collect();
    assert_eq!(ports, [29500, 9400]);
    assert_eq!(cm.metadata.name.as_deref(), Some("mixed-plan"));
    let text = &cm.data.as_ref().expect("data")[PLAN_KEY];
    let plan = BatchPlan::parse(text, 3).expect("valid plan");
    assert_eq!(plan.generation, 0);
    assert_eq!(plan.batch_sizes, [32, 32, 32]);
    for o in [&d.service.metadata, &cm.metadata] {
        assert_eq!(o.owner_references.as_ref().expect("owner")[0].name, "mixed");
    }
}

#[test]
fn ranks_are_isolated_by_job_uid_and_only_rank_0_reaches_the_api() {
    let job = fixture("mixed.yaml");
    let v = valid(&job);
    let uid = v.owner.uid.clone();
    let d = desired(&v, &inputs(0)).expect("build");
    // Every pod carries the job-UID label; only rank 0 mounts a token.
    for (rank, pod) in d.pods.iter().enumerate() {
        assert_eq!(pod.labels().get(labels::JOB_UID), Some(&uid), "rank {rank}");
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(
            spec.automount_service_account_token,
            Some(rank == 0),
            "rank {rank}"
        );
    }
    assert_eq!(d.policies.len(), 2);
    let by_uid = |sel: &LabelSelector| {
        sel.match_labels
            .as_ref()
            .and_then(|m| m.get(labels::JOB_UID))
            .cloned()
    };
    let isolate = d.policies[0].spec.as_ref().expect("spec");
    assert_eq!(d.policies[0].metadata.name.as_deref(), Some("mixed"));
    assert_eq!(
        by_uid(isolate.pod_selector.as_ref().expect("selector")),
        Some(uid.clone())
    );
    assert_eq!(
        isolate.policy_types.as_deref(),
        Some(&["Ingress".to_string(), "Egress".to_string()][..])
    );
    let ingress = isolate.ingress.as_ref().expect("ingress");
    // Peers: any port, only from the same job's pods.
    let peers = ingress[0].from.as_ref().expect("from");
    assert_eq!(peers.len(), 1);
    assert_eq!(
        by_uid(peers[0].pod_selector.as_ref().expect("pods")),
        Some(uid.clone())
    );
    assert!(peers[0].namespace_selector.is_none());
    // Scrapers: only the metrics port, only from the named namespaces.
    let ports = ingress[1].ports.as_ref().expect("ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].port, Some(IntOrString::Int(9400)));
    let namespaces: Vec<String> = ingress[1]
        .from
        .as_ref()
        .expect("from")
        .iter()
        .filter_map(|p| {
            p.namespace_selector
                .as_ref()?
                .match_labels
                .as_ref()?
                .get(labels::NAMESPACE_NAME)
                .cloned()
        })
        .collect();
    assert_eq!(namespaces, ["heterotrain-system", "monitoring"]);
    let egress = isolate.egress.as_ref().expect("egress");
    assert_eq!(
        by_uid(
            egress[0].to.as_ref().expect("to")[0]
                .pod_selector
                .as_ref()
                .expect("pods")
        ),
        Some(uid.clone())
    );
    assert!(egress[1].to.is_none(), "DNS to any resolver");
    assert!(egress[1]
        .ports
        .as_ref()
        .expect("ports")
        .iter()
        .all(|p| p.port == Some(IntOrString::Int(53))));
    // The API server: rank 0 only.
    let api = d.policies[1].spec.as_ref().expect("spec");
    let sel = api
        .pod_selector
        .as_ref()
        .expect("selector")
        .match_labels
        .as_ref()
        .expect("labels");
    assert_eq!(sel.get(labels::RANK).map(String::as_str), Some("0"));
    assert_eq!(sel.get(labels::JOB_UID), Some(&uid));
    assert!(api.ingress.is_none());
    // The trainers' Role reads the plan only, bound to the pods' account.
    let (role, binding) = &d.access;
    let rule = &role.rules.as_ref().expect("rules")[0];
    assert_eq!(
        rule.resource_names.as_deref(),
        Some(&["mixed-plan".to_string()][..])
    );
    let sa = d.pods[0]
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone());
    assert_eq!(
        binding.subjects.as_ref().map(|s| Some(s[0].name.clone())),
        Some(sa)
    );
    for o in [
        &d.policies[0].metadata,
        &d.policies[1].metadata,
        &role.metadata,
        &binding.metadata,
    ] {
        assert_eq!(o.owner_references.as_ref().expect("owner")[0].uid, uid);
    }
}

#[test]
fn listed_egress_follows_the_jobs_own_rules() {
    let mut job = fixture("mixed.yaml");
    job.spec.isolation.egress = serde_json::from_value(serde_json::json!([
        {"to": [{"ipBlock": {"cidr": "203.0.113.7/32"}}], "ports": [{"port": 443}]},
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mirror"}}}]}
    ]))
    .expect("rules");
    let v = valid(&job);
    let d = desired(&v, &inputs(0)).expect("build");
    let egress = d.policies[0]
        .spec
        .as_ref()
        .and_then(|s| s.egress.clone())
        .expect("egress");
    // The job's pods and DNS first, then the listed rules, unchanged.
    assert_eq!(egress.len(), 4);
    assert_eq!(&egress[2..], &job.spec.isolation.egress[..]);
    // Rank 0's API policy does not grow.
    let api = d.policies[1].spec.as_ref().and_then(|s| s.egress.clone());
    assert_eq!(api.map(|e| e.len()), Some(1));
}

#[test]
fn isolation_off_builds_no_policies() {
    let mut job = fixture("mixed.yaml");
    job.spec.isolation.network_policy = false;
    let v = valid(&job);
    let d = desired(&v, &inputs(0)).expect("build");
    assert!(d.policies.is_empty());
    assert_eq!(d.pods[0].labels().get(labels::JOB_UID), Some(&v.owner.uid));
}

#[test]
fn minimal_job_uses_defaults() {
    let job = fixture("minimal.yaml");
    let v = valid(&job);
    let d = desired(&v, &inputs(0)).expect("build");
    let cm = plan::configmap(&v, &plan::equal(&v, 0));
    assert_eq!(d.pods.len(), 2);
    let p = &d.pods[1];
    let spec = p.spec.as_ref().expect("spec");
    assert_eq!(
        spec.service_account_name.as_deref(),
        Some("heterotrain-trainer")
    );
    assert_eq!(
        spec.containers[0].image.as_deref(),
        Some("default/trainer:1")
    );
    let a = args_of(p);
    assert!(a.contains(&"--no-profile".to_string()));
    assert_eq!(flag(&a, "--max-steps").as_deref(), Some("100"));
    assert_eq!(flag(&a, "--hidden").as_deref(), Some("64"));
    assert_eq!(flag(&a, "--synthetic-samples").as_deref(), Some("512"));
    assert_eq!(flag(&a, "--threads").as_deref(), Some("1"));
    assert_eq!(flag(&a, "--epochs"), None);
    assert_eq!(flag(&a, "--data-dir"), None);
    // The trainer's own timeouts unless the run policy sets them.
    let defaults = heterotrain_crds::TrainerArgs::defaults().expect("defaults");
    assert_eq!(
        flag(&a, "--collective-timeout-secs"),
        Some(defaults.dist.collective_timeout_secs.to_string())
    );
    let mut timed = job.clone();
    timed.spec.run_policy.collective_timeout_seconds = Some(45);
    timed.spec.run_policy.rendezvous_timeout_seconds = Some(600);
    let t = args_of(&desired(&valid(&timed), &inputs(0)).expect("build").pods[1]);
    assert_eq!(flag(&t, "--collective-timeout-secs").as_deref(), Some("45"));
    assert_eq!(
        flag(&t, "--rendezvous-timeout-secs").as_deref(),
        Some("600")
    );
    // Checkpoints without a claim: an emptyDir.
    let ck = spec
        .volumes
        .as_ref()
        .expect("volumes")
        .iter()
        .find(|v| v.name == "checkpoints")
        .expect("vol");
    assert!(ck.empty_dir.is_some());
    let text = &cm.data.as_ref().expect("data")[PLAN_KEY];
    assert_eq!(
        BatchPlan::parse(text, 2).expect("plan").batch_sizes,
        [17, 16]
    );
}

#[test]
fn spec_hash_names_changed_sections() {
    let job = fixture("minimal.yaml");
    let h = hash::spec_hash(&job.spec);
    let mut changed = job.spec.clone();
    assert!(hash::changed_sections(&h, &changed).is_empty());
    changed.workers[0].replicas = 3;
    changed.model.as_mut().expect("model").hidden = Some(128);
    changed.load_balancing.min_gain_percent = 10;
    assert_eq!(hash::changed_sections(&h, &changed), ["workers", "model"]);
}

#[test]
fn missing_uid_is_an_error_not_a_panic() {
    let mut job = fixture("minimal.yaml");
    job.metadata.uid = None;
    let err = validate::check(&job, Default::default()).expect_err("no uid");
    assert_eq!(err.metric_label(), "missing_field");
}

#[test]
fn group_pod_customisation_lands_in_its_pods() {
    let job = fixture("custom.yaml");
    let d = desired(&valid(&job), &inputs(2)).expect("build");
    assert_eq!(d.pods.len(), 3);
    for (rank, pod) in d.pods[..2].iter().enumerate() {
        let spec = pod.spec.as_ref().expect("spec");
        let c = &spec.containers[0];
        // Extra volumes and mounts, after the operator's own.
        let vols = spec.volumes.as_ref().expect("volumes");
        let vol_names: Vec<&str> = vols.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            vol_names,
            ["scratch", "checkpoints", "dshm", "tokenizer", "hf-token"]
        );
        let tok = vols.iter().find(|v| v.name == "tokenizer").expect("vol");
        assert_eq!(
            tok.config_map.as_ref().map(|c| c.name.as_str()),
            Some("tokenizer-files")
        );
        let secret = vols.iter().find(|v| v.name == "hf-token").expect("vol");
        assert_eq!(
            secret
                .secret
                .as_ref()
                .and_then(|s| s.secret_name.as_deref()),
            Some("hf-token")
        );
        let mounts = c.volume_mounts.as_ref().expect("mounts");
        let m = mounts
            .iter()
            .find(|m| m.name == "tokenizer")
            .expect("mount");
        assert_eq!(m.mount_path, "/etc/tokenizer");
        assert_eq!(m.read_only, Some(true));
        assert!(mounts
            .iter()
            .any(|m| m.name == "hf-token" && m.mount_path == "/var/run/secrets/hf"));
        // /dev/shm: a memory-backed emptyDir with the group's size.
        let shm = vols.iter().find(|v| v.name == "dshm").expect("shm volume");
        let ed = shm.empty_dir.as_ref().expect("emptyDir");
        assert_eq!(ed.medium.as_deref(), Some("Memory"));
        assert_eq!(ed.size_limit.as_ref().map(|q| q.0.as_str()), Some("2Gi"));
        assert!(mounts
            .iter()
            .any(|m| m.name == "dshm" && m.mount_path == "/dev/shm" && m.read_only.is_none()));
        // Pull secret, priority and runtime class.
        let secrets: Vec<&str> = spec
            .image_pull_secrets
            .as_ref()
            .expect("pull secrets")
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(secrets, ["registry-creds"]);
        assert_eq!(spec.priority_class_name.as_deref(), Some("training-high"));
        assert_eq!(spec.runtime_class_name.as_deref(), Some("nvidia"));
        // Labels and annotations merged with the operator's own.
        let l = pod.metadata.labels.as_ref().expect("labels");
        assert_eq!(l["team"], "vision");
        assert_eq!(l["cost-centre"], "4711");
        assert_eq!(l["heterotrain.dev/job"], "custom");
        assert_eq!(l["heterotrain.dev/rank"], rank.to_string());
        assert_eq!(l["heterotrain.dev/group"], "gpu");
        assert_eq!(l["heterotrain.dev/restart"], "2");
        assert_eq!(
            Some(&l["heterotrain.dev/job-uid"]),
            job.metadata.uid.as_ref()
        );
        assert_eq!(l.len(), 8, "{l:?}");
        let a = pod.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(a["sidecar.istio.io/inject"], "false");
        assert_eq!(a["example.org/owner"], "vision-team");
        assert_eq!(a["heterotrain.dev/spec-hash"], hash::spec_hash(&job.spec));
        // envFrom, next to the operator's env.
        let from = c.env_from.as_ref().expect("envFrom");
        assert_eq!(from.len(), 2);
        assert_eq!(
            from[0].config_map_ref.as_ref().map(|r| r.name.as_str()),
            Some("training-settings")
        );
        assert_eq!(
            from[1].secret_ref.as_ref().map(|r| r.name.as_str()),
            Some("wandb")
        );
        assert_eq!(from[1].prefix.as_deref(), Some("WANDB_"));
        assert_eq!(env_value(pod, "RANK"), Some(rank.to_string()));
        // The restricted security context is untouched.
        let sc = c.security_context.as_ref().expect("security context");
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(
            spec.security_context
                .as_ref()
                .and_then(|s| s.run_as_non_root),
            Some(true)
        );
    }
    // The plain group gets none of it.
    let plain = d.pods[2].spec.as_ref().expect("spec");
    let names: Vec<&str> = plain
        .volumes
        .as_ref()
        .expect("volumes")
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(names, ["scratch", "checkpoints"]);
    assert!(plain.image_pull_secrets.is_none());
    assert!(plain.priority_class_name.is_none());
    assert!(plain.runtime_class_name.is_none());
    assert!(plain.containers[0].env_from.is_none());
    let l = d.pods[2].metadata.labels.as_ref().expect("labels");
    assert!(!l.contains_key("team"));
    assert_eq!(
        d.pods[2].metadata.annotations.as_ref().map(|a| a.len()),
        Some(1)
    );
}

#[test]
fn operator_keys_win_over_group_labels_and_annotations() {
    // Validation refuses these keys; the build still lets the operator win.
    let own = names::common_labels("j");
    let user = std::collections::BTreeMap::from([
        ("heterotrain.dev/job".to_string(), "other".to_string()),
        ("team".to_string(), "a".to_string()),
    ]);
    let m = custom::merged(&user, own);
    assert_eq!(m["heterotrain.dev/job"], "j");
    assert_eq!(m["team"], "a");
    assert_eq!(m["app.kubernetes.io/managed-by"], "heterotrain-operator");
}

#[test]
fn operator_mounts_are_the_mounts_the_pod_gets() {
    for (file, group) in [("custom.yaml", 0), ("mixed.yaml", 1), ("minimal.yaml", 0)] {
        let job = fixture(file);
        let v = valid(&job);
        let g = &job.spec.workers[group];
        let rank = v
            .layout
            .iter()
            .position(|&(gi, _)| gi == group)
            .expect("rank");
        let pod = pod::pod(&v, &inputs(0), rank as u32, group).expect("pod");
        let own: Vec<(String, String)> = pod.spec.as_ref().expect("spec").containers[0]
            .volume_mounts
            .as_ref()
            .expect("mounts")
            .iter()
            .filter(|m| !g.volume_mounts.iter().any(|u| u.name == m.name))
            .map(|m| (m.name.clone(), m.mount_path.clone()))
            .collect();
        let expect: Vec<(String, String)> = custom::operator_mounts(&job.spec, g)
            .into_iter()
            .map(|(n, p)| (n.to_string(), p))
            .collect();
        assert_eq!(own, expect, "{file}");
    }
}

/// Every job in `examples/` (subdirectories too: `own-model/job.yaml`):
/// the arguments the operator writes for each group parse back, as the
/// trainer parses them, to the settings it built, and those carry the
/// spec's values. Every example file holds at least one job.
#[test]
fn example_jobs_round_trip_through_the_trainer_command_line() {
    let jobs = heterotrain_e2e::paths::example_jobs().expect("examples");
    assert!(
        jobs.iter().any(|(p, _)| p.ends_with("own-model/job.yaml")),
        "{jobs:?}"
    );
    let mut groups = 0;
    let mut files = std::collections::BTreeSet::new();
    for (path, value) in jobs {
        let job: heterotrain_crds::HeteroTrainingJob = serde_yaml::from_value(value).expect("job");
        let spec = &job.spec;
        for g in &spec.workers {
            let built = args::trainer_settings(spec, g).expect("settings");
            let written = args::trainer_args(spec, g).expect("args");
            assert_eq!(written[0], "train");
            let parsed = heterotrain_crds::TrainerArgs::parse_flags(&written[1..])
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(parsed, built, "{}: {written:?}", path.display());
            assert_eq!(parsed.optim.batch_size, spec.training.global_batch_size);
            assert_eq!(parsed.model.arch, spec.model.as_ref().expect("model").name);
            assert_eq!(
                parsed.data.dataset,
                spec.dataset.as_ref().expect("dataset").name
            );
            assert_eq!(parsed.dist.device, g.device);
            assert_eq!(parsed.dist.threads, args::group_threads(g) as usize);
            assert_eq!(
                parsed.optim.lr,
                spec.training.learning_rate.parse::<f64>().expect("lr")
            );
            groups += 1;
        }
        files.insert(path);
    }
    // Every example file holds a job.
    let yaml_files = std::fs::read_dir(heterotrain_e2e::paths::examples_dir())
        .expect("examples")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("yaml"));
    for f in yaml_files {
        assert!(files.contains(&f), "{}: no HeteroTrainingJob", f.display());
    }
    assert!(
        groups >= 5,
        "only {groups} worker groups found in examples/"
    );
}

/// A group with its own command runs it with its args, and no trainer
/// flags; the contract's environment is the same as the built-in trainer's.
#[test]
fn own_command_replaces_the_trainer_and_keeps_the_contract() {
    let mut job = fixture("mixed.yaml");
    job.spec.command = vec!["python".into(), "/app/train.py".into()];
    job.spec.args = vec!["--steps".into(), "5".into()];
    job.spec.workers[1].command = vec!["/opt/other".into()];
    // The built-in trainer's settings are refused when no group runs it.
    let t = &mut job.spec.training;
    t.learning_rate = "0.05".into();
    (t.momentum, t.weight_decay) = (None, None);
    (t.schedule, t.warmup_steps) = (Default::default(), 0);
    let d = desired(&valid(&job), &inputs(0)).expect("build");
    let c = |rank: usize| d.pods[rank].spec.as_ref().expect("spec").containers[0].clone();
    // Rank 0 (group 0) runs the job's command with the job's args.
    assert_eq!(
        c(0).command,
        Some(vec!["python".into(), "/app/train.py".into()])
    );
    assert_eq!(c(0).args, Some(vec!["--steps".into(), "5".into()]));
    // The group with its own command takes its own (empty) args.
    let last = d.pods.len() - 1;
    assert_eq!(c(last).command, Some(vec!["/opt/other".into()]));
    assert_eq!(c(last).args, None);
    for pod in &d.pods {
        for var in [
            "RANK",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "HETEROTRAIN_PLAN_CONFIGMAP",
        ] {
            assert!(env_of(pod, var).is_some(), "{var} missing");
        }
        assert_eq!(
            env_value(pod, "HT_BATCH_SIZE"),
            Some(job.spec.training.global_batch_size.to_string())
        );
        assert_eq!(env_value(pod, "HT_METRICS_PORT"), Some("9400".into()));
        // The training fields a script reads (the Python library does).
        let t = &job.spec.training;
        assert_eq!(env_value(pod, "HT_SEED"), Some(t.seed.to_string()));
        assert_eq!(
            env_value(pod, "HT_MAX_STEPS"),
            t.max_steps.map(|n| n.to_string())
        );
        assert_eq!(env_value(pod, "HT_EPOCHS"), t.epochs.map(|n| n.to_string()));
        assert_eq!(
            env_value(pod, "HT_CHECKPOINT_DIR"),
            Some(job.spec.checkpoint.path.clone())
        );
        assert_eq!(
            env_value(pod, "HT_CHECKPOINT_EVERY"),
            Some(job.spec.checkpoint.every_steps.to_string())
        );
    }
    assert!(
        job.spec.training.max_steps.is_some() || job.spec.training.epochs.is_some(),
        "the fixture names the run's length"
    );
    // Without a command: the built-in trainer, whose flags carry them.
    let plain = fixture("mixed.yaml");
    let d = desired(&valid(&plain), &inputs(0)).expect("build");
    assert_eq!(env_value(&d.pods[0], "HT_SEED"), None);
    let c0 = &d.pods[0].spec.as_ref().expect("spec").containers[0];
    assert_eq!(c0.command, Some(vec!["heterotrain-trainer".into()]));
    assert_eq!(c0.args.as_ref().map(|a| a[0].as_str()), Some("train"));
}

#[test]
fn each_run_has_its_own_checkpoint_directory_and_reads_an_earlier_one_read_only() {
    let mut job = fixture("mixed.yaml");
    let uid = job.metadata.uid.clone().expect("uid");
    let sub_paths = |job: &HeteroTrainingJob, rank: u32| {
        let v = valid(job);
        let group = v.layout[rank as usize].0;
        let pod = pod::pod(&v, &inputs(0), rank, group).expect("pod");
        let c = &pod.spec.expect("spec").containers[0];
        let mounts: Vec<(String, Option<String>, Option<bool>)> = c
            .volume_mounts
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m.name == "checkpoints")
            .map(|m| (m.mount_path, m.sub_path, m.read_only))
            .collect();
        (mounts, c.args.clone().unwrap_or_default())
    };
    // A new job: `<job>/<UID>`, recorded in status on its first write.
    let (mounts, args) = sub_paths(&job, 0);
    assert_eq!(
        mounts,
        vec![("/checkpoints".into(), Some(format!("mixed/{uid}")), None)]
    );
    assert!(!args.contains(&"--resume-from".to_string()));
    // A job an earlier operator ran (a status, no checkpointDir) keeps
    // the job's name; a recorded directory is kept whatever it is.
    job.status = Some(HeteroTrainingJobStatus {
        phase: Some("Running".into()),
        ..Default::default()
    });
    assert_eq!(sub_paths(&job, 0).0[0].1.as_deref(), Some("mixed"));
    job.status.as_mut().expect("status").checkpoint_dir = Some("mixed/earlier".into());
    assert_eq!(sub_paths(&job, 0).0[0].1.as_deref(), Some("mixed/earlier"));
    job.status = None;
    // resumeFrom: a UID is an earlier run of this name, a path is taken as
    // it is; rank 0 only, read only, and the trainer is told where.
    for (from, dir) in [
        ("0123-abcd", "mixed/0123-abcd"),
        ("other/5678", "other/5678"),
    ] {
        job.spec.checkpoint.resume_from = Some(from.into());
        let (mounts, args) = sub_paths(&job, 0);
        assert_eq!(
            mounts[1],
            ("/resume-from".into(), Some(dir.into()), Some(true)),
            "{from}"
        );
        let at = args
            .iter()
            .position(|a| a == "--resume-from")
            .expect("flag");
        assert_eq!(args[at + 1], "/resume-from");
        let (rank1, _) = sub_paths(&job, 1);
        assert_eq!(rank1.len(), 1, "rank 1 mounts no earlier run: {rank1:?}");
    }
}
