//! The node simulator against the real control plane: the real scheduler
//! binds pods to simulated nodes by nodeSelector / extended resources, and
//! the simulator runs them as processes with resolved env, pod DNS, a CPU
//! quota of node speed × CPU limit (on the node's own CPUs where it names
//! them), kubelet-like status, and graceful deletion.

mod support;

use std::time::Duration;

use futures::FutureExt;
use heterotrain_e2e::nodesim::netpol;
use heterotrain_e2e::system::SystemOptions;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use support::*;

/// Handles SIGTERM; prints its CPU quota and period (µs) every 100 ms:
/// `q=<quota> <period>` (v2's `cpu.max`, or v1's two files).
const QUOTA_LOOP: &str = r#"trap 'echo got-term; exit 0' TERM
echo started
cg=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' /proc/self/cgroup)
f=/sys/fs/cgroup/cpu$cg/cpu.cfs_quota_us
[ -f "$f" ] || f=/sys/fs/cgroup$(awk -F: '$1==0 {print $3}' /proc/self/cgroup)/cpu.max
p=${f%/*}/cpu.cfs_period_us
while true; do if [ -f "$p" ]; then echo "q=$(cat $f) $(cat $p)"; else echo "q=$(cat $f)"; fi; sleep 0.1; done"#;

async fn wait_pod<F: Fn(&Pod) -> bool>(api: &Api<Pod>, name: &str, what: &str, f: F) -> Pod {
    let (f, what) = (&f, format!("pod {name} {what}"));
    wait_for(&what, Duration::from_secs(60), || async move {
        api.get_opt(name).await.ok().flatten().filter(f)
    })
    .await
}

/// The latest CPU quota `sleeper` printed is `q` (`q=<quota>` or
/// `q=<quota> <period>`).
async fn wait_quota(log_path: &std::path::Path, q: &str) {
    let what = format!("{q:?} in {}", log_path.display());
    wait_for(&what, Duration::from_secs(20), || async move {
        let log = std::fs::read_to_string(log_path).unwrap_or_default();
        let last = log.lines().rev().find(|l| l.starts_with("q="));
        last.is_some_and(|l| l == q || l.starts_with(&format!("{q} ")))
            .then_some(())
    })
    .await
}

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_pods_like_a_kubelet() {
    // The slow node's pods run on one CPU of their own.
    let own_cpu = *heterotrain_e2e::nodesim::config::usable_cpus()
        .last()
        .expect("a usable CPU");
    let mut bed = test_bed(SystemOptions {
        prometheus: true,
        ..SystemOptions::bare(
            "nodesim-test",
            nodes(&format!("nodes:\n- {{name: fast, speed: 1.0, cpu: '2'}}\n- {{name: slow, speed: 0.25, cpu: '2', gpus: 1, gpuProduct: NVIDIA-T4, cpus: [{own_cpu}]}}\n")),
        )
    })
    .await;
    let client = bed.client().await.unwrap();
    let sim = &bed.sim;

    // The control plane keeps off the components' fixed default ports
    // (kube-scheduler's 10251, kube-controller-manager's 10252), so that
    // clusters of test binaries running at once do not collide.
    for port in [10251, 10252] {
        heterotrain_e2e::ports::ensure_free(port).unwrap_or_else(|e| panic!("{e}"));
    }

    // Nodes are registered, Ready, labelled and untainted.
    let node_api: Api<Node> = Api::all(client.clone());
    let slow = node_api.get("slow").await.unwrap();
    let labels = slow.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("nvidia.com/gpu.product").map(String::as_str),
        Some("NVIDIA-T4")
    );
    // Nodes of different simulated speed have different instance types
    // (the profile cache's hardware class).
    assert_eq!(
        labels
            .get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some("sim-2cpu-x0.25")
    );
    let fast = node_api.get("fast").await.unwrap();
    assert_eq!(
        fast.metadata
            .labels
            .unwrap_or_default()
            .get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some("sim-2cpu-x1")
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
    create_namespace(&client, ns).await;
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
    let sas = &sas;
    wait_for(
        "the default serviceaccount",
        Duration::from_secs(30),
        || async move {
            let sa = sas.get_opt("default").await.unwrap();
            sa.and_then(|sa| sa.secrets).filter(|s| !s.is_empty())
        },
    )
    .await;

    heterotrain_e2e::volumes::create_claim(&client, sim.state_dir(), ns, "ckpt")
        .await
        .expect("claim");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let script = r#"echo "ip=$POD_IP ns=$MY_NS cm=$FROM_CM limit=$CPU_LIMIT"
getent hosts probe-0.probe.nodesim.svc | awk '{print "dns=" $1}'
cg=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' /proc/self/cgroup)
echo "quota=$(cat /sys/fs/cgroup/cpu$cg/cpu.cfs_quota_us 2>/dev/null || cat /sys/fs/cgroup$(awk -F: '$1==0 {print $3}' /proc/self/cgroup)/cpu.max)"
test -s "$KUBECONFIG" && echo kubeconfig=yes
awk '/^Cpus_allowed_list/ {print "cpus=" $2}' /proc/self/status
echo persisted > /ht-ckpt/marker && echo scratch > /ht-scratch/s && echo mounts=ok
echo "bye from probe" > /dev/termination-log
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
    create(&pods, pod, "create pod").await;
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
    // The termination message file, reported as a kubelet does.
    assert_eq!(term.message.as_deref(), Some("bye from probe"));
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
    assert!(
        log.lines().any(|l| l == format!("cpus={own_cpu}")),
        "the pod did not run on its node's CPU {own_cpu} only: {log}"
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
    create(&pods, pod, "create pod").await;
    wait_pod(&pods, "sleeper", "Running", |p| phase(p) == "Running").await;
    let sleeper_log = heterotrain_e2e::nodesim::log_path(sim.state_dir(), ns, "sleeper");
    // Speed 1.0 × 1 CPU: the whole 10 ms period.
    wait_quota(&sleeper_log, "q=10000").await;
    // A node slowed at run time: the running pod's quota follows.
    assert_eq!(sim.speed("fast"), Some(1.0));
    assert_eq!(sim.set_speed("fast", 0.4).expect("set speed"), 1);
    assert_eq!(sim.speed("fast"), Some(0.4));
    wait_quota(&sleeper_log, "q=4000 10000").await;
    // Slower than the kernel's 1 ms quota floor allows over 10 ms: the
    // period grows, so the pod gets 0.05 of a core and not 0.1.
    assert_eq!(sim.set_speed("fast", 0.05).expect("set speed"), 1);
    wait_quota(&sleeper_log, "q=1000 20000").await;
    assert!(sim.set_speed("nowhere", 0.5).is_err());
    assert!(sim.set_speed("fast", 0.0).is_err());
    assert_eq!(sim.set_speed("fast", 1.0).expect("restore speed"), 1);
    wait_quota(&sleeper_log, "q=10000").await;
    pods.delete("sleeper", &DeleteParams::default())
        .await
        .unwrap();
    let pods_ref = &pods;
    wait_for(
        "the pod removed after graceful delete",
        Duration::from_secs(20),
        || async move {
            pods_ref
                .get_opt("sleeper")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        },
    )
    .await;
    let log = std::fs::read_to_string(heterotrain_e2e::nodesim::log_path(
        sim.state_dir(),
        ns,
        "sleeper",
    ))
    .unwrap();
    assert!(log.contains("got-term"), "SIGTERM not delivered: {log}");

    // Pods' `metrics` ports become Prometheus targets with the PodMonitor's labels.
    let prom = bed.prometheus.as_ref().expect("the bed's prometheus");
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
    create(&pods, pod, "create pod").await;
    let pods_ref = &pods;
    let v = wait_for("prometheus to scrape the pod", Duration::from_secs(300), || async move {
        // An exporter that died is never scraped: say so now, with its log.
        let p = pods_ref.get("exporter").await.unwrap();
        assert_ne!(
            phase(&p),
            "Failed",
            "the exporter pod failed: {}",
            std::fs::read_to_string(heterotrain_e2e::nodesim::log_path(sim.state_dir(), ns, "exporter"))
                .unwrap_or_default()
        );
        let r = prom.query(r#"heterotrain_test_value{job_name="j",rank="0",group="g",namespace="nodesim",pod="exporter"}"#).unwrap();
        r.first().cloned()
    })
    .await;
    assert_eq!(v["value"][1], "42", "{v}");

    // NetworkPolicies are enforced between pod IPs: with a policy admitting
    // only `role: friend` pods to the exporter's `metrics` port, a friend
    // connects, a stranger (same namespace) is refused, the node itself
    // (Prometheus, the operator) still connects; without the policy the
    // stranger connects again.
    let exporter_ip = wait_pod(&pods, "exporter", "Running", |p| phase(p) == "Running")
        .await
        .status
        .and_then(|s| s.pod_ip)
        .unwrap();
    let mut ips = std::collections::BTreeMap::new();
    for (name, role) in [("friend", "friend"), ("stranger", "other")] {
        let pod = json!({
            "metadata": {"name": name, "labels": {"role": role}},
            "spec": {"restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "300"]}]}
        });
        create(&pods, pod, "create pod").await;
        let p = wait_pod(&pods, name, "Running", |p| phase(p) == "Running").await;
        ips.insert(name, p.status.and_then(|s| s.pod_ip).unwrap());
    }
    let connect = |from: String| {
        let to = exporter_ip.clone();
        async move { netpol::connect_from(&from, &to, 9400).await }
    };
    for from in [&ips["friend"], &ips["stranger"]] {
        connect(from.clone()).await.expect("no policy yet: open");
    }
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let policy = json!({
        "metadata": {"name": "exporter-from-friends"},
        "spec": {"podSelector": {"matchLabels": {"heterotrain.dev/job": "j"}},
                 "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "friend"}}}],
                              "ports": [{"port": "metrics"}]}]}
    });
    create(&policies, policy, "create policy").await;
    let stranger = ips["stranger"].clone();
    let refused = wait_for("the stranger refused", Duration::from_secs(20), || {
        let c = connect(stranger.clone());
        async move { c.await.err() }
    })
    .await;
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "{refused}"
    );
    assert_eq!(sim.network_policy_state(), netpol::State::Enforcing);
    connect(ips["friend"].clone())
        .await
        .expect("a friend connects");
    connect("127.0.0.1".into())
        .await
        .expect("the node connects");
    policies
        .delete("exporter-from-friends", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "the stranger admitted again",
        Duration::from_secs(20),
        || {
            let c = connect(stranger.clone());
            async move { c.await.ok() }
        },
    )
    .await;

    // Egress too: with a policy letting `role: other` pods out only to one
    // endpoint (and in from nowhere), the stranger reaches that endpoint,
    // is refused at another and at the exporter, and the friend (not
    // selected) still reaches both endpoints.
    let allowed = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let other = tokio::net::TcpListener::bind("127.0.0.3:0").await.unwrap();
    let (allowed_port, other_port) = (
        allowed.local_addr().unwrap().port(),
        other.local_addr().unwrap().port(),
    );
    let policy = json!({
        "metadata": {"name": "others-out"},
        "spec": {"podSelector": {"matchLabels": {"role": "other"}},
                 "policyTypes": ["Ingress", "Egress"],
                 "egress": [{"to": [{"ipBlock": {"cidr": "127.0.0.2/32"}}],
                             "ports": [{"port": allowed_port}]}]}
    });
    create(&policies, policy, "create policy").await;
    let refused = wait_for("the stranger held in", Duration::from_secs(20), || {
        let s = stranger.clone();
        async move {
            netpol::connect_from(&s, "127.0.0.3", other_port)
                .await
                .err()
        }
    })
    .await;
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "{refused}"
    );
    // Who connected to a listener (the peers' addresses) since last asked.
    let peer = |l: &tokio::net::TcpListener| {
        let mut seen = Vec::new();
        while let Some(Ok((_, a))) = l.accept().now_or_never() {
            seen.push(a.ip().to_string());
        }
        seen
    };
    // Connections made before the policy took effect.
    peer(&other);
    netpol::connect_from(&stranger, "127.0.0.2", allowed_port)
        .await
        .expect("the stranger reaches its listed endpoint");
    let to_exporter = connect(stranger.clone())
        .await
        .expect_err("egress to the exporter");
    assert_eq!(to_exporter.kind(), std::io::ErrorKind::ConnectionRefused);
    for (ip, port) in [("127.0.0.2", allowed_port), ("127.0.0.3", other_port)] {
        netpol::connect_from(&ips["friend"], ip, port)
            .await
            .unwrap_or_else(|e| panic!("the friend (not selected) reaches {ip}:{port}: {e}"));
    }
    // The listed endpoint saw the stranger's address; the other saw only the friend.
    assert!(
        peer(&allowed).contains(&stranger),
        "allowed endpoint's peers"
    );
    assert_eq!(peer(&other), vec![ips["friend"].clone()]);

    bed.stop().await;
    let hosts = std::fs::read_to_string("/etc/hosts").unwrap();
    assert!(
        !hosts.contains("probe-0.probe.nodesim.svc"),
        "stale /etc/hosts entry"
    );
}
