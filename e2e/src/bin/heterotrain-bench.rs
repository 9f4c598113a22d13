//! `heterotrain-bench` (`make bench`): every balancing policy on every
//! scenario, side by side in one run, on the local control plane with
//! simulated nodes; see `heterotrain-bench --help` and the README.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use heterotrain_e2e::bench::analysis::{self, cluster_steps, summarise};
use heterotrain_e2e::bench::runner::{self, BenchCluster, JobParams, ThrottlePlan};
use heterotrain_e2e::bench::{
    self, ideal_split, model_runs, plots, report, scale, BenchNode, DdpRow, ModelRun, Results,
    RunResult, Scenario, Series, Standalone, POLICIES,
};

#[derive(Parser)]
#[command(
    name = "heterotrain-bench",
    version,
    about = "Benchmark HeteroTrain's balancing policies on simulated heterogeneous nodes",
    long_about = "Starts a local control plane (real kube-apiserver, scheduler, controller-manager) \
with simulated nodes whose speed is a CPU quota, and the real operator. For each model and \
scenario it first runs every rank alone on its node (the ideal is the sum of those rates), then \
trains the same job under each balancing policy, one run at a time, on scikit-learn's digits \
(from `make setup`'s cache, as 3x32x32 CIFAR-10 binaries for the conv nets, as 8x8 MNIST IDX files for the mlp) and reports held-out accuracy. It also reports plan \
propagation latency, the trainer against PyTorch DDP, and the operator at 50/200/500 jobs × 8 \
ranks. Writes results.json, results.csv, results.md and PNG plots to --out. \
The whole default bench takes about 20-25 minutes on a 2-core machine; targets are reported, \
not asserted."
)]
struct Cli {
    /// Output directory.
    #[arg(long, default_value = "out/bench")]
    out: PathBuf,
    /// Models to run (comma-separated): simple_cnn, mlp, resnet18.
    #[arg(long, value_delimiter = ',', default_value = "simple_cnn,mlp,resnet18")]
    models: Vec<String>,
    /// Scenarios (comma-separated): two-node, four-node, throttle, homogeneous.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "two-node,four-node,throttle,homogeneous"
    )]
    scenarios: Vec<String>,
    /// Policies (comma-separated): static, proportional, dynamic, hybrid, seed-formula.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "static,proportional,dynamic,hybrid,seed-formula"
    )]
    policies: Vec<String>,
    /// Shorter runs (half the steps): a quick look, noisier numbers.
    #[arg(long)]
    quick: bool,
    /// Cores a rank on a speed-1.0 node gets (its CPU limit); node speeds scale it.
    #[arg(long, default_value_t = 0.6)]
    core_unit: f64,
    /// The operator's --rebalance-interval, seconds.
    #[arg(long, default_value_t = 2.0)]
    rebalance_interval: f64,
    /// Job counts for the operator scale test (8 ranks each).
    #[arg(long, value_delimiter = ',', default_value = "50,200,500")]
    scale_jobs: Vec<u32>,
    /// Seconds to hold each job count before reading the operator's metrics.
    #[arg(long, default_value_t = 20)]
    scale_hold: u64,
    /// Skip the operator scale test.
    #[arg(long)]
    no_scale: bool,
    /// Skip the training runs (e.g. only the scale test).
    #[arg(long)]
    no_training: bool,
    /// Skip the trainer-vs-DDP comparison.
    #[arg(long)]
    no_ddp: bool,
    /// Runs per side of the trainer-vs-DDP comparison (median).
    #[arg(long, default_value_t = 1)]
    ddp_runs: u32,
    /// Only redraw plots and the markdown from <out>/results.json.
    #[arg(long)]
    plots_only: bool,
    /// Print the control plane's progress.
    #[arg(long, short)]
    verbose: bool,
}

fn say(msg: &str) {
    println!("{msg}");
}

fn short(model: &str) -> &str {
    match model {
        "simple_cnn" => "cnn",
        m => m,
    }
}

fn now_rfc3339() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    out.unwrap_or_default()
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let cg = heterotrain_e2e::nodesim::cgroup::detect();
    format!("{cpus} CPUs, cgroup {cg:?}")
}

/// Per-run results kept between runs (standalone rates, static baselines).
struct State {
    results: Results,
    standalone: BTreeMap<(String, String, u64, u32), f64>,
    base_speed: BTreeMap<String, f64>,
    done: usize,
    total: usize,
}

async fn standalone(
    cl: &BenchCluster,
    st: &mut State,
    m: &ModelRun,
    node: &str,
    speed: f64,
    batch: u32,
) -> Result<f64> {
    let key = (m.model.clone(), node.to_string(), speed.to_bits(), batch);
    if let Some(r) = st.standalone.get(&key) {
        return Ok(*r);
    }
    let base = st.base_speed.get(node).copied().unwrap_or(speed);
    let name = format!(
        "solo-{}-{node}-{}-b{batch}",
        short(&m.model),
        (speed * 100.0).round() as u32
    );
    let nodes = [BenchNode {
        name: node.into(),
        speed,
    }];
    let job = runner::job(&JobParams {
        name: &name,
        model: m,
        nodes: &nodes,
        policy: "static",
        global_batch: batch,
        steps: m.standalone_steps,
        core_unit: cl.core_unit,
        profiling: false,
    })?;
    if (speed - base).abs() > 1e-9 {
        cl.system.sim.set_speed(node, speed)?;
    }
    let run = cl.run(job, None, Duration::from_secs(900)).await;
    if (speed - base).abs() > 1e-9 {
        cl.system.sim.set_speed(node, base)?;
    }
    let run = run?;
    let s = summarise(&cluster_steps(&run.ranks), &run.evals);
    say(&format!(
        "    alone: {} on {node} (speed {speed}), batch {batch}: {:.1} samples/s",
        m.model, s.samples_per_second
    ));
    st.standalone.insert(key, s.samples_per_second);
    st.results.standalone.push(Standalone {
        model: m.model.clone(),
        node: node.into(),
        speed,
        batch,
        samples_per_second: s.samples_per_second,
    });
    Ok(s.samples_per_second)
}

/// Σ standalone rates of the ideal split of `speeds`.
async fn ideal(
    cl: &BenchCluster,
    st: &mut State,
    m: &ModelRun,
    nodes: &[BenchNode],
) -> Result<f64> {
    let speeds: Vec<f64> = nodes.iter().map(|n| n.speed).collect();
    let split = ideal_split(m.global_batch, &speeds);
    let mut sum = 0.0;
    for (n, b) in nodes.iter().zip(split) {
        sum += standalone(cl, st, m, &n.name, n.speed, b).await?;
    }
    Ok(sum)
}

async fn cluster_run(
    cl: &BenchCluster,
    st: &mut State,
    m: &ModelRun,
    sc: &Scenario,
    policy: &str,
    ideals: (f64, Option<f64>),
) -> Result<RunResult> {
    let steps = if sc.throttle.is_some() {
        m.steps * 3 / 2
    } else {
        m.steps
    };
    let name = format!("{}-{}-{policy}", short(&m.model), sc.name);
    let job = runner::job(&JobParams {
        name: &name,
        model: m,
        nodes: &sc.nodes,
        policy,
        global_batch: m.global_batch,
        steps,
        core_unit: cl.core_unit,
        profiling: true,
    })?;
    let throttle = sc.throttle.as_ref().map(|t| ThrottlePlan {
        node: sc.nodes[t.node].name.clone(),
        speed: t.speed,
        normal_speed: sc.nodes[t.node].speed,
        at_step: (steps as f64 * t.at).round() as u64,
        restore_step: (steps as f64 * t.restore).round() as u64,
    });
    st.done += 1;
    say(&format!(
        "==> [{}/{}] {} · {} · {policy}: {} steps of global batch {}",
        st.done, st.total, m.model, sc.title, steps, m.global_batch
    ));
    let run = cl
        .run(job, throttle.as_ref(), Duration::from_secs(1200))
        .await?;
    let cs = cluster_steps(&run.ranks);
    if cs.is_empty() {
        bail!("{name}: no step ran on every rank");
    }
    let mut summary = summarise(&cs, &run.evals);
    let t0 = cs[0].start;
    let rolling = analysis::rolling_rates(&cs, analysis::ROLLING);
    let series = Series {
        t: cs.iter().map(|s| s.end - t0).collect(),
        batches: (0..run.ranks.len())
            .map(|r| cs.iter().map(|s| s.batches[r]).collect())
            .collect(),
        compute_seconds: (0..run.ranks.len())
            .map(|r| cs.iter().map(|s| s.compute_seconds[r]).collect())
            .collect(),
        rolling_rate: rolling.iter().map(|r| r.unwrap_or(0.0)).collect(),
    };
    let (mut ideal, throttled_ideal) = ideals;
    let mut recovery = None;
    let mut window = None;
    if let (Some((t1, t2)), Some(ti)) = (run.throttle_times, throttled_ideal) {
        let rc = analysis::recovery(&cs, t1, t2, ti);
        // Over the whole run: the same work at each phase's ideal rate.
        let n_t = cs.iter().filter(|s| s.start >= t1 && s.end <= t2).count() as f64;
        let n_n = cs.len() as f64 - n_t;
        if ideal > 0.0 && ti > 0.0 {
            ideal = (n_n + n_t) / (n_n / ideal + n_t / ti);
        }
        summary.samples_per_second = analysis::rate_over(&cs);
        recovery = Some(rc);
        window = Some((t1 - t0, t2 - t0));
    }
    let static_rate = st
        .results
        .runs
        .iter()
        .find(|r| r.model == m.model && r.scenario == sc.name && r.policy == "static")
        .map(|r| r.summary.samples_per_second)
        .or_else(|| (policy == "static").then_some(summary.samples_per_second));
    let lat = analysis::propagation_latencies(&run.ranks, &run.plan_writes);
    let result = RunResult {
        model: m.model.clone(),
        scenario: sc.name.clone(),
        policy: policy.into(),
        nodes: run.nodes.clone(),
        speeds: sc.speeds(),
        global_batch: m.global_batch,
        efficiency: if ideal > 0.0 {
            summary.samples_per_second / ideal
        } else {
            0.0
        },
        speedup_vs_static: static_rate
            .filter(|s| *s > 0.0)
            .map(|s| summary.samples_per_second / s),
        summary,
        ideal,
        recovery,
        throttle_window: window,
        propagation_seconds: lat,
        wall_seconds: run.wall_seconds,
        series,
    };
    say(&format!(
        "    {:.0} samples/s = {:.2} × ideal ({:.0}){}; plan {:?} after {} change(s); balance CV {:.1}%; held-out accuracy {}; {:.0} s",
        result.summary.samples_per_second,
        result.efficiency,
        result.ideal,
        result
            .speedup_vs_static
            .map(|s| format!(", {s:.2} × static"))
            .unwrap_or_default(),
        result.summary.final_plan,
        result.summary.plan_changes,
        result.summary.balance_cv_percent,
        result
            .summary
            .final_accuracy
            .map(|a| format!("{:.1}%", a * 100.0))
            .unwrap_or_else(|| "-".into()),
        result.wall_seconds
    ));
    if let Some(rc) = &result.recovery {
        say(&format!(
            "    throttled: {:.0} samples/s vs new ideal {:.0}; within 5% of it after {}; settled after {}",
            rc.throttled_samples_per_second,
            rc.throttled_ideal,
            rc.seconds_to_ideal_95
                .map(|s| format!("{s:.1} s"))
                .unwrap_or_else(|| "never".into()),
            rc.seconds_to_settle
                .map(|s| format!("{s:.1} s"))
                .unwrap_or_else(|| "-".into())
        ));
    }
    Ok(result)
}

async fn training(cli: &Cli, st: &mut State, out: &Path) -> Result<()> {
    let scale = if cli.quick { 0.5 } else { 1.0 };
    let models: Vec<ModelRun> = model_runs(scale)
        .into_iter()
        .filter(|m| cli.models.contains(&m.model))
        .collect();
    let scenarios: Vec<Scenario> = bench::scenarios()
        .into_iter()
        .filter(|s| cli.scenarios.contains(&s.name))
        .collect();
    let mut policies: Vec<&str> = POLICIES
        .iter()
        .copied()
        .filter(|p| cli.policies.iter().any(|x| x == p))
        .collect();
    // Static first: the others are compared with it.
    policies.sort_by_key(|p| *p != "static");
    let all_nodes: Vec<BenchNode> = scenarios.iter().flat_map(|s| s.nodes.clone()).collect();
    for n in &all_nodes {
        st.base_speed.entry(n.name.clone()).or_insert(n.speed);
    }
    st.total = models
        .iter()
        .map(|m| {
            scenarios
                .iter()
                .filter(|s| m.scenarios.contains(&s.name))
                .count()
                * policies.len()
        })
        .sum();
    // The real data the jobs train on, from `make setup`'s cache.
    let mut data: Vec<&str> = models.iter().map(|m| m.dataset.as_str()).collect();
    data.sort_unstable();
    data.dedup();
    for d in &data {
        let dir = heterotrain_e2e::datasets::dir(d)?;
        say(&format!("==> dataset {d}: {}", dir.display()));
    }
    say(&format!(
        "==> starting the local control plane with {} simulated nodes and the operator",
        runner::nodes_file(&all_nodes).nodes.len()
    ));
    let mut cl = BenchCluster::start(
        runner::nodes_file(&all_nodes),
        &data,
        cli.core_unit,
        cli.rebalance_interval,
        cli.verbose,
    )
    .await?;
    let outcome = async {
        for m in &models {
            for sc in scenarios.iter().filter(|s| m.scenarios.contains(&s.name)) {
                say(&format!(
                    "==> {} · {}: each rank alone first",
                    m.model, sc.title
                ));
                let ideal_n = ideal(&cl, st, m, &sc.nodes).await?;
                let ideal_t = match &sc.throttle {
                    Some(t) => {
                        let mut nodes = sc.nodes.clone();
                        nodes[t.node].speed = t.speed;
                        Some(ideal(&cl, st, m, &nodes).await?)
                    }
                    None => None,
                };
                for policy in &policies {
                    match cluster_run(&cl, st, m, sc, policy, (ideal_n, ideal_t)).await {
                        Ok(r) => st.results.runs.push(r),
                        Err(e) => {
                            let msg = format!("{} · {} · {policy} failed: {e:#}", m.model, sc.name);
                            eprintln!("    {msg}");
                            st.results
                                .notes
                                .push(msg.lines().next().unwrap_or("").to_string());
                        }
                    }
                    report::write_all(out, &st.results)?;
                }
            }
        }
        anyhow::Ok(())
    }
    .await;
    cl.system.stop().await;
    outcome
}

fn ddp(cli: &Cli) -> Result<Vec<DdpRow>> {
    let script = Path::new("trainer-image/scripts/bench_trainer.sh");
    if !script.exists() {
        bail!(
            "{} not found (run from the repository root)",
            script.display()
        );
    }
    let exe = std::env::current_exe()?;
    let trainer = exe
        .parent()
        .map(|d| d.join("heterotrain-trainer"))
        .filter(|p| p.exists())
        .context("heterotrain-trainer is not built next to heterotrain-bench")?;
    say(&format!(
        "==> trainer vs PyTorch DDP ({} run(s) each, 2 ranks, Gloo)",
        cli.ddp_runs
    ));
    let out = Command::new("bash")
        .arg(script)
        .env("TRAINER", &trainer)
        .env("RUNS", cli.ddp_runs.to_string())
        .output()
        .context("running bench_trainer.sh")?;
    if !out.status.success() {
        bail!(
            "bench_trainer.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let rows = parse_ddp(&text);
    if rows.is_empty() {
        bail!("bench_trainer.sh printed no results:\n{text}");
    }
    for r in &rows {
        say(&format!(
            "    {}: ours {:.1}, DDP {:.1} samples/s → {:.2}",
            r.model, r.ours, r.ddp, r.ratio
        ));
    }
    Ok(rows)
}

/// Rows `| model | batch | threads | ours | ddp | ratio |` of bench_trainer.sh.
fn parse_ddp(text: &str) -> Vec<DdpRow> {
    text.lines()
        .filter_map(|l| {
            let c: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            if c.len() != 6 {
                return None;
            }
            let ours: f64 = c[3].parse().ok()?;
            let ddp: f64 = c[4].parse().ok()?;
            (ddp > 0.0).then(|| DdpRow {
                model: c[0].to_string(),
                ours,
                ddp,
                ratio: ours / ddp,
            })
        })
        .collect()
}

/// Reject unknown names before starting anything.
fn validate(cli: &Cli) -> Result<()> {
    for m in &cli.models {
        if !model_runs(1.0).iter().any(|x| &x.model == m) {
            bail!("unknown model {m:?} (simple_cnn, mlp, resnet18)");
        }
    }
    for s in &cli.scenarios {
        if !bench::scenarios().iter().any(|x| &x.name == s) {
            bail!("unknown scenario {s:?} (two-node, four-node, throttle, homogeneous)");
        }
    }
    for p in &cli.policies {
        if !POLICIES.contains(&p.as_str()) {
            bail!("unknown policy {p:?} ({})", POLICIES.join(", "));
        }
    }
    Ok(())
}

async fn main_inner(cli: Cli) -> Result<()> {
    validate(&cli)?;
    let t0 = Instant::now();
    let out = cli.out.clone();
    if cli.plots_only {
        let path = out.join("results.json");
        let r: Results = serde_json::from_slice(
            &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
        )?;
        report::write_all(&out, &r)?;
        for p in plots::write_all(&out, &r)? {
            say(&format!("wrote {}", p.display()));
        }
        return Ok(());
    }
    if !(cli.core_unit > 0.0 && cli.core_unit <= 8.0) {
        bail!("--core-unit must be in (0, 8]");
    }
    if cli.rebalance_interval.is_nan() || cli.rebalance_interval < 0.5 {
        bail!("--rebalance-interval must be at least 0.5 s");
    }
    let mut st = State {
        results: Results {
            started: now_rfc3339(),
            machine: machine(),
            settings: serde_json::json!({
                "core_unit": cli.core_unit,
                "rebalance_interval_seconds": cli.rebalance_interval,
                "scrape_interval_seconds": 1,
                "quick": cli.quick,
                "models": model_runs(if cli.quick { 0.5 } else { 1.0 }),
            }),
            ..Default::default()
        },
        standalone: BTreeMap::new(),
        base_speed: BTreeMap::new(),
        done: 0,
        total: 0,
    };
    std::fs::create_dir_all(&out)?;
    if !cli.no_training {
        if let Err(e) = training(&cli, &mut st, &out).await {
            st.results
                .notes
                .push(format!("training runs stopped: {e:#}"));
            eprintln!("training runs stopped: {e:#}");
        }
        let lat: Vec<f64> = st
            .results
            .runs
            .iter()
            .flat_map(|r| r.propagation_seconds.iter().copied())
            .collect();
        st.results.propagation_samples = lat.len();
        st.results.propagation_p50_seconds = analysis::quantile(&lat, 0.5);
        st.results.propagation_max_seconds = analysis::quantile(&lat, 1.0);
    }
    if !cli.no_ddp {
        match ddp(&cli) {
            Ok(rows) => st.results.ddp = rows,
            Err(e) => st
                .results
                .notes
                .push(format!("trainer vs DDP not measured: {e:#}")),
        }
    }
    if !cli.no_scale && !cli.scale_jobs.is_empty() {
        match scale::run(&cli.scale_jobs, Duration::from_secs(cli.scale_hold), &say).await {
            Ok(points) => st.results.scale = points,
            Err(e) => {
                eprintln!("operator scale stopped: {e:#}");
                st.results
                    .notes
                    .push(format!("operator scale stopped: {e:#}"));
            }
        }
    }
    st.results.total_seconds = t0.elapsed().as_secs_f64();
    st.results.targets = report::check_targets(&st.results, cli.rebalance_interval);
    report::write_all(&out, &st.results)?;
    match plots::write_all(&out, &st.results) {
        Ok(files) => say(&format!("==> {} plot(s) in {}", files.len(), out.display())),
        Err(e) => {
            eprintln!("plots not drawn: {e:#}");
        }
    }
    println!("\n{}", report::markdown(&st.results));
    say(&format!(
        "==> results in {} ({:.0} s)",
        out.display(),
        t0.elapsed().as_secs_f64()
    ));
    Ok(())
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    if let Err(e) = main_inner(cli).await {
        eprintln!("heterotrain-bench: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_are_rejected_before_anything_starts() {
        let ok = Cli::try_parse_from([
            "b",
            "--models",
            "simple_cnn",
            "--policies",
            "dynamic,seed-formula",
        ])
        .unwrap();
        assert!(validate(&ok).is_ok());
        for args in [
            ["b", "--models", "gpt5"],
            ["b", "--scenarios", "moon"],
            ["b", "--policies", "fastest"],
        ] {
            let cli = Cli::try_parse_from(args).unwrap();
            let e = validate(&cli).unwrap_err().to_string();
            assert!(e.starts_with("unknown "), "{e}");
        }
    }

    #[test]
    fn parses_the_ddp_script_table() {
        let t = "| model | global batch | threads/rank | ours samples/s | DDP samples/s | ratio |\n|---|---|---|---|---|---|\n| resnet18 | 64 | 1 | 110.5 | 100.0 | 1.10 |\n| mlp | 256 | 1 | 8000.0 | 10000.0 | 0.80 |\n";
        let r = parse_ddp(t);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].model, "resnet18");
        assert!((r[1].ratio - 0.8).abs() < 1e-12);
    }
}
