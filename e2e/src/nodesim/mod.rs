//! The node simulator: registers Nodes of configurable speed with the real
//! API server, keeps them Ready, and runs the pods the real scheduler binds
//! to them as local processes — each in a CPU-quota cgroup (node speed × the
//! pod's CPU limit), with its own loopback IP as `POD_IP`, its DNS name in
//! `/etc/hosts`, and a kubeconfig for its ServiceAccount's token.

pub mod cgroup;
pub mod config;
pub mod env;
pub mod hosts;
pub mod mounts;
pub mod node;
pub mod pod;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
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
    kubeconfig_template: Box<dyn Fn(&str) -> String + Send + Sync>,
    next_ip: AtomicU32,
    ip_prefix: u8,
    pub running: Mutex<HashMap<String, Arc<pod::RunningPod>>>,
    /// Prometheus file-SD output, when enabled.
    targets_file: Mutex<Option<PathBuf>>,
    targets: Mutex<BTreeMap<String, serde_json::Value>>,
    /// Speeds changed at run time ([`NodeSimulator::set_speed`]).
    speeds: Mutex<HashMap<String, f64>>,
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

    /// A fresh loopback IP (never reused within an instance).
    pub fn next_ip(&self) -> String {
        let n = self.next_ip.fetch_add(1, Ordering::SeqCst);
        format!("127.{}.{}.{}", self.ip_prefix, (n >> 8) & 0xff, n & 0xff)
    }

    /// A kubeconfig for `token` against this cluster.
    pub fn kubeconfig_for_token(&self, token: &str) -> String {
        (self.kubeconfig_template)(token)
    }

    /// Record the metrics target of a started pod (its container port named
    /// `metrics`), with the labels the chart's PodMonitor gives trainer targets.
    pub fn add_target(&self, pod: &Pod, ip: &str) {
        let port = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.ports.as_ref())
            .and_then(|ps| ps.iter().find(|p| p.name.as_deref() == Some("metrics")))
            .map(|p| p.container_port);
        let Some(port) = port else { return };
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let l = |k: &str| labels.get(k).cloned().unwrap_or_default();
        use heterotrain_crds::metrics::labels as L;
        let target = serde_json::json!({
            "targets": [format!("{ip}:{port}")],
            "labels": {
                "namespace": pod.metadata.namespace.clone().unwrap_or_default(),
                "pod": pod.metadata.name.clone().unwrap_or_default(),
                "node": pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
                "job_name": l(L::JOB),
                "rank": l(L::RANK),
                "group": l(L::GROUP),
            }
        });
        if let Ok(mut t) = self.targets.lock() {
            t.insert(pod.metadata.uid.clone().unwrap_or_default(), target);
        }
        self.write_targets();
    }

    /// Forget a pod's metrics target.
    pub fn remove_target(&self, uid: &str) {
        let removed = self
            .targets
            .lock()
            .map(|mut t| t.remove(uid).is_some())
            .unwrap_or(false);
        if removed {
            self.write_targets();
        }
    }

    fn write_targets(&self) {
        let Some(path) = self.targets_file.lock().ok().and_then(|p| p.clone()) else {
            return;
        };
        let all: Vec<_> = self
            .targets
            .lock()
            .map(|t| t.values().cloned().collect())
            .unwrap_or_default();
        let tmp = path.with_extension("tmp");
        if std::fs::write(&tmp, serde_json::to_vec_pretty(&all).unwrap_or_default()).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }

    /// Where a pod's stdout/stderr go.
    pub fn log_path(&self, ns: &str, name: &str) -> PathBuf {
        log_path(&self.state_dir, ns, name)
    }
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
    /// Register `nodes` and start running their pods. `kubeconfig_for_token`
    /// renders a kubeconfig for a pod's ServiceAccount token.
    pub async fn start(
        client: Client,
        nodes: NodesFile,
        state_dir: &Path,
        kubeconfig_for_token: impl Fn(&str) -> String + Send + Sync + 'static,
    ) -> Result<NodeSimulator> {
        let instance = format!("sim-{}-{}", std::process::id(), rand_suffix());
        let version = cgroup::detect();
        if version == cgroup::Version::Unavailable {
            eprintln!("nodesim: warning: no writable cgroup CPU controller; pods run unthrottled");
        }
        let ctx = Arc::new(Ctx {
            client: client.clone(),
            nodes: nodes
                .nodes
                .iter()
                .map(|n| (n.name.clone(), n.clone()))
                .collect(),
            state_dir: state_dir.to_path_buf(),
            hosts: hosts::HostsFile::new(Path::new("/etc/hosts"), &instance),
            cgroup_version: version,
            instance,
            kubeconfig_template: Box::new(kubeconfig_for_token),
            next_ip: AtomicU32::new(2),
            ip_prefix: next_ip_prefix(),
            running: Mutex::new(HashMap::new()),
            targets_file: Mutex::new(None),
            targets: Mutex::new(BTreeMap::new()),
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
                for n in hb.nodes.values() {
                    if let Err(e) = node::heartbeat(&hb.client, n).await {
                        eprintln!("nodesim: heartbeat: {e:#}");
                    }
                }
            }
        }));
        let w = ctx.clone();
        tasks.push(tokio::spawn(async move { watch_pods(w).await }));
        Ok(NodeSimulator {
            ctx,
            tasks,
            stopped: AtomicBool::new(false),
        })
    }

    /// Keep a Prometheus file-SD target list of running pods' `metrics`
    /// ports at `path` (see [`crate::prometheus`]).
    pub fn export_prometheus_targets(&self, path: &Path) {
        if let Ok(mut p) = self.ctx.targets_file.lock() {
            *p = Some(path.to_path_buf());
        }
        self.ctx.write_targets();
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
        let pods: Vec<_> = self
            .ctx
            .running
            .lock()
            .map(|m| m.values().filter(|p| p.node == node).cloned().collect())
            .unwrap_or_default();
        let mut changed = 0;
        for p in pods {
            let cg = p.cgroup.lock().ok().and_then(|g| g.clone());
            if let Some((cg, limit)) = cg {
                cg.set_cores(limit * speed)?;
                changed += 1;
            }
        }
        Ok(changed)
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
    }
}

/// Second octet of an instance's pod IPs: distinct for every simulator in
/// this process (and, by the process id, most likely across processes).
fn next_ip_prefix() -> u8 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    (20 + (std::process::id().wrapping_mul(7).wrapping_add(n * 53)) % 230) as u8
}

fn rand_suffix() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() & 0xffff) as u32
}

async fn watch_pods(ctx: Arc<Ctx>) {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Apply(p)) | Ok(Event::InitApply(p)) => on_pod(&ctx, p),
            Ok(Event::Delete(p)) => on_pod_gone(&ctx, &p),
            Ok(_) => {}
            Err(e) => {
                eprintln!("nodesim: pod watch error (retrying): {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

fn on_pod(ctx: &Arc<Ctx>, p: Pod) {
    let node = p
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    if !ctx.nodes.contains_key(&node) {
        return;
    }
    let uid = p.metadata.uid.clone().unwrap_or_default();
    let existing = ctx.running.lock().ok().and_then(|m| m.get(&uid).cloned());
    let deleting = p.metadata.deletion_timestamp.is_some();
    match existing {
        Some(running) => {
            if deleting {
                let grace = p
                    .metadata
                    .deletion_grace_period_seconds
                    .or_else(|| {
                        p.spec
                            .as_ref()
                            .and_then(|s| s.termination_grace_period_seconds)
                    })
                    .unwrap_or(30)
                    .max(0) as u64;
                tokio::spawn(pod::terminate(running, Duration::from_secs(grace)));
            }
        }
        None => {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let started = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|c| !c.is_empty());
            if deleting {
                let ctx = ctx.clone();
                tokio::spawn(async move { pod::finalize_delete(&ctx, &p).await });
                return;
            }
            if phase == "Succeeded" || phase == "Failed" || started {
                return;
            }
            let running = Arc::new(pod::RunningPod {
                pid: Mutex::new(None),
                terminating: AtomicBool::new(false),
                node: node.clone(),
                cgroup: Mutex::new(None),
            });
            if let Ok(mut m) = ctx.running.lock() {
                m.insert(uid, running.clone());
            }
            tokio::spawn(pod::run(ctx.clone(), p, running));
        }
    }
}

fn on_pod_gone(ctx: &Arc<Ctx>, p: &Pod) {
    let uid = p.metadata.uid.clone().unwrap_or_default();
    if let Some(running) = ctx.running.lock().ok().and_then(|m| m.get(&uid).cloned()) {
        running.terminating.store(true, Ordering::SeqCst);
        if let Some(pid) = running.pid.lock().ok().and_then(|g| *g) {
            crate::keeper::signal_group(pid, libc::SIGKILL);
        }
    }
}
