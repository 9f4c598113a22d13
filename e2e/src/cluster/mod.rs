//! Start and stop a real local control plane: etcd, kube-apiserver (TLS,
//! token auth, RBAC), kube-scheduler and kube-controller-manager, on free
//! loopback ports, with state and logs under one directory.

mod access;
mod components;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::Api;

pub use access::base64_encode;
use access::random_token;
pub use components::GANG_SCHEDULER_STAND_IN;
use components::{log_tail, Component};

use crate::paths::{cache_dir, find_binary};
use crate::pki::ensure_pki;
use crate::ports::free_ports;

/// How often the start-up waits look again.
const POLL: Duration = Duration::from_millis(250);

/// Binaries the control plane needs, with where `make setup` puts them.
pub const REQUIRED_BINARIES: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
];

/// How to start a cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// A name used in the state directory.
    pub name: String,
    /// State directory (certs, etcd data, kubeconfig, logs). Default:
    /// `$HETEROTRAIN_CACHE/clusters/<name>-<pid>`, removed on stop.
    pub state_dir: Option<PathBuf>,
    /// Keep the state directory when stopping.
    pub keep_state: bool,
    /// Print progress lines to stderr.
    pub verbose: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            name: "test".into(),
            state_dir: None,
            keep_state: false,
            verbose: false,
        }
    }
}

/// Loopback ports of one cluster.
#[derive(Clone, Copy, Debug)]
pub struct Ports {
    pub etcd_client: u16,
    pub etcd_peer: u16,
    pub apiserver: u16,
    pub scheduler: u16,
    pub controller_manager: u16,
}

/// A running local control plane. Dropping it stops every process.
pub struct LocalCluster {
    state_dir: PathBuf,
    keep_state: bool,
    ports: Ports,
    admin_token: String,
    components: Mutex<Vec<Component>>,
    /// Second octet of the Service range, `127.<octet>.0.0/16`, held
    /// (with its lock file) while the control plane lives.
    service_octet: u8,
    _service_octet_lock: Option<std::fs::File>,
}

fn wait_port(port: u16, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

impl LocalCluster {
    /// Start every component and wait until the API server answers and the
    /// controller manager has created the `default` ServiceAccount.
    pub async fn start(opts: ClusterOptions) -> Result<LocalCluster> {
        let mut missing = Vec::new();
        for b in REQUIRED_BINARIES {
            if find_binary(b).is_none() {
                missing.push(b);
            }
        }
        if !missing.is_empty() {
            bail!(
                "missing {}: run `make setup` (it builds the control plane into {}/bin)",
                missing.join(", "),
                cache_dir().display()
            );
        }
        let state_dir = opts.state_dir.clone().unwrap_or_else(|| {
            cache_dir()
                .join("clusters")
                .join(format!("{}-{}", opts.name, std::process::id()))
        });
        std::fs::create_dir_all(state_dir.join("logs"))
            .with_context(|| format!("creating {}", state_dir.display()))?;
        let p = free_ports(5)?;
        let ports = Ports {
            etcd_client: p[0],
            etcd_peer: p[1],
            apiserver: p[2],
            scheduler: p[3],
            controller_manager: p[4],
        };
        let pki = state_dir.join("pki");
        ensure_pki(&pki)?;
        let admin_token = random_token()?;
        std::fs::write(
            pki.join("tokens.csv"),
            format!("{admin_token},heterotrain-admin,heterotrain-admin,\"system:masters\"\n"),
        )?;
        let (service_octet, service_octet_lock) = crate::nodesim::claim_octet(
            crate::nodesim::SERVICE_IP_OCTETS,
            "heterotrain-service-ranges",
        );
        let cluster = LocalCluster {
            state_dir,
            keep_state: opts.keep_state,
            ports,
            admin_token,
            components: Mutex::new(Vec::new()),
            service_octet,
            _service_octet_lock: service_octet_lock,
        };
        std::fs::write(
            cluster.kubeconfig_path(),
            cluster.kubeconfig_yaml(&cluster.admin_token),
        )?;
        let say = |m: &str| {
            if opts.verbose {
                eprintln!("==> {m}");
            }
        };
        say(&format!("starting etcd on 127.0.0.1:{}", ports.etcd_client));
        cluster.spawn_etcd()?;
        if !wait_port(ports.etcd_client, Duration::from_secs(30)) {
            bail!(
                "etcd did not start listening on {}:\n{}",
                ports.etcd_client,
                log_tail(&cluster.state_dir, "etcd")
            );
        }
        say(&format!(
            "starting kube-apiserver on https://127.0.0.1:{}",
            ports.apiserver
        ));
        cluster.spawn_apiserver()?;
        cluster.wait_apiserver(Duration::from_secs(90)).await?;
        say("starting kube-scheduler and kube-controller-manager");
        cluster.spawn_scheduler()?;
        cluster.spawn_controller_manager()?;
        cluster.wait_default_sa(Duration::from_secs(90)).await?;
        say("control plane ready");
        Ok(cluster)
    }

    /// Directory with certs, etcd data, kubeconfig and logs.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Ports in use.
    pub fn ports(&self) -> Ports {
        self.ports
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.ports.apiserver)
    }

    async fn wait_apiserver(&self, timeout: Duration) -> Result<()> {
        let client = self.client().await?;
        let client = &client;
        let ready =
            crate::wait::eventually("kube-apiserver /readyz", timeout, POLL, || async move {
                let req = http_get("/readyz").map_err(|e| anyhow!("building request: {e}"))?;
                let ok = matches!(client.request_text(req).await, Ok(body) if body.trim() == "ok");
                self.component_alive("kube-apiserver")?;
                Ok(ok.then_some(()))
            })
            .await;
        ready.map_err(|e| e.context(log_tail(&self.state_dir, "kube-apiserver")))
    }

    async fn wait_default_sa(&self, timeout: Duration) -> Result<()> {
        let sas: Api<ServiceAccount> = Api::namespaced(self.client().await?, "default");
        let sas = &sas;
        let what = "the controller manager's default ServiceAccount";
        let made = crate::wait::eventually(what, timeout, POLL, || async move {
            let found = matches!(sas.get_opt("default").await, Ok(Some(_)));
            self.component_alive("kube-controller-manager")?;
            self.component_alive("kube-scheduler")?;
            Ok(found.then_some(()))
        })
        .await;
        made.map_err(|e| {
            e.context(format!(
                "{}\n--- kube-scheduler ---\n{}",
                log_tail(&self.state_dir, "kube-controller-manager"),
                log_tail(&self.state_dir, "kube-scheduler")
            ))
        })
    }

    /// Stop the API server, wait `down`, start it again and wait until ready.
    pub async fn restart_apiserver(&self, down: Duration) -> Result<()> {
        self.stop_component("kube-apiserver");
        tokio::time::sleep(down).await;
        self.spawn_apiserver()?;
        self.wait_apiserver(Duration::from_secs(90)).await
    }

    /// Stop etcd, wait `down`, start it again on its data directory and
    /// wait until the API server answers ready again.
    pub async fn restart_etcd(&self, down: Duration) -> Result<()> {
        self.stop_component("etcd");
        tokio::time::sleep(down).await;
        self.spawn_etcd()?;
        if !wait_port(self.ports.etcd_client, Duration::from_secs(30)) {
            bail!(
                "etcd did not listen again: {}",
                log_tail(&self.state_dir, "etcd")
            );
        }
        self.wait_apiserver(Duration::from_secs(90)).await
    }

    /// Stop every component (reverse start order) and remove the state
    /// directory unless asked to keep it.
    pub fn stop(&self) {
        self.stop_components();
        if !self.keep_state {
            let _ = std::fs::remove_dir_all(&self.state_dir);
        }
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

fn http_get(path: &str) -> Result<http::Request<Vec<u8>>, http::Error> {
    http::Request::get(path).body(Vec::new())
}
