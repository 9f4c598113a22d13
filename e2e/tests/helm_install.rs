//! `helm install` of `charts/heterotrain` onto the real local control plane:
//! the real scheduler places the operator's Deployment pod on a simulated
//! node, the node simulator runs the real `heterotrain-operator` binary as
//! that pod under the chart's ServiceAccount token — so the chart's RBAC is
//! what the operator gets — and the operator reconciles a job into rank pods
//! that use the chart's trainer ServiceAccount. `helm uninstall` then leaves
//! nothing behind but the CRD.
//!
//! Needs `target/<profile>/heterotrain-operator` and, for the training test,
//! `heterotrain-trainer` (`cargo build -p heterotrain-operator -p heterotrain-trainer`).

mod support;

use std::time::Duration;

use heterotrain_e2e::nodesim::NodeSimulator;
use heterotrain_e2e::system::SystemOptions;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::Client;
use serde_json::json;
use support::*;

const RELEASE: &str = "ht";
const SYSTEM_NS: &str = "heterotrain-system";
const JOBS_NS: &str = "ml";

/// One test at a time: two node simulators in one process hand out the same
/// loopback pod IPs (the prefix comes from the process id), so their pods'
/// ports would collide.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn dump(client: &Client, sim: &NodeSimulator) -> String {
    dump_namespaces(client, sim, &[SYSTEM_NS, JOBS_NS]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_runs_the_operator_under_the_charts_rbac_and_uninstalls_cleanly() {
    let _serial = SERIAL.lock().await;
    // `ops` runs its pods' processes (the operator); `lab` only reports its
    // pods Running, like a node whose trainers never finish by themselves.
    let mut bed = test_bed(SystemOptions::bare(
        "helm-install",
        nodes("nodes:\n- {name: ops, cpu: '2'}\n- {name: lab, cpu: '8', runProcesses: false}\n"),
    ))
    .await;
    let client = bed.client().await.unwrap();
    let (cluster, sim) = (&bed.cluster, &bed.sim);
    create_namespace(&client, JOBS_NS).await;

    let kubeconfig = cluster.kubeconfig_path();
    let chart = chart_dir();
    let install = run_helm(&[
        "install",
        RELEASE,
        chart.to_str().unwrap(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        SYSTEM_NS,
        "--create-namespace",
        "--set",
        &format!("watchNamespaces={{{JOBS_NS}}}"),
        "--set",
        "operator.nodeSelector.kubernetes\\.io/hostname=ops",
        // Simulated pods share this machine's network: bind the pod's own IP.
        "--set",
        "operator.listenAddress=$(POD_IP)",
        "--set",
        "operator.scrapeIntervalSeconds=1",
        "--set",
        "operator.rebalanceIntervalSeconds=2",
        "--set",
        "networkPolicy.enabled=true",
        "--wait",
        "--timeout",
        "180s",
    ]);
    if let Err(e) = &install {
        panic!("{e}\n{}", dump(&client, sim).await);
    }
    let install = install.unwrap();
    assert!(install.contains("STATUS: deployed"), "{install}");
    wait_for_webhook(&client, JOBS_NS).await;
    assert!(
        install.contains("kubectl heterotrain"),
        "NOTES tell the next step: {install}"
    );

    // The operator pod runs on the simulated node, as the chart's ServiceAccount.
    let pods: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    let op_pod = wait_for("the operator pod Running", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default().labels("app.kubernetes.io/component=operator"))
                .await
                .ok()?
                .items
                .into_iter()
                .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        }
    })
    .await;
    let op_name = op_pod.metadata.name.clone().unwrap();
    let op_spec = op_pod.spec.clone().unwrap();
    assert_eq!(op_spec.node_name.as_deref(), Some("ops"));
    assert_eq!(
        op_spec.service_account_name.as_deref(),
        Some("ht-heterotrain")
    );

    // Leader election: the pod's name (POD_NAME) holds the chart's Lease.
    let leases: Api<Lease> = Api::namespaced(client.clone(), SYSTEM_NS);
    let holder = wait_for(
        "the operator to hold its Lease",
        Duration::from_secs(60),
        || {
            let leases = leases.clone();
            async move {
                leases
                    .get_opt("heterotrain-operator")
                    .await
                    .ok()??
                    .spec?
                    .holder_identity
                    .filter(|h| !h.is_empty())
            }
        },
    )
    .await;
    assert_eq!(holder, op_name);

    // A job in the watched namespace becomes rank pods on the `lab` node.
    let job = json!({
        "apiVersion": "heterotrain.dev/v1alpha1",
        "kind": "HeteroTrainingJob",
        "metadata": {"name": "chart-job"},
        "spec": {
            "workers": [{"name": "cpu", "replicas": 2, "nodeSelector": {"kubernetes.io/hostname": "lab"}}],
            "model": {"name": "mlp"},
            "dataset": {"name": "synthetic_image"},
            "training": {"globalBatchSize": 32, "maxSteps": 10}
        }
    });
    let jobs = jobs_api(&client, JOBS_NS);
    create(&jobs, job, "create job").await;
    let job_pods: Api<Pod> = Api::namespaced(client.clone(), JOBS_NS);
    let phase_of = |jobs: Api<DynamicObject>| async move {
        jobs.get_opt("chart-job")
            .await
            .ok()
            .flatten()
            .and_then(|j| j.data["status"]["phase"].as_str().map(str::to_string))
    };
    let running = tokio::time::timeout(Duration::from_secs(90), async {
        loop {
            if phase_of(jobs.clone()).await.as_deref() == Some("Running") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    if running.is_err() {
        panic!(
            "job never Running: {:?}\n{}",
            jobs.get_opt("chart-job")
                .await
                .ok()
                .flatten()
                .map(|j| j.data["status"].clone()),
            dump(&client, sim).await
        );
    }
    let ranks = job_pods
        .list(&ListParams::default().labels("heterotrain.dev/job=chart-job"))
        .await
        .unwrap()
        .items;
    assert_eq!(ranks.len(), 2);
    for p in &ranks {
        let spec = p.spec.clone().unwrap();
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some("heterotrain-trainer")
        );
        assert_eq!(spec.node_name.as_deref(), Some("lab"));
        assert!(
            p.spec.as_ref().unwrap().containers[0]
                .image
                .as_deref()
                .is_some_and(
                    |i| i == format!("ghcr.io/heterotrain/heterotrain-trainer:{}", app_version())
                ),
            "the chart's default trainer image"
        );
    }
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), JOBS_NS);
    assert!(
        cms.get_opt("chart-job-plan").await.unwrap().is_some(),
        "plan ConfigMap"
    );

    // The trainer identity may read (and only read) ConfigMaps.
    let trainer_client = {
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), JOBS_NS);
        let tr = sas
            .create_token_request(
                "heterotrain-trainer",
                &PostParams::default(),
                &Default::default(),
            )
            .await
            .expect("token for heterotrain-trainer");
        let token = tr.status.and_then(|s| s.token).expect("token");
        cluster.client_for_token(&token).await.unwrap()
    };
    let tcms: Api<ConfigMap> = Api::namespaced(trainer_client.clone(), JOBS_NS);
    assert!(
        tcms.get("chart-job-plan").await.is_ok(),
        "trainer reads its plan"
    );
    let patch = tcms
        .patch(
            "chart-job-plan",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"x": "y"}})),
        )
        .await;
    assert!(
        matches!(patch, Err(kube::Error::Api(ref s)) if s.code == 403),
        "{patch:?}"
    );
    let tpods: Api<Pod> = Api::namespaced(trainer_client, JOBS_NS);
    assert!(
        matches!(tpods.list(&ListParams::default()).await, Err(kube::Error::Api(ref s)) if s.code == 403)
    );

    // The operator serves /metrics on its pod IP, as the leader, only to a
    // token allowed to read it (operator.metricsAuth, the default): none
    // is refused; Prometheus' ServiceAccount bound to the chart's
    // metrics-reader ClusterRole is served.
    let ip = op_pod
        .status
        .and_then(|s| s.pod_ip)
        .expect("operator pod IP");
    let refused = http_get(&format!("{ip}:8080"), "/metrics").expect_err("served without a token");
    assert!(refused.contains("401"), "{refused}");
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), SYSTEM_NS);
    let prom: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "prometheus"}})).unwrap();
    sas.create(&PostParams::default(), &prom).await.unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "prometheus-reads-heterotrain"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ht-heterotrain-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": SYSTEM_NS}]
    }))
    .unwrap();
    let crbs: Api<ClusterRoleBinding> = Api::all(client.clone());
    crbs.create(&PostParams::default(), &binding).await.unwrap();
    let token = sas
        .create_token_request("prometheus", &PostParams::default(), &Default::default())
        .await
        .expect("token for prometheus")
        .status
        .and_then(|s| s.token)
        .expect("token");
    let auth = format!("Authorization: Bearer {token}\r\n");
    let metrics = wait_for("operator /metrics", Duration::from_secs(30), || {
        let (ip, auth) = (ip.clone(), auth.clone());
        async move {
            let body = http_get_with(&format!("{ip}:8080"), "/metrics", &auth).ok()?;
            body.contains("heterotrain_operator_reconciles_total")
                .then_some(body)
        }
    })
    .await;
    crbs.delete("prometheus-reads-heterotrain", &DeleteParams::default())
        .await
        .unwrap();
    sas.delete("prometheus", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        metrics.contains("heterotrain_operator_leader 1"),
        "{metrics}"
    );
    // (`promtool check metrics` on this exposition: tests/exposition.rs.)

    // Ranks exit 0 (reported as a kubelet would): the job Succeeds.
    for p in &ranks {
        let name = p.metadata.name.clone().unwrap();
        job_pods
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Succeeded", "containerStatuses": [{
                    "name": "trainer", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}})),
            )
            .await
            .expect("mark rank Succeeded");
    }
    let done = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if phase_of(jobs.clone()).await.as_deref() == Some("Succeeded") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    assert!(
        done.is_ok(),
        "job never Succeeded\n{}",
        dump(&client, sim).await
    );

    // Delete the job (its children go with it), then uninstall.
    jobs.delete("chart-job", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the job's children to be collected",
        Duration::from_secs(60),
        || {
            let (pods, cms) = (job_pods.clone(), cms.clone());
            async move {
                let p = pods
                    .list(&ListParams::default().labels("heterotrain.dev/job=chart-job"))
                    .await
                    .ok()?;
                let c = cms.get_opt("chart-job-plan").await.ok()?;
                (p.items.is_empty() && c.is_none()).then_some(())
            }
        },
    )
    .await;
    let out = run_helm(&[
        "uninstall",
        RELEASE,
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        SYSTEM_NS,
        "--wait",
        "--timeout",
        "120s",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.contains("uninstalled"), "{out}");
    wait_for("the operator pod to go", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        }
    })
    .await;
    // Let a dying operator try (and fail: its RBAC is gone) to re-create state.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let mut left = Vec::new();
    for ns in [SYSTEM_NS, JOBS_NS] {
        let names = |v: Vec<String>| {
            v.into_iter()
                .map(|n| format!("{ns}/{n}"))
                .collect::<Vec<_>>()
        };
        macro_rules! names_of {
            ($t:ty, $skip:expr) => {{
                let api: Api<$t> = Api::namespaced(client.clone(), ns);
                let skip: &[&str] = $skip;
                names(
                    api.list(&ListParams::default())
                        .await
                        .unwrap()
                        .items
                        .into_iter()
                        .filter_map(|o| o.metadata.name)
                        .filter(|n| !skip.contains(&n.as_str()))
                        .map(|n| format!("{} {n}", stringify!($t)))
                        .collect(),
                )
            }};
        }
        left.extend(names_of!(Deployment, &[]));
        left.extend(names_of!(Pod, &[]));
        left.extend(names_of!(Service, &[]));
        left.extend(names_of!(ServiceAccount, &["default"]));
        left.extend(names_of!(ConfigMap, &["kube-root-ca.crt"]));
        left.extend(names_of!(Role, &[]));
        left.extend(names_of!(RoleBinding, &[]));
        left.extend(names_of!(Lease, &[]));
        left.extend(names_of!(NetworkPolicy, &[]));
        // 1.20 still makes a token Secret for each ServiceAccount.
        left.extend(
            names_of!(Secret, &[])
                .into_iter()
                .filter(|n| !n.contains("-token-")),
        );
    }
    // Cluster-scoped: the release's webhook configuration and roles.
    macro_rules! cluster_names_of {
        ($t:ty) => {{
            let api: Api<$t> = Api::all(client.clone());
            api.list(&ListParams::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|o| o.metadata.name)
                .filter(|n| n.contains("heterotrain"))
                .map(|n| format!("{} {n}", stringify!($t)))
                .collect::<Vec<_>>()
        }};
    }
    left.extend(cluster_names_of!(ValidatingWebhookConfiguration));
    left.extend(cluster_names_of!(ClusterRole));
    left.extend(cluster_names_of!(ClusterRoleBinding));
    assert!(
        left.is_empty(),
        "helm uninstall left objects behind: {left:#?}"
    );
    // ...but the CRD stays (Helm never deletes CRDs from crds/), and so do users' jobs.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    assert!(crds
        .get_opt("heterotrainingjobs.heterotrain.dev")
        .await
        .unwrap()
        .is_some());

    bed.stop().await;
}

/// Each case of `operator/tests/fixtures/invalid.yaml` (one broken rule
/// each), an image from outside `operator.allowedImages` and a Secret from
/// outside `operator.allowedSecrets`, is refused
/// by the API server through the chart's webhook, naming the rule and a
/// field; nothing is stored. The valid base job passes (a dry run).
async fn invalid_specs_are_refused_at_admission(client: &Client) {
    let jobs = jobs_api(client, JOBS_NS);
    let base = json!({
        "workers": [{"name": "cpu", "replicas": 4}],
        "model": {"name": "mlp"},
        "dataset": {"name": "synthetic_image"},
        "training": {"globalBatchSize": 64, "maxSteps": 5}
    });
    let job = |name: &str, spec: serde_json::Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "heterotrain.dev/v1alpha1",
            "kind": "HeteroTrainingJob",
            "metadata": {"name": name},
            "spec": spec
        }))
        .unwrap()
    };
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for_webhook(client, JOBS_NS).await;
    jobs.create(&dry, &job("good", base.clone()))
        .await
        .expect("the valid base job is admitted");
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../operator/tests/fixtures/invalid.yaml"
    );
    let mut cases: Vec<serde_json::Value> =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    cases.push(json!({"expect": "is not from a source this operator allows", "patch": {"image": "evil.example/miner:1"}}));
    cases.push(json!({"expect": "Secret \"db-admin\" is not one this operator lets jobs read",
        "patch": {"workers": [{"name": "cpu", "replicas": 4, "envFrom": [{"secretRef": {"name": "db-admin"}}]}]}}));
    for (i, case) in cases.iter().enumerate() {
        let mut spec = base.clone();
        merge(&mut spec, &case["patch"]);
        let name = format!("bad-{i}");
        let err = jobs
            .create(&PostParams::default(), &job(&name, spec))
            .await
            .expect_err(&format!("admitted: {case}"));
        let kube::Error::Api(e) = err else {
            panic!("not an API refusal for {case}: {err}")
        };
        let expect = case["expect"].as_str().unwrap();
        assert!(
            e.message.contains("denied the request") && e.message.contains(expect),
            "case {case}: {}",
            e.message
        );
        assert!(
            e.message.contains(": spec.") || e.message.contains(": metadata."),
            "names a field: {}",
            e.message
        );
        assert!(
            jobs.get_opt(&name).await.unwrap().is_none(),
            "{name} was stored"
        );
    }
}

/// Real trainers (`target/<profile>/heterotrain-trainer`) under the chart's
/// trainer ServiceAccount, balanced by the chart's operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installed_operator_trains_a_job_to_succeeded() {
    let _serial = SERIAL.lock().await;
    let mut bed = test_bed(SystemOptions::bare(
        "helm-train",
        nodes("nodes:\n- {name: ops, cpu: '2'}\n- {name: fast, speed: 1.0, cpu: '1'}\n- {name: slow, speed: 0.5, cpu: '1'}\n"),
    ))
    .await;
    let client = bed.client().await.unwrap();
    let (cluster, sim) = (&bed.cluster, &bed.sim);
    create_namespace(&client, JOBS_NS).await;
    let kubeconfig = cluster.kubeconfig_path();
    let chart = chart_dir();
    run_helm(&[
        "install",
        RELEASE,
        chart.to_str().unwrap(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        SYSTEM_NS,
        "--create-namespace",
        "--set",
        &format!("watchNamespaces={{{JOBS_NS}}}"),
        "--set",
        "operator.nodeSelector.kubernetes\\.io/hostname=ops",
        "--set",
        "operator.listenAddress=$(POD_IP)",
        "--set",
        "operator.scrapeIntervalSeconds=1",
        "--set",
        "operator.rebalanceIntervalSeconds=2",
        "--set",
        "operator.allowedImages={ghcr.io/heterotrain}",
        "--set",
        "operator.allowedSecrets={s3-creds}",
        // The chart's policy for the operator, beside each job's own.
        "--set",
        "networkPolicy.enabled=true",
        "--wait",
        "--timeout",
        "180s",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    invalid_specs_are_refused_at_admission(&client).await;
    egress_is_listed_and_c10d_stays_closed(&client, sim).await;
    let job = json!({
        "apiVersion": "heterotrain.dev/v1alpha1",
        "kind": "HeteroTrainingJob",
        "metadata": {"name": "trained"},
        "spec": {
            "workers": [
                {"name": "fast", "replicas": 1, "threads": 1, "nodeSelector": {"kubernetes.io/hostname": "fast"},
                 "resources": {"limits": {"cpu": "1"}}},
                {"name": "slow", "replicas": 1, "threads": 1, "nodeSelector": {"kubernetes.io/hostname": "slow"},
                 "resources": {"limits": {"cpu": "1"}}}
            ],
            "model": {"name": "mlp"},
            "dataset": {"name": "synthetic_image", "syntheticSamples": 2048},
            // Short, but long enough for the operator's scrapes (every
            // second) to read both ranks' profiles before the ranks exit: 60
            // steps once ended before the second rank's profile was read
            // ("1 of 2 ranks reported their profile"). The ranks'
            // termination messages give status.step.
            "training": {"globalBatchSize": 32, "maxSteps": 300},
            "loadBalancing": {"policy": "dynamic", "rebalanceIntervalSteps": 5}
        }
    });
    let jobs = jobs_api(&client, JOBS_NS);
    create(&jobs, job, "create job").await;
    let done = tokio::time::timeout(Duration::from_secs(300), async {
        loop {
            if let Ok(Some(j)) = jobs.get_opt("trained").await {
                match j.data["status"]["phase"].as_str() {
                    Some("Succeeded") => return j.data["status"].clone(),
                    Some("Failed") => return j.data["status"].clone(),
                    _ => {}
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    let status = match done {
        Ok(s) => s,
        Err(_) => panic!("job did not finish in 300 s\n{}", dump(&client, sim).await),
    };
    assert_eq!(
        status["phase"],
        "Succeeded",
        "{status}\n{}",
        dump(&client, sim).await
    );
    // status.step of a finished job is its last step, read or not.
    assert_eq!(status["step"].as_u64(), Some(300), "{status}");
    assert!(
        status["conditions"].as_array().is_some_and(|c| c
            .iter()
            .any(|c| c["type"] == "Profiled" && c["status"] == "True")),
        "the ranks reported their profiles: {status}"
    );
    run_helm(&[
        "uninstall",
        RELEASE,
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        SYSTEM_NS,
        "--wait",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    bed.stop().await;
}

/// A job whose ranks serve its store port (an HTTP server as the command)
/// and list one endpoint in `isolation.egress`, with the chart's own
/// NetworkPolicy on: its rank 0 reaches that endpoint and is refused at
/// another, its rank 1 reaches rank 0's store port, and a pod of another
/// job in the namespace (copying the job-name label) is refused there.
/// The job is deleted afterwards.
async fn egress_is_listed_and_c10d_stays_closed(client: &Client, sim: &NodeSimulator) {
    let listed = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let unlisted = tokio::net::TcpListener::bind("127.0.0.3:0").await.unwrap();
    let (listed_port, unlisted_port) = (
        listed.local_addr().unwrap().port(),
        unlisted.local_addr().unwrap().port(),
    );
    let job = json!({
        "apiVersion": "heterotrain.dev/v1alpha1",
        "kind": "HeteroTrainingJob",
        "metadata": {"name": "probe"},
        "spec": {
            "workers": [{"name": "g", "replicas": 2}],
            "command": ["python3", "-m", "http.server", "--bind", "$(POD_IP)", "29500"],
            "training": {"globalBatchSize": 2, "maxSteps": 1},
            "isolation": {"egress": [
                {"to": [{"ipBlock": {"cidr": "127.0.0.2/32"}}], "ports": [{"port": listed_port}]}
            ]}
        }
    });
    let jobs = jobs_api(client, JOBS_NS);
    create(&jobs, job, "create the probe job").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), JOBS_NS);
    let neighbour = json!({
        "metadata": {"name": "neighbour", "labels": {"heterotrain.dev/job": "probe"}},
        "spec": {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "300"]}]}
    });
    create(&pods, neighbour, "create the neighbour pod").await;
    let (rank0, rank1, intruder) = (
        running_ip(&pods, "probe-0").await,
        running_ip(&pods, "probe-1").await,
        running_ip(&pods, "neighbour").await,
    );
    // Rank 1 reaches rank 0's store port once rank 0 serves it.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while let Err(e) = heterotrain_e2e::nodesim::netpol::connect_from(&rank1, &rank0, 29500).await {
        if std::time::Instant::now() > deadline {
            let log = heterotrain_e2e::nodesim::log_path(sim.state_dir(), JOBS_NS, "probe-0");
            panic!(
                "rank 1 never reached rank 0's store port: {e}\nrank 0's log: {}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default(),
                dump(client, sim).await
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let refused = |r: std::io::Result<()>, what: &str| match r {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
        other => panic!(
            "{what}: {other:?} (policy enforcement: {:?})",
            sim.network_policy_state()
        ),
    };
    use heterotrain_e2e::nodesim::netpol::connect_from;
    refused(
        connect_from(&intruder, &rank0, 29500).await,
        "another job's pod reached rank 0's store port",
    );
    connect_from(&rank0, "127.0.0.2", listed_port)
        .await
        .expect("rank 0 reaches the endpoint its job lists");
    refused(
        connect_from(&rank0, "127.0.0.3", unlisted_port).await,
        "rank 0 reached an endpoint its job does not list",
    );
    // The listed endpoint saw rank 0's own address.
    let (_, peer) = tokio::time::timeout(Duration::from_secs(5), listed.accept())
        .await
        .expect("a connection on the listed endpoint")
        .unwrap();
    assert_eq!(peer.ip().to_string(), rank0);
    drop(unlisted);
    jobs.delete("probe", &DeleteParams::default())
        .await
        .unwrap();
    pods.delete("neighbour", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the probe job's pods gone",
        Duration::from_secs(120),
        || {
            let pods = pods.clone();
            async move {
                pods.list(&ListParams::default().labels("heterotrain.dev/job=probe"))
                    .await
                    .ok()
                    .filter(|l| l.items.is_empty())
            }
        },
    )
    .await;
}

/// The IP of pod `name` once it runs.
async fn running_ip(pods: &Api<Pod>, name: &str) -> String {
    let what = format!("{name} Running with an IP");
    wait_for(&what, Duration::from_secs(120), || async {
        let st = pods.get_opt(name).await.ok()??.status?;
        (st.phase.as_deref() == Some("Running")).then_some(st.pod_ip?)
    })
    .await
}
