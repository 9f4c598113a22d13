//! `heterotrain-local`: run HeteroTrain's real local control plane (etcd,
//! kube-apiserver, kube-scheduler, kube-controller-manager) in the
//! background, and stop it again.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use heterotrain_e2e::cache_dir;

#[derive(Parser)]
#[command(
    name = "heterotrain-local",
    version,
    about = "Run a real local Kubernetes control plane for HeteroTrain",
    long_about = "Runs etcd, kube-apiserver (TLS, token auth, RBAC), kube-scheduler and \
kube-controller-manager from the binaries `make setup` built, on free loopback ports, \
in the background. State and logs live in $HETEROTRAIN_CACHE/local/<name> \
(default ~/.cache/heterotrain/local/default).\n\nTypical use:\n  heterotrain-local up\n  \
eval \"$(heterotrain-local env)\"\n  kubectl get ns\n  heterotrain-local down"
)]
struct Cli {
    /// Cluster name; several named clusters can run side by side.
    #[arg(
        long,
        global = true,
        default_value = "default",
        env = "HETEROTRAIN_CLUSTER"
    )]
    name: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start the control plane in the background (no-op when it already runs).
    Up {
        /// Seconds to wait for the control plane to become ready (1 to 86400).
        #[arg(long, default_value_t = 180, value_parser = clap::value_parser!(u64).range(1..=86_400))]
        timeout: u64,
        #[command(flatten)]
        stack: Stack,
    },
    /// Stop the control plane and every process it started.
    Down,
    /// Show whether it runs, its processes and its API server.
    Status,
    /// Print `export KUBECONFIG=...` for the running control plane.
    Env,
    /// Print the log of a pod run by the node simulator.
    Logs {
        /// Pod name.
        pod: String,
        /// Namespace of the pod.
        #[arg(short, long, default_value = "default")]
        namespace: String,
    },
    /// Run the control plane in the foreground until SIGTERM/SIGINT (what `up` starts).
    #[command(hide = true)]
    Serve {
        #[command(flatten)]
        stack: Stack,
    },
}

/// What runs beside the control plane (`up` hands it on to `serve`).
#[derive(Args)]
struct Stack {
    /// Simulated nodes to register and run pods on (YAML, see
    /// e2e/nodes/*.yaml); without it the cluster has no nodes.
    #[arg(long)]
    nodes: Option<PathBuf>,
    /// Also install the HeteroTrainingJob CRD and run `heterotrain-operator`
    /// (under a ServiceAccount with its documented RBAC rules only).
    #[arg(long)]
    operator: bool,
    /// Extra flags for the operator, e.g. `--operator-arg=--rebalance-interval=5`.
    #[arg(long = "operator-arg", allow_hyphen_values = true)]
    operator_args: Vec<String>,
}

fn state_dir(name: &str) -> PathBuf {
    cache_dir().join("local").join(name)
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks existence.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

fn read_pid(dir: &std::path::Path) -> Option<i32> {
    std::fs::read_to_string(dir.join("supervisor.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn running(dir: &std::path::Path) -> Option<i32> {
    read_pid(dir).filter(|&p| pid_alive(p))
}

fn print_env(dir: &std::path::Path) {
    println!("export KUBECONFIG={}", dir.join("kubeconfig").display());
}

fn up(name: &str, timeout: u64, stack: &Stack) -> Result<()> {
    if let Some(n) = &stack.nodes {
        // Fail fast, before starting anything, on a bad nodes file.
        heterotrain_e2e::nodesim::NodesFile::load(n)?;
    }
    let dir = state_dir(name);
    if running(&dir).is_some() && dir.join("ready").exists() {
        eprintln!("control plane `{name}` already running");
        print_env(&dir);
        return Ok(());
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("cleaning {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir.join("logs"))?;
    let log = std::fs::File::create(dir.join("logs").join("supervisor.log"))?;
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--name", name, "serve"]);
    if let Some(n) = &stack.nodes {
        cmd.arg("--nodes").arg(std::fs::canonicalize(n)?);
    }
    if stack.operator {
        cmd.arg("--operator");
    }
    for a in &stack.operator_args {
        cmd.arg(format!("--operator-arg={a}"));
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: setsid is async-signal-safe; detaches from our terminal.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().context("starting the supervisor")?;
    eprintln!(
        "==> starting local control plane `{name}` (state in {})",
        dir.display()
    );
    let deadline = Instant::now() + Duration::from_secs(timeout);
    let mut last = String::new();
    loop {
        if dir.join("ready").exists() {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read_to_string(dir.join("logs").join("supervisor.log"))
                .unwrap_or_default();
            bail!("control plane failed to start ({status}):\n{text}");
        }
        let text =
            std::fs::read_to_string(dir.join("logs").join("supervisor.log")).unwrap_or_default();
        if let Some(line) = text.lines().rev().find(|l| l.starts_with("==>")) {
            if line != last {
                eprintln!("{line}");
                last = line.to_string();
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!(
                "control plane not ready after {timeout}s; logs in {}/logs",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("==> ready. Use it with:");
    print_env(&dir);
    Ok(())
}

fn down(name: &str) -> Result<()> {
    let dir = state_dir(name);
    let Some(pid) = running(&dir) else {
        eprintln!("control plane `{name}` is not running");
        kill_leftovers(&dir);
        return Ok(());
    };
    // SAFETY: plain syscall.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(40);
    while pid_alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    if pid_alive(pid) {
        // SAFETY: plain syscall.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    kill_leftovers(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!("control plane `{name}` stopped");
    Ok(())
}

/// Components die with the supervisor (PDEATHSIG); this is a safety net.
fn kill_leftovers(dir: &std::path::Path) {
    let Ok(text) = std::fs::read_to_string(dir.join("components.pids")) else {
        return;
    };
    for pid in text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<i32>().ok())
    {
        if pid_alive(pid) {
            // SAFETY: plain syscall.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

async fn status(name: &str) -> Result<()> {
    let dir = state_dir(name);
    let Some(pid) = running(&dir) else {
        println!("control plane `{name}`: not running");
        return Ok(());
    };
    println!("control plane `{name}`: running (supervisor pid {pid})");
    if let Ok(text) = std::fs::read_to_string(dir.join("components.pids")) {
        for line in text.lines() {
            println!("  {line}");
        }
    }
    let kubeconfig = dir.join("kubeconfig");
    let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    println!("  server: {}", config.cluster_url);
    let client = kube::Client::try_from(config)?;
    match client.apiserver_version().await {
        Ok(v) => println!("  version: {}", v.git_version),
        Err(e) => println!("  API server not answering: {e}"),
    }
    print_env(&dir);
    Ok(())
}

async fn serve(name: &str, stack: Stack) -> Result<()> {
    let Stack {
        nodes,
        operator,
        operator_args,
    } = stack;
    let dir = state_dir(name);
    std::fs::write(dir.join("supervisor.pid"), std::process::id().to_string())?;
    let nodes = match &nodes {
        Some(path) => Some(heterotrain_e2e::nodesim::NodesFile::load(path)?),
        None => None,
    };
    let mut system =
        heterotrain_e2e::system::System::start(heterotrain_e2e::system::SystemOptions {
            crd: operator,
            operator,
            operator_args,
            state_dir: Some(dir.clone()),
            verbose: true,
            ..heterotrain_e2e::system::SystemOptions::new(
                name,
                nodes.unwrap_or(heterotrain_e2e::nodesim::NodesFile { nodes: Vec::new() }),
            )
        })
        .await?;
    let cluster = &system.cluster;
    let pids: String = cluster
        .pids()
        .iter()
        .map(|(n, p)| format!("{n} {p}\n"))
        .collect();
    std::fs::write(dir.join("components.pids"), pids)?;
    std::fs::write(dir.join("ready"), cluster.server_url())?;
    eprintln!("==> control plane ready at {}", cluster.server_url());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
    eprintln!("==> stopping");
    let _ = std::fs::remove_file(dir.join("ready"));
    system.stop().await;
    Ok(())
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Up { timeout, stack } => up(&cli.name, timeout, &stack),
        Cmd::Down => down(&cli.name),
        Cmd::Status => status(&cli.name).await,
        Cmd::Env => {
            let dir = state_dir(&cli.name);
            if running(&dir).is_some() {
                print_env(&dir);
                Ok(())
            } else {
                Err(anyhow::anyhow!(
                    "control plane `{}` is not running; start it with `heterotrain-local up`",
                    cli.name
                ))
            }
        }
        Cmd::Serve { stack } => serve(&cli.name, stack).await,
        Cmd::Logs { pod, namespace } => {
            let path = heterotrain_e2e::nodesim::log_path(&state_dir(&cli.name), &namespace, &pod);
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    print!("{text}");
                    Ok(())
                }
                Err(e) => Err(anyhow::anyhow!(
                    "no log for pod {namespace}/{pod} at {}: {e}",
                    path.display()
                )),
            }
        }
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
