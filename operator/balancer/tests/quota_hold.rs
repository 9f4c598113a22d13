//! A rank that spends its whole CPU quota gets no more samples: its
//! compute, measured while it runs between throttled periods, says it could
//! take more, but it has no idle time left to run them in.

mod common;

use common::{config, feed_measured, m, profiled, sum};
use heterotrain_balancer::{Balancer, Policy, StepModel};

/// Two ranks of the same compute speed.
fn equal() -> Vec<StepModel> {
    vec![m(0.002, 0.001), m(0.002, 0.001)]
}

/// Decisions from `plan` with 20 measured steps before each and, before
/// each, the given share of each rank's CPU quota used (`None`: no quota).
fn run(
    policy: Policy,
    plan: &[u32],
    quota: [Option<f64>; 2],
    rounds: usize,
) -> Vec<(String, Vec<u32>)> {
    let mut bal: Balancer = profiled(config(policy, 128), &equal());
    let mut plan = plan.to_vec();
    let mut out = Vec::new();
    for _ in 0..rounds {
        feed_measured(&mut bal, &plan, &equal(), 20, &|_: &[u32]| 0.004);
        for (r, u) in quota.iter().enumerate() {
            if let Some(u) = u {
                bal.observe_quota_use(r, *u).expect("valid ratio");
            }
        }
        let d = bal.decide(&plan).expect("decide");
        plan = d.batches_or(&plan).to_vec();
        assert_eq!(sum(&plan), 128, "{}", d.reason);
        out.push((d.reason.clone(), plan.clone()));
    }
    out
}

#[test]
fn a_rank_that_used_its_cpu_quota_is_held_at_its_batch() {
    for policy in [Policy::Dynamic, Policy::Hybrid] {
        // Without a quota, or with one it uses little of, rank 1 grows
        // from 32 towards the equal split its compute model asks for.
        for quota in [[None, None], [Some(0.5), Some(0.4)]] {
            let rounds = run(policy, &[96, 32], quota, 3);
            let last = &rounds.last().expect("rounds").1;
            assert!(last[1] > 48, "{policy} {quota:?}: {rounds:#?}");
        }
        // Using 85% of it at 32 samples, rank 1 may take ⌈32 / 0.85⌉ = 38
        // in one decision: the samples its quota has room for.
        let rounds = run(policy, &[96, 32], [Some(0.5), Some(0.85)], 1);
        assert_eq!(rounds[0].1, [90, 38], "{policy}: {}", rounds[0].0);
        // Spending 97% of it, rank 1 stays at 32, and the decisions say why.
        let rounds = run(policy, &[96, 32], [Some(0.5), Some(0.97)], 3);
        for (reason, plan) in &rounds {
            assert_eq!(plan, &[96, 32], "{policy}: {reason}");
        }
        assert!(
            rounds[0].0.contains(
                "held by their CPU quota (more samples would lengthen the step whatever their compute model predicts): rank 1 at 32 (97% of its quota used)"
            ),
            "{policy}: {}",
            rounds[0].0
        );
    }
}

#[test]
fn a_saturated_rank_may_still_shrink() {
    // Rank 0 spends its quota at 96 samples; rank 1 does not: the split
    // moves samples from rank 0 to rank 1, and no rank is said to be held.
    let rounds = run(Policy::Dynamic, &[96, 32], [Some(0.97), Some(0.5)], 3);
    let last = &rounds.last().expect("rounds").1;
    assert!(last[0] < 80 && last[1] > 48, "{rounds:#?}");
    for (reason, _) in &rounds {
        assert!(!reason.contains("held by their CPU quota"), "{reason}");
    }
}

#[test]
fn the_cap_can_be_turned_off() {
    let cfg = heterotrain_balancer::BalancerConfig {
        cap_quota_bound_ranks: false,
        ..config(Policy::Dynamic, 128)
    };
    let mut bal: Balancer = profiled(cfg, &equal());
    let mut plan = vec![96, 32];
    for _ in 0..3 {
        feed_measured(&mut bal, &plan, &equal(), 20, &|_: &[u32]| 0.004);
        bal.observe_quota_use(1, 0.97).expect("valid ratio");
        let d = bal.decide(&plan).expect("decide");
        assert!(
            !d.reason.contains("held by their CPU quota"),
            "{}",
            d.reason
        );
        plan = d.batches_or(&plan).to_vec();
    }
    assert!(plan[1] > 48, "{plan:?}");
}

#[test]
fn the_static_and_profile_policies_ignore_quota_use() {
    // Proportional plans from the start-up profiles alone: equal speeds,
    // equal split, whatever the quota use.
    let rounds = run(Policy::Proportional, &[96, 32], [Some(0.5), Some(0.97)], 2);
    assert_eq!(
        rounds.last().expect("rounds").1,
        vec![64, 64],
        "{rounds:#?}"
    );
}
