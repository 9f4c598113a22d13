//! Helpers the leave-out tests share.
#![allow(dead_code)]

use heterotrain_balancer::{Balancer, BalancerConfig, Decision, Policy, StepModel};

pub fn m(a: f64, c: f64) -> StepModel {
    StepModel {
        fixed_seconds: a,
        per_sample_seconds: c,
    }
}

pub fn config(policy: Policy, global: u32) -> BalancerConfig {
    BalancerConfig {
        policy,
        global_batch_size: global,
        ..BalancerConfig::default()
    }
}

/// A balancer that has seen every rank's start-up profile under `truth`.
pub fn profiled(cfg: BalancerConfig, truth: &[StepModel]) -> Balancer {
    let mut bal = Balancer::new(cfg, truth.len()).expect("valid config");
    for (r, t) in truth.iter().enumerate() {
        let pts: Vec<(u32, f64)> = [1u32, 4, 16, 32]
            .iter()
            .map(|&b| (b, t.predict(b)))
            .collect();
        bal.observe_profile(r, &pts, 1024).expect("profile");
    }
    bal
}

/// `n` steps of every rank that trains under `plan`, at `truth`'s times.
pub fn feed(bal: &mut Balancer, plan: &[u32], truth: &[StepModel], n: usize) {
    for _ in 0..n {
        for (r, t) in truth.iter().enumerate() {
            if plan[r] > 0 {
                bal.observe_step(r, plan[r], t.predict(plan[r]))
                    .expect("valid sample");
            }
        }
    }
}

pub fn plan_of(d: &Decision) -> Vec<u32> {
    d.plan.clone().expect("a new plan")
}

pub fn sum(p: &[u32]) -> u32 {
    p.iter().sum()
}

/// `n` steps of every rank that trains under `plan`: each reports its
/// compute time under `truth` and the whole step it saw, the slowest
/// compute plus `exchange(plan)` (time no compute model shows).
pub fn feed_measured(
    bal: &mut Balancer,
    plan: &[u32],
    truth: &[StepModel],
    n: usize,
    exchange: &dyn Fn(&[u32]) -> f64,
) {
    let step = truth
        .iter()
        .zip(plan)
        .filter(|(_, &b)| b > 0)
        .map(|(t, &b)| t.predict(b))
        .fold(0.0, f64::max)
        + exchange(plan);
    for _ in 0..n {
        for (r, t) in truth.iter().enumerate() {
            if plan[r] > 0 {
                bal.observe_step(r, plan[r], t.predict(plan[r]))
                    .expect("valid sample");
                bal.observe_step_time(r, plan[r], step)
                    .expect("valid step time");
            }
        }
    }
}
