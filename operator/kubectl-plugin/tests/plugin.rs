//! `kubectl heterotrain` against the real local control plane: a job, its
//! status, rank pods, plan ConfigMap, `Rebalanced` Events and the operator's
//! profile cache are created by the test (as the operator and kubelets would
//! write them), then the plugin binary's tables are checked cell by cell.

use std::process::Command;
use std::time::Duration;

use heterotrain_crds::HeteroTrainingJob;
use heterotrain_e2e::{ClusterOptions, LocalCluster};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

const NS: &str = "plugin";
const OPERATOR_NS: &str = "heterotrain-system";
/// `profile --live-timeout` in these tests: seconds for one rank's live
/// gauges through the API server's pod proxy on a loaded machine.
const LIVE_TIMEOUT: &str = "10";

async fn create<K>(api: &Api<K>, v: serde_json::Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(
        &PostParams::default(),
        &serde_json::from_value(v).expect("object"),
    )
    .await
    .expect("create");
}

async fn setup(client: &Client) {
    heterotrain_e2e::crd::install_crd(client)
        .await
        .expect("CRD");
    let nss: Api<Namespace> = Api::all(client.clone());
    for ns in [NS, OPERATOR_NS] {
        create(&nss, json!({"metadata": {"name": ns}})).await;
    }
    // Pods need the namespace's default ServiceAccount (made by the controller manager).
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    heterotrain_e2e::wait::eventually(
        "the default ServiceAccount",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async { Ok(sas.get_opt("default").await?) },
    )
    .await
    .expect("no default ServiceAccount");

    let jobs: Api<HeteroTrainingJob> = Api::namespaced(client.clone(), NS);
    create(
        &jobs,
        json!({
            "apiVersion": "heterotrain.dev/v1alpha1", "kind": "HeteroTrainingJob",
            "metadata": {"name": "demo"},
            "spec": {
                "workers": [
                    {"name": "t4", "replicas": 1, "device": "cuda",
                     "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-T4"},
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "cpu", "replicas": 2}
                ],
                "model": {"name": "mlp", "hidden": 128},
                "dataset": {"name": "synthetic_image"},
                "training": {"globalBatchSize": 96},
                "loadBalancing": {"policy": "dynamic"}
            }
        }),
    )
    .await;
    let job = jobs.get("demo").await.unwrap();
    let uid = job.metadata.uid.clone().unwrap();
    jobs.patch_status(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Running", "ranks": 3, "planGeneration": 2, "step": 340, "epoch": 1,
            "clusterSamplesPerSecond": 812.46, "restarts": 0,
            "progress": {"totalSteps": 1000, "percent": 34, "percentText": "34%",
                         "estimatedRemainingSeconds": 52, "eta": "52s"},
            "leftOutRanks": [2],
            "rankBottlenecks": [
                {"rank": 0, "bottleneck": "Communication", "dataSeconds": 0.0, "computeSeconds": 0.02,
                 "communicationSeconds": 0.05, "updateSeconds": 0.001},
                {"rank": 1, "bottleneck": "Straggler", "dataSeconds": 0.0, "computeSeconds": 0.07,
                 "communicationSeconds": 0.001, "updateSeconds": 0.001}
            ],
            "groups": [
                {"name": "t4", "device": "cuda", "replicas": 1, "ready": 1, "batchSizes": [48], "samplesPerSecond": 530.2},
                {"name": "cpu", "device": "cpu", "replicas": 2, "ready": 2, "batchSizes": [24, 24], "samplesPerSecond": 282.26}
            ],
            "balance": {"cvPercent": 4.21, "class": "Excellent"},
            "lastRebalance": {"generation": 2, "time": "2026-01-01T00:00:00Z", "reason": "dynamic: live speeds",
                              "predictedGainPercent": 12.5, "batchSizes": [48, 24, 24]},
            "conditions": [{"type": "Running", "status": "True", "reason": "AllRanksRunning",
                            "message": "3 of 3 ranks running", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        }})),
    )
    .await
    .expect("status");

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for (rank, group, node) in [
        (0, "t4", "gpu-node"),
        (1, "cpu", "cpu-node-a"),
        (2, "cpu", "cpu-node-b"),
    ] {
        create(
            &pods,
            json!({
                "metadata": {"name": format!("demo-{rank}"), "labels": {
                    "heterotrain.dev/job": "demo", "heterotrain.dev/rank": rank.to_string(),
                    "heterotrain.dev/group": group, "app.kubernetes.io/managed-by": "heterotrain-operator"}},
                "spec": {"nodeName": node, "automountServiceAccountToken": false,
                         "containers": [{"name": "trainer", "image": "heterotrain-trainer"}]}
            }),
        )
        .await;
        pods.patch_status(
            &format!("demo-{rank}"),
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Running", "podIP": format!("127.0.0.{}", 200 + rank)}}),
            ),
        )
        .await
        .expect("pod status");
    }

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    create(
        &cms,
        json!({"metadata": {"name": "demo-plan"}, "data": {"plan.json":
            r#"{"generation": 2, "globalBatchSize": 96, "batchSizes": [48, 24, 24], "policy": "dynamic", "reason": "dynamic: live speeds", "predictedStepSeconds": 0.125}"#}}),
    )
    .await;
    let ops: Api<ConfigMap> = Api::namespaced(client.clone(), OPERATOR_NS);
    create(
        &ops,
        json!({"metadata": {"name": "heterotrain-profile-cache"}, "data": {
            // t(b) = 0.02 + 0.001 b on the T4.
            "plugin.gpu-NVIDIA-T4_cuda_t1_mlp.h128": r#"{"points": [[8, 0.028], [32, 0.052]], "maxBatch": 4096}"#,
            // Another namespace's profile of the same hardware and model:
            // neither used nor listed.
            "team-b.gpu-NVIDIA-T4_cuda_t1_mlp.h128": r#"{"points": [[8, 0.5], [32, 0.9]], "maxBatch": 16}"#,
            "plugin.other_cpu_t1_resnet18": r#"{"points": [[8, 1.0]], "maxBatch": 64}"#
        }}),
    )
    .await;

    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    for (i, (gen, batches, gain, reason)) in [
        (1, "[40, 28, 28]", "31.0", "proportional: startup profile"),
        (2, "[48, 24, 24]", "12.5", "dynamic: live speeds"),
    ]
    .into_iter()
    .enumerate()
    {
        create(
            &events,
            json!({
                "apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": format!("demo.rebalanced.{i}")},
                "eventTime": format!("2026-01-01T00:0{i}:00.000000Z"),
                "reportingController": "heterotrain-operator", "reportingInstance": "op-0",
                "action": "Rebalance", "reason": "Rebalanced", "type": "Normal",
                "regarding": {"apiVersion": "heterotrain.dev/v1alpha1", "kind": "HeteroTrainingJob",
                              "namespace": NS, "name": "demo", "uid": uid},
                "note": format!("plan generation {gen}: batches {batches}; predicted gain {gain}%; {reason}")
            }),
        )
        .await;
    }
}

/// An IPv4 address of this machine that is not loopback (the API server
/// refuses to proxy to loopback pod IPs).
fn machine_ip() -> String {
    let out = Command::new("hostname")
        .arg("-I")
        .output()
        .expect("run hostname -I");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|a| {
            a.parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| !ip.is_loopback() && !ip.is_link_local())
        })
        .map(str::to_string)
        .expect("this machine has no non-loopback IPv4 address (hostname -I)")
}

/// A stand-in rank on `ip`: `/metrics` with profile gauges (t(b) = 0.01 +
/// 0.002 b, max batch 512) for requests the API server's proxy forwarded,
/// 403 for any other. Its port, and how many requests it answered.
async fn serve_metrics_via_proxy_only(
    ip: &str,
) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind((ip, 0))
        .await
        .expect("bind the stand-in rank");
    let port = listener.local_addr().expect("address").port();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let body = "# TYPE heterotrain_profile_fixed_seconds gauge\n\
                    heterotrain_profile_fixed_seconds 0.01\n\
                    heterotrain_profile_per_sample_seconds 0.002\n\
                    heterotrain_profile_max_batch_size 512\n";
                let reply = if head.contains("x-forwarded-for:") {
                    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                } else {
                    "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                        .into()
                };
                let _ = s.write_all(reply.as_bytes()).await;
            });
        }
    });
    (port, hits)
}

fn plugin(cluster: &LocalCluster, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-heterotrain"))
        .args(args)
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .output()
        .expect("run kubectl-heterotrain");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "kubectl-heterotrain {args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The cells of the table row whose first cell is `first` (after `header`).
fn row(text: &str, header: &str, first: &str) -> Vec<String> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with(header));
    assert!(lines.next().is_some(), "no table {header:?} in:\n{text}");
    lines
        .take_while(|l| !l.trim().is_empty())
        .map(|l| {
            l.split("   ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .find(|cells| cells.first().map(String::as_str) == Some(first))
        .unwrap_or_else(|| panic!("no row {first:?} in table {header:?}:\n{text}"))
}

fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_top_plan_and_profile_show_the_job() {
    let cluster = LocalCluster::start(ClusterOptions {
        name: "kubectl-plugin".into(),
        ..Default::default()
    })
    .await
    .expect("start control plane (run `make setup`)");
    let client = cluster.client().await.unwrap();
    setup(&client).await;

    let status = plugin(&cluster, &["-n", NS, "status", "demo"]);
    assert!(line(&status, "Phase:").contains("Running"), "{status}");
    assert!(
        line(&status, "Progress:").contains("step 340 of 1000 (34%, ETA 52s)"),
        "{status}"
    );
    assert!(line(&status, "Left out:").contains("ranks [2]"), "{status}");
    assert!(
        line(&status, "Throughput:").contains("812.5 samples/s"),
        "{status}"
    );
    assert!(line(&status, "Policy:").contains("dynamic"));
    assert!(
        line(&status, "Checkpoints:").contains("emptyDir: lost with the pod"),
        "{status}"
    );
    assert!(line(&status, "Plan:").contains("generation 2"), "{status}");
    assert!(
        line(&status, "Plan:").contains("batches [48, 24, 24]"),
        "{status}"
    );
    assert!(
        line(&status, "Balance:").contains("CV 4.2 %  Excellent"),
        "{status}"
    );
    assert!(
        line(&status, "Last rebalance:").contains("generation 2"),
        "{status}"
    );
    assert!(
        line(&status, "Last rebalance:").contains("12.5 %"),
        "{status}"
    );
    assert_eq!(
        row(&status, "GROUP", "t4"),
        ["t4", "cuda", "1/1", "[48]", "530.2"]
    );
    assert_eq!(
        row(&status, "GROUP", "cpu"),
        ["cpu", "cpu", "2/2", "[24, 24]", "282.3"]
    );
    assert_eq!(
        row(&status, "RANK", "0"),
        [
            "0",
            "t4",
            "demo-0",
            "gpu-node",
            "Running",
            "48",
            "communication"
        ]
    );
    assert_eq!(
        row(&status, "RANK", "2"),
        ["2", "cpu", "demo-2", "cpu-node-b", "Running", "24", "-"]
    );
    let last = row(&status, "GENERATION", "2");
    assert_eq!(
        last[2..],
        ["[48, 24, 24]", "12.5 %", "-", "dynamic: live speeds"]
    );
    assert_eq!(row(&status, "CONDITION", "Running")[2], "AllRanksRunning");

    // `top --once` draws the same view once.
    let top = plugin(
        &cluster,
        &["-n", NS, "top", "demo", "--once", "--interval", "1"],
    );
    assert_eq!(
        row(&top, "RANK", "1"),
        [
            "1",
            "cpu",
            "demo-1",
            "cpu-node-a",
            "Running",
            "24",
            "straggler"
        ]
    );

    let plan = plugin(&cluster, &["-n", NS, "plan", "demo"]);
    assert!(
        line(&plan, "Current plan of demo:")
            .contains("generation 2, global batch 96, policy dynamic"),
        "{plan}"
    );
    assert!(line(&plan, "Predicted step time:").contains("0.1250 s"));
    assert_eq!(row(&plan, "RANK", "0"), ["0", "t4", "48", "50.0 %"]);
    assert_eq!(row(&plan, "RANK", "1"), ["1", "cpu", "24", "25.0 %"]);
    let g1 = row(&plan, "GENERATION", "1");
    assert_eq!(
        g1[2..],
        [
            "[40, 28, 28]",
            "31.0 %",
            "-",
            "proportional: startup profile"
        ]
    );
    let g2 = row(&plan, "GENERATION", "2");
    assert_eq!(
        g2[2..],
        ["[48, 24, 24]", "12.5 %", "-", "dynamic: live speeds"]
    );

    // With status.planHistory (what the operator writes) the history is
    // read from it, not from Events: generations 3 and 4 have none.
    let jobs: Api<HeteroTrainingJob> = Api::namespaced(client.clone(), NS);
    let decision = |g: u32, b: [u32; 3], gain: f64, why: &str| {
        json!({"generation": g, "time": "2026-01-01T00:00:00Z", "reason": why,
               "predictedGainPercent": gain, "batchSizes": b})
    };
    jobs.patch_status(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"planHistory": [
            decision(1, [40, 28, 28], 31.0, "proportional: startup profile"),
            decision(2, [48, 24, 24], 12.5, "dynamic: live speeds"),
            decision(3, [50, 23, 23], 6.0, "dynamic: rank 0 sped up"),
            json!({"generation": 4, "time": "2026-01-01T00:00:00Z",
                   "reason": "dynamic: rank 0 sped up again", "predictedGainPercent": 5.5,
                   "batchSizes": [52, 22, 22], "predictedStepSeconds": 0.025,
                   "predictedCommunicationSeconds": 0.004}),
        ]}})),
    )
    .await
    .expect("status");
    let plan = plugin(&cluster, &["-n", NS, "plan", "demo"]);
    let g4 = row(&plan, "GENERATION", "4");
    assert_eq!(
        g4[2..],
        [
            "[52, 22, 22]",
            "5.5 %",
            "25.0 + 4.0 ms",
            "dynamic: rank 0 sped up again"
        ],
        "{plan}"
    );
    assert_eq!(row(&plan, "GENERATION", "1")[2], "[40, 28, 28]");

    let profile = plugin(
        &cluster,
        &[
            "-n",
            NS,
            "profile",
            "demo",
            "--operator-namespace",
            OPERATOR_NS,
            "--no-live",
        ],
    );
    // Rank 0 from the cache: t(b) = 0.02 + 0.001 b; equal share 32 → 32 / 0.052 s.
    // The hardware class comes from the group's GPU-product pin (the nodes
    // are not readable here); the figures are marked as cached.
    let r0 = row(&profile, "RANK", "0");
    assert_eq!(
        r0[..5],
        ["0", "t4", "gpu-node", "gpu-NVIDIA-T4", "cached"],
        "{profile}"
    );
    assert_eq!(
        r0[7..],
        ["0.0200", "0.001000", "4096", "615.4", "1.00x"],
        "{profile}"
    );
    // CPU ranks: no hardware pin, no cache entry.
    assert_eq!(
        row(&profile, "RANK", "1")[3..],
        ["-", "-", "-", "-", "-", "-", "-", "-", "-"]
    );
    let cached = row(
        &profile,
        "CACHED PROFILE",
        "plugin.gpu-NVIDIA-T4_cuda_t1_mlp.h128",
    );
    assert_eq!(cached[1..], ["0.0200", "0.001000", "4096", "2"]);
    assert!(
        !profile.contains("other_cpu_t1_resnet18"),
        "other models' profiles are not listed"
    );
    assert!(
        !profile.contains("team-b."),
        "other namespaces' profiles are not listed: {profile}"
    );

    // Live gauges through the API server's pod proxy. Rank 0's pod gets an
    // address of this machine the API server may proxy to (not loopback),
    // where a stand-in rank serves /metrics only to requests the proxy
    // forwarded (`X-Forwarded-For`): a direct read would get nothing.
    let (port, hits) = serve_metrics_via_proxy_only(&machine_ip()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.patch_status(
        "demo-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"podIP": machine_ip()}})),
    )
    .await
    .expect("pod IP");
    jobs.patch(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"metricsPort": port}})),
    )
    .await
    .expect("metrics port");
    // The live read's default 2 s is short for a loaded test machine (the
    // proxy's round trip competes for CPU with other tests): 10 s here.
    let profile = plugin(
        &cluster,
        &[
            "-n",
            NS,
            "profile",
            "demo",
            "--operator-namespace",
            OPERATOR_NS,
            "--live-timeout",
            LIVE_TIMEOUT,
        ],
    );
    let r0 = row(&profile, "RANK", "0");
    assert_eq!(r0[4], "measured", "{profile}");
    assert_eq!(r0[7..10], ["0.0100", "0.002000", "512"], "{profile}");
    assert!(
        hits.load(std::sync::atomic::Ordering::SeqCst) >= 1,
        "the stand-in rank was read through the proxy"
    );

    // A job that does not exist is an error naming it.
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-heterotrain"))
        .args(["-n", NS, "status", "nope"])
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("\"nope\" not found"));

    // `list` / `get`, like `kubectl get htj`: the printer columns.
    let list = plugin(&cluster, &["-n", NS, "list"]);
    let demo = row(&list, "NAME", "demo");
    assert_eq!(
        demo[..9],
        ["demo", "Running", "3", "dynamic", "812.5", "2", "340", "34%", "52s"],
        "{list}"
    );
    let wide = plugin(&cluster, &["-n", NS, "get", "demo", "-o", "wide"]);
    assert_eq!(
        row(&wide, "NAME", "demo")[10..],
        ["0", "0", "Excellent (4.2%)", "dynamic: live speeds"],
        "{wide}"
    );
    let all = plugin(&cluster, &["list", "-A"]);
    assert_eq!(row(&all, "NAMESPACE", NS)[..2], [NS, "demo"], "{all}");
    let empty = plugin(&cluster, &["-n", OPERATOR_NS, "ls"]);
    assert_eq!(empty, "No HeteroTrainingJobs found.\n");
    // -o yaml: the same object.
    let yaml: serde_json::Value =
        serde_yaml::from_str(&plugin(&cluster, &["-n", NS, "get", "demo", "-o", "yaml"]))
            .expect("get -o yaml is YAML");
    assert_eq!(yaml["metadata"]["name"], "demo");
    assert_eq!(yaml["status"]["step"], 340);
    // -o json parses: the object itself, and a List for `list`.
    let one: serde_json::Value =
        serde_json::from_str(&plugin(&cluster, &["-n", NS, "get", "demo", "-o", "json"]))
            .expect("get -o json is JSON");
    assert_eq!(one["metadata"]["name"], "demo");
    assert_eq!(one["status"]["step"], 340);
    let many: serde_json::Value =
        serde_json::from_str(&plugin(&cluster, &["list", "-A", "-o", "json"]))
            .expect("list -o json is JSON");
    assert_eq!(many["kind"], "List");
    assert_eq!(many["items"][0]["metadata"]["namespace"], NS);

    // The CRD's printer columns, as the API server serves `kubectl get
    // htj` (a meta.k8s.io Table): progress and ETA among them.
    let req = http::Request::get(format!(
        "/apis/heterotrain.dev/v1alpha1/namespaces/{NS}/heterotrainingjobs/demo"
    ))
    .header(
        "Accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .body(Vec::new())
    .expect("request");
    let table: serde_json::Value =
        serde_json::from_str(&client.request_text(req).await.expect("Table")).expect("JSON");
    assert_eq!(table["kind"], "Table", "{table}");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    let cells = table["rows"][0]["cells"].as_array().expect("a row");
    let cell = |name: &str| {
        let i = columns
            .iter()
            .position(|c| *c == name)
            .unwrap_or_else(|| panic!("no column {name}: {columns:?}"));
        cells[i].clone()
    };
    assert_eq!(cell("Name"), "demo");
    assert_eq!(cell("Status"), "Running");
    assert_eq!(cell("Ranks"), 3);
    assert_eq!(cell("Policy"), "dynamic");
    assert_eq!(cell("Plan"), 2);
    assert_eq!(cell("Step"), 340);
    assert_eq!(cell("Progress"), "34%");
    assert_eq!(cell("ETA"), "52s");

    // --kubeconfig and --context instead of $KUBECONFIG.
    let kubeconfig = cluster.kubeconfig_path();
    let context = kube::config::Kubeconfig::read_from(&kubeconfig)
        .expect("kubeconfig")
        .current_context
        .expect("a current context");
    let path = kubeconfig.display().to_string();
    let bare = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kubectl-heterotrain"))
            .args(args)
            .env_remove("KUBECONFIG")
            .env("HOME", "/nonexistent")
            .output()
            .unwrap()
    };
    let out = bare(&[
        "--kubeconfig",
        &path,
        "--context",
        &context,
        "-n",
        NS,
        "list",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("demo"));
    let out = bare(&["--kubeconfig", &path, "--context", "nope", "-n", NS, "list"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("context \"nope\""),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A user with exactly the permissions `examples/rbac/plugin-user.yaml`
    // grants sees what the cluster's admin sees, without a warning; a user
    // without them is refused with the API server's reason.
    let dir = tempfile::tempdir().expect("temporary directory");
    let account = |name: &'static str, grant: Grant| {
        account_kubeconfig(&cluster, &client, name, grant, dir.path())
    };
    let limited = account("plugin-user", Grant::Example).await;
    let nobody = account("plugin-nobody", Grant::Nothing).await;
    let no_events = account("plugin-no-events", Grant::ExampleWithoutEvents).await;
    let profile = [
        "profile",
        "demo",
        "--operator-namespace",
        OPERATOR_NS,
        "--live-timeout",
        LIVE_TIMEOUT,
    ];
    let commands: [&[&str]; 7] = [
        &["status", "demo"],
        &["plan", "demo"],
        &["top", "demo", "--once", "--interval", "1"],
        &["list"],
        &["get", "demo", "-o", "wide"],
        &profile,
        &[
            "profile",
            "demo",
            "--operator-namespace",
            OPERATOR_NS,
            "--no-live",
        ],
    ];
    let mut proxied = 0;
    for args in commands {
        let live = args == profile;
        let args: Vec<&str> = ["-n", NS].iter().chain(args).copied().collect();
        let admin = run_as(&cluster.kubeconfig_path(), &args);
        let hits_before = hits.load(std::sync::atomic::Ordering::SeqCst);
        // RBAC takes effect within moments of the binding.
        let user = heterotrain_e2e::wait::eventually(
            "the plugin user's access",
            Duration::from_secs(60),
            Duration::from_millis(250),
            || async {
                let out = run_as(&limited, &args);
                Ok(out.status.success().then_some(out))
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{args:?} as the plugin user: {e}"));
        assert_eq!(
            without_age(&user.stdout),
            without_age(&admin.stdout),
            "{args:?}"
        );
        assert_eq!(
            String::from_utf8_lossy(&user.stderr),
            "",
            "{args:?}: no warning"
        );
        if live {
            proxied = hits.load(std::sync::atomic::Ordering::SeqCst) - hits_before;
        }
    }
    assert!(
        proxied >= 1,
        "the plugin user read the live gauges through the proxy"
    );
    let out = run_as(&nobody, &["-n", NS, "status", "demo"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("forbidden"), "{err}");
    assert!(err.contains("plugin-nobody"), "{err}");
    // Without status.planHistory the history comes from Events: the user
    // reads it; one without leave to list Events is warned, and gets the
    // rest.
    jobs.patch_status(
        "demo",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"planHistory": null}})),
    )
    .await
    .expect("status");
    let plan = ["-n", NS, "plan", "demo"];
    let admin = run_as(&cluster.kubeconfig_path(), &plan);
    assert_eq!(
        row(&String::from_utf8_lossy(&admin.stdout), "GENERATION", "2")[2],
        "[48, 24, 24]"
    );
    let user = run_as(&limited, &plan);
    assert_eq!(without_age(&user.stdout), without_age(&admin.stdout));
    assert_eq!(String::from_utf8_lossy(&user.stderr), "");
    let out = run_as(&no_events, &plan);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("warning: no plan history"), "{err}");
    assert!(err.contains("forbidden"), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        line(&text, "Current plan of demo:").contains("generation 2"),
        "{text}"
    );
    assert!(
        !text.contains("[40, 28, 28]"),
        "no history without Events: {text}"
    );

    cluster.stop();
}

/// A command's output without the job's age in seconds (`age 2s`), which
/// moves between two runs.
fn without_age(out: &[u8]) -> String {
    let collapse = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut age_at = None;
    String::from_utf8_lossy(out)
        .lines()
        .map(|l| {
            if let (true, Some(i)) = (l.starts_with("Job:"), l.find(", age ")) {
                return format!("{}, age …)", &l[..i]);
            }
            // A table's header: the AGE column's value ("1s" or "12s")
            // shifts the columns after it, so rows compare with spaces
            // collapsed.
            let words: Vec<&str> = l.split_whitespace().collect();
            if words.contains(&"AGE") && l == l.to_uppercase() {
                age_at = format!(" {l} ").find(" AGE ");
                return collapse(l);
            }
            let chars: Vec<char> = l.chars().collect();
            match age_at {
                Some(i) if chars.len() > i && !l.trim().is_empty() => {
                    let end = (i..chars.len()).find(|&e| chars[e] == ' ');
                    let rest: String = chars[end.unwrap_or(chars.len())..].iter().collect();
                    let head: String = chars[..i].iter().collect();
                    collapse(&format!("{head}… {rest}"))
                }
                _ => {
                    age_at = None;
                    l.to_string()
                }
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The plugin binary run with `kubeconfig`.
fn run_as(kubeconfig: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-heterotrain"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run kubectl-heterotrain")
}

/// What a test account is granted.
#[derive(Clone, Copy, PartialEq)]
enum Grant {
    Nothing,
    /// `examples/rbac/plugin-user.yaml`'s Roles.
    Example,
    /// The same without its rule on Events.
    ExampleWithoutEvents,
}

/// A kubeconfig (in `dir`) for ServiceAccount `account` of the job's
/// namespace, bound as `grant` says (the example's Roles renamed after the
/// account, their subject replaced by it).
async fn account_kubeconfig(
    cluster: &LocalCluster,
    client: &Client,
    account: &str,
    grant: Grant,
    dir: &std::path::Path,
) -> std::path::PathBuf {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use serde::Deserialize;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    create(&sas, json!({"metadata": {"name": account}})).await;
    if grant != Grant::Nothing {
        let path = heterotrain_e2e::paths::examples_dir().join("rbac/plugin-user.yaml");
        let text = std::fs::read_to_string(&path).expect("examples/rbac/plugin-user.yaml");
        let mut kinds = Vec::new();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut v = serde_json::Value::deserialize(doc).expect("a YAML document");
            // The example's namespaces: the jobs' (`ml`) and the operator's.
            let ns = match v["metadata"]["namespace"].as_str() {
                Some("ml") => NS,
                Some(OPERATOR_NS) => OPERATOR_NS,
                other => panic!("unexpected namespace {other:?} in {}", path.display()),
            };
            v["metadata"]["namespace"] = json!(ns);
            let renamed =
                |n: &serde_json::Value| json!(format!("{}-{account}", n.as_str().unwrap_or("")));
            v["metadata"]["name"] = renamed(&v["metadata"]["name"]);
            let kind = v["kind"].as_str().unwrap_or_default().to_string();
            match kind.as_str() {
                "Role" => {
                    if grant == Grant::ExampleWithoutEvents {
                        if let Some(rules) = v["rules"].as_array_mut() {
                            rules.retain(|r| r["resources"] != json!(["events"]));
                        }
                    }
                    create(&Api::<Role>::namespaced(client.clone(), ns), v).await;
                }
                "RoleBinding" => {
                    v["roleRef"]["name"] = renamed(&v["roleRef"]["name"]);
                    v["subjects"] =
                        json!([{"kind": "ServiceAccount", "name": account, "namespace": NS}]);
                    create(&Api::<RoleBinding>::namespaced(client.clone(), ns), v).await;
                }
                k => panic!("unexpected kind {k} in {}", path.display()),
            }
            kinds.push(kind);
        }
        assert_eq!(kinds, ["Role", "RoleBinding", "Role", "RoleBinding"]);
    }
    let req: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}
    }))
    .expect("TokenRequest");
    let resp: TokenRequest = sas
        .create_subresource("token", account, &PostParams::default(), &req)
        .await
        .expect("a token for the account");
    let token = resp
        .status
        .and_then(|s| s.token)
        .expect("a token in the TokenRequest's status");
    let path = dir.join(format!("{account}.kubeconfig"));
    std::fs::write(&path, cluster.kubeconfig_yaml(&token)).expect("write the kubeconfig");
    path
}

#[test]
fn tables_compare_without_their_age_column() {
    let at = |age: &str, balance: &str| {
        format!(
            "NAME   STATUS    AGE   BALANCE\ndemo   Running   {age:<5} {balance}\n\nGENERATION   AGE   BATCHES\n2            {age:<5} [1, 2]"
        )
    };
    let (a, b) = (at("1s", "Good"), at("12s", "Good"));
    assert_ne!(a, b);
    assert_eq!(without_age(a.as_bytes()), without_age(b.as_bytes()));
    let c = at("1s", "Poor");
    assert_ne!(without_age(a.as_bytes()), without_age(c.as_bytes()));
}
