//! `heterotrain-demo` (`make demo`): the whole system on this machine. Brings
//! up the local control plane with simulated nodes of different speed and the
//! operator, applies `examples/quickstart.yaml` (a CNN on scikit-learn's
//! digits, which `make setup` builds into the cache and the demo offers as
//! the claim the job names), shows a live per-rank table, then runs the
//! equal split on the same nodes and prints the comparison, with the
//! held-out accuracy of both runs.
//! The cluster stays up afterwards for exploring with kubectl.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use heterotrain_crds::metrics as m;
use heterotrain_crds::{BatchPlan, HeteroTrainingJob, PLAN_KEY};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::Client;

#[derive(Parser)]
#[command(
    name = "heterotrain-demo",
    version,
    about = "Run HeteroTrain end to end on this machine",
    long_about = "Starts (or reuses) the local control plane `demo` with three simulated \
nodes of different speed and the operator, trains examples/quickstart.yaml with dynamic \
balancing while showing a live table, then trains the same job with the equal split on \
the same nodes and prints the throughput and held-out accuracy of both. A job whose \
dataset names a claim gets it filled from `make setup`'s datasets (digits-mnist, \
digits-cifar10, pystdlib-bytes). The cluster stays up; `--down` stops it."
)]
struct Cli {
    /// Stop the demo cluster and exit.
    #[arg(long)]
    down: bool,
    /// Nodes file for the simulated nodes.
    #[arg(long, default_value = "e2e/nodes/demo.yaml")]
    nodes: PathBuf,
    /// The job to run.
    #[arg(long, default_value = "examples/quickstart.yaml")]
    job: PathBuf,
    /// Namespace for the demo's jobs.
    #[arg(long, default_value = "demo")]
    namespace: String,
    /// Skip the equal-split comparison run.
    #[arg(long)]
    no_baseline: bool,
}

fn local_bin() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().ok_or_else(|| anyhow!("no exe dir"))?;
    let p = dir.join("heterotrain-local");
    if p.exists() {
        Ok(p)
    } else {
        bail!("heterotrain-local not found next to {}", exe.display())
    }
}

fn local(args: &[&str]) -> Result<String> {
    let out = Command::new(local_bin()?)
        .args(["--name", "demo"])
        .args(args)
        .stderr(std::process::Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("heterotrain-local {} failed", args.join(" "));
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// One scrape of a rank's `/metrics`.
#[derive(Clone, Debug, Default)]
struct Sample {
    samples: f64,
    steps: f64,
    step: f64,
    step_sum: f64,
    step_count: f64,
    batch: f64,
    generation: f64,
    accuracy: Option<f64>,
    finished: bool,
}

fn parse_metrics(text: &str) -> Sample {
    let mut s = Sample::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        let name = key.split('{').next().unwrap_or("");
        match name {
            n if n == m::SAMPLES_TOTAL => s.samples += v,
            n if n == m::STEPS_TOTAL => s.steps += v,
            n if n == m::STEP => s.step = v,
            n if n == format!("{}_sum", m::STEP_SECONDS) => s.step_sum += v,
            n if n == format!("{}_count", m::STEP_SECONDS) => s.step_count += v,
            n if n == m::LOCAL_BATCH_SIZE => s.batch = v,
            n if n == m::PLAN_GENERATION => s.generation = v,
            n if n == m::EVAL_ACCURACY_RATIO => s.accuracy = Some(v),
            n if n == m::FINISHED => s.finished = v > 0.0,
            _ => {}
        }
    }
    s
}

fn scrape(ip: &str, port: u16) -> Option<Sample> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect_timeout(
        &format!("{ip}:{port}").parse().ok()?,
        Duration::from_millis(500),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    Some(parse_metrics(text.split_once("\r\n\r\n")?.1))
}

struct RankView {
    rank: u32,
    node: String,
    ip: String,
    last: Option<(Instant, Sample)>,
    rate: f64,
    step_time: f64,
}

/// What one run measured.
struct RunResult {
    steady_samples_per_second: f64,
    converge: Option<Duration>,
    final_plan: Vec<u32>,
    /// Rank 0's last held-out evaluation, and on how many samples.
    accuracy: Option<(f64, Option<u64>)>,
    nodes: BTreeMap<u32, String>,
    elapsed: Duration,
}

async fn rank_pods(client: &Client, ns: &str, job: &str) -> Result<Vec<(u32, String, String)>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("{}={job}", m::labels::JOB));
    let mut out = Vec::new();
    for p in pods.list(&lp).await? {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let rank = labels
            .get(m::labels::RANK)
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let ip = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        out.push((rank, node, ip));
    }
    out.sort();
    Ok(out)
}

/// Rank 0's last `eval` record in its step log on the simulated node:
/// (accuracy, samples evaluated).
fn logged_accuracy(state_dir: &Path, ns: &str, job: &str) -> Option<(f64, Option<u64>)> {
    let path = heterotrain_e2e::bench::runner::rank_log_path(state_dir, ns, job, 0)?;
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == "eval")
        .and_then(|v| Some((v["eval_accuracy"].as_f64()?, v["eval_samples"].as_u64())))
}

/// Train `job` to completion, drawing the live table; returns the measurements.
async fn run_job(
    client: &Client,
    state_dir: &Path,
    ns: &str,
    job: HeteroTrainingJob,
    title: &str,
) -> Result<RunResult> {
    let name = job.metadata.name.clone().unwrap_or_default();
    let api: Api<HeteroTrainingJob> = Api::namespaced(client.clone(), ns);
    if api.get_opt(&name).await?.is_some() {
        api.delete(&name, &DeleteParams::background()).await?;
        while api.get_opt(&name).await?.is_some() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let port = job.spec.metrics_port;
    let max_steps = job.spec.training.max_steps.unwrap_or(0) as f64;
    api.create(&PostParams::default(), &job)
        .await
        .context("creating the job")?;
    let tty = std::io::stdout().is_terminal();
    let t0 = Instant::now();
    let mut ranks: Vec<RankView> = Vec::new();
    let mut drawn = 0usize;
    let mut window: Option<(Instant, f64)> = None;
    let mut last_total = (Instant::now(), 0.0);
    let mut last_gen = 0.0;
    let mut converge = None;
    let mut first_step_at: Option<Instant> = None;
    let mut accuracy = None;
    let mut last_print = Instant::now() - Duration::from_secs(10);
    loop {
        let j = api.get(&name).await?;
        let status = j.status.clone().unwrap_or_default();
        let phase = status.phase.clone().unwrap_or_else(|| "Pending".into());
        if ranks.len() < j.spec.world_size() as usize {
            ranks = rank_pods(client, ns, &name)
                .await?
                .into_iter()
                .map(|(rank, node, ip)| RankView {
                    rank,
                    node,
                    ip,
                    last: None,
                    rate: 0.0,
                    step_time: 0.0,
                })
                .collect();
        }
        for r in ranks.iter_mut().filter(|r| r.ip.is_empty()) {
            if let Some((_, node, ip)) = rank_pods(client, ns, &name)
                .await?
                .into_iter()
                .find(|(k, _, _)| *k == r.rank)
            {
                r.node = node;
                r.ip = ip;
            }
        }
        let now = Instant::now();
        for r in ranks.iter_mut().filter(|r| !r.ip.is_empty()) {
            if let Some(s) = scrape(&r.ip, port) {
                if let Some((t, prev)) = &r.last {
                    let dt = now.duration_since(*t).as_secs_f64();
                    if dt > 0.0 && s.samples >= prev.samples {
                        r.rate = (s.samples - prev.samples) / dt;
                    }
                    let dc = s.step_count - prev.step_count;
                    if dc > 0.0 {
                        r.step_time = (s.step_sum - prev.step_sum) / dc;
                    }
                }
                if let Some(a) = s.accuracy {
                    accuracy = Some((a, None));
                }
                r.last = Some((now, s));
            }
        }
        let total: f64 = ranks
            .iter()
            .filter_map(|r| r.last.as_ref().map(|(_, s)| s.samples))
            .sum();
        let step = ranks
            .iter()
            .filter_map(|r| r.last.as_ref().map(|(_, s)| s.step))
            .fold(0.0, f64::max);
        let gen = ranks
            .iter()
            .filter_map(|r| r.last.as_ref().map(|(_, s)| s.generation))
            .fold(0.0, f64::max);
        if step > 0.0 && first_step_at.is_none() {
            first_step_at = Some(now);
        }
        if gen > last_gen {
            last_gen = gen;
            converge = first_step_at.map(|f| now.duration_since(f));
        }
        if window.is_none() && max_steps > 0.0 && step >= 0.4 * max_steps {
            window = Some((now, total));
        }
        if total > last_total.1 {
            last_total = (now, total);
        }
        let cluster_rate: f64 = ranks.iter().map(|r| r.rate).sum();
        // The table.
        let mut lines = vec![format!(
            "{title}  job {ns}/{name}  phase {phase}  step {step:.0}/{max_steps:.0}  plan gen {gen:.0}  balance {}  cluster {cluster_rate:.0} samples/s",
            status.balance.as_ref().map(|b| format!("{} ({:.1}%)", b.class, b.cv_percent)).unwrap_or_else(|| "-".into())
        )];
        lines.push(format!(
            "  {:>4}  {:<8} {:<7} {:>6} {:>11} {:>10}",
            "rank", "node", "device", "batch", "samples/s", "step time"
        ));
        for r in &ranks {
            let batch = r.last.as_ref().map(|(_, s)| s.batch).unwrap_or(0.0);
            lines.push(format!(
                "  {:>4}  {:<8} {:<7} {:>6.0} {:>11.1} {:>9.0}ms",
                r.rank,
                r.node,
                "cpu",
                batch,
                r.rate,
                r.step_time * 1000.0
            ));
        }
        if tty {
            let mut out = std::io::stdout();
            if drawn > 0 {
                let _ = write!(out, "\x1b[{drawn}A");
            }
            for l in &lines {
                let _ = writeln!(out, "\x1b[2K{l}");
            }
            let _ = out.flush();
            drawn = lines.len();
        } else if last_print.elapsed() >= Duration::from_secs(5) {
            println!("{}", lines.join("\n"));
            last_print = Instant::now();
        }
        match phase.as_str() {
            "Succeeded" => break,
            "Failed" => bail!(
                "job {ns}/{name} failed: {:?}",
                status.conditions.last().map(|c| c.message.clone())
            ),
            _ => {}
        }
        if t0.elapsed() > Duration::from_secs(1800) {
            bail!("job {ns}/{name} did not finish in 30 minutes");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let steady = match window {
        Some((t1, s1)) if last_total.0 > t1 => {
            (last_total.1 - s1) / last_total.0.duration_since(t1).as_secs_f64()
        }
        _ => 0.0,
    };
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let plan = cms
        .get(&format!("{name}-plan"))
        .await
        .ok()
        .and_then(|c| c.data?.get(PLAN_KEY).cloned())
        .and_then(|t| serde_json::from_str::<BatchPlan>(&t).ok());
    Ok(RunResult {
        steady_samples_per_second: steady,
        converge,
        final_plan: plan.map(|p| p.batch_sizes).unwrap_or_default(),
        // The log has the final evaluation; the last scrape may predate it.
        accuracy: logged_accuracy(state_dir, ns, &name).or(accuracy),
        nodes: ranks.iter().map(|r| (r.rank, r.node.clone())).collect(),
        elapsed: t0.elapsed(),
    })
}

/// The same job with the equal split, each rank pinned to the node it ran on.
fn equal_split_twin(
    job: &HeteroTrainingJob,
    nodes: &BTreeMap<u32, String>,
) -> Result<HeteroTrainingJob> {
    let mut twin = job.clone();
    twin.metadata.name = Some(format!(
        "{}-equal",
        job.metadata.name.clone().unwrap_or_default()
    ));
    twin.spec.load_balancing.policy = heterotrain_crds::BalancePolicy::Static;
    let template = job
        .spec
        .workers
        .first()
        .cloned()
        .ok_or_else(|| anyhow!("job has no workers"))?;
    twin.spec.workers = nodes
        .iter()
        .map(|(rank, node)| {
            let mut g = template.clone();
            g.name = format!("rank{rank}");
            g.replicas = 1;
            g.node_selector = [("kubernetes.io/hostname".to_string(), node.clone())].into();
            g
        })
        .collect();
    Ok(twin)
}

/// Offer the cached dataset `claim` (`make setup` builds them into
/// `$HETEROTRAIN_CACHE/data`) to the demo's jobs as a claim of that name.
async fn provide_dataset(client: &Client, state_dir: &Path, ns: &str, claim: &str) -> Result<()> {
    use heterotrain_e2e::datasets;
    if !datasets::ALL.contains(&claim) {
        bail!(
            "the demo fills claims named after the datasets of `make setup` ({}); the job asks for {claim:?}",
            datasets::ALL.join(", ")
        );
    }
    println!(
        "==> dataset: claim {ns}/{claim} with {}",
        datasets::dir(claim)?.display()
    );
    datasets::provide_claim(client, state_dir, ns, claim).await
}

fn dataset_label(job: &HeteroTrainingJob) -> String {
    let d = &job.spec.dataset;
    match &d.claim_name {
        Some(c) => format!("{} files from claim {c}", d.name.as_str()),
        None => format!(
            "{} files in {}",
            d.name.as_str(),
            d.path.as_deref().unwrap_or("?")
        ),
    }
}

fn accuracy_text(a: Option<(f64, Option<u64>)>) -> String {
    match a {
        Some((a, Some(n))) => format!("{:.1}% of {n}", a * 100.0),
        Some((a, None)) => format!("{:.1}%", a * 100.0),
        None => "(no evaluation reported)".into(),
    }
}

async fn demo(cli: &Cli) -> Result<()> {
    let t0 = Instant::now();
    println!("==> starting the local control plane `demo` with simulated nodes and the operator");
    let env = local(&[
        "up",
        "--nodes",
        &cli.nodes.display().to_string(),
        "--operator",
        "--operator-arg=--scrape-interval=1",
        "--operator-arg=--rebalance-interval=4",
    ])?;
    let kubeconfig = env
        .lines()
        .find_map(|l| l.strip_prefix("export KUBECONFIG="))
        .ok_or_else(|| anyhow!("heterotrain-local printed no KUBECONFIG"))?
        .to_string();
    std::env::set_var("KUBECONFIG", &kubeconfig);
    let client = Client::try_default().await?;
    println!(
        "==> control plane up in {:.0?}; preparing namespace {}",
        t0.elapsed(),
        cli.namespace
    );
    heterotrain_e2e::system::prepare_namespace(&client, &cli.namespace).await?;
    let text = std::fs::read_to_string(&cli.job)
        .with_context(|| format!("reading {}", cli.job.display()))?;
    let job: HeteroTrainingJob = serde_yaml::from_str(&text)?;
    // The simulated nodes keep their state (claims, pod logs) beside the kubeconfig.
    let state_dir = Path::new(&kubeconfig)
        .parent()
        .ok_or_else(|| anyhow!("kubeconfig {kubeconfig} has no directory"))?
        .to_path_buf();
    if let Some(claim) = &job.spec.dataset.claim_name {
        provide_dataset(&client, &state_dir, &cli.namespace, claim)
            .await
            .with_context(|| format!("providing the dataset claim {claim}"))?;
    }
    println!(
        "==> training {} with {} balancing",
        cli.job.display(),
        job.spec.load_balancing.policy.as_str()
    );
    let balanced = run_job(&client, &state_dir, &cli.namespace, job.clone(), "balanced").await?;
    let mut equal = None;
    if !cli.no_baseline {
        println!("\n==> the same job with the equal split, on the same nodes (baseline)");
        let twin = equal_split_twin(&job, &balanced.nodes)?;
        equal = Some(run_job(&client, &state_dir, &cli.namespace, twin, "equal split").await?);
    }
    println!("\n==> summary");
    println!("  ranks on nodes:           {:?}", balanced.nodes);
    println!("  final balanced plan:      {:?}", balanced.final_plan);
    println!(
        "  balanced throughput:      {:.1} samples/s (steady state)",
        balanced.steady_samples_per_second
    );
    if let Some(e) = &equal {
        println!(
            "  equal-split throughput:   {:.1} samples/s (steady state)",
            e.steady_samples_per_second
        );
        if e.steady_samples_per_second > 0.0 {
            println!(
                "  speed-up:                 {:.2}x",
                balanced.steady_samples_per_second / e.steady_samples_per_second
            );
        }
    }
    match balanced.converge {
        Some(d) => println!("  time to final plan:       {d:.1?} after the first step"),
        None => println!("  time to final plan:       plan never changed"),
    }
    let note = if job.spec.dataset.name.from_files() {
        format!(" ({})", dataset_label(&job))
    } else {
        " (synthetic data with random labels: chance level)".to_string()
    };
    println!(
        "  held-out accuracy:        {} balanced{}{note}",
        accuracy_text(balanced.accuracy),
        equal
            .as_ref()
            .map(|e| format!(", {} equal split", accuracy_text(e.accuracy)))
            .unwrap_or_default()
    );
    println!(
        "  wall time:                {:.0?} (balanced run {:.0?})",
        t0.elapsed(),
        balanced.elapsed
    );
    println!("\nThe cluster is still up. Explore it with:\n  export KUBECONFIG={kubeconfig}\n  kubectl get htj,pods -n {} -o wide\nStop it with: make demo-down", cli.namespace);
    Ok(())
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let result = if cli.down {
        local(&["down"]).map(|_| ())
    } else {
        demo(&cli).await
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
