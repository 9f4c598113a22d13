//! The node simulator against the real control plane: the real scheduler
//! binds pods to simulated nodes by nodeSelector / extended resources, and
//! the simulator runs them as processes with resolved env, pod DNS, a CPU
//! quota of node speed × CPU limit, kubelet-like status, and graceful deletion.

use std::time::{Duration, Instant};

use heterotrain_e2e::nodesim::{NodeSimulator, NodesFile};
use heterotrain_e2e::{ClusterOptions, LocalCluster};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

/// Handles SIGTERM; prints its CPU quota (µs per period) every 100 ms.
const QUOTA_LOOP: &str = r#"trap 'echo got-term; exit 0' TERM
echo started
cg=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' /proc/self/cgroup)
f=/sys/fs/cgroup/cpu$cg/cpu.cfs_quota_us
[ -f "$f" ] || f=/sys/fs/cgroup$(awk -F: '$1==0 {print $3}' /proc/self/cgroup)/cpu.max
while true; do echo "q=$(cat $f)"; sleep 0.1; done"#;

async fn wait_pod<F: Fn(&Pod) -> bool>(api: &Api<Pod>, name: &str, what: &str, f: F) -> Pod {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(p)) = api.get_opt(name).await {
            if f(&p) {
                return p;
            }
            if Instant::now() > deadline {
                panic!("pod {name}: timed out waiting for {what}: {:?}", p.status);
            }
        } else if Instant::now() > deadline {
            panic!("pod {name}: gone while waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_pods_like_a_kubelet() {
    let cluster = LocalCluster::start(ClusterOptions {
        name: "nodesim-test".into(),
        ..Default::default()
    })
    .await
    .expect("start control plane");
    let client = cluster.client().await.unwrap();
    let nodes = NodesFile::parse(
        "nodes:\n- {name: fast, speed: 1.0, cpu: '2'}\n- {name: slow, speed: 0.25, cpu: '2', gpus: 1, gpuProduct: NVIDIA-T4}\n",
    )
    .unwrap();
    let sim = NodeSimulator::start(
        client.clone(),
        nodes,
        cluster.state_dir(),
        cluster.kubeconfig_renderer(),
    )
    .await
    .expect("start node simulator");

    // Nodes are registered, Ready, labelled and untainted.
    let node_api: Api<Node> = Api::all(client.clone());
    let slow = node_api.get("slow").await.unwrap();
    let labels = slow.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("nvidia.com/gpu.product").map(String::as_str),
        Some("NVIDIA-T4")
    );
    let status = slow.status.clone().unwrap();
    assert_eq!(
        status.capacity.unwrap().get("nvidia.com/gpu").unwrap().0,
        "1"
    );
    assert!(slow
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .is_empty());

    let ns = "nodesim";
    let ns_api: Api<Namespace> = Api::all(client.clone());
    ns_api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": "cfg"}, "data": {"k": "from-configmap"}}),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    // The default ServiceAccount and its token secret (which 1.20's admission
    // requires before pods) appear shortly.
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    while sas
        .get_opt("default")
        .await
        .unwrap()
        .and_then(|sa| sa.secrets)
        .is_none_or(|s| s.is_empty())
    {
        assert!(Instant::now() < deadline, "no default serviceaccount");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    heterotrain_e2e::volumes::create_claim(&client, sim.state_dir(), ns, "ckpt")
        .await
        .expect("claim");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let script = r#"echo "ip=$POD_IP ns=$MY_NS cm=$FROM_CM limit=$CPU_LIMIT"
getent hosts probe-0.probe.nodesim.svc | awk '{print "dns=" $1}'
cg=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' /proc/self/cgroup)
echo "quota=$(cat /sys/fs/cgroup/cpu$cg/cpu.cfs_quota_us 2>/dev/null || cat /sys/fs/cgroup$(awk -F: '$1==0 {print $3}' /proc/self/cgroup)/cpu.max)"
test -s "$KUBECONFIG" && echo kubeconfig=yes
echo persisted > /ht-ckpt/marker && echo scratch > /ht-scratch/s && echo mounts=ok
exit 3"#;
    let pod = json!({
        "metadata": {"name": "probe-0"},
        "spec": {
            "hostname": "probe-0", "subdomain": "probe",
            "restartPolicy": "Never",
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-T4"},
            "volumes": [{"name": "scratch", "emptyDir": {}},
                        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
            "containers": [{
                "name": "main", "image": "busybox", "command": ["sh", "-c", script],
                "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "1"}},
                "volumeMounts": [{"name": "scratch", "mountPath": "/ht-scratch"},
                                 {"name": "ckpt", "mountPath": "/ht-ckpt"}],
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "FROM_CM", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "k"}}},
                    {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}
                ]
            }]
        }
    });
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    let done = wait_pod(&pods, "probe-0", "Failed", |p| phase(p) == "Failed").await;
    let spec = done.spec.clone().unwrap();
    assert_eq!(
        spec.node_name.as_deref(),
        Some("slow"),
        "scheduled by the GPU selector"
    );
    let st = done.status.clone().unwrap();
    let ip = st.pod_ip.clone().expect("podIP set");
    assert!(ip.starts_with("127."), "{ip}");
    let term = st.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .terminated
        .expect("terminated");
    assert_eq!(term.exit_code, 3);
    let log = std::fs::read_to_string(heterotrain_e2e::nodesim::log_path(
        sim.state_dir(),
        ns,
        "probe-0",
    ))
    .unwrap();
    assert!(
        log.contains(&format!("ip={ip} ns=nodesim cm=from-configmap limit=1")),
        "{log}"
    );
    assert!(
        log.contains(&format!("dns={ip}")),
        "pod DNS name did not resolve: {log}"
    );
    assert!(log.contains("kubeconfig=yes"), "{log}");
    assert!(log.contains("mounts=ok"), "{log}");
    // The claim's data outlives the pod; the emptyDir never touched the host path.
    let marker =
        heterotrain_e2e::nodesim::mounts::claim_dir(sim.state_dir(), ns, "ckpt").join("marker");
    assert_eq!(std::fs::read_to_string(marker).unwrap(), "persisted\n");
    assert!(
        !std::path::Path::new("/ht-scratch/s").exists(),
        "emptyDir leaked to the host"
    );
    // 0.25 speed × 1 CPU limit = a quarter of the 10 ms period.
    assert!(
        log.contains("quota=2500\n") || log.contains("quota=2500 10000"),
        "{log}"
    );

    // Graceful deletion: SIGTERM reaches the process, then the pod disappears.
    let pod = json!({
        "metadata": {"name": "sleeper"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 10,
            "nodeSelector": {"kubernetes.io/hostname": "fast"},
            "containers": [{"name": "main", "image": "busybox",
                "resources": {"limits": {"cpu": "1"}},
                "command": ["sh", "-c", QUOTA_LOOP]}]
        }
    });
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    wait_pod(&pods, "sleeper", "Running", |p| phase(p) == "Running").await;
    let sleeper_log = || {
        std::fs::read_to_string(heterotrain_e2e::nodesim::log_path(
            sim.state_dir(),
            ns,
            "sleeper",
        ))
        .unwrap_or_default()
    };
    let wait_log = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = sleeper_log();
            // The latest quota printed (cgroup v2 adds the period).
            let last = log.lines().rev().find(|l| l.starts_with("q="));
            if last.is_some_and(|l| l == what || l.starts_with(&format!("{what} "))) {
                return;
            }
            assert!(Instant::now() < deadline, "no {what:?} in: {log}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Speed 1.0 × 1 CPU: the whole 10 ms period.
    wait_log("q=10000");
    // A node slowed at run time: the running pod's quota follows.
    assert_eq!(sim.speed("fast"), Some(1.0));
    assert_eq!(sim.set_speed("fast", 0.4).expect("set speed"), 1);
    assert_eq!(sim.speed("fast"), Some(0.4));
    wait_log("q=4000");
    assert!(sim.set_speed("nowhere", 0.5).is_err());
    assert!(sim.set_speed("fast", 0.0).is_err());
    assert_eq!(sim.set_speed("fast", 1.0).expect("restore speed"), 1);
    wait_log("q=10000");
    pods.delete("sleeper", &DeleteParams::default())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while pods.get_opt("sleeper").await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "pod not removed after graceful delete"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = std::fs::read_to_string(heterotrain_e2e::nodesim::log_path(
        sim.state_dir(),
        ns,
        "sleeper",
    ))
    .unwrap();
    assert!(log.contains("got-term"), "SIGTERM not delivered: {log}");

    // Pods' `metrics` ports become Prometheus targets with the PodMonitor's labels.
    let mut prom = heterotrain_e2e::prometheus::Prometheus::start(
        &cluster.state_dir().join("prometheus"),
        Duration::from_secs(1),
    )
    .expect("start prometheus");
    sim.export_prometheus_targets(&heterotrain_e2e::prometheus::targets_file(prom.dir()));
    let pod = json!({
        "metadata": {"name": "exporter", "labels": {"heterotrain.dev/job": "j", "heterotrain.dev/rank": "0", "heterotrain.dev/group": "g"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "busybox",
                "ports": [{"name": "metrics", "containerPort": 9400}],
                "command": ["sh", "-c", "mkdir -p m && cd m && printf 'heterotrain_test_value 42\\n' > metrics && exec python3 -m http.server --bind $POD_IP 9400"],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}]
        }
    });
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = prom.query(r#"heterotrain_test_value{job_name="j",rank="0",group="g",namespace="nodesim",pod="exporter"}"#).unwrap();
        if let Some(v) = r.first() {
            assert_eq!(v["value"][1], "42", "{v}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus never scraped the pod"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    prom.stop();

    sim.stop().await;
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap();
    assert!(
        !hosts.contains("probe-0.probe.nodesim.svc"),
        "stale /etc/hosts entry"
    );
    cluster.stop();
}
