//! Start and stop a real local control plane: etcd, kube-apiserver (TLS,
//! token auth, RBAC), kube-scheduler and kube-controller-manager, on free
//! loopback ports, with state and logs under one directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;

use crate::keeper::{spawn_tied, stop_child};
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

struct Component {
    name: &'static str,
    child: Child,
}

/// A running local control plane. Dropping it stops every process.
pub struct LocalCluster {
    state_dir: PathBuf,
    keep_state: bool,
    ports: Ports,
    admin_token: String,
    components: Mutex<Vec<Component>>,
}

fn random_token() -> Result<String> {
    use std::io::Read;
    let mut buf = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn log_file(dir: &Path, name: &str) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("logs").join(format!("{name}.log")))
        .with_context(|| format!("opening log for {name}"))
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

/// The last lines of a component's log, for error messages.
fn log_tail(dir: &Path, name: &str) -> String {
    let text =
        std::fs::read_to_string(dir.join("logs").join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
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
        let cluster = LocalCluster {
            state_dir,
            keep_state: opts.keep_state,
            ports,
            admin_token,
            components: Mutex::new(Vec::new()),
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

    /// The admin kubeconfig (token in `system:masters`).
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.state_dir.join("kubeconfig")
    }

    /// CA certificate that signed the API server's serving certificate.
    pub fn ca_path(&self) -> PathBuf {
        self.state_dir.join("pki").join("ca.crt")
    }

    /// A kubeconfig document authenticating with `token`.
    pub fn kubeconfig_yaml(&self, token: &str) -> String {
        (self.kubeconfig_renderer())(token)
    }

    /// A function rendering kubeconfigs for tokens, detached from `self`
    /// (for the node simulator, which writes one per pod).
    pub fn kubeconfig_renderer(&self) -> impl Fn(&str) -> String + Send + Sync + 'static {
        let ca = std::fs::read(self.ca_path()).unwrap_or_default();
        let ca_b64 = base64_encode(&ca);
        let server = self.server_url();
        move |token: &str| {
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: heterotrain-local\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca_b64}\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: heterotrain-local\n  context:\n    cluster: heterotrain-local\n    user: user\ncurrent-context: heterotrain-local\n"
            )
        }
    }

    /// A client authenticating as the admin.
    pub async fn client(&self) -> Result<Client> {
        self.client_for_token(&self.admin_token).await
    }

    /// A client authenticating with `token` (e.g. a ServiceAccount token, so RBAC applies).
    pub async fn client_for_token(&self, token: &str) -> Result<Client> {
        let kc = Kubeconfig::from_yaml(&self.kubeconfig_yaml(token))?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    fn spawn(&self, name: &'static str, bin: &str, args: Vec<String>) -> Result<()> {
        let path = find_binary(bin).ok_or_else(|| anyhow!("{bin} not found; run `make setup`"))?;
        let log = log_file(&self.state_dir, name)?;
        let mut cmd = Command::new(path);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = spawn_tied(cmd).with_context(|| format!("starting {bin}"))?;
        self.components
            .lock()
            .map_err(|_| anyhow!("cluster state poisoned"))?
            .push(Component { name, child });
        Ok(())
    }

    fn spawn_etcd(&self) -> Result<()> {
        let p = self.ports;
        let data = self.state_dir.join("etcd");
        self.spawn(
            "etcd",
            "etcd",
            vec![
                "--name=heterotrain".into(),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls=http://127.0.0.1:{}", p.etcd_client),
                format!("--advertise-client-urls=http://127.0.0.1:{}", p.etcd_client),
                format!("--listen-peer-urls=http://127.0.0.1:{}", p.etcd_peer),
                format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{}",
                    p.etcd_peer
                ),
                format!(
                    "--initial-cluster=heterotrain=http://127.0.0.1:{}",
                    p.etcd_peer
                ),
                "--log-level=warn".into(),
            ],
        )
    }

    fn spawn_apiserver(&self) -> Result<()> {
        let p = self.ports;
        let pki = self.state_dir.join("pki");
        let f = |n: &str| pki.join(n).display().to_string();
        self.spawn(
            "kube-apiserver",
            "kube-apiserver",
            vec![
                format!("--etcd-servers=http://127.0.0.1:{}", p.etcd_client),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={}", p.apiserver),
                format!("--tls-cert-file={}", f("server.crt")),
                format!("--tls-private-key-file={}", f("server.key")),
                format!("--client-ca-file={}", f("ca.crt")),
                format!("--token-auth-file={}", f("tokens.csv")),
                "--authorization-mode=RBAC".into(),
                format!("--service-account-key-file={}", f("sa.pub")),
                format!("--service-account-signing-key-file={}", f("sa.key")),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                "--api-audiences=https://kubernetes.default.svc.cluster.local".into(),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                format!("--cert-dir={}", f("apiserver-certs")),
                "--profiling=false".into(),
                "--v=1".into(),
            ],
        )
    }

    fn spawn_scheduler(&self) -> Result<()> {
        let kc = self.kubeconfig_path().display().to_string();
        self.spawn(
            "kube-scheduler",
            "kube-scheduler",
            vec![
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", self.ports.scheduler),
                "--port=0".into(),
                "--leader-elect=false".into(),
                format!(
                    "--cert-dir={}",
                    self.state_dir.join("pki/scheduler-certs").display()
                ),
                "--v=1".into(),
            ],
        )
    }

    fn spawn_controller_manager(&self) -> Result<()> {
        let kc = self.kubeconfig_path().display().to_string();
        let pki = self.state_dir.join("pki");
        self.spawn(
            "kube-controller-manager",
            "kube-controller-manager",
            vec![
                format!("--kubeconfig={kc}"),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", self.ports.controller_manager),
                "--port=0".into(),
                "--leader-elect=false".into(),
                "--controllers=*,-nodelifecycle,-csrsigning,-nodeipam".into(),
                format!(
                    "--service-account-private-key-file={}",
                    pki.join("sa.key").display()
                ),
                format!("--root-ca-file={}", pki.join("ca.crt").display()),
                format!("--cert-dir={}", pki.join("cm-certs").display()),
                "--v=1".into(),
            ],
        )
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
            Ok(found.then_some(()))
        })
        .await;
        made.map_err(|e| e.context(log_tail(&self.state_dir, "kube-controller-manager")))
    }

    /// An error if the component `name` has exited.
    fn component_alive(&self, name: &str) -> Result<()> {
        if self.exited(name) {
            bail!("{name} exited");
        }
        Ok(())
    }

    fn exited(&self, name: &str) -> bool {
        let Ok(mut comps) = self.components.lock() else {
            return true;
        };
        comps
            .iter_mut()
            .filter(|c| c.name == name)
            .all(|c| matches!(c.child.try_wait(), Ok(Some(_))))
    }

    /// PIDs of the running components.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.components
            .lock()
            .map(|c| {
                c.iter()
                    .map(|c| (c.name.to_string(), c.child.id()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Stop the API server, wait `down`, start it again and wait until ready.
    pub async fn restart_apiserver(&self, down: Duration) -> Result<()> {
        self.stop_component("kube-apiserver");
        tokio::time::sleep(down).await;
        self.spawn_apiserver()?;
        self.wait_apiserver(Duration::from_secs(90)).await
    }

    fn stop_component(&self, name: &str) {
        if let Ok(mut comps) = self.components.lock() {
            for c in comps.iter_mut().filter(|c| c.name == name) {
                stop_child(&mut c.child, Duration::from_secs(10));
            }
            comps.retain(|c| c.name != name);
        }
    }

    /// Stop every component (reverse start order) and remove the state
    /// directory unless asked to keep it.
    pub fn stop(&self) {
        if let Ok(mut comps) = self.components.lock() {
            while let Some(mut c) = comps.pop() {
                stop_child(&mut c.child, Duration::from_secs(10));
            }
        }
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

/// Standard base64 (for kubeconfig `*-data` fields).
pub fn base64_encode(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(T[(n >> 18) as usize & 63] as char);
        out.push(T[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64_encode;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64_encode(i.as_bytes()), o);
        }
    }
}
