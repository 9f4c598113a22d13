//! `heterotrain-bench` (`make bench`): every balancing policy on every
//! scenario, side by side in one run, on the local control plane with
//! simulated nodes; see `heterotrain-bench --help` and the README.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use heterotrain_crds::OptimizerSharding;
use heterotrain_e2e::bench::session::{self, say, State, TrainingOptions};
use heterotrain_e2e::bench::spec::NodeCpus;
use heterotrain_e2e::bench::{
    self, analysis, ddp, model_runs, plots, report, scale, Results, POLICIES, VARIANTS,
};

#[derive(Parser)]
#[command(
    name = "heterotrain-bench",
    version,
    about = "Benchmark HeteroTrain's balancing policies on simulated heterogeneous nodes",
    long_about = "Starts a local control plane (real kube-apiserver, scheduler, controller-manager) \
with simulated nodes whose speed is a CPU quota, and the real operator. For each model and \
scenario it first runs every rank alone on its node, one after another (the sequential ideal \
is the sum of those rates) and all at the same time (the concurrent ideal), then trains the \
same job under each balancing policy, one run at a time (2- and 4-node scenarios in --rounds \
interleaved rounds of concurrent ideal, static, dynamic, and the concurrent ideal once more \
after the last round: each round is held to the mean of the two around it), on scikit-learn's digits \
(from `make setup`'s cache, as 3x32x32 CIFAR-10 binaries for the conv nets, as 8x8 MNIST IDX files for the mlp) and reports held-out accuracy. It also reports plan \
propagation latency, the trainer against PyTorch DDP, and the operator at 50/200/500 jobs × 8 \
ranks. Writes results.json, results.csv, results.md (with every plan the operator wrote for a \
run and its reason) and PNG plots to --out. \
The whole default bench takes about 35-40 minutes on a 2-core machine; targets are reported, \
not asserted."
)]
struct Cli {
    /// Output directory.
    #[arg(long, default_value = "out/bench")]
    out: PathBuf,
    /// Models to run (comma-separated): simple_cnn, mlp, resnet18.
    #[arg(long, value_delimiter = ',', default_value = "simple_cnn,mlp,resnet18")]
    models: Vec<String>,
    /// Scenarios (comma-separated): two-node, four-node, throttle, homogeneous,
    /// slow-node (1.0 / 0.05, against the fast node alone: no static run).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "two-node,four-node,throttle,homogeneous,slow-node"
    )]
    scenarios: Vec<String>,
    /// Policies (comma-separated): static, proportional, dynamic, hybrid, seed-formula;
    /// also dynamic-uncapped (dynamic with capQuotaBoundRanks off, run in every round beside
    /// dynamic: what the cap on ranks that spent their CPU quota does).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "static,proportional,dynamic,hybrid,seed-formula"
    )]
    policies: Vec<String>,
    /// Shorter runs (half the steps) and one round: a quick look, noisier numbers.
    #[arg(long)]
    quick: bool,
    /// Scale every run's steps by this factor (at least 0.25, at most 20;
    /// `--quick` halves it again). The figures are taken over each run's last
    /// half, so a longer run shows more of the steady state: on 4 nodes,
    /// simple_cnn's 480 steps at `--length 2` gave the live policies 16–18
    /// decisions a run.
    #[arg(long, default_value_t = 1.0)]
    length: f64,
    /// Interleaved rounds of the 2- and 4-node scenarios (concurrent ideal, static,
    /// dynamic; the first round also the other policies; one more concurrent ideal
    /// after the last). Default 3, 1 with --quick.
    #[arg(long)]
    rounds: Option<u32>,
    /// Cores a rank on a speed-1.0 node gets (its CPU limit); node speeds scale it.
    #[arg(long, default_value_t = 0.6)]
    core_unit: f64,
    /// The jobs' `training.optimizerSharding` (who runs the optimizer
    /// update): fastest (the default), proportional or replicated.
    #[arg(long, value_enum, default_value = "fastest")]
    optimizer_sharding: OptimizerSharding,
    /// The operator's --rebalance-interval, seconds.
    #[arg(long, default_value_t = 2.0)]
    rebalance_interval: f64,
    /// Which CPUs the simulated nodes' pods run on. `own` (default): in a
    /// scenario with no more nodes than this machine has CPUs, each node on
    /// CPUs of its own, as separate machines have (a CPU quota spread over
    /// shared CPUs strands slices of it and slows every rank); larger
    /// scenarios share every CPU. `spread`: as `own`, and in larger
    /// scenarios one CPU per node, spread by speed. `shared`: any CPU.
    #[arg(long, value_enum, default_value = "own")]
    node_cpus: NodeCpus,
    /// Job counts for the operator scale test (8 ranks each).
    #[arg(long, value_delimiter = ',', default_value = "50,200,500")]
    scale_jobs: Vec<u32>,
    /// Seconds to hold each job count before reading the operator's metrics.
    #[arg(long, default_value_t = 20)]
    scale_hold: u64,
    /// Extra flags for the scale test's operator, e.g.
    /// `--scale-operator-args=--concurrency=16` to compare with the default
    /// (space-separated; repeat the flag or quote the list).
    #[arg(long, allow_hyphen_values = true)]
    scale_operator_args: Vec<String>,
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

/// Reject unknown names before starting anything.
fn validate(cli: &Cli) -> Result<()> {
    for m in &cli.models {
        if !model_runs(1.0).iter().any(|x| &x.model == m) {
            bail!("unknown model {m:?} (simple_cnn, mlp, resnet18)");
        }
    }
    for s in &cli.scenarios {
        if !bench::scenarios().iter().any(|x| &x.name == s) {
            bail!("unknown scenario {s:?} (two-node, four-node, throttle, homogeneous, slow-node)");
        }
    }
    for p in &cli.policies {
        if !POLICIES.contains(&p.as_str()) && !VARIANTS.contains(&p.as_str()) {
            bail!(
                "unknown policy {p:?} ({}, or the variant {})",
                POLICIES.join(", "),
                VARIANTS.join(", ")
            );
        }
    }
    if !(cli.core_unit > 0.0 && cli.core_unit <= 8.0) {
        bail!("--core-unit must be in (0, 8]");
    }
    if !(0.25..=20.0).contains(&cli.length) {
        bail!(
            "--length must be between 0.25 and 20 (a factor on every run's steps), not {}",
            cli.length
        );
    }
    if cli.rebalance_interval.is_nan() || cli.rebalance_interval < 0.5 {
        bail!("--rebalance-interval must be at least 0.5 s");
    }
    Ok(())
}

fn training_options(cli: &Cli) -> TrainingOptions {
    let scale = cli.length * if cli.quick { 0.5 } else { 1.0 };
    let mut policies: Vec<String> = POLICIES
        .iter()
        .chain(&VARIANTS)
        .filter(|p| cli.policies.iter().any(|x| x == *p))
        .map(|p| p.to_string())
        .collect();
    // Static first: the others are compared with it.
    policies.sort_by_key(|p| p != "static");
    TrainingOptions {
        models: model_runs(scale)
            .into_iter()
            .filter(|m| cli.models.contains(&m.model))
            .collect(),
        scenarios: bench::scenarios()
            .into_iter()
            .filter(|s| cli.scenarios.contains(&s.name))
            .collect(),
        policies,
        rounds: cli.rounds.unwrap_or(if cli.quick { 1 } else { 3 }),
        core_unit: cli.core_unit,
        optimizer_sharding: cli.optimizer_sharding,
        rebalance_interval: cli.rebalance_interval,
        node_cpus: cli.node_cpus,
        verbose: cli.verbose,
    }
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
    let opts = training_options(&cli);
    let mut st = State::new(session::new_results(serde_json::json!({
        "core_unit": cli.core_unit,
        "optimizer_sharding": cli.optimizer_sharding.as_str(),
        "rebalance_interval_seconds": cli.rebalance_interval,
        "node_cpus": format!("{:?}", cli.node_cpus).to_lowercase(),
        "scrape_interval_seconds": 1,
        "quick": cli.quick,
        "rounds": opts.rounds,
        "models": opts.models,
    })));
    std::fs::create_dir_all(&out)?;
    if !cli.no_training {
        if let Err(e) = session::training(&opts, &mut st, &out).await {
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
        match ddp::run(cli.ddp_runs) {
            Ok(rows) => st.results.ddp = rows,
            Err(e) => st
                .results
                .notes
                .push(format!("trainer vs DDP not measured: {e:#}")),
        }
    }
    if !cli.no_scale && !cli.scale_jobs.is_empty() {
        let operator_args: Vec<String> = cli
            .scale_operator_args
            .iter()
            .flat_map(|a| a.split_whitespace().map(String::from))
            .collect();
        if !operator_args.is_empty() {
            st.results.notes.push(format!(
                "operator scale run with the operator flags {}",
                operator_args.join(" ")
            ));
        }
        let hold = Duration::from_secs(cli.scale_hold);
        match scale::run(&cli.scale_jobs, hold, &operator_args, &say).await {
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
        Err(e) => eprintln!("plots not drawn: {e:#}"),
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
    fn quick_runs_one_round_and_static_goes_first() {
        let quick = Cli::try_parse_from(["b", "--quick", "--policies", "dynamic,static"]).unwrap();
        let o = training_options(&quick);
        assert_eq!(o.rounds, 1);
        assert_eq!(o.policies, vec!["static", "dynamic"]);
        let full = Cli::try_parse_from(["b"]).unwrap();
        assert_eq!(training_options(&full).rounds, 3);
        let two = Cli::try_parse_from(["b", "--quick", "--rounds", "2"]).unwrap();
        assert_eq!(training_options(&two).rounds, 2);
        // The cap's A/B variant runs after the policies it is compared with.
        let ab = Cli::try_parse_from(["b", "--policies", "dynamic-uncapped,dynamic"]).unwrap();
        assert!(validate(&ab).is_ok());
        assert_eq!(
            training_options(&ab).policies,
            vec!["dynamic", "dynamic-uncapped"]
        );
    }

    #[test]
    fn length_scales_every_run_and_is_bounded() {
        let steps = |args: &[&str]| {
            let cli = Cli::try_parse_from(args).unwrap();
            validate(&cli).map(|_| {
                let o = training_options(&cli);
                o.models.iter().map(|m| m.steps).collect::<Vec<_>>()
            })
        };
        let one = steps(&["b"]).unwrap();
        let longer = steps(&["b", "--length", "2.5"]).unwrap();
        assert_eq!(longer[0], one[0] * 5 / 2);
        assert_eq!(steps(&["b", "--quick", "--length", "2"]).unwrap(), one);
        for bad in ["0", "0.1", "21", "NaN"] {
            let e = steps(&["b", "--length", bad]).unwrap_err().to_string();
            assert!(e.contains("--length"), "{e}");
        }
    }
}
