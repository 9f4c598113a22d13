//! The test bed: the whole system on one machine, for the end-to-end tests,
//! the demo, the bench and `heterotrain-local`. The local control plane,
//! simulated nodes, and as asked the HeteroTrainingJob CRD, the real
//! operator binary running under a ServiceAccount token bound only to its
//! documented RBAC rules, and a real Prometheus scraping the pods.

mod dump;
mod identity;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use heterotrain_crds::HeteroTrainingJob;
use kube::api::{Api, PostParams};
use kube::Client;

pub use identity::{prepare_namespace, replica_kubeconfig};

use crate::crd::install_crd;
use crate::keeper::{spawn_tied, stop_child};
use crate::nodesim::{NodeSimulator, NodesFile};
use crate::prometheus::Prometheus;
use crate::wait::eventually;
use crate::{ClusterOptions, LocalCluster};

/// The operator's ClusterRole, generated from `operator/src/rbac.rs`.
pub const OPERATOR_RBAC: &str = include_str!("../../../operator/rbac.yaml");
/// Namespace the operator runs in (Lease, profile cache).
pub const OPERATOR_NAMESPACE: &str = "heterotrain-system";
/// ServiceAccount rank pods run as.
pub const TRAINER_SA: &str = "heterotrain-trainer";

/// What to start; [`SystemOptions::new`] gives the whole system.
pub struct SystemOptions {
    pub name: String,
    pub nodes: NodesFile,
    /// Install the HeteroTrainingJob CRD (off where a chart installs it).
    pub crd: bool,
    /// Start the operator binary (off where a chart runs it as a pod).
    pub operator: bool,
    /// Extra operator flags (intervals, metrics source, ...).
    pub operator_args: Vec<String>,
    /// Start a Prometheus scraping the pods (and pass its URL to the operator).
    pub prometheus: bool,
    /// Keep the control plane's state directory (the demo's `up`).
    pub state_dir: Option<PathBuf>,
    pub verbose: bool,
}

impl SystemOptions {
    /// The CRD, `nodes` and the operator with its default flags; quiet.
    pub fn new(name: &str, nodes: NodesFile) -> SystemOptions {
        SystemOptions {
            name: name.into(),
            nodes,
            crd: true,
            operator: true,
            operator_args: Vec::new(),
            prometheus: false,
            state_dir: None,
            verbose: false,
        }
    }

    /// Only the control plane and `nodes` (no CRD, no operator).
    pub fn bare(name: &str, nodes: NodesFile) -> SystemOptions {
        SystemOptions {
            crd: false,
            operator: false,
            ..SystemOptions::new(name, nodes)
        }
    }
}

/// A running system.
pub struct System {
    pub cluster: LocalCluster,
    pub sim: NodeSimulator,
    pub prometheus: Option<Prometheus>,
    operator: Arc<OperatorSlot>,
}

/// The system's own operator process, and what starting it takes.
struct OperatorSlot {
    child: Mutex<Option<Child>>,
    /// Whether the thread that restarts it ([`supervise`]) runs.
    supervised: std::sync::atomic::AtomicBool,
    /// Port of the running operator's HTTP server (`/metrics`, probes).
    http: Mutex<Option<u16>>,
    args: Vec<String>,
    kubeconfig: PathBuf,
    logs: PathBuf,
}

impl OperatorSlot {
    /// Start it (no-op if it runs).
    fn start(&self) -> Result<()> {
        let mut guard = self
            .child
            .lock()
            .map_err(|_| anyhow!("operator state poisoned"))?;
        if let Some(child) = guard.as_mut() {
            if matches!(child.try_wait(), Ok(None)) {
                return Ok(());
            }
        }
        let http = crate::ports::free_ports(1)?[0];
        let cmd = self.command("operator-e2e", &self.kubeconfig, http, "operator")?;
        *guard = Some(spawn_tied(cmd).context("starting heterotrain-operator")?);
        if let Ok(mut h) = self.http.lock() {
            *h = Some(http);
        }
        Ok(())
    }

    /// Restart it if it exited on its own (not if it was stopped).
    fn revive(&self) {
        let exited = self
            .child
            .lock()
            .ok()
            .and_then(|mut g| g.as_mut().and_then(|c| c.try_wait().ok().flatten()));
        if let Some(status) = exited {
            eprintln!("operator exited ({status}); restarting it as its Deployment would");
            if let Err(e) = self.start() {
                eprintln!("restarting the operator: {e:#}");
            }
        }
    }

    /// The operator's command line with the system's flags, as replica
    /// `identity` (its Lease holder name) with `kubeconfig`, serving HTTP
    /// on `http`, logging to `logs/<log>.log`.
    fn command(&self, identity: &str, kubeconfig: &Path, http: u16, log: &str) -> Result<Command> {
        let bin =
            crate::nodesim::container::find_program("heterotrain-operator").ok_or_else(|| {
                anyhow!("heterotrain-operator binary not found (build the workspace)")
            })?;
        let log_path = self.logs.join(format!("{log}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let mut cmd = Command::new(bin);
        cmd.args(&self.args)
            .arg(format!("--http-addr=127.0.0.1:{http}"))
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAMESPACE", OPERATOR_NAMESPACE)
            .env("POD_NAME", identity)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        Ok(cmd)
    }
}

/// Watch the operator as its Deployment would: every second, restart it
/// if it exited on its own (it exits on purpose when it cannot renew its
/// leader Lease, e.g. while the API server is down or overloaded). Ends
/// with the system.
fn supervise(slot: Weak<OperatorSlot>) {
    std::thread::spawn(move || {
        while let Some(slot) = slot.upgrade() {
            slot.revive();
            drop(slot);
            std::thread::sleep(Duration::from_secs(1));
        }
    });
}

impl System {
    /// Start everything and wait until the operator is up.
    pub async fn start(opts: SystemOptions) -> Result<System> {
        let say = |m: &str| {
            if opts.verbose {
                eprintln!("==> {m}");
            }
        };
        let cluster = LocalCluster::start(ClusterOptions {
            name: opts.name.clone(),
            state_dir: opts.state_dir.clone(),
            keep_state: opts.state_dir.is_some(),
            verbose: opts.verbose,
        })
        .await?;
        let client = cluster.client().await?;
        if opts.crd {
            say("installing the HeteroTrainingJob CRD");
            install_crd(&client).await?;
        }
        say(&format!(
            "registering {} simulated node(s)",
            opts.nodes.nodes.len()
        ));
        let sim = NodeSimulator::start(
            client.clone(),
            opts.nodes,
            cluster.state_dir(),
            cluster.pod_api_access(),
        )
        .await?;
        let prometheus = if opts.prometheus {
            say("starting Prometheus");
            let p = Prometheus::start(
                &cluster.state_dir().join("prometheus"),
                Duration::from_secs(1),
            )?;
            sim.export_prometheus_targets(&crate::prometheus::targets_file(p.dir()));
            Some(p)
        } else {
            None
        };
        let operator_kubeconfig = cluster.state_dir().join("operator.kubeconfig");
        let mut operator_args = opts.operator_args;
        if let Some(p) = &prometheus {
            operator_args.push(format!("--prometheus-url={}", p.url()));
        }
        let logs = cluster.state_dir().join("logs");
        let system = System {
            cluster,
            sim,
            prometheus,
            operator: Arc::new(OperatorSlot {
                child: Mutex::new(None),
                supervised: Default::default(),
                http: Mutex::new(None),
                args: operator_args,
                kubeconfig: operator_kubeconfig,
                logs,
            }),
        };
        if opts.operator {
            say("granting the operator its RBAC rules");
            identity::setup_operator_identity(&system.cluster, &system.operator.kubeconfig).await?;
            say("starting heterotrain-operator");
            system.start_operator()?;
        }
        Ok(system)
    }

    /// The admin client.
    pub async fn client(&self) -> Result<Client> {
        self.cluster.client().await
    }

    /// Start the real `heterotrain-operator` binary (no-op if it runs).
    /// From then on it is restarted within a second whenever it exits on
    /// its own, as its Deployment would (it exits on purpose when it loses
    /// its leader Lease, e.g. while the API server is down); one stopped
    /// with [`System::stop_operator`] stays stopped.
    pub fn start_operator(&self) -> Result<()> {
        self.operator.start()?;
        if !self
            .operator
            .supervised
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            supervise(Arc::downgrade(&self.operator));
        }
        Ok(())
    }

    /// Start another operator replica, `identity`, with `kubeconfig` (see
    /// [`identity::replica_kubeconfig`]); its log is `logs/<identity>.log`.
    pub fn start_replica(&self, identity: &str, kubeconfig: &Path) -> Result<Replica> {
        let http = crate::ports::free_ports(1)?[0];
        let cmd = self
            .operator
            .command(identity, kubeconfig, http, identity)?;
        Ok(Replica {
            identity: identity.to_string(),
            kubeconfig: kubeconfig.to_path_buf(),
            child: Some(spawn_tied(cmd).context("starting an operator replica")?),
            exits: 0,
        })
    }

    /// The running operator's process id.
    pub fn operator_pid(&self) -> Option<u32> {
        let mut g = self.operator.child.lock().ok()?;
        let child = g.as_mut()?;
        matches!(child.try_wait(), Ok(None)).then(|| child.id())
    }

    /// Port (on 127.0.0.1) of the running operator's HTTP server.
    pub fn operator_http_port(&self) -> Option<u16> {
        self.operator_pid()?;
        *self.operator.http.lock().ok()?
    }

    /// SIGKILL the operator (a crash), or stop it gracefully.
    pub fn stop_operator(&self, kill: bool) {
        if let Ok(mut g) = self.operator.child.lock() {
            if let Some(mut child) = g.take() {
                if kill {
                    let _ = child.kill();
                    let _ = child.wait();
                } else {
                    stop_child(&mut child, Duration::from_secs(10));
                }
            }
        }
    }

    /// The operator's log so far.
    pub fn operator_log(&self) -> String {
        std::fs::read_to_string(self.cluster.state_dir().join("logs").join("operator.log"))
            .unwrap_or_default()
    }

    /// Create a namespace for jobs (see [`prepare_namespace`]).
    pub async fn create_namespace(&self, ns: &str) -> Result<()> {
        prepare_namespace(&self.client().await?, ns).await
    }

    /// Create a job from YAML in `ns`.
    pub async fn create_job(&self, ns: &str, yaml: &str) -> Result<HeteroTrainingJob> {
        let job: HeteroTrainingJob = serde_yaml::from_str(yaml).context("parsing job YAML")?;
        let api: Api<HeteroTrainingJob> = Api::namespaced(self.client().await?, ns);
        Ok(api.create(&PostParams::default(), &job).await?)
    }

    /// Poll the job until `done` holds (or a terminal phase that isn't wanted).
    pub async fn wait_job(
        &self,
        ns: &str,
        name: &str,
        timeout: Duration,
        what: &str,
        done: impl Fn(&HeteroTrainingJob) -> bool,
    ) -> Result<HeteroTrainingJob> {
        let api: Api<HeteroTrainingJob> = Api::namespaced(self.client().await?, ns);
        let (api, done) = (&api, &done);
        let waited = eventually(what, timeout, Duration::from_millis(500), || async move {
            // The API server may be restarting: an error is another poll.
            let Ok(found) = api.get_opt(name).await else {
                return Ok(None);
            };
            let Some(job) = found else {
                bail!("job {ns}/{name} disappeared while waiting for {what}");
            };
            if done(&job) {
                return Ok(Some(job));
            }
            let phase = job.status.as_ref().and_then(|s| s.phase.as_deref());
            if phase == Some("Failed") && what != "Failed" {
                bail!(
                    "job {ns}/{name} Failed while waiting for {what}: {:?}",
                    job.status
                );
            }
            Ok(None)
        })
        .await;
        match waited {
            Err(e) if !e.to_string().starts_with("job ") => {
                let status = api
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|j| j.status);
                Err(e.context(format!("job {ns}/{name}: status {status:?}")))
            }
            other => other,
        }
    }

    /// Everything useful when a test fails: pods, events, pod logs, operator log tail.
    pub async fn dump(&self, ns: &str) -> String {
        dump::dump(self, ns).await
    }

    /// Stop the operator, the pods, Prometheus and the control plane.
    pub async fn stop(&mut self) {
        self.stop_operator(false);
        self.sim.stop().await;
        if let Some(p) = self.prometheus.as_mut() {
            p.stop();
        }
        self.cluster.stop();
    }
}

/// An operator replica started beside the system's own
/// ([`System::start_replica`]).
pub struct Replica {
    pub identity: String,
    kubeconfig: PathBuf,
    child: Option<Child>,
    /// Times it exited on its own.
    pub exits: u32,
}

impl Replica {
    /// Start it again if it exited on its own, as its Deployment would;
    /// whether it had exited.
    pub fn revive(&mut self, system: &System) -> bool {
        let exited = self
            .child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
        if exited {
            self.exits += 1;
            match system.start_replica(&self.identity, &self.kubeconfig) {
                Ok(mut r) => self.child = r.child.take(),
                Err(e) => eprintln!("restarting replica {}: {e:#}", self.identity),
            }
        }
        exited
    }

    /// Whether its process is running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Stop it (SIGTERM, then SIGKILL after 10 s).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            stop_child(&mut c, Duration::from_secs(10));
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for System {
    fn drop(&mut self) {
        self.stop_operator(true);
    }
}
