//! The "Done when" checks, run through the simulator.

use heterotrain_balancer::sim::{run, run_with, sim_config, RunReport, Scenario};
use heterotrain_balancer::{continuous_split, max_step, optimal_split, Policy, StepModel};

fn scenario(name: &str) -> Scenario {
    Scenario::builtin(name).expect("built-in scenario")
}

fn truth(s: &Scenario) -> Vec<StepModel> {
    s.ranks
        .iter()
        .map(|r| StepModel {
            fixed_seconds: r.fixed_seconds,
            per_sample_seconds: r.per_sample_seconds,
        })
        .collect()
}

/// Efficiency of the equal split, computed from the true models (no noise).
fn equal_split_efficiency(s: &Scenario) -> f64 {
    let models = truth(s);
    let n = models.len();
    let caps: Vec<u32> = s.ranks.iter().map(|r| r.max_batch).collect();
    let unit = vec![
        StepModel {
            fixed_seconds: 0.0,
            per_sample_seconds: 1.0
        };
        n
    ];
    let equal = optimal_split(&unit, s.global_batch, 1, &caps)
        .expect("split")
        .batches;
    let (_, ideal) = continuous_split(&models, s.global_batch, &vec![1; n], &caps).expect("ideal");
    (ideal + s.allreduce_seconds) / (max_step(&models, &equal) + s.allreduce_seconds)
}

fn first_interval_from(r: &RunReport, step: u64) -> usize {
    r.intervals
        .iter()
        .position(|i| i.start_step >= step)
        .expect("interval")
}

#[test]
fn dynamic_reaches_95_percent_within_3_rebalances_and_static_stays_equal() {
    let s = scenario("four-rank");
    let dynamic = run(&s, Policy::Dynamic, 1).expect("run");
    let rebalances = dynamic.rebalances_to_95.expect("dynamic reaches 95%");
    assert!(rebalances <= 3, "{rebalances} rebalances");
    assert!(
        dynamic.steady_efficiency >= 0.95,
        "{}",
        dynamic.steady_efficiency
    );
    // ... and stays there.
    let k = first_interval_from(&dynamic, dynamic.steps_to_95.unwrap_or(0));
    assert!(
        dynamic.intervals[k..].iter().all(|i| i.efficiency >= 0.95),
        "{:?}",
        dynamic.intervals
    );

    let expected = equal_split_efficiency(&s);
    assert!((0.40..0.55).contains(&expected), "{expected}");
    let quiet = Scenario {
        noise: 0.0,
        ..s.clone()
    };
    let exact = run(&quiet, Policy::Static, 1).expect("run");
    assert!(
        (exact.efficiency - expected).abs() < 1e-6,
        "{} vs {expected}",
        exact.efficiency
    );
    let noisy = run(&s, Policy::Static, 1).expect("run");
    assert_eq!(noisy.plan_changes, 0);
    assert!(noisy.steps_to_95.is_none());
    for i in &noisy.intervals {
        assert!(
            (i.efficiency - expected).abs() < 0.03,
            "{} vs {expected}",
            i.efficiency
        );
    }
}

#[test]
fn dynamic_recovers_from_a_2x_slowdown_within_2_intervals() {
    let s = scenario("throttle"); // rank 0 slows 2x at step 200, recovers at 400
    let r = run(&s, Policy::Dynamic, 1).expect("run");
    let hit = first_interval_from(&r, 200);
    assert!(
        r.intervals[hit].efficiency < 0.9,
        "the slowdown must hurt: {:?}",
        r.intervals[hit]
    );
    // The interval after the first post-event decision is already back.
    for i in &r.intervals[hit + 1..first_interval_from(&r, 400)] {
        assert!(i.efficiency >= 0.95, "{i:?}");
    }
    for i in &r.intervals[first_interval_from(&r, 400) + 1..] {
        assert!(i.efficiency >= 0.95, "after recovery: {i:?}");
    }
    // The profile-only policy does not recover: the check can fail.
    let p = run(&s, Policy::Proportional, 1).expect("run");
    assert!(
        p.intervals[hit + 2].efficiency < 0.9,
        "{:?}",
        p.intervals[hit + 2]
    );
}

#[test]
fn five_percent_noise_gives_at_most_one_change_per_20_intervals() {
    for seed in 1..=4 {
        let s = Scenario {
            noise: 0.05,
            steps: 20 * 85, // 85 intervals: 5 to converge, then 4 blocks of 20
            ..scenario("four-rank")
        };
        for policy in [Policy::Dynamic, Policy::Hybrid] {
            let r = run(&s, policy, seed).expect("run");
            for block in 0..4 {
                let from = 5 + 20 * block;
                let changes = r.changes_between(from, from + 20);
                assert!(
                    changes <= 1,
                    "{policy} seed {seed}: {changes} changes in intervals {from}..{}",
                    from + 20
                );
            }
        }
    }
    let h = Scenario {
        steps: 20 * 40,
        ..scenario("homogeneous")
    };
    let r = run(&h, Policy::Dynamic, 1).expect("run");
    assert_eq!(r.plan_changes, 0, "{}", r.last_reason);
}

#[test]
fn seed_formula_oscillates_where_dynamic_does_not() {
    let s = scenario("four-rank");
    let seed = run(&s, Policy::SeedFormula, 1).expect("run");
    let dynamic = run(&s, Policy::Dynamic, 1).expect("run");
    assert!(seed.plan_changes >= 10, "{}", seed.plan_changes);
    assert!(dynamic.plan_changes <= 2, "{}", dynamic.plan_changes);
    assert!(dynamic.steady_efficiency > seed.steady_efficiency + 0.1);
}

#[test]
fn a_joining_rank_is_absorbed() {
    let s = scenario("join");
    let r = run(&s, Policy::Dynamic, 1).expect("run");
    assert_eq!(r.final_plan.len(), 5);
    assert!(r.final_plan[4] > 40, "{:?}", r.final_plan);
    let after = first_interval_from(&r, 240);
    assert!(
        r.intervals[after..].iter().all(|i| i.efficiency >= 0.95),
        "{:?}",
        r.intervals
    );
}

#[test]
fn big_cluster_dynamic_is_near_ideal_at_steady_state() {
    let s = Scenario {
        steps: 200,
        ..scenario("big")
    };
    let r = run(&s, Policy::Dynamic, 1).expect("run");
    assert!(r.steady_efficiency >= 0.97, "{}", r.steady_efficiency);
    assert!(r.plan_changes <= 3, "{}", r.plan_changes);
    let st = run(&s, Policy::Static, 1).expect("run");
    assert!(st.steady_efficiency < 0.2, "{}", st.steady_efficiency);
}

#[test]
fn a_very_slow_node_is_left_out_and_the_job_runs_at_the_best_subsets_speed() {
    let s = Scenario {
        steps: 1200, // 60 decisions: the slow node is re-admitted twice
        ..scenario("slow-node")
    };
    for policy in [Policy::Proportional, Policy::Dynamic, Policy::Hybrid] {
        let r = run(&s, policy, 1).expect("run");
        assert!(
            r.steady_efficiency >= 0.97,
            "{policy}: {}",
            r.steady_efficiency
        );
        assert_eq!(r.final_plan.len(), 5);
        assert_eq!(r.final_plan[4], 0, "{policy}: {}", r.last_reason);
        assert!(r.final_plan[0] >= 1);
        assert!(
            r.last_reason.contains("left out: rank 4"),
            "{}",
            r.last_reason
        );
    }
    // Keeping every rank in, each step waits for the slow node.
    let cfg = heterotrain_balancer::BalancerConfig {
        leave_out_slow_ranks: false,
        ..sim_config(&s, Policy::Dynamic)
    };
    let all = run_with(&s, cfg, 1).expect("run");
    assert!(all.steady_efficiency < 0.93, "{}", all.steady_efficiency);
    assert!(all.final_plan[4] >= 1);
}

#[test]
fn a_rank_stalling_every_exchange_is_left_out_on_the_measured_step() {
    // Its compute fits one sample in the others' step, so the compute
    // models keep it at 1; only the measured step shows the 0.3 s it adds.
    let s = Scenario {
        steps: 1200, // 60 decisions: re-admitted for measurement twice
        ..scenario("slow-comm")
    };
    let kept = run(&s, Policy::Proportional, 1).expect("run");
    assert_eq!(kept.final_plan[4], 1, "{}", kept.last_reason);
    assert!(kept.steady_efficiency < 0.3, "{}", kept.steady_efficiency);
    for policy in [Policy::Dynamic, Policy::Hybrid] {
        let r = run(&s, policy, 1).expect("run");
        assert_eq!(r.final_plan[4], 0, "{policy}: {}", r.last_reason);
        assert!(
            r.steady_efficiency >= 0.97,
            "{policy}: {}",
            r.steady_efficiency
        );
        assert!(
            r.throughput > 3.0 * kept.throughput,
            "{policy}: {} vs {}",
            r.throughput,
            kept.throughput
        );
        assert!(
            r.last_reason.contains("left out: rank 4"),
            "{}",
            r.last_reason
        );
    }
    // Without leaving ranks out, dynamic keeps it at one sample.
    let cfg = heterotrain_balancer::BalancerConfig {
        leave_out_slow_ranks: false,
        ..sim_config(&s, Policy::Dynamic)
    };
    let all = run_with(&s, cfg, 1).expect("run");
    assert_eq!(all.final_plan[4], 1);
    assert!(all.steady_efficiency < 0.3, "{}", all.steady_efficiency);
}

#[test]
fn a_slow_partner_whose_exchange_costs_a_quarter_of_the_step_is_left_out_early() {
    // Two ranks; the slow one (speed 0.05) fits a few samples in the fast
    // one's step, but its share of every exchange adds 80 ms: with the
    // scenario's 30 ms all-reduce the step is about 0.36 s against a
    // predicted compute step of 0.25 s (1.4 ×), below the 2 × that starts a
    // trial among many ranks. Leaving it out leaves one rank and no
    // exchange of its making, so the trial starts on the margin alone.
    let base = scenario("four-rank");
    let s = Scenario {
        ranks: [1.0, 0.05]
            .iter()
            .map(|&v| heterotrain_balancer::sim::SimRank {
                exchange_seconds: if v < 1.0 { 0.08 } else { 0.0 },
                ..heterotrain_balancer::sim::SimRank::with_speed(v, 0.002, 0.010, 1024)
            })
            .collect(),
        global_batch: 128,
        steps: 400,
        ..base
    };
    let r = run(&s, Policy::Dynamic, 1).expect("run");
    assert_eq!(r.final_plan, vec![128, 0], "{}", r.last_reason);
    // Out by the fifth decision, and the rest of the run near the best
    // subset's rate.
    for i in &r.intervals[6..] {
        assert!(i.efficiency >= 0.95, "{i:?}");
    }
}
