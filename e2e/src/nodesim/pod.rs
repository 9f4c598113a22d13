//! Run the pods the scheduler binds to simulated nodes as local processes
//! (what runs: [`super::container`]), and report their status like a
//! kubelet ([`super::status`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use heterotrain_crds::resources::cpu_cores;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use super::cgroup::{join_from_child, Cgroup};
use super::container::{argv, cpu_limit, find_program, simulate_gpu_args, unpullable, wants_gpu};
use super::{status, Ctx};
use crate::keeper::{signal_group, spawn_tied};

/// A pod whose process runs.
pub struct RunningPod {
    /// Process (group leader) id, once started.
    pub pid: std::sync::Mutex<Option<u32>>,
    /// Set when the pod is being deleted.
    pub terminating: AtomicBool,
    /// The node it runs on.
    pub node: String,
    /// Its cgroup and CPU limit in cores (the quota is limit × node speed).
    pub cgroup: std::sync::Mutex<Option<(Arc<Cgroup>, f64)>>,
}

fn now() -> String {
    super::node::rfc3339_now()
}

/// DNS names of a pod with hostname + subdomain.
pub fn dns_names(pod: &Pod) -> Vec<String> {
    let spec = pod.spec.as_ref();
    let ns = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    match (
        spec.and_then(|s| s.hostname.clone()),
        spec.and_then(|s| s.subdomain.clone()),
    ) {
        (Some(h), Some(sd)) => vec![
            format!("{h}.{sd}.{ns}.svc"),
            format!("{h}.{sd}.{ns}.svc.cluster.local"),
            format!("{h}.{sd}.{ns}"),
        ],
        _ => Vec::new(),
    }
}

/// A token of the pod's ServiceAccount (TokenRequest), so the process's API
/// access goes through RBAC like a real pod's.
async fn service_account_token(ctx: &Ctx, pod: &Pod) -> Result<String> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let api: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &ns);
    let req: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 86400},
    }))?;
    let resp: TokenRequest = api
        .create_subresource("token", &sa, &PostParams::default(), &req)
        .await
        .with_context(|| format!("requesting a token for serviceaccount {ns}/{sa}"))?;
    let token = resp
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| anyhow!("empty TokenRequest status"))?;
    Ok(token)
}

/// Start the pod's process and follow it to its end. Errors before the
/// process starts mark the pod Failed with the reason.
pub async fn run(ctx: Arc<Ctx>, pod: Pod, running: Arc<RunningPod>) {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let name = format!(
        "{}/{}",
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default()
    );
    if let Err(e) = run_inner(&ctx, &pod, &running).await {
        eprintln!("nodesim: pod {name}: {e:#}");
        let at = now();
        let _ = status::patch(&ctx, &pod, status::start_error(&format!("{e:#}"), &at)).await;
    }
    let _ = ctx.hosts.remove(&uid);
    ctx.targets.remove(&uid);
    // Rules change only when a pod with an address goes: a pod on a node
    // that runs no processes never had rules, and re-reading every policy
    // for each of thousands of such pods would load the API server the
    // operator's scale bench measures.
    if ctx.netpol.remove(&uid) {
        let _ = ctx.netpol.sync(&ctx.client).await;
    }
    if running.terminating.load(Ordering::SeqCst) && !ctx.is_lost(&running.node) {
        finalize_delete(&ctx, &pod).await;
    }
    if let Ok(mut m) = ctx.running.lock() {
        m.remove(&uid);
    }
}

async fn run_inner(ctx: &Ctx, pod: &Pod, running: &RunningPod) -> Result<()> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let spec = pod.spec.clone().ok_or_else(|| anyhow!("pod has no spec"))?;
    let node_name = spec.node_name.clone().unwrap_or_default();
    let node = ctx
        .nodes
        .get(&node_name)
        .ok_or_else(|| anyhow!("node {node_name} is not simulated here"))?;
    let ip = ctx.next_ip();
    let at = now();
    let container = spec
        .containers
        .first()
        .cloned()
        .ok_or_else(|| anyhow!("pod has no containers"))?;
    if unpullable(&container).is_some() {
        status::patch(ctx, pod, status::image_pull_backoff(&container, &at)).await?;
        while !running.terminating.load(Ordering::SeqCst) {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
        return Ok(());
    }
    if !node.run_processes {
        return status::patch(ctx, pod, status::running(&ip, &at, &container, None)).await;
    }
    let mut env = super::env::resolve(&ctx.client, pod, &container, &ip).await?;
    // `$(VAR)` in command and args: the container's variables, as Kubernetes expands them.
    let mut argv: Vec<String> = argv(&container)?
        .iter()
        .map(|a| super::env::expand(a, &env))
        .collect();
    let gpu = wants_gpu(&container);
    if gpu {
        simulate_gpu_args(&mut argv);
    }
    let program = find_program(&argv[0]).ok_or_else(|| {
        anyhow!(
            "executable {:?} not found on this machine (see HETEROTRAIN_BIN_DIR)",
            argv[0]
        )
    })?;
    let pod_dir = ctx
        .state_dir
        .join("pods")
        .join(format!("{ns}_{pod_name}_{uid}"));
    std::fs::create_dir_all(pod_dir.join("tmp"))?;
    let kubeconfig = pod_dir.join("kubeconfig");
    let token = service_account_token(ctx, pod).await?;
    std::fs::write(&kubeconfig, ctx.kubeconfig_for_token(&token))?;
    env.entry("KUBECONFIG".into())
        .or_insert_with(|| kubeconfig.display().to_string());
    env.insert("HETEROTRAIN_SIMULATED_NODE".into(), node_name.clone());
    if gpu {
        env.insert(
            "HETEROTRAIN_SIMULATED_GPU".into(),
            node.gpu_product.clone().unwrap_or_else(|| "gpu".into()),
        );
    }
    env.entry("TMPDIR".into())
        .or_insert_with(|| pod_dir.join("tmp").display().to_string());
    let mut binds = super::mounts::plan(
        &ctx.client,
        &ctx.state_dir,
        &pod_dir,
        pod,
        &container,
        &token,
    )
    .await?;
    let (term_mount, term_file) = super::mounts::termination_log(&pod_dir, &container)?;
    binds.push(term_mount);
    if spec.automount_service_account_token != Some(false) {
        binds.push(super::mounts::service_account(
            &pod_dir,
            ctx.api(),
            &token,
            &ns,
        )?);
        env.insert("KUBERNETES_SERVICE_HOST".into(), ctx.api().host.clone());
        env.insert("KUBERNETES_SERVICE_PORT".into(), ctx.api().port.to_string());
    }
    ctx.hosts.add(&uid, &ip, dns_names(pod))?;
    // The pod's policies hold before its process can accept a connection.
    ctx.netpol.add(&uid, super::netpol::PodNet::of(pod, &ip));
    let _ = ctx.netpol.sync(&ctx.client).await;
    let limit = cpu_limit(&container, cpu_cores(&node.cpu).unwrap_or(1.0));
    let cores = limit * ctx.speed_of(&node_name);
    let cgroup = Cgroup::create(ctx.cgroup_version, &ctx.instance, &uid, cores)?.map(Arc::new);
    if let (Some(cg), Ok(mut slot)) = (&cgroup, running.cgroup.lock()) {
        *slot = Some((cg.clone(), limit));
    }
    let log_path = ctx.log_path(&ns, &pod_name);
    if let Some(dir) = log_path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    let mut cmd = Command::new(&program);
    cmd.args(&argv[1..])
        .envs(&env)
        .current_dir(
            container
                .working_dir
                .clone()
                .map(PathBuf::from)
                .filter(|d| d.is_dir())
                .unwrap_or(pod_dir.clone()),
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: apply_in_child only makes async-signal-safe syscalls.
        unsafe {
            cmd.pre_exec(move || super::mounts::apply_in_child(&binds));
        }
    }
    if !node.cpus.is_empty() {
        let set = super::config::cpu_set(&node.cpus);
        use std::os::unix::process::CommandExt;
        // SAFETY: sched_setaffinity is a plain syscall on a set built
        // before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    if let Some(cg) = &cgroup {
        let procs = cg.procs_cstr().clone();
        use std::os::unix::process::CommandExt;
        // SAFETY: join_from_child only makes async-signal-safe syscalls.
        unsafe {
            cmd.pre_exec(move || join_from_child(&procs));
        }
    }
    // A program under a path the pod mounts a volume over (a build in
    // /tmp, where the operator's chart mounts an emptyDir) is not there
    // inside the pod: say so rather than only "No such file".
    let hidden_by = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.clone())
        .find(|m| program.starts_with(m));
    let mut child = spawn_tied(cmd).with_context(|| match &hidden_by {
        Some(m) => format!(
            "starting {}: the pod mounts a volume at {m}, which hides it inside the pod; \
             keep the build (CARGO_TARGET_DIR) outside the pod's mount paths",
            program.display()
        ),
        None => format!("starting {}", program.display()),
    })?;
    let pid = child.id();
    if let Ok(mut p) = running.pid.lock() {
        *p = Some(pid);
    }
    ctx.targets.add(pod, &ip);
    let started = now();
    let up = status::running(&ip, &started, &container, Some(pid));
    status::patch(ctx, pod, up).await.ok();
    let code = loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                use std::os::unix::process::ExitStatusExt;
                break status
                    .code()
                    .unwrap_or_else(|| 128 + status.signal().unwrap_or(9));
            }
            Ok(None) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => bail!("waiting for pid {pid}: {e}"),
        }
    };
    // Anything the container left behind in its group goes with it.
    signal_group(pid, libc::SIGKILL);
    if let Some(cg) = &cgroup {
        cg.remove();
    }
    // A lost node's kubelet reports nothing more.
    if ctx.is_lost(&node_name) {
        return Ok(());
    }
    if running.terminating.load(Ordering::SeqCst) {
        return Ok(());
    }
    let finished = now();
    let message = super::mounts::termination_message(&term_file);
    let end = status::terminated(&container, pid, code, &started, &finished, message);
    status::patch(ctx, pod, end).await
}

/// SIGTERM the pod's processes, SIGKILL after the grace period.
pub async fn terminate(running: Arc<RunningPod>, grace: Duration) {
    if running.terminating.swap(true, Ordering::SeqCst) {
        return;
    }
    let pid = running.pid.lock().ok().and_then(|p| *p);
    let Some(pid) = pid else { return };
    signal_group(pid, libc::SIGTERM);
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        // SAFETY: signal 0 checks existence.
        if unsafe { libc::kill(pid as i32, 0) } != 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    signal_group(pid, libc::SIGKILL);
}

/// Remove a terminated pod from the API, as a kubelet does at the end of a graceful delete.
pub async fn finalize_delete(ctx: &Ctx, pod: &Pod) {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let mut dp = DeleteParams::default().grace_period(0);
    if let Some(uid) = pod.metadata.uid.clone() {
        dp.preconditions = Some(kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        });
    }
    let _ = api.delete(&name, &dp).await;
}

/// Environment summary for debugging.
pub fn describe_env(env: &BTreeMap<String, String>) -> String {
    env.keys().cloned().collect::<Vec<_>>().join(",")
}
