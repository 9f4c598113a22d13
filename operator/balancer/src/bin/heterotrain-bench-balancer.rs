//! `heterotrain-bench-balancer`: the balancer benchmark (`make
//! bench-balancer`). Prints (1) efficiency per policy on the `big` scenario
//! (1,024 ranks × 8 device types, 5% noise), (2) the same on `slow-node`
//! (a node of speed 0.05 the best plan leaves out; 1,200 steps, long enough
//! for its re-admissions) and (3) plan computation time for 10, 1,000 and
//! 10,000 ranks, median of several runs. Numbers, not pass/fail: build with
//! `--release`.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use heterotrain_balancer::sim::devices::BIG_MIX;
use heterotrain_balancer::sim::rng::Rng;
use heterotrain_balancer::sim::{run_all, Scenario};
use heterotrain_balancer::{optimal_split, Balancer, BalancerConfig, Policy, StepModel};

/// Balancer benchmark: policy efficiency at 1,024 ranks and plan time at
/// 10 / 1,000 / 10,000 ranks.
#[derive(Debug, Parser)]
#[command(name = "heterotrain-bench-balancer", version)]
struct Args {
    /// Timed runs per size (the median is reported).
    #[arg(long, default_value_t = 11)]
    runs: usize,
    /// Steps of the 1,024-rank simulation.
    #[arg(long, default_value_t = 400)]
    steps: u64,
    /// Noise seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Steps of the `slow-node` run: 60 decisions, so the left-out node is
/// re-admitted for measurement (and left out again) twice.
const SLOW_NODE_STEPS: u64 = 1200;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("heterotrain-bench-balancer: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let mut big = Scenario::builtin("big").ok_or("no big scenario")?;
    big.steps = args.steps;
    let report = run_all(&big, &Policy::ALL, args.seed).map_err(|e| e.to_string())?;
    println!("## Efficiency per policy\n");
    print!("{}", report.table());
    println!();
    let mut slow = Scenario::builtin("slow-node").ok_or("no slow-node scenario")?;
    slow.steps = SLOW_NODE_STEPS;
    let report = run_all(&slow, &Policy::ALL, args.seed).map_err(|e| e.to_string())?;
    println!("## A very slow node (left out by the measurement policies)\n");
    print!("{}", report.table());
    println!();
    println!("## Plan computation time (median of {} runs)\n", args.runs);
    println!(
        "{:>8} {:>18} {:>26}",
        "ranks", "optimal_split ms", "Balancer::decide ms (dyn)"
    );
    for n in [10usize, 1_000, 10_000] {
        let (split_ms, decide_ms) = time_plan(n, args.runs.max(1), args.seed)?;
        println!("{n:>8} {split_ms:>18.3} {decide_ms:>26.3}");
    }
    Ok(())
}

/// Median milliseconds of `optimal_split` and of a full dynamic
/// `Balancer::decide` (re-fitting every rank's window) for `n` ranks.
fn time_plan(n: usize, runs: usize, seed: u64) -> Result<(f64, f64), String> {
    let global = u32::try_from(128 * n).map_err(|e| e.to_string())?;
    let devices: Vec<_> = (0..n).map(|i| BIG_MIX[i % BIG_MIX.len()]).collect();
    let models: Vec<StepModel> = devices
        .iter()
        .map(|d| StepModel {
            fixed_seconds: d.fixed_seconds,
            per_sample_seconds: d.per_sample_seconds(),
        })
        .collect();
    let caps: Vec<u32> = devices.iter().map(|d| d.max_batch()).collect();
    let mut split_ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let s = optimal_split(&models, global, 1, &caps).map_err(|e| e.to_string())?;
        split_ms.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(s);
    }

    let cfg = BalancerConfig {
        policy: Policy::Dynamic,
        global_batch_size: global,
        ..BalancerConfig::default()
    };
    let window = cfg.window;
    let mut bal = Balancer::new(cfg, n).map_err(|e| e.to_string())?;
    let current = optimal_split(&vec![models[0]; n], global, 1, &caps)
        .map_err(|e| e.to_string())?
        .batches;
    let mut rng = Rng::new(seed);
    let mut feed = |bal: &mut Balancer| {
        for (r, m) in models.iter().enumerate() {
            let b = current[r];
            let _ = bal.observe_step(r, b, m.predict(b) * (1.0 + 0.05 * rng.normal()).max(0.05));
        }
    };
    for _ in 0..window {
        feed(&mut bal);
    }
    let mut decide_ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        feed(&mut bal); // one new sample per rank: every model is re-fitted
        let t = Instant::now();
        let d = bal.decide(&current).map_err(|e| e.to_string())?;
        decide_ms.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(d);
    }
    Ok((median(&mut split_ms), median(&mut decide_ms)))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}
