//! `heterotrain-sim`: runs balancing policies on a simulated heterogeneous
//! cluster and reports throughput, the ideal, efficiency, convergence, plan
//! changes and balance quality.

use std::process::ExitCode;

use clap::Parser;
use heterotrain_balancer::sim::{run_all, Scenario, BUILTIN_SCENARIOS};
use heterotrain_balancer::Policy;

/// Simulate synchronous data-parallel training on heterogeneous ranks and
/// compare balancing policies.
///
/// Every step each rank computes its local batch in (a + c·b)·noise seconds,
/// all ranks wait for the slowest, then pay a fixed all-reduce (plus any
/// non-compute cost a rank adds while it takes part). The ideal is
/// the oracle split (true speeds, every rank finishing together) under the
/// same noise; efficiency = throughput / ideal.
///
/// Scenarios: four-rank (speeds 1 : 0.7 : 0.4 : 0.25), throttle (rank 0
/// slows 2x at step 200, recovers at 400), homogeneous (8 identical GPUs),
/// join (a fifth rank joins at step 200), mixed (one of each of 9 device
/// types), big (1,024 ranks x 8 device types), slow-node (a rank of speed
/// 0.05 the best plan leaves out), slow-comm (a rank whose presence adds
/// 0.3 s to every exchange, which only the measured step shows).
#[derive(Debug, Parser)]
#[command(name = "heterotrain-sim", version)]
struct Args {
    /// Built-in scenario.
    #[arg(long, default_value = "four-rank", value_parser = clap::builder::PossibleValuesParser::new(BUILTIN_SCENARIOS))]
    scenario: String,
    /// Policy to run: all, static, proportional, dynamic, hybrid or seed-formula.
    /// Repeat or comma-separate for several.
    #[arg(long, default_value = "all", value_delimiter = ',')]
    policy: Vec<String>,
    /// Steps to simulate (default: the scenario's).
    #[arg(long)]
    steps: Option<u64>,
    /// Steps between balancing decisions (default: the scenario's).
    #[arg(long)]
    interval: Option<u64>,
    /// Relative standard deviation of per-step noise, e.g. 0.05 (default: the scenario's).
    #[arg(long)]
    noise: Option<f64>,
    /// Probability that a rank's step is a 5x outlier (default: the scenario's).
    #[arg(long)]
    outliers: Option<f64>,
    /// Noise seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("heterotrain-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), String> {
    let mut scenario = Scenario::builtin(&args.scenario)
        .ok_or_else(|| format!("unknown scenario {:?}", args.scenario))?;
    if let Some(s) = args.steps {
        scenario.steps = s;
    }
    if let Some(i) = args.interval {
        scenario.interval = i.max(1);
    }
    if let Some(n) = args.noise {
        if !(n.is_finite() && n >= 0.0) {
            return Err(format!("--noise must be ≥ 0, got {n}"));
        }
        scenario.noise = n;
    }
    if let Some(o) = args.outliers {
        if !(0.0..=1.0).contains(&o) {
            return Err(format!("--outliers must be in [0, 1], got {o}"));
        }
        scenario.outlier_rate = o;
    }
    let mut policies = Vec::new();
    for p in &args.policy {
        if p.trim().eq_ignore_ascii_case("all") {
            policies.extend(Policy::ALL);
        } else {
            policies.push(p.parse::<Policy>().map_err(|e| e.to_string())?);
        }
    }
    let report = run_all(&scenario, &policies, args.seed).map_err(|e| e.to_string())?;
    if args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        println!("{json}");
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
