//! Test harness: one real local control plane per test binary (CRD and the
//! operator ClusterRole installed), a namespace per test, the operator run
//! in-process under a ServiceAccount token bound only to `rbac.rs`'s rules,
//! and fake trainer ranks serving real exposition text on loopback.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use heterotrain_crds::{BatchPlan, HeteroTrainingJob, PLAN_KEY};
use heterotrain_e2e::{ClusterOptions, LocalCluster};
use heterotrain_operator::config::OperatorConfig;
use heterotrain_operator::metrics::Metrics;
use heterotrain_operator::{rbac, Context};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;

static CLUSTER: OnceLock<LocalCluster> = OnceLock::new();

/// The shared control plane (started on first use).
pub fn cluster() -> &'static LocalCluster {
    CLUSTER.get_or_init(|| {
        remove_stale_state_dirs();
        std::thread::spawn(|| {
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            rt.block_on(async {
                let c = LocalCluster::start(ClusterOptions {
                    name: "operator-tests".into(),
                    state_dir: Some(
                        std::env::temp_dir()
                            .join(format!("heterotrain-operator-tests-{}", std::process::id())),
                    ),
                    ..Default::default()
                })
                .await
                .expect("local control plane (run `make setup`)");
                let admin = c.client().await.expect("admin client");
                let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
                crds.create(&PostParams::default(), &HeteroTrainingJob::crd())
                    .await
                    .expect("create CRD");
                // Served only once Established; a job created before that gets a 404.
                let established = kube::runtime::wait::await_condition(
                    crds.clone(),
                    "heterotrainingjobs.heterotrain.dev",
                    kube::runtime::wait::conditions::is_crd_established(),
                );
                tokio::time::timeout(Duration::from_secs(60), established)
                    .await
                    .expect("CRD established within 60s")
                    .expect("watch CRD");
                let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin.clone());
                roles
                    .create(&PostParams::default(), &rbac::cluster_role())
                    .await
                    .expect("create ClusterRole");
                c
            })
        })
        .join()
        .expect("cluster thread")
    })
}

/// State directories of earlier test runs whose process is gone (the
/// shared cluster lives in a static and is never dropped; its processes die
/// with the test binary, its directory is removed by the next run).
fn remove_stale_state_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name.strip_prefix("heterotrain-operator-tests-") else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// One test's namespace, admin client and operator client.
pub struct Env {
    pub ns: String,
    pub admin: Client,
    /// A client authenticating as the operator's ServiceAccount.
    pub operator: Client,
    /// Third octet of this test's loopback pod IPs.
    pub net: u8,
}

static NET: AtomicU64 = AtomicU64::new(10);

/// A fresh namespace with the operator's ServiceAccount bound to the documented rules.
pub async fn env(ns: &str) -> Env {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(
            std::env::var("RUST_LOG").unwrap_or_else(|_| "heterotrain_operator=info".into()),
        )
        .try_init();
    let c = cluster();
    let admin = c.client().await.expect("admin");
    let nss: Api<Namespace> = Api::all(admin.clone());
    nss.create(
        &PostParams::default(),
        &Namespace {
            metadata: ObjectMeta {
                name: Some(ns.into()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await
    .expect("namespace");
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    sas.create(
        &PostParams::default(),
        &ServiceAccount {
            metadata: ObjectMeta {
                name: Some("heterotrain-operator".into()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await
    .expect("service account");
    // The rank pods' ServiceAccount (the Helm chart creates it in real installs).
    sas.create(
        &PostParams::default(),
        &ServiceAccount {
            metadata: ObjectMeta {
                name: Some("heterotrain-trainer".into()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await
    .expect("trainer service account");
    let crbs: Api<ClusterRoleBinding> = Api::all(admin.clone());
    crbs.create(
        &PostParams::default(),
        &ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(format!("heterotrain-operator-{ns}")),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: Some("rbac.authorization.k8s.io".into()),
                kind: "ClusterRole".into(),
                name: rbac::CLUSTER_ROLE.into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: "heterotrain-operator".into(),
                namespace: Some(ns.into()),
                ..Default::default()
            }]),
        },
    )
    .await
    .expect("binding");
    let operator = token_client(&admin, ns, "heterotrain-operator").await;
    Env {
        ns: ns.into(),
        admin,
        operator,
        net: NET.fetch_add(1, Ordering::SeqCst) as u8,
    }
}

/// A client authenticating as ServiceAccount `ns`/`sa` (an hour's token).
pub async fn token_client(admin: &Client, ns: &str, sa: &str) -> Client {
    let token = sa_token(admin, ns, sa).await;
    cluster()
        .client_for_token(&token)
        .await
        .expect("token client")
}

/// An hour's token of ServiceAccount `ns`/`sa`.
pub async fn sa_token(admin: &Client, ns: &str, sa: &str) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    let tr = sas
        .create_token_request(
            sa,
            &PostParams::default(),
            &TokenRequest {
                metadata: Default::default(),
                spec: Some(TokenRequestSpec {
                    audiences: Some(vec!["https://kubernetes.default.svc.cluster.local".into()]),
                    expiration_seconds: Some(3600),
                    ..Default::default()
                }),
                status: None,
            },
        )
        .await
        .expect("token request");
    tr.status.and_then(|s| s.token).expect("token")
}

/// The chart's namespaced mode, by hand: ServiceAccount `sa` in `home.ns`
/// with the namespaced rules in a Role of each of `watched` only, the
/// cluster-scoped reads in a ClusterRole, and its Lease by name (which
/// it may also create, nothing having pre-created it) in `home.ns`. Returns
/// a client authenticating as it.
pub async fn scoped_operator(home: &Env, sa: &str, watched: &[&str]) -> Client {
    let admin = &home.admin;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), &home.ns);
    let account: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": sa}})).expect("sa");
    sas.create(&PostParams::default(), &account)
        .await
        .expect("scoped service account");
    let subject = serde_json::json!([{"kind": "ServiceAccount", "name": sa, "namespace": home.ns}]);
    let name = format!("{sa}-{}", home.ns);
    let grant = |kind: &str, rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule>| {
        (
            serde_json::json!({"metadata": {"name": name}, "rules": rules}),
            serde_json::json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
                "subjects": subject,
            }),
        )
    };
    let (role, binding) = grant("ClusterRole", rbac::cluster_scoped_rules());
    Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(role).expect("role"),
        )
        .await
        .expect("cluster role");
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(binding).expect("binding"),
        )
        .await
        .expect("cluster role binding");
    let mut roles = vec![(
        home.ns.clone(),
        vec![
            rbac::policy_rule(&rbac::LEASE_RULE),
            rbac::policy_rule(&rbac::LEASE_CREATE_RULE),
        ],
    )];
    roles.extend(
        watched
            .iter()
            .map(|ns| (ns.to_string(), rbac::namespaced_rules())),
    );
    for (ns, rules) in roles {
        let (role, binding) = grant("Role", rules);
        Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(admin.clone(), &ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(role).expect("role"),
            )
            .await
            .expect("role");
        Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(admin.clone(), &ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(binding).expect("binding"),
            )
            .await
            .expect("role binding");
    }
    token_client(admin, &home.ns, sa).await
}

/// Operator settings for tests: short intervals, this namespace only.
pub fn test_config(env: &Env, identity: &str) -> OperatorConfig {
    OperatorConfig {
        trainer_image: "test/trainer:1".into(),
        scrape_interval: Duration::from_millis(500),
        // The fake ranks answer at once; a short timeout would only turn a
        // CPU-starved answer into a missed reading.
        scrape_timeout: Duration::from_secs(3),
        rebalance_interval: Duration::from_millis(1500),
        watch_namespaces: vec![env.ns.clone()],
        operator_namespace: env.ns.clone(),
        identity: identity.into(),
        // Long enough that renewals starved of CPU on a loaded machine do
        // not lose the Lease (a replica that loses it stops for good);
        // a stopped replica releases it, so a standby still takes over
        // within a renew interval.
        lease_duration: Duration::from_secs(15),
        lease_renew_interval: Duration::from_secs(2),
        crd_wait: Duration::from_secs(30),
        ..OperatorConfig::default()
    }
}

/// An operator replica running in-process.
pub struct Operator {
    pub ctx: Arc<Context>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Operator {
    /// Start a replica as the operator ServiceAccount.
    pub fn start(env: &Env, config: OperatorConfig) -> Operator {
        Operator::start_as(env.operator.clone(), config)
    }

    /// Start a replica as whoever `client` authenticates.
    pub fn start_as(client: Client, config: OperatorConfig) -> Operator {
        let ctx = Context::new(client, config, Metrics::new()).expect("context");
        let (tx, rx) = oneshot::channel();
        let c = ctx.clone();
        let task = tokio::spawn(async move {
            let r = heterotrain_operator::run(c, async {
                let _ = rx.await;
            })
            .await;
            if let Err(e) = r {
                eprintln!("operator stopped with error: {e}");
            }
        });
        Operator {
            ctx,
            stop: Some(tx),
            task: Some(task),
        }
    }

    /// Stop and wait.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(20), t).await;
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Poll `f` every 200 ms until it returns `Some`, or panic after `timeout`
/// with `what`: the project's one wait, [`heterotrain_e2e::wait::until_some`],
/// for checks that cannot fail.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    heterotrain_e2e::wait::until_some(what, timeout, Duration::from_millis(200), f).await
}

/// A job from YAML (namespace filled in).
pub fn job_from_yaml(ns: &str, yaml: &str) -> HeteroTrainingJob {
    let mut job: HeteroTrainingJob = serde_yaml::from_str(yaml).expect("job yaml");
    job.metadata.namespace = Some(ns.into());
    job
}

pub async fn create_job(env: &Env, job: &HeteroTrainingJob) -> HeteroTrainingJob {
    let api: Api<HeteroTrainingJob> = Api::namespaced(env.admin.clone(), &env.ns);
    api.create(&PostParams::default(), job)
        .await
        .expect("create job")
}

pub async fn get_job(env: &Env, name: &str) -> Option<HeteroTrainingJob> {
    let api: Api<HeteroTrainingJob> = Api::namespaced(env.admin.clone(), &env.ns);
    api.get_opt(name).await.expect("get job")
}

pub async fn patch_job_spec(env: &Env, name: &str, spec_patch: serde_json::Value) {
    let api: Api<HeteroTrainingJob> = Api::namespaced(env.admin.clone(), &env.ns);
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "spec": spec_patch })),
    )
    .await
    .expect("patch job");
}

/// The condition `type_` of job `name`: (status, reason, message).
pub async fn condition(env: &Env, name: &str, type_: &str) -> Option<(String, String, String)> {
    let job = get_job(env, name).await?;
    let c = job
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)?;
    Some((c.status, c.reason, c.message))
}

pub async fn pods(env: &Env, job: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    let mut items = api
        .list(&ListParams::default().labels(&format!("heterotrain.dev/job={job}")))
        .await
        .expect("list pods")
        .items;
    items.sort_by_key(|p| p.metadata.name.clone());
    items
}

pub async fn plan(env: &Env, job: &str) -> Option<BatchPlan> {
    let api: Api<ConfigMap> = Api::namespaced(env.admin.clone(), &env.ns);
    let cm = api.get_opt(&format!("{job}-plan")).await.expect("get cm")?;
    serde_json::from_str(cm.data?.get(PLAN_KEY)?).ok()
}

pub async fn events(env: &Env) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(env.admin.clone(), &env.ns);
    api.list(&ListParams::default())
        .await
        .expect("events")
        .items
}

/// Loopback IP of `rank` in this test: 127.77.x.x, below the octets the
/// node simulator gives its pods (128 and up), so no simulator of a test
/// running beside these ever hands a pod this address.
pub fn rank_ip(env: &Env, rank: u32) -> String {
    format!("127.77.{}.{}", env.net, rank + 1)
}

/// Play the kubelet: set a pod's status via the status subresource.
pub async fn set_pod_status(env: &Env, pod: &str, status: serde_json::Value) {
    let api: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    api.patch_status(
        pod,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "status": status })),
    )
    .await
    .expect("patch pod status");
}

/// Mark `pod` Running with `ip`.
pub async fn run_pod(env: &Env, pod: &str, ip: &str) {
    set_pod_status(
        env,
        pod,
        serde_json::json!({
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "containerStatuses": [{
                "name": "trainer", "ready": true, "restartCount": 0,
                "image": "test/trainer:1", "imageID": "",
                "state": {"running": {"startedAt": "2024-01-01T00:00:00Z"}}
            }]
        }),
    )
    .await;
}

/// Mark `pod` terminated with `code` (Failed, or Succeeded for 0).
pub async fn finish_pod(env: &Env, pod: &str, code: i32, reason: &str) {
    // Finished now: a rank that exited 0 long ago while another still runs
    // is a stop (the collective-timeout grace has passed), not the end of
    // training, and the gang would be restarted between two finish_pod calls.
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    set_pod_status(
        env,
        pod,
        serde_json::json!({
            "phase": if code == 0 { "Succeeded" } else { "Failed" },
            "containerStatuses": [{
                "name": "trainer", "ready": false, "restartCount": 0,
                "image": "test/trainer:1", "imageID": "",
                "state": {"terminated": {"exitCode": code, "reason": reason,
                    "startedAt": now, "finishedAt": now}}
            }]
        }),
    )
    .await;
}

/// Wait until the job has `n` pods of gang `restart`, then mark them Running.
pub async fn run_gang(env: &Env, job: &str, n: usize, restart: u32) -> Vec<Pod> {
    let ps = eventually(Duration::from_secs(60), "the gang's pods", || async {
        let ps = pods(env, job).await;
        let ok = ps.len() == n
            && ps.iter().all(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get("heterotrain.dev/restart"))
                        == Some(&restart.to_string())
            });
        ok.then_some(ps)
    })
    .await;
    for (r, p) in ps.iter().enumerate() {
        run_pod(
            env,
            p.metadata.name.as_deref().unwrap_or_default(),
            &rank_ip(env, r as u32),
        )
        .await;
    }
    ps
}

/// What a fake rank reports.
#[derive(Clone, Debug)]
pub struct FakeRank {
    /// Compute seconds per sample.
    pub per_sample: f64,
    pub batch: u32,
    pub plan_generation: u64,
    /// Profile points to export, if any.
    pub profile: Option<Vec<(u32, f64)>>,
    /// The profile's largest batch that fits (the memory cap).
    pub max_batch: u32,
    steps: u64,
    compute: f64,
    samples: u64,
}

impl FakeRank {
    pub fn new(per_sample: f64, batch: u32) -> FakeRank {
        FakeRank {
            per_sample,
            batch,
            plan_generation: 0,
            profile: None,
            max_batch: 4096,
            steps: 0,
            compute: 0.0,
            samples: 0,
        }
    }

    /// Steps taken so far (one per scrape served).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// One more step per scrape; the exposition text of the trainer's metric names.
    fn next_text(&mut self) -> String {
        use heterotrain_crds::metrics as m;
        self.steps += 1;
        let step_compute = self.per_sample * f64::from(self.batch);
        self.compute += step_compute;
        self.samples += u64::from(self.batch);
        let mut t = format!(
            "# TYPE {steps} counter\n{steps}_total {}\n# TYPE {comp} counter\n{comp}_total {}\n# TYPE {samp} counter\n{samp}_total {}\n# TYPE {lb} gauge\n{lb} {}\n# TYPE {last} gauge\n{last} {}\n# TYPE {step} gauge\n{step} {}\n# TYPE {gen} gauge\n{gen} {}\n",
            self.steps,
            self.compute,
            self.samples,
            self.batch,
            step_compute,
            self.steps,
            self.plan_generation,
            steps = m::STEPS_TOTAL.trim_end_matches("_total"),
            comp = m::COMPUTE_SECONDS_TOTAL.trim_end_matches("_total"),
            samp = m::SAMPLES_TOTAL.trim_end_matches("_total"),
            lb = m::LOCAL_BATCH_SIZE,
            last = m::LAST_STEP_COMPUTE_SECONDS,
            step = m::STEP,
            gen = m::PLAN_GENERATION,
        );
        if let Some(points) = &self.profile {
            t.push_str(&format!("# TYPE {} gauge\n", m::PROFILE_STEP_SECONDS));
            for (b, s) in points {
                t.push_str(&format!(
                    "{}{{batch_size=\"{b}\"}} {s}\n",
                    m::PROFILE_STEP_SECONDS
                ));
            }
            t.push_str(&format!(
                "# TYPE {0} gauge\n{0} {1}\n",
                m::PROFILE_MAX_BATCH_SIZE,
                self.max_batch
            ));
        }
        t.push_str("# EOF\n");
        t
    }
}

/// Serve `rank`'s metrics on `ip:port` until the test ends.
pub async fn serve_rank(ip: &str, port: u16, rank: Arc<Mutex<FakeRank>>) {
    let listener = tokio::net::TcpListener::bind((ip, port))
        .await
        .expect("bind fake rank");
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let rank = rank.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let body = rank.lock().map(|mut r| r.next_text()).unwrap_or_default();
                let resp = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
}

/// Labels of a pod.
pub fn labels(p: &Pod) -> BTreeMap<String, String> {
    p.metadata.labels.clone().unwrap_or_default()
}
