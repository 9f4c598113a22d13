//! The node simulator: registers Nodes of configurable speed with the real
//! API server, keeps them Ready, and runs the pods the real scheduler binds
//! to them as local processes — each in a CPU-quota cgroup (node speed × the
//! pod's CPU limit), with its own loopback IP as `POD_IP`, its DNS name in
//! `/etc/hosts`, and what a kubelet gives it to reach the API server: its
//! ServiceAccount's token, the CA and namespace at
//! `/var/run/secrets/kubernetes.io/serviceaccount` with
//! `KUBERNETES_SERVICE_HOST`/`_PORT` (unless `automountServiceAccountToken`
//! is false), and a `KUBECONFIG` for the same token.

pub mod cgroup;
pub mod config;
pub mod container;
pub mod entries;
pub mod env;
pub mod hosts;
pub mod mounts;
pub mod netpol;
pub mod node;
mod octets;
pub mod pod;
pub use octets::{claim_octet, POD_IP_OCTETS, SERVICE_IP_OCTETS};
pub mod services;
pub mod status;
pub mod targets;
mod watch;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::Client;

pub use config::{NodeConfig, NodesFile};

/// Shared state of one simulator instance.
pub struct Ctx {
    pub client: Client,
    pub nodes: BTreeMap<String, NodeConfig>,
    pub state_dir: PathBuf,
    pub hosts: hosts::HostsFile,
    pub cgroup_version: cgroup::Version,
    pub instance: String,
    api: PodApiAccess,
    next_ip: AtomicU32,
    ip_prefix: u8,
    /// Held while the instance lives: no other simulator, in this process
    /// or another, takes the same `ip_prefix` (see [`claim_octet`]).
    _ip_prefix_lock: Option<std::fs::File>,
    pub running: Mutex<HashMap<String, Arc<pod::RunningPod>>>,
    /// Prometheus file-SD output of the running pods' metrics ports.
    pub targets: targets::Targets,
    /// Speeds changed at run time ([`NodeSimulator::set_speed`]).
    speeds: Mutex<HashMap<String, f64>>,
    /// NetworkPolicy enforcement between the pods' IPs.
    pub netpol: netpol::Enforcer,
    /// Nodes lost ([`NodeSimulator::lose_node`]): no heartbeat, their
    /// pods' processes gone and nothing reported or finished for them.
    lost: Mutex<HashSet<String>>,
}

impl Ctx {
    /// A node's current speed (its configured one unless changed at run time).
    pub fn speed_of(&self, node: &str) -> f64 {
        self.speeds
            .lock()
            .ok()
            .and_then(|s| s.get(node).copied())
            .or_else(|| self.nodes.get(node).map(|n| n.speed))
            .unwrap_or(1.0)
    }

    /// Whether `node` was lost.
    pub fn is_lost(&self, node: &str) -> bool {
        self.lost.lock().map(|l| l.contains(node)).unwrap_or(false)
    }

    /// A fresh loopback IP (never reused within an instance).
    pub fn next_ip(&self) -> String {
        let n = self.next_ip.fetch_add(1, Ordering::SeqCst);
        format!("127.{}.{}.{}", self.ip_prefix, (n >> 8) & 0xff, n & 0xff)
    }

    /// A kubeconfig for `token` against this cluster.
    pub fn kubeconfig_for_token(&self, token: &str) -> String {
        (self.api.kubeconfig_for_token)(token)
    }

    /// How pods reach the API server.
    pub fn api(&self) -> &PodApiAccess {
        &self.api
    }

    /// Where a pod's stdout/stderr go.
    pub fn log_path(&self, ns: &str, name: &str) -> PathBuf {
        log_path(&self.state_dir, ns, name)
    }
}

/// What a kubelet gives a pod to reach the API server: the in-cluster
/// service variables and the ServiceAccount directory (token, CA,
/// namespace), and, for clients that prefer one, a kubeconfig.
pub struct PodApiAccess {
    /// Renders a kubeconfig for a ServiceAccount token.
    pub kubeconfig_for_token: Box<dyn Fn(&str) -> String + Send + Sync>,
    /// `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`.
    pub host: String,
    pub port: u16,
    /// The CA that signed the API server's certificate (PEM).
    pub ca_pem: Vec<u8>,
}

/// Log file of pod `ns/name` under a simulator's state directory.
pub fn log_path(state_dir: &Path, ns: &str, name: &str) -> PathBuf {
    state_dir
        .join("logs")
        .join("pods")
        .join(format!("{ns}_{name}.log"))
}

/// A running node simulator; dropping it stops its pods and tasks.
pub struct NodeSimulator {
    ctx: Arc<Ctx>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stopped: AtomicBool,
}

impl NodeSimulator {
    /// Register `nodes` and start running their pods; `api` is how their
    /// processes reach the API server.
    pub async fn start(
        client: Client,
        nodes: NodesFile,
        state_dir: &Path,
        api: PodApiAccess,
    ) -> Result<NodeSimulator> {
        let instance = format!("sim-{}-{}", std::process::id(), rand_suffix());
        let version = cgroup::detect();
        if version == cgroup::Version::Unavailable {
            eprintln!("nodesim: warning: no writable cgroup CPU controller; pods run unthrottled");
        }
        let (ip_prefix, ip_prefix_lock) = octets::claim_ip_prefix();
        let ctx = Arc::new(Ctx {
            client: client.clone(),
            nodes: nodes
                .nodes
                .iter()
                .map(|n| (n.name.clone(), n.clone()))
                .collect(),
            state_dir: state_dir.to_path_buf(),
            hosts: hosts::HostsFile::new(Path::new("/etc/hosts"), &instance),
            netpol: netpol::Enforcer::new(&instance),
            lost: Mutex::new(HashSet::new()),
            cgroup_version: version,
            instance,
            api,
            next_ip: AtomicU32::new(2),
            ip_prefix,
            _ip_prefix_lock: ip_prefix_lock,
            running: Mutex::new(HashMap::new()),
            targets: targets::Targets::default(),
            speeds: Mutex::new(HashMap::new()),
        });
        for n in ctx.nodes.values() {
            node::register(&client, n).await?;
        }
        let mut tasks = Vec::new();
        let hb = ctx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                for n in hb.nodes.values().filter(|n| !hb.is_lost(&n.name)) {
                    if let Err(e) = node::heartbeat(&hb.client, n).await {
                        eprintln!("nodesim: heartbeat: {e:#}");
                    }
                }
            }
        }));
        let w = ctx.clone();
        tasks.push(tokio::spawn(async move { watch::watch_pods(w).await }));
        // Policies change without pods changing: re-read them every second.
        tasks.push(tokio::spawn(services::proxy_services(client.clone())));
        let np = ctx.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let _ = np.netpol.sync(&np.client).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }));
        Ok(NodeSimulator {
            ctx,
            tasks,
            stopped: AtomicBool::new(false),
        })
    }

    /// Keep a Prometheus file-SD target list of running pods' `metrics`
    /// ports at `path` (see [`crate::prometheus`]).
    pub fn export_prometheus_targets(&self, path: &Path) {
        self.ctx.targets.export_to(path);
    }

    /// Send `signal` to the process group of pod `ns/name` (e.g. SIGKILL to
    /// simulate a crashed rank). Returns false when the pod runs nothing here.
    pub async fn signal_pod(&self, ns: &str, name: &str, signal: i32) -> bool {
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), ns);
        let Ok(Some(p)) = api.get_opt(name).await else {
            return false;
        };
        let uid = p.metadata.uid.unwrap_or_default();
        let pid = self
            .ctx
            .running
            .lock()
            .ok()
            .and_then(|m| m.get(&uid).cloned())
            .and_then(|r| r.pid.lock().ok().and_then(|g| *g));
        match pid {
            Some(pid) => {
                crate::keeper::signal_group(pid, signal);
                true
            }
            None => false,
        }
    }

    /// Change a node's speed now: the CPU quota of every pod running on it
    /// and of pods started later (a node slowing down, e.g. thermal
    /// throttling or a noisy neighbour). Returns how many running pods were
    /// re-quota'd.
    pub fn set_speed(&self, node: &str, speed: f64) -> Result<usize> {
        if !self.ctx.nodes.contains_key(node) {
            anyhow::bail!("node {node} is not simulated here");
        }
        if !(speed.is_finite() && speed > 0.0 && speed <= 64.0) {
            anyhow::bail!("speed {speed} must be in (0, 64]");
        }
        if let Ok(mut s) = self.ctx.speeds.lock() {
            s.insert(node.to_string(), speed);
        }
        let mut changed = 0;
        for p in self.pods_on(node)? {
            let cg = p.cgroup.lock().ok().and_then(|g| g.clone());
            if let Some((cg, limit)) = cg {
                cg.set_cores(limit * speed)?;
                changed += 1;
            }
        }
        Ok(changed)
    }

    /// The pods running on simulated node `node` (an error for another node).
    fn pods_on(&self, node: &str) -> Result<Vec<Arc<pod::RunningPod>>> {
        if !self.ctx.nodes.contains_key(node) {
            anyhow::bail!("node {node} is not simulated here");
        }
        Ok(self
            .ctx
            .running
            .lock()
            .map(|m| m.values().filter(|p| p.node == node).cloned().collect())
            .unwrap_or_default())
    }

    /// Lose `node` as a cluster loses a machine: its pods' processes die
    /// (SIGKILL), its heartbeats stop, and nothing more is reported for its
    /// pods — a deleted pod stays Terminating, as no kubelet finishes the
    /// delete. The node is marked as the node lifecycle controller would
    /// (Ready Unknown, the `unreachable` NoSchedule taint). Returns how many
    /// processes were killed.
    pub async fn lose_node(&self, node: &str) -> Result<usize> {
        let pods = self.pods_on(node)?;
        if let Ok(mut l) = self.ctx.lost.lock() {
            l.insert(node.to_string());
        }
        let mut killed = 0;
        for p in pods {
            if let Some(pid) = p.pid.lock().ok().and_then(|g| *g) {
                crate::keeper::signal_group(pid, libc::SIGKILL);
                killed += 1;
            }
        }
        node::mark_unreachable(&self.ctx.client, node).await?;
        Ok(killed)
    }

    /// A node's current speed.
    pub fn speed(&self, node: &str) -> Option<f64> {
        self.ctx
            .nodes
            .contains_key(node)
            .then(|| self.ctx.speed_of(node))
    }

    /// Names of the simulated nodes.
    pub fn node_names(&self) -> Vec<String> {
        self.ctx.nodes.keys().cloned().collect()
    }

    /// Whether the pods' NetworkPolicies are enforced (see [`netpol`]).
    pub fn network_policy_state(&self) -> netpol::State {
        self.ctx.netpol.state()
    }

    /// The simulator's state directory (pod logs are under `logs/pods/`).
    pub fn state_dir(&self) -> &Path {
        &self.ctx.state_dir
    }

    /// Stop watching, SIGTERM every pod process (SIGKILL after 5 s), drop
    /// the DNS entries and cgroups.
    pub async fn stop(&self) {
        if self.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        for t in &self.tasks {
            t.abort();
        }
        let pods: Vec<_> = self
            .ctx
            .running
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        let stops = pods
            .into_iter()
            .map(|p| pod::terminate(p, Duration::from_secs(5)));
        futures::future::join_all(stops).await;
        let _ = self.ctx.hosts.clear();
        self.ctx.netpol.clear();
    }
}

impl Drop for NodeSimulator {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Ok(m) = self.ctx.running.lock() {
            for p in m.values() {
                if let Some(pid) = p.pid.lock().ok().and_then(|g| *g) {
                    crate::keeper::signal_group(pid, libc::SIGKILL);
                }
            }
        }
        let _ = self.ctx.hosts.clear();
        self.ctx.netpol.clear();
    }
}

fn rand_suffix() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() & 0xffff) as u32
}
