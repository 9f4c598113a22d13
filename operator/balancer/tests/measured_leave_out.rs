//! Leaving ranks out on the measured step: a rank whose compute looks
//! cheap but whose presence stalls every step (its share of the exchange
//! on a throttled CPU) is found by a leave-out trial; a trial that measures
//! worse brings the rank back and waits out a doubling back-off.

mod common;

use common::{config, feed_measured, m, profiled, sum};
use heterotrain_balancer::{
    Balancer, BalancerConfig, Decision, Policy, StepModel, READMIT_COST_BUDGET,
};

/// Three ranks of the same speed and rank 3, cheap to compute (its model
/// keeps it in with a small batch).
fn truth() -> Vec<StepModel> {
    vec![
        m(0.01, 0.001),
        m(0.01, 0.001),
        m(0.01, 0.001),
        m(0.005, 0.002),
    ]
}

/// The exchange: 10 ms, plus 0.3 s whenever rank 3 takes part.
fn stalled_by_rank_3(plan: &[u32]) -> f64 {
    0.01 + if plan[3] > 0 { 0.3 } else { 0.0 }
}

fn with_readmit(policy: Policy, readmit: u32) -> BalancerConfig {
    BalancerConfig {
        readmit_after_decisions: readmit,
        ..config(policy, 120)
    }
}

/// `rounds` decisions from the equal split, 20 measured steps before each;
/// the decisions and the plan each one left running.
fn run(
    bal: &mut Balancer,
    rounds: usize,
    exchange: &dyn Fn(&[u32]) -> f64,
) -> Vec<(Decision, Vec<u32>)> {
    let truth = truth();
    let mut plan = vec![30; 4];
    let mut out = Vec::new();
    for _ in 0..rounds {
        feed_measured(bal, &plan, &truth, 20, exchange);
        let d = bal.decide(&plan).expect("decide");
        plan = d.batches_or(&plan).to_vec();
        assert_eq!(sum(&plan), 120, "{}", d.reason);
        assert!(plan[0] >= 1);
        out.push((d, plan.clone()));
    }
    out
}

fn trial_rounds(rounds: &[(Decision, Vec<u32>)]) -> Vec<usize> {
    rounds
        .iter()
        .enumerate()
        .filter(|(_, (d, _))| d.reason.contains("leave-out trial: rank 3"))
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn a_rank_whose_presence_stalls_the_step_is_left_out_after_a_trial() {
    let mut bal = profiled(with_readmit(Policy::Dynamic, 20), &truth());
    let rounds = run(&mut bal, 7, &stalled_by_rank_3);
    // 1: the compute models keep rank 3 in with a small batch.
    let (d, p) = &rounds[0];
    assert!(p[3] >= 1 && p[3] < 30, "{p:?}: {}", d.reason);
    assert_eq!(
        d.measured_step_seconds, 0.0,
        "the equal split was not decided here"
    );
    // 2: the first interval at that plan: the excess must show twice.
    let (d, p) = &rounds[1];
    assert_eq!(p, &rounds[0].1, "{}", d.reason);
    assert!(
        d.reason
            .contains("leave-out trial of rank 3 waits for a second interval at this plan"),
        "{}",
        d.reason
    );
    // 3: the step measured with it is far above the predicted compute
    // step, again.
    let (d, p) = &rounds[2];
    assert!(d.measured_step_seconds > 0.3, "{d:?}");
    assert!(d.measured_step_seconds > 5.0 * d.current_predicted_step_seconds);
    assert_eq!(p, &vec![40, 40, 40, 0], "{}", d.reason);
    assert!(
        d.reason.contains("leave-out trial: rank 3 (batch")
            && d.reason.contains("the slowest per sample")
            && d.reason
                .contains("it stays out only if the step measured without it is shorter by"),
        "{}",
        d.reason
    );
    // 4: measured without it, 0.05 s: it stays out.
    let (d, p) = &rounds[3];
    assert_eq!(p, &vec![40, 40, 40, 0], "{}", d.reason);
    assert_eq!(d.left_out, vec![3]);
    assert!(
        d.reason.contains("rank 3 stays left out after its leave-out trial: the step measured without it, 0.0600 s, is 83.1% shorter than the 0.354 s measured with it (it needed leaveOutMarginPercent 10%): its presence costs about 0.294 s/step that its compute does not show"),
        "{}",
        d.reason
    );
    for (d, p) in &rounds[4..] {
        assert_eq!(p[3], 0, "{}", d.reason);
        assert!(d.plan.is_none(), "{}", d.reason);
        assert!(d.reason.contains("left out: rank 3"), "{}", d.reason);
    }
}

#[test]
fn without_step_times_or_with_leave_out_off_the_rank_stays_in() {
    let mut cfg = with_readmit(Policy::Dynamic, 20);
    cfg.leave_out_slow_ranks = false;
    let mut bal = profiled(cfg, &truth());
    let rounds = run(&mut bal, 10, &stalled_by_rank_3);
    assert!(rounds.iter().all(|(_, p)| p[3] >= 1));
    // Profiles only (proportional) never measure a step: no trial either.
    let mut bal = profiled(with_readmit(Policy::Proportional, 20), &truth());
    let rounds = run(&mut bal, 10, &stalled_by_rank_3);
    assert!(rounds.iter().all(|(_, p)| p[3] >= 1));
    assert!(trial_rounds(&rounds).is_empty());
}

#[test]
fn a_trial_that_measures_worse_brings_the_rank_back_and_waits_out_a_doubling_back_off() {
    // A slow exchange whoever takes part: leaving rank 3 out only moves its
    // samples to the others.
    let slow_exchange = |_: &[u32]| 0.3;
    let mut bal = profiled(with_readmit(Policy::Hybrid, 3), &truth());
    let rounds = run(&mut bal, 16, &slow_exchange);
    let trials = trial_rounds(&rounds);
    // Trials at 2 (the excess measured over two intervals), then 3
    // decisions after the loss (2 + 1 + 3 = 6), then 6 (6 + 1 + 6 = 13):
    // the back-off doubles.
    assert_eq!(
        trials,
        vec![2, 6, 13],
        "{:#?}",
        rounds.iter().map(|r| &r.0.reason).collect::<Vec<_>>()
    );
    for &t in &trials {
        assert_eq!(rounds[t].1[3], 0);
        let (d, p) = &rounds[t + 1];
        assert!(p[3] >= 1, "back after the trial: {p:?}");
        assert!(
            d.reason
                .contains("rank 3 back after its leave-out trial: the step measured without it")
                && d.reason
                    .contains("measured with it by leaveOutMarginPercent 10%"),
            "{}",
            d.reason
        );
    }
    assert!(rounds[3]
        .0
        .reason
        .contains("no new trial for it before 3 decisions"));
    assert!(rounds[7]
        .0
        .reason
        .contains("no new trial for it before 6 decisions"));
    // Only the trials leave it out.
    for (i, (d, p)) in rounds.iter().enumerate() {
        assert_eq!(p[3] == 0, trials.contains(&i), "{i}: {}", d.reason);
    }
}

#[test]
fn a_rank_whose_presence_measures_cheaper_is_never_left_out() {
    // A healthy job: the measured step is the compute step plus a short
    // exchange, well below twice the prediction.
    let mut bal = profiled(with_readmit(Policy::Dynamic, 2), &truth());
    let rounds = run(&mut bal, 30, &|_: &[u32]| 0.01);
    for (d, p) in &rounds {
        assert!(p[3] >= 1, "{p:?}: {}", d.reason);
        assert!(d.left_out.is_empty());
        assert!(!d.reason.contains("leave-out trial"), "{}", d.reason);
    }
    assert!(rounds[5].0.measured_step_seconds > 0.0);
}

#[test]
fn a_rank_left_out_on_measurement_is_measured_again_and_stays_in_once_it_is_cheap() {
    let mut bal = profiled(with_readmit(Policy::Dynamic, 3), &truth());
    let rounds = run(&mut bal, 8, &stalled_by_rank_3);
    // Out at 2 (trial) and 3 (verdict); back for measurement after 3
    // decisions out (at 5), out again at 6. Its one decision back measured
    // the step 5.9× the step without it (0.354 s against 0.0600 s): 4.9
    // decisions' worth of training lost, so the next re-admission waits
    // 4.9 / 5% = 98 decisions, past the doubled back-off's 6.
    let outs: Vec<bool> = rounds.iter().map(|(_, p)| p[3] == 0).collect();
    assert_eq!(outs, [false, false, true, true, true, false, true, true]);
    let d = &rounds[5].0;
    assert!(
        d.reason.contains("rank 3 re-admitted with batch"),
        "{}",
        d.reason
    );
    let d = &rounds[6].0;
    assert!(
        d.reason
            .contains("rank 3 left out again: the step measured without it, 0.0600 s, is still shorter than the 0.3")
            && d.reason.contains("next re-admission after 98 decisions (its re-admission ran 1 decision(s) at a measured step 5.9× the 0.0600 s without it"),
        "{}",
        d.reason
    );
    // The device recovered: when next measured with it, it stays in.
    let mut plan = rounds[7].1.clone();
    let mut stayed = None;
    for i in 0..105 {
        feed_measured(&mut bal, &plan, &truth(), 20, &|_: &[u32]| 0.01);
        let d = bal.decide(&plan).expect("decide");
        plan = d.batches_or(&plan).to_vec();
        if d.reason
            .contains("rank 3 stays in: the step measured without it, 0.0600 s, is not shorter than the 0.0540 s measured with it now by")
        {
            stayed = Some(i);
        }
    }
    assert!(stayed.is_some(), "{plan:?}");
    assert!(plan[3] >= 1, "{plan:?}");
}

/// Four ranks at 1, 0.7, 0.4 and 0.25 of the fastest one's speed (per
/// sample), B 128, as the bench's four-node scenario.
fn four_speeds() -> Vec<StepModel> {
    vec![
        m(0.002, 0.0007),
        m(0.002, 0.001),
        m(0.002, 0.0018),
        m(0.002, 0.0036),
    ]
}

/// `rounds` decisions from the equal split (B 128); before each, 20
/// measured steps and, when given, each rank's share of its CPU quota used.
fn run_four(
    bal: &mut Balancer,
    rounds: usize,
    exchange: &dyn Fn(&[u32]) -> f64,
    quota_use: Option<[f64; 4]>,
) -> Vec<(Decision, Vec<u32>)> {
    let truth = four_speeds();
    let mut plan = vec![32; 4];
    let mut out = Vec::new();
    for _ in 0..rounds {
        feed_measured(bal, &plan, &truth, 20, exchange);
        if let Some(q) = quota_use {
            for (r, &u) in q.iter().enumerate() {
                if plan[r] > 0 {
                    bal.observe_quota_use(r, u).expect("valid ratio");
                }
            }
        }
        let d = bal.decide(&plan).expect("decide");
        plan = d.batches_or(&plan).to_vec();
        assert_eq!(sum(&plan), 128, "{}", d.reason);
        out.push((d, plan.clone()));
    }
    out
}

/// The slowest rank's own part of the exchange, run on its spent quota,
/// ends every step 15 ms late: the measured step stays under 2× the
/// predicted compute.
fn late_by_rank_3(p: &[u32]) -> f64 {
    0.004 + if p[3] > 0 { 0.015 } else { 0.0 }
}

fn four_config() -> BalancerConfig {
    BalancerConfig {
        readmit_after_decisions: 20,
        ..config(Policy::Dynamic, 128)
    }
}

/// Eight decisions of the four ranks with rank 3 costing 15 ms a step and
/// each rank's `quota` use: rank 3 is tried (on a step under twice the
/// predicted compute, at 11 of 128 samples, its trial's reason naming each
/// of `why`), measured faster without, and stays out.
fn tried_and_left_out(quota: [f64; 4], why: &[&str]) {
    let mut bal = profiled(four_config(), &four_speeds());
    let rounds = run_four(&mut bal, 8, &late_by_rank_3, Some(quota));
    let reasons = || rounds.iter().map(|r| &r.0.reason).collect::<Vec<_>>();
    let first = rounds
        .iter()
        .position(|(d, _)| d.reason.contains("leave-out trial: rank 3"))
        .unwrap_or_else(|| panic!("no trial: {:#?}", reasons()));
    let (d, p) = &rounds[first];
    assert!(
        d.measured_step_seconds < 2.0 * d.current_predicted_step_seconds,
        "{d:?}"
    );
    assert_eq!(p[3], 0);
    for w in why.iter().chain(&[
        "(batch 11 of 128",
        "shorter by 9.4% (the most its samples can save, under leaveOutMarginPercent 10%)",
    ]) {
        assert!(d.reason.contains(w), "{w}: {}", d.reason);
    }
    // Measured faster without it: it stays out.
    for (d, p) in &rounds[first..] {
        assert_eq!(p[3], 0, "{}", d.reason);
    }
    assert!(
        rounds[first + 1].0.reason.contains("rank 3 stays left out"),
        "{:#?}",
        reasons()
    );
}

#[test]
fn a_small_rank_saturated_on_its_cpu_quota_is_tried_and_left_out() {
    tried_and_left_out([0.6, 0.7, 0.8, 0.97], &["it used 97% of its CPU quota"]);
}

/// A small rank on a CPU quota (80% used, not saturated) whose samples can
/// save less than `leaveOutMarginPercent` costs at most that share of the
/// step while on trial, so a step measured longer than the compute step
/// predicted without it by as much starts one, without a doubled step; as
/// rank 3 costs 15 ms of each step, it stays out. Without a quota reading
/// the same job tries no rank.
#[test]
fn a_small_rank_worth_less_than_the_margin_is_tried_on_the_measured_step() {
    tried_and_left_out(
        [0.6, 0.7, 0.8, 0.8],
        &["its samples can save at most 9.4% of the step"],
    );
    let mut bal = profiled(four_config(), &four_speeds());
    for (d, p) in run_four(&mut bal, 8, &late_by_rank_3, None) {
        assert!(p[3] >= 1, "{p:?}: {}", d.reason);
        assert!(!d.reason.contains("leave-out trial"), "{}", d.reason);
    }
}

/// On CPU quotas the step moves by 10% or more between intervals at one
/// plan. A trial of a rank on a quota worth less than the margin, on
/// either ground, needs two intervals at the plan but not a steady step
/// (it costs at most its share); a quota-saturation trial of a rank worth
/// more still waits for one.
#[test]
fn a_small_ranks_trial_does_not_wait_for_a_steady_step() {
    let flip = std::cell::Cell::new(false);
    // Rank 3's cost, 1× and 1.6× in turn: the step moves about 18%.
    let unsteady = |p: &[u32]| {
        flip.set(!flip.get());
        late_by_rank_3(p) * if flip.get() { 1.6 } else { 1.0 }
    };
    for (q3, ground) in [
        (0.8, "its samples can save at most 9.4% of the step"),
        (0.97, "it used 97% of its CPU quota"),
    ] {
        let mut bal = profiled(four_config(), &four_speeds());
        let rounds = run_four(&mut bal, 8, &unsteady, Some([0.6, 0.7, 0.8, q3]));
        assert!(
            rounds.iter().any(|(d, p)| p[3] == 0
                && d.reason.contains("leave-out trial: rank 3")
                && d.reason.contains(ground)),
            "{:#?}",
            rounds.iter().map(|r| &r.0.reason).collect::<Vec<_>>()
        );
    }
    let cfg = BalancerConfig {
        leave_out_margin_percent: 5,
        ..four_config()
    };
    let mut bal = profiled(cfg, &four_speeds());
    let rounds = run_four(&mut bal, 8, &unsteady, Some([0.6, 0.7, 0.8, 0.97]));
    for (d, p) in &rounds {
        assert!(p[3] >= 1, "{p:?}: {}", d.reason);
    }
    assert!(
        rounds.iter().any(|(d, _)| d
            .reason
            .contains("leave-out trial of rank 3 waits: the step measured over this interval")),
        "{:#?}",
        rounds.iter().map(|r| &r.0.reason).collect::<Vec<_>>()
    );
}

/// With `leaveOutMarginPercent` 5%, rank 3's 11 samples of 128 can save
/// more than the margin (9.4%): without quota saturation a step under
/// twice the predicted compute step tries no rank.
#[test]
fn without_quota_saturation_a_step_under_twice_the_compute_tries_no_rank_worth_the_margin() {
    for (quota, why) in [
        (None, "no reading of its CPU quota use"),
        (Some([0.6, 0.7, 0.8, 0.8]), "it used 80% of its CPU quota"),
    ] {
        let cfg = BalancerConfig {
            leave_out_margin_percent: 5,
            ..four_config()
        };
        let mut bal = profiled(cfg, &four_speeds());
        let rounds = run_four(&mut bal, 12, &late_by_rank_3, quota);
        for (d, p) in &rounds {
            assert!(p[3] >= 1, "{quota:?} {p:?}: {}", d.reason);
            assert!(!d.reason.contains("leave-out trial"), "{}", d.reason);
        }
        // The decisions that keep the small rank say why it is not tried:
        // the step's excess and its quota use, each against its threshold.
        let held: Vec<_> = rounds
            .iter()
            .filter(|(d, _)| d.reason.contains("no trial leaving rank 3 out yet"))
            .collect();
        assert!(
            !held.is_empty(),
            "{quota:?}: {:#?}",
            rounds.iter().map(|r| &r.0.reason).collect::<Vec<_>>()
        );
        for (d, _) in held {
            assert!(d.reason.contains(why), "{}", d.reason);
            assert!(
                d.reason.contains("its samples can save up to 9.4% of the step (a trial on that ground needs a CPU quota and under leaveOutMarginPercent 5%)"),
                "{}",
                d.reason
            );
            assert!(
                d.reason.contains("(a trial on the step needs 2×)"),
                "{}",
                d.reason
            );
            let ratio = d.measured_step_seconds / d.current_predicted_step_seconds;
            assert!(
                d.reason
                    .contains(&format!("is {ratio:.2}× the predicted compute step")),
                "{ratio}: {}",
                d.reason
            );
        }
    }
}

#[test]
fn a_saturated_rank_with_a_large_share_needs_the_excess() {
    // Every rank saturated (a gang of quota-bound ranks), but rank 3 trains
    // more than half an equal share: no trial on saturation alone.
    let even = vec![m(0.002, 0.001); 4];
    let mut bal = profiled(four_config(), &even);
    let mut plan = vec![32; 4];
    for _ in 0..10 {
        feed_measured(&mut bal, &plan, &even, 20, &|_: &[u32]| 0.01);
        for r in 0..4 {
            bal.observe_quota_use(r, 1.0).expect("valid ratio");
        }
        let d = bal.decide(&plan).expect("decide");
        assert!(!d.reason.contains("leave-out trial"), "{}", d.reason);
        plan = d.batches_or(&plan).to_vec();
        assert!(plan.iter().all(|&b| b > 0), "{plan:?}");
    }
    assert!(bal.observe_quota_use(0, f64::NAN).is_err());
    assert!(bal.observe_quota_use(0, -0.1).is_err());
    assert!(bal.observe_quota_use(9, 0.5).is_err());
}

#[test]
fn step_times_of_another_plan_are_ignored() {
    let mut bal = profiled(with_readmit(Policy::Dynamic, 20), &truth());
    common::feed(&mut bal, &[30; 4], &truth(), 20);
    let d = bal.decide(&[30; 4]).expect("decide");
    let plan = d.batches_or(&[30; 4]).to_vec();
    assert_ne!(plan, vec![30; 4]);
    // The ranks still run the equal split: their step times do not count.
    feed_measured(&mut bal, &[30; 4], &truth(), 20, &stalled_by_rank_3);
    let d = bal.decide(&plan).expect("decide");
    assert_eq!(d.measured_step_seconds, 0.0, "{d:?}");
    assert!(!d.reason.contains("leave-out trial"), "{}", d.reason);
    assert!(bal.observe_step_time(0, 0, 0.1).is_err());
    assert!(bal.observe_step_time(0, 4, f64::NAN).is_err());
    assert!(bal.observe_step_time(9, 4, 0.1).is_err());
}

mod props {
    use super::common::{config, feed_measured, m, profiled};
    use heterotrain_balancer::{BalancerConfig, Policy};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the ranks and whatever they cost beyond compute, every
        /// plan sums to B, rank 0 trains, left-out ranks get 0, and no
        /// trial runs beside another.
        #[test]
        fn plans_keep_the_contract_under_measured_trials(
            ranks in prop::collection::vec((0.0..0.05f64, 0.0005..0.02f64, 0.0..0.5f64), 2..6),
            global in 8u32..200,
            readmit in 1u32..4,
            hybrid in any::<bool>(),
        ) {
            let truth: Vec<_> = ranks.iter().map(|&(a, c, _)| m(a, c)).collect();
            let extra: Vec<f64> = ranks.iter().map(|r| r.2).collect();
            let n = truth.len() as u32;
            prop_assume!(global >= n);
            let policy = if hybrid { Policy::Hybrid } else { Policy::Dynamic };
            let cfg = BalancerConfig { readmit_after_decisions: readmit, ..config(policy, global) };
            let mut bal = profiled(cfg, &truth);
            let exchange = |p: &[u32]| {
                p.iter().zip(&extra).filter(|(&b, _)| b > 0).map(|(_, &e)| e).fold(0.0, f64::max)
            };
            let mut plan = vec![global / n; truth.len()];
            plan[0] += global % n;
            for _ in 0..25 {
                feed_measured(&mut bal, &plan, &truth, 5, &exchange);
                let d = bal.decide(&plan).expect("decide");
                plan = d.batches_or(&plan).to_vec();
                prop_assert_eq!(plan.iter().sum::<u32>(), global);
                prop_assert!(plan[0] >= 1);
                let zeros: Vec<usize> = (0..plan.len()).filter(|&r| plan[r] == 0).collect();
                prop_assert_eq!(&d.left_out, &zeros);
                prop_assert!(d.reason.matches("leave-out trial: rank").count() <= 1, "{}", d.reason);
            }
        }
    }
}

/// The failure this guards against: rank 0 on the slow node, rank 1 fast,
/// and every exchange slow (a busy shared machine). The slowest rank per
/// sample is rank 0, which never leaves: no trial may put the *fast* rank
/// out, and the split settles with the fast rank's batch well above the
/// slow one's.
#[test]
fn a_rank_faster_than_rank_zero_is_never_tried() {
    let truth = vec![m(0.002, 0.003), m(0.002, 0.001)];
    let mut bal = Balancer::new(config(Policy::Dynamic, 64), 2).expect("balancer");
    let mut plan = vec![32, 32];
    for round in 0..30 {
        feed_measured(&mut bal, &plan, &truth, 20, &|_: &[u32]| 0.3);
        let d = bal.decide(&plan).expect("decide");
        assert!(
            !d.reason.contains("leave-out trial"),
            "round {round}: {}",
            d.reason
        );
        plan = d.batches_or(&plan).to_vec();
        assert!(plan.iter().all(|&b| b > 0), "round {round}: {plan:?}");
    }
    assert!(plan[1] >= 2 * plan[0], "{plan:?}");
}

/// The bench's throttle: two ranks (1 : 0.33, B 128), the fast rank 0
/// slowed 2.5× halfway through a decision interval, the operator's samples
/// one a second (each the mean of many steps), so the live model has not
/// re-fitted yet at the next decision. The step measured over that
/// interval is longer than the (stale) models predict because rank 0's
/// compute grew, which its own measured compute shows: no leave-out trial
/// of rank 1 (the rank that did *not* slow down), and once rank 0's model
/// has caught up the split moves samples to rank 1.
#[test]
fn a_slowdown_the_models_have_not_caught_up_with_starts_no_trial() {
    let before = vec![m(0.005, 0.0006), m(0.005, 0.0018)];
    let throttled = vec![m(0.0125, 0.0015), before[1]];
    let exchange = |_: &[u32]| 0.004;
    let mut bal = profiled(config(Policy::Dynamic, 128), &before);
    let mut plan = vec![64, 64];
    for _ in 0..6 {
        feed_measured(&mut bal, &plan, &before, 2, &exchange);
        let d = bal.decide(&plan).expect("decide");
        assert!(!d.reason.contains("leave-out trial: rank"), "{}", d.reason);
        plan = d.batches_or(&plan).to_vec();
    }
    assert!(plan[0] > 80 && plan[1] > 0, "settled: {plan:?}");
    let settled = plan.clone();
    // One sample before the throttle, one after it.
    feed_measured(&mut bal, &plan, &before, 1, &exchange);
    feed_measured(&mut bal, &plan, &throttled, 1, &exchange);
    let d = bal.decide(&plan).expect("decide");
    assert!(
        d.measured_step_seconds > 1.15 * d.current_predicted_step_seconds,
        "the interval's step runs over the stale prediction: {d:?}"
    );
    assert!(!d.reason.contains("leave-out trial: rank"), "{}", d.reason);
    assert!(
        d.reason
            .contains("leave-out trials wait: rank 0's compute over the interval"),
        "{}",
        d.reason
    );
    plan = d.batches_or(&plan).to_vec();
    assert!(plan[1] > 0, "{plan:?}: {}", d.reason);
    // Throttled from now on: the split follows rank 0's new speed.
    let mut reasons = Vec::new();
    for _ in 0..6 {
        feed_measured(&mut bal, &plan, &throttled, 2, &exchange);
        let d = bal.decide(&plan).expect("decide");
        assert!(plan[1] > 0, "{plan:?}: {}", d.reason);
        plan = d.batches_or(&plan).to_vec();
        reasons.push(d.reason);
    }
    assert!(
        plan[1] > settled[1] + 10,
        "{plan:?} after {settled:?}: {reasons:#?}"
    );
}

/// A step that moved since the interval before (at the same plan) starts no
/// trial: the excess must hold over two intervals in a row. Here rank 3's
/// share of the exchange turns slow mid-run: one decision notes the jump,
/// the next tries it.
#[test]
fn a_step_that_just_moved_waits_an_interval_before_a_trial() {
    let mut bal = profiled(with_readmit(Policy::Dynamic, 20), &truth());
    let healthy = run(&mut bal, 4, &|_: &[u32]| 0.01);
    let mut plan = healthy.last().expect("rounds").1.clone();
    assert!(plan[3] >= 1, "{plan:?}");
    let mut reasons = Vec::new();
    for _ in 0..2 {
        feed_measured(&mut bal, &plan, &truth(), 20, &stalled_by_rank_3);
        let d = bal.decide(&plan).expect("decide");
        plan = d.batches_or(&plan).to_vec();
        reasons.push((d.reason, plan.clone()));
    }
    let (why, p) = &reasons[0];
    assert!(p[3] >= 1, "{why}");
    assert!(
        why.contains("leave-out trial of rank 3 waits: the step measured over this interval, 0.354 s, moved more than leaveOutMarginPercent 10% from the 0.0540 s of the interval before at the same plan"),
        "{why}"
    );
    let (why, p) = &reasons[1];
    assert_eq!(p[3], 0, "{why}");
    assert!(why.contains("leave-out trial: rank 3"), "{why}");
}

/// On CPU quotas the live models are noisy, so the noise margin keeps a
/// re-split from chasing gains of a few percent: the split stays where it
/// is with a predicted gain between minGainPercent and minGainPercent plus
/// the margin. That split is settled — it will not move — so a trial of a
/// small rank saturated on its quota still starts. (It once waited for a
/// predicted gain under minGainPercent alone: in a 4-node bench, 18 of
/// the 38 decisions that kept the split could start no trial.)
#[test]
fn a_split_held_by_the_noise_margin_is_settled_for_a_trial() {
    let mut truth = four_speeds();
    // Under the default 10% margin rank 3's 11 samples would be tried on
    // the measured step alone, before the slowdown (see
    // a_small_rank_worth_less_than_the_margin_is_tried_on_the_measured_step).
    let cfg = BalancerConfig {
        leave_out_margin_percent: 5,
        ..four_config()
    };
    let mut bal = profiled(cfg, &truth);
    let mut plan = vec![32; 4];
    let (mut held, mut trial) = (None, None);
    for round in 0..24 {
        if round == 6 {
            // Rank 0 slows by 15%: a re-split would gain about 7%.
            truth[0] = m(0.0023, 0.000805);
        }
        let step = (0..4)
            .filter(|&r| plan[r] > 0)
            .map(|r| truth[r].predict(plan[r]))
            .fold(0.0, f64::max)
            + late_by_rank_3(&plan);
        // Compute times 10% either side of the truth, alternately.
        for i in 0..20 {
            let jitter = if i % 2 == 0 { 0.9 } else { 1.1 };
            for r in (0..4).filter(|&r| plan[r] > 0) {
                let t = truth[r].predict(plan[r]) * jitter;
                bal.observe_step(r, plan[r], t).expect("valid sample");
                bal.observe_step_time(r, plan[r], step).expect("valid step");
            }
        }
        // Rank 3 saturates its quota from the slowdown on (before it, no
        // trial: the split settles first); the others have room on theirs
        // (a rank's quota caps its growth at batch / share used).
        let q3 = if round >= 6 { 0.97 } else { 0.8 };
        for (r, u) in [0.3, 0.35, 0.4, q3].into_iter().enumerate() {
            if plan[r] > 0 {
                bal.observe_quota_use(r, u).expect("valid ratio");
            }
        }
        let d = bal.decide(&plan).expect("decide");
        let kept_gain = d
            .reason
            .split("predicted gain ")
            .nth(1)
            .and_then(|s| s.split('%').next())
            .and_then(|g| g.parse::<f64>().ok())
            .filter(|_| d.reason.contains("noise margin; keeping the current plan"));
        if kept_gain.is_some_and(|g| g >= 5.0) && round >= 6 {
            held.get_or_insert(round);
        }
        if d.reason.contains("leave-out trial: rank 3") {
            trial.get_or_insert(round);
        }
        plan = d.batches_or(&plan).to_vec();
        assert_eq!(sum(&plan), 128, "{}", d.reason);
    }
    let held = held.expect("the margin held a gain of 5% or more after the slowdown");
    assert!(
        trial.is_some_and(|t| t > held),
        "held by the margin from round {held}, trial {trial:?}"
    );
}

/// One fast rank and one whose presence costs a second of exchange every
/// step (a CPU rank beside an accelerator, its share of each exchange
/// through host memory): each re-admission's measured cost spaces the next
/// one, so that over a long run the re-admissions cost about
/// `READMIT_COST_BUDGET` of the time, not the doubling back-off's 25 %.
#[test]
fn re_admissions_of_a_costly_rank_are_spaced_by_their_measured_cost() {
    let truth = vec![m(0.001, 0.0001), m(0.02, 0.002)];
    let exchange = |p: &[u32]| 0.001 + if p[1] > 0 { 1.0 } else { 0.0 };
    let step = |p: &[u32]| {
        truth
            .iter()
            .zip(p)
            .filter(|(_, &b)| b > 0)
            .map(|(t, &b)| t.predict(b))
            .fold(0.0, f64::max)
            + exchange(p)
    };
    let cfg = BalancerConfig {
        readmit_after_decisions: 20,
        ..config(Policy::Dynamic, 256)
    };
    let mut bal = profiled(cfg, &truth);
    let mut plan = vec![128, 128];
    let best = step(&[256, 0]);
    // Seconds spent and the best subset's seconds for the same decision
    // intervals (20 steps each), from the first leave-out on.
    let (mut spent, mut ideal) = (0.0, 0.0);
    let (mut first_out, mut readmitted, mut spaced) = (None, Vec::new(), Vec::new());
    for i in 0..2000 {
        feed_measured(&mut bal, &plan, &truth, 20, &exchange);
        if first_out.is_some() {
            spent += step(&plan);
            ideal += best;
        }
        let d = bal.decide(&plan).expect("decide");
        let next = d.batches_or(&plan).to_vec();
        assert_eq!(sum(&next), 256, "{}", d.reason);
        if first_out.is_none() && next[1] == 0 {
            first_out = Some(i);
        }
        if plan[1] == 0 && next[1] > 0 {
            readmitted.push(i);
        }
        if d.reason.contains("re-admissions are spaced") {
            spaced.push(d.reason.clone());
        }
        plan = next;
    }
    assert!(first_out.is_some_and(|i| i < 5), "{first_out:?}");
    let overhead = spent / ideal - 1.0;
    assert!(
        overhead < 2.0 * READMIT_COST_BUDGET,
        "{:.1}% over the best subset, re-admitted at {readmitted:?}",
        100.0 * overhead
    );
    // It is still measured again now and then, and the reason says why it
    // waits longer than the back-off.
    assert!(readmitted.len() >= 2, "{readmitted:?}");
    assert!(!spaced.is_empty(), "{readmitted:?}");
    let ratio = step(&[255, 1]) / best;
    assert!(
        spaced[0].contains(&format!("at a measured step {ratio:.1}× the")),
        "{ratio}: {}",
        spaced[0]
    );
}
