//! The control plane's processes: each component's command line, started
//! tied to this process with its output in `logs/<name>.log`, and watched
//! and stopped by name.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use super::LocalCluster;
use crate::keeper::{spawn_tied, stop_child};
use crate::paths::find_binary;

/// What the API server writes to its audit log (`logs/audit.log`): the
/// writes of the operator's ServiceAccounts, metadata only, so a test can
/// tell which replica wrote what and when.
/// The second scheduler profile's name: the name Volcano's scheduler runs
/// under, so pods wired to a Volcano PodGroup are placed on the local
/// control plane too.
pub const GANG_SCHEDULER_STAND_IN: &str = "volcano";

const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: [\"system:serviceaccounts:heterotrain-system\"]
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
";

/// One started component process.
pub(super) struct Component {
    pub(super) name: &'static str,
    pub(super) child: Child,
}

fn log_file(dir: &Path, name: &str) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("logs").join(format!("{name}.log")))
        .with_context(|| format!("opening log for {name}"))
}

/// The last lines of a component's log, for error messages.
pub(super) fn log_tail(dir: &Path, name: &str) -> String {
    let text =
        std::fs::read_to_string(dir.join("logs").join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

impl LocalCluster {
    /// The last lines of a component's log (`kube-scheduler`, …), for a
    /// failing test's dump.
    pub fn component_log_tail(&self, name: &str) -> String {
        log_tail(&self.state_dir, name)
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

    pub(super) fn spawn_etcd(&self) -> Result<()> {
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

    pub(super) fn spawn_apiserver(&self) -> Result<()> {
        let p = self.ports;
        let pki = self.state_dir.join("pki");
        let f = |n: &str| pki.join(n).display().to_string();
        let policy = self.state_dir.join("audit-policy.yaml");
        std::fs::write(&policy, AUDIT_POLICY).context("writing the audit policy")?;
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
                // Loopback ClusterIPs, which the node simulator listens on.
                format!(
                    "--service-cluster-ip-range=127.{}.0.0/16",
                    self.service_octet
                ),
                format!("--cert-dir={}", f("apiserver-certs")),
                "--profiling=false".into(),
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", self.audit_log_path().display()),
                "--v=1".into(),
            ],
        )
    }

    /// The scheduler, with a second profile under the name Volcano's
    /// scheduler runs as ([`GANG_SCHEDULER_STAND_IN`]): pods a job wires to
    /// a Volcano PodGroup are then placed here (one by one, without gang
    /// semantics), so gang wiring can be run end to end without Volcano.
    pub(super) fn spawn_scheduler(&self) -> Result<()> {
        let kc = self.kubeconfig_path().display().to_string();
        let config = self.state_dir.join("scheduler.yaml");
        let plain = crate::ports::free_ports(1).context("a port for kube-scheduler's /healthz")?[0];
        // With a configuration file, kube-scheduler 1.20 serves plain HTTP
        // on 0.0.0.0:10251 unless told otherwise (`--port=0` is ignored):
        // a second cluster's scheduler on this machine (test binaries run in
        // parallel) could not bind it and exited, leaving its pods Pending.
        // A free port of its own instead (the configuration refuses 0).
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubescheduler.config.k8s.io/v1beta1\n\
                 kind: KubeSchedulerConfiguration\n\
                 clientConnection: {{kubeconfig: {kc:?}}}\n\
                 leaderElection: {{leaderElect: false}}\n\
                 healthzBindAddress: \"127.0.0.1:{plain}\"\n\
                 metricsBindAddress: \"127.0.0.1:{plain}\"\n\
                 profiles:\n\
                 - schedulerName: default-scheduler\n\
                 - schedulerName: {GANG_SCHEDULER_STAND_IN}\n"
            ),
        )
        .context("writing the scheduler's configuration")?;
        self.spawn(
            "kube-scheduler",
            "kube-scheduler",
            vec![
                format!("--config={}", config.display()),
                format!("--authentication-kubeconfig={kc}"),
                format!("--authorization-kubeconfig={kc}"),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", self.ports.scheduler),
                "--port=0".into(),
                format!(
                    "--cert-dir={}",
                    self.state_dir.join("pki/scheduler-certs").display()
                ),
                "--v=1".into(),
            ],
        )
    }

    pub(super) fn spawn_controller_manager(&self) -> Result<()> {
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

    /// An error if the component `name` has exited.
    pub(super) fn component_alive(&self, name: &str) -> Result<()> {
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

    /// Stop the component `name` (SIGTERM, SIGKILL after 10 s).
    pub(super) fn stop_component(&self, name: &str) {
        if let Ok(mut comps) = self.components.lock() {
            for c in comps.iter_mut().filter(|c| c.name == name) {
                stop_child(&mut c.child, Duration::from_secs(10));
            }
            comps.retain(|c| c.name != name);
        }
    }

    /// Stop every component, in reverse start order.
    pub(super) fn stop_components(&self) {
        if let Ok(mut comps) = self.components.lock() {
            while let Some(mut c) = comps.pop() {
                stop_child(&mut c.child, Duration::from_secs(10));
            }
        }
    }
}
