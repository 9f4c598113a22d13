//! The whole system on one machine, for end-to-end tests and the demo: the
//! local control plane, the HeteroTrainingJob CRD, simulated nodes, and the
//! real operator binary running under a ServiceAccount token bound only to
//! its documented RBAC rules; optionally a real Prometheus.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use heterotrain_crds::HeteroTrainingJob;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

use crate::crd::install_crd;
use crate::keeper::{spawn_tied, stop_child};
use crate::nodesim::{NodeSimulator, NodesFile};
use crate::prometheus::Prometheus;
use crate::{ClusterOptions, LocalCluster};

/// The operator's ClusterRole, generated from `operator/src/rbac.rs`.
pub const OPERATOR_RBAC: &str = include_str!("../../operator/rbac.yaml");
/// Namespace the operator runs in (Lease, profile cache).
pub const OPERATOR_NAMESPACE: &str = "heterotrain-system";
/// ServiceAccount rank pods run as.
pub const TRAINER_SA: &str = "heterotrain-trainer";

/// What to start.
pub struct SystemOptions {
    pub name: String,
    pub nodes: NodesFile,
    /// Extra operator flags (intervals, metrics source, ...).
    pub operator_args: Vec<String>,
    /// Start a Prometheus scraping the pods (and pass its URL to the operator).
    pub prometheus: bool,
    /// Keep the control plane's state directory (the demo's `up`).
    pub state_dir: Option<PathBuf>,
    pub verbose: bool,
}

/// A running system.
pub struct System {
    pub cluster: LocalCluster,
    pub sim: NodeSimulator,
    pub prometheus: Option<Prometheus>,
    operator: Mutex<Option<Child>>,
    /// Port of the running operator's HTTP server (`/metrics`, probes).
    operator_http: Mutex<Option<u16>>,
    operator_args: Vec<String>,
    operator_kubeconfig: PathBuf,
}

async fn wait_token_secret(client: &Client, ns: &str, sa: &str) -> Result<()> {
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = api
            .get_opt(sa)
            .await?
            .and_then(|s| s.secrets)
            .is_some_and(|s| !s.is_empty());
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("serviceaccount {ns}/{sa} got no token secret in 60s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn ensure_namespace(client: &Client, ns: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    api.patch(
        ns,
        &PatchParams::apply("heterotrain-e2e").force(),
        &Patch::Apply(&obj),
    )
    .await?;
    Ok(())
}

async fn apply<K>(api: &Api<K>, name: &str, value: serde_json::Value) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply("heterotrain-e2e").force(),
        &Patch::Apply(&value),
    )
    .await
    .with_context(|| format!("applying {name}"))?;
    Ok(())
}

/// Create a namespace for jobs with the trainer ServiceAccount and its
/// Role (read and watch ConfigMaps — the plan — nothing else).
pub async fn prepare_namespace(client: &Client, ns: &str) -> Result<()> {
    let client = client.clone();
    ensure_namespace(&client, ns).await?;
    apply(
        &Api::<ServiceAccount>::namespaced(client.clone(), ns),
        TRAINER_SA,
        json!({
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": TRAINER_SA}
        }),
    )
    .await?;
    apply(&Api::<Role>::namespaced(client.clone(), ns), TRAINER_SA, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": TRAINER_SA},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]
    }))
    .await?;
    apply(&Api::<RoleBinding>::namespaced(client.clone(), ns), TRAINER_SA, json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": TRAINER_SA},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": TRAINER_SA},
        "subjects": [{"kind": "ServiceAccount", "name": TRAINER_SA, "namespace": ns}]
    }))
    .await?;
    wait_token_secret(&client, ns, TRAINER_SA).await?;
    wait_token_secret(&client, ns, "default").await?;
    Ok(())
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
        say("installing the HeteroTrainingJob CRD");
        install_crd(&client).await?;
        say(&format!(
            "registering {} simulated node(s)",
            opts.nodes.nodes.len()
        ));
        let sim = NodeSimulator::start(
            client.clone(),
            opts.nodes,
            cluster.state_dir(),
            cluster.kubeconfig_renderer(),
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
        let system = System {
            cluster,
            sim,
            prometheus,
            operator: Mutex::new(None),
            operator_http: Mutex::new(None),
            operator_args,
            operator_kubeconfig,
        };
        say("granting the operator its RBAC rules");
        system.setup_operator_identity().await?;
        say("starting heterotrain-operator");
        system.start_operator()?;
        Ok(system)
    }

    /// The admin client.
    pub async fn client(&self) -> Result<Client> {
        self.cluster.client().await
    }

    async fn setup_operator_identity(&self) -> Result<()> {
        let client = self.client().await?;
        ensure_namespace(&client, OPERATOR_NAMESPACE).await?;
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
        apply(&sas, "heterotrain-operator", json!({
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "heterotrain-operator"}
        }))
        .await?;
        let mut role: serde_json::Value = serde_yaml::from_str(OPERATOR_RBAC)?;
        role["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
        role["kind"] = json!("ClusterRole");
        let role_name = role["metadata"]["name"]
            .as_str()
            .ok_or_else(|| anyhow!("operator/rbac.yaml has no name"))?
            .to_string();
        apply(&Api::<ClusterRole>::all(client.clone()), &role_name, role).await?;
        apply(&Api::<ClusterRoleBinding>::all(client.clone()), &role_name, json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": role_name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "name": "heterotrain-operator", "namespace": OPERATOR_NAMESPACE}]
        }))
        .await?;
        let req: TokenRequest = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 86400}
        }))?;
        let resp: TokenRequest = sas
            .create_subresource(
                "token",
                "heterotrain-operator",
                &PostParams::default(),
                &req,
            )
            .await
            .context("requesting the operator's token")?;
        let token = resp
            .status
            .and_then(|s| s.token)
            .ok_or_else(|| anyhow!("empty TokenRequest status"))?;
        std::fs::write(
            &self.operator_kubeconfig,
            self.cluster.kubeconfig_yaml(&token),
        )?;
        Ok(())
    }

    /// Start the real `heterotrain-operator` binary (no-op if it runs).
    pub fn start_operator(&self) -> Result<()> {
        let mut guard = self
            .operator
            .lock()
            .map_err(|_| anyhow!("operator state poisoned"))?;
        if let Some(child) = guard.as_mut() {
            if matches!(child.try_wait(), Ok(None)) {
                return Ok(());
            }
        }
        let bin = crate::nodesim::pod::find_program("heterotrain-operator").ok_or_else(|| {
            anyhow!("heterotrain-operator binary not found (build the workspace)")
        })?;
        let log_path = self.cluster.state_dir().join("logs").join("operator.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        let http = crate::ports::free_ports(1)?[0];
        let mut cmd = Command::new(bin);
        cmd.args(&self.operator_args)
            .arg(format!("--http-addr=127.0.0.1:{http}"))
            .env("KUBECONFIG", &self.operator_kubeconfig)
            .env("POD_NAMESPACE", OPERATOR_NAMESPACE)
            .env("POD_NAME", "operator-e2e")
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        *guard = Some(spawn_tied(cmd).context("starting heterotrain-operator")?);
        if let Ok(mut h) = self.operator_http.lock() {
            *h = Some(http);
        }
        Ok(())
    }

    /// The running operator's process id.
    pub fn operator_pid(&self) -> Option<u32> {
        let mut g = self.operator.lock().ok()?;
        let child = g.as_mut()?;
        matches!(child.try_wait(), Ok(None)).then(|| child.id())
    }

    /// Port (on 127.0.0.1) of the running operator's HTTP server.
    pub fn operator_http_port(&self) -> Option<u16> {
        self.operator_pid()?;
        *self.operator_http.lock().ok()?
    }

    /// SIGKILL the operator (a crash), or stop it gracefully.
    pub fn stop_operator(&self, kill: bool) {
        if let Ok(mut g) = self.operator.lock() {
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
        let deadline = Instant::now() + timeout;
        loop {
            match api.get_opt(name).await {
                Ok(Some(job)) => {
                    if done(&job) {
                        return Ok(job);
                    }
                    let phase = job
                        .status
                        .as_ref()
                        .and_then(|s| s.phase.clone())
                        .unwrap_or_default();
                    if phase == "Failed" && what != "Failed" {
                        bail!(
                            "job {ns}/{name} Failed while waiting for {what}: {:?}",
                            job.status
                        );
                    }
                    if Instant::now() > deadline {
                        bail!(
                            "job {ns}/{name}: no {what} after {timeout:?}; status {:?}",
                            job.status
                        );
                    }
                }
                Ok(None) => bail!("job {ns}/{name} disappeared while waiting for {what}"),
                Err(e) => {
                    // The API server may be restarting; keep polling.
                    if Instant::now() > deadline {
                        bail!("job {ns}/{name}: {e}");
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Everything useful when a test fails: pods, events, pod logs, operator log tail.
    pub async fn dump(&self, ns: &str) -> String {
        let mut out = String::new();
        let Ok(client) = self.client().await else {
            return "no client".into();
        };
        if let Ok(jobs) = Api::<HeteroTrainingJob>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
        {
            for j in jobs {
                out += &format!(
                    "job {}: {}\n",
                    j.metadata.name.unwrap_or_default(),
                    serde_json::to_string(&j.status).unwrap_or_default()
                );
            }
        }
        if let Ok(pods) = Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
        {
            for p in pods {
                let name = p.metadata.name.clone().unwrap_or_default();
                let st = p.status.as_ref();
                out += &format!(
                    "pod {name} node={:?} phase={:?}\n",
                    p.spec.as_ref().and_then(|s| s.node_name.clone()),
                    st.and_then(|s| s.phase.clone())
                );
                let log = std::fs::read_to_string(crate::nodesim::log_path(
                    self.sim.state_dir(),
                    ns,
                    &name,
                ))
                .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                for l in tail.into_iter().rev() {
                    out += &format!("    | {l}\n");
                }
            }
        }
        if let Ok(evs) = Api::<Event>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
        {
            for e in evs {
                out += &format!(
                    "event {:?} {:?}: {:?}\n",
                    e.reason,
                    e.regarding.and_then(|r| r.name),
                    e.note
                );
            }
        }
        let log = self.operator_log();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        out += "operator log (tail):\n";
        for l in tail.into_iter().rev() {
            out += &format!("    | {l}\n");
        }
        out
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

impl Drop for System {
    fn drop(&mut self) {
        self.stop_operator(true);
    }
}
