//! Behaviour of the stateful balancer: policies, hysteresis, damping,
//! stragglers, staleness, errors and reasons.

use heterotrain_balancer::{
    spread_weight, Balancer, BalancerConfig, BalancerError, Decision, Policy,
};

/// Per-sample seconds of four ranks with speeds 1 : 0.7 : 0.4 : 0.25.
const C: [f64; 4] = [0.002, 0.002 / 0.7, 0.002 / 0.4, 0.002 / 0.25];

fn balancer(policy: Policy, global: u32) -> Balancer {
    balancer_of(policy, global, 4)
}

fn balancer_of(policy: Policy, global: u32, ranks: usize) -> Balancer {
    let cfg = BalancerConfig {
        policy,
        global_batch_size: global,
        ..BalancerConfig::default()
    };
    Balancer::new(cfg, ranks).expect("valid config")
}

/// `n` steps of every rank at `plan`, compute time `c_r · b_r`.
fn feed(bal: &mut Balancer, plan: &[u32], c: &[f64], n: usize) {
    for _ in 0..n {
        for (r, (&b, &c)) in plan.iter().zip(c).enumerate() {
            bal.observe_step(r, b, c * f64::from(b))
                .expect("valid sample");
        }
    }
}

fn plan_of(d: &Decision) -> Vec<u32> {
    d.plan.clone().expect("a new plan")
}

#[test]
fn dynamic_starts_equal_then_follows_measured_speeds() {
    let mut bal = balancer(Policy::Dynamic, 235);
    let d = bal.decide(&[]).expect("decide");
    assert_eq!(plan_of(&d), vec![59, 59, 59, 58]);
    assert!(d.reason.contains("no measurements yet"), "{}", d.reason);
    // Known plan but no data: keep it.
    let d = bal.decide(&[59, 59, 59, 58]).expect("decide");
    assert!(d.plan.is_none());
    feed(&mut bal, &[59, 59, 59, 58], &C, 20);
    let d = bal.decide(&[59, 59, 59, 58]).expect("decide");
    assert_eq!(plan_of(&d), vec![100, 70, 40, 25]);
    assert!(d.gain_percent > 50.0, "{d:?}");
    assert!(
        d.reason.starts_with("dynamic: predicted step"),
        "{}",
        d.reason
    );
    assert!((d.predicted_step_seconds - 0.2).abs() < 1e-9);
}

#[test]
fn the_spread_counts_as_the_expected_slowest_of_n_ranks() {
    // E[max of n standard normals] / the normal's p90 (1.2816).
    assert_eq!(spread_weight(0), 0.0);
    assert_eq!(spread_weight(1), 0.0);
    for (n, e) in [(2, 0.5642), (4, 1.0294), (8, 1.4236), (16, 1.7660)] {
        assert!((spread_weight(n) - e / 1.2816).abs() < 1e-12, "{n}");
    }
    // Past the table: the Gumbel limit (E[max of 1024] ≈ 3.24), rising.
    assert!((spread_weight(1024) * 1.2816 - 3.24).abs() < 0.1);
    let w: Vec<f64> = (1..2000).map(spread_weight).collect();
    assert!(
        w.windows(2).all(|p| p[1] >= p[0]),
        "never falls with more ranks"
    );
}

#[test]
fn a_slowdown_leaves_no_spread_behind() {
    // Two ranks at 64 samples, 2 ms a sample. Rank 0 slows 2.5× (a CPU
    // quota cut): while the slowdown sets in its steps read as a long tail
    // (a spread of 130 ms), then its live model re-fits at the new level.
    let mut bal = balancer_of(Policy::Dynamic, 128, 2);
    let plan = [64, 64];
    feed(&mut bal, &plan, &[0.002, 0.002], 20);
    assert!(bal.decide(&plan).expect("decide").plan.is_none());
    bal.observe_compute_spread(0, 0.130).expect("valid spread");
    // Three steps off the model by more than the straggler factor: re-fit.
    feed(&mut bal, &plan, &[0.005, 0.002], 3);
    let d = bal.decide(&plan).expect("decide");
    // The split of the two rates alone: [36, 92], a step of 0.184 s (at
    // [37, 91] rank 0 would take 0.185 s). With the transition's spread
    // still counted (0.44 × 130 ms, falling 5% a reading) rank 0 would get
    // fewer.
    assert_eq!(plan_of(&d), vec![36, 92], "{}", d.reason);
    assert!((d.predicted_step_seconds - 0.184).abs() < 1e-9, "{d:?}");
    assert!(d.reason.contains("re-fitted fast: ranks 0"), "{}", d.reason);
    // The next figure, the new level's own jitter, counts at once (not
    // half of it, as a rise from the old one would).
    let plan = [36, 92];
    feed(&mut bal, &plan, &[0.005, 0.002], 20);
    bal.observe_compute_spread(0, 0.020).expect("valid spread");
    let d = bal.decide(&plan).expect("decide");
    // Rank 0 is planned at 0.44 × 20 ms over its 0.18 s (falling from the
    // transition's 130 ms it would still count 0.44 × 124.5 ms).
    let want = 36.0 * 0.005 + spread_weight(2) * 0.020;
    assert!(
        (d.current_predicted_step_seconds - want).abs() < 1e-9,
        "{d:?}"
    );
}

#[test]
fn a_rank_whose_compute_jumps_is_planned_nearer_its_slow_steps() {
    // Four equal ranks at 32 samples: 64 ms of compute each.
    let c = [0.002; 4];
    let plan = [32, 32, 32, 32];
    // A spread that counts as 24 ms among four ranks.
    let s = 0.024 / spread_weight(4);
    let run = |spread: &[f64; 4], policy: Policy| {
        let mut bal = balancer(policy, 128);
        feed(&mut bal, &plan, &c, 20);
        for (r, &s) in spread.iter().enumerate() {
            bal.observe_compute_spread(r, s).expect("valid spread");
        }
        bal.decide(&plan).expect("decide")
    };
    // Equal spreads change nothing.
    assert!(run(&[0.01; 4], Policy::Dynamic).plan.is_none());
    // Rank 3's slow steps run over its typical 64 ms (a CPU quota's next
    // period): planned at 24 ms more, it gives up 9 samples to the others,
    // so that every rank's planned step is the same 70 ms.
    let d = run(&[0.0, 0.0, 0.0, s], Policy::Dynamic);
    assert_eq!(plan_of(&d), vec![35, 35, 35, 23]);
    assert!((d.predicted_step_seconds - 0.070).abs() < 1e-9, "{d:?}");
    let d = run(&[0.0, 0.0, 0.0, s], Policy::Hybrid);
    assert_eq!(plan_of(&d), vec![35, 35, 35, 23]);
    // Policies that do not measure live ignore it.
    assert!(run(&[0.0, 0.0, 0.0, s], Policy::Static).plan.is_none());
    // A spread past the rank's compute counts as its compute (64 ms):
    // rank 3 keeps a share.
    let d = run(&[0.0, 0.0, 0.0, 1.0], Policy::Dynamic);
    assert_eq!(plan_of(&d), vec![40, 40, 40, 8]);
    // The spread rises fast and falls slowly: once rank 3's smaller batch
    // fits its quota its spread vanishes, but one such reading does not
    // hand the samples back.
    let mut bal = balancer(Policy::Dynamic, 128);
    feed(&mut bal, &plan, &c, 20);
    bal.observe_compute_spread(3, s).expect("valid spread");
    bal.observe_compute_spread(3, 0.0).expect("valid spread");
    let d = bal.decide(&plan).expect("decide");
    assert_eq!(plan_of(&d), vec![35, 35, 35, 23]);
    let mut bal = balancer(Policy::Dynamic, 128);
    feed(&mut bal, &plan, &c, 20);
    bal.observe_compute_spread(3, 0.0).expect("valid spread");
    bal.observe_compute_spread(3, 2.0 * s)
        .expect("valid spread");
    let d = bal.decide(&plan).expect("decide");
    assert_eq!(plan_of(&d), vec![35, 35, 35, 23], "half way up at once");
    // With two ranks the same spread counts at 0.44 of its size, not 0.80.
    let mut bal = balancer_of(Policy::Dynamic, 128, 2);
    feed(&mut bal, &[64, 64], &[0.002, 0.002], 20);
    bal.observe_compute_spread(1, 0.024 / spread_weight(2))
        .expect("valid spread");
    let d = bal.decide(&[64, 64]).expect("decide");
    assert_eq!(plan_of(&d), vec![70, 58]);
    // Bad figures are refused.
    let mut bal = balancer(Policy::Dynamic, 128);
    assert!(bal.observe_compute_spread(0, f64::NAN).is_err());
    assert!(bal.observe_compute_spread(0, -1.0).is_err());
    assert!(bal.observe_compute_spread(9, 0.0).is_err());
}

#[test]
fn a_live_rank_at_most_doubles_its_batch_per_decision() {
    // Rank 3 at 8 samples measures ten times faster per sample than the
    // others: the line through that point would give it most of the batch
    // at once; it may grow to 2·8 + 2.
    let mut bal = balancer(Policy::Dynamic, 128);
    let plan = [40, 40, 40, 8];
    let c = [0.001, 0.001, 0.001, 0.0001];
    feed(&mut bal, &plan, &c, 20);
    let d = bal.decide(&plan).expect("decide");
    let next = d.plan.clone().unwrap_or_else(|| panic!("{d:?}"));
    assert_eq!(next[3], 18, "{next:?}");
    assert_eq!(next.iter().sum::<u32>(), 128);
    // Measured at 18 as fast again, it goes on: at most 38 next.
    feed(&mut bal, &next, &c, 20);
    let d = bal.decide(&next).expect("decide");
    assert_eq!(d.batches_or(&next)[3], 38, "{d:?}");
    // Proportional plans from profiles over several batches: not bound.
    let mut bal = balancer(Policy::Proportional, 128);
    for (r, &c) in c.iter().enumerate() {
        bal.observe_profile(r, &[(1, c), (8, 8.0 * c), (32, 32.0 * c)], 128)
            .expect("profile");
    }
    let d = bal.decide(&plan).expect("decide");
    assert!(d.batches_or(&plan)[3] > 18, "{d:?}");
}

#[test]
fn hysteresis_keeps_a_plan_that_is_nearly_optimal() {
    let mut bal = balancer(Policy::Dynamic, 235);
    // 2% off the optimum 100/70/40/25.
    let current = [98, 71, 41, 25];
    feed(&mut bal, &current, &C, 20);
    let d = bal.decide(&current).expect("decide");
    assert!(d.plan.is_none(), "{d:?}");
    assert!(d.gain_percent > 0.0 && d.gain_percent < 5.0, "{d:?}");
    assert!(d.reason.contains("below minGainPercent 5%"), "{}", d.reason);
    // With no hysteresis it would move.
    let cfg = BalancerConfig {
        global_batch_size: 235,
        min_gain_percent: 0,
        ..BalancerConfig::default()
    };
    let mut eager = Balancer::new(cfg, 4).expect("config");
    feed(&mut eager, &current, &C, 20);
    assert_eq!(
        plan_of(&eager.decide(&current).expect("decide")),
        vec![100, 70, 40, 25]
    );
}

#[test]
fn a_single_wild_sample_does_not_move_the_plan() {
    let mut bal = balancer(Policy::Dynamic, 235);
    let plan = [100, 70, 40, 25];
    feed(&mut bal, &plan, &C, 20);
    assert!(bal.decide(&plan).expect("decide").plan.is_none());
    bal.observe_step(0, 100, 100.0 * C[0] * 20.0)
        .expect("sample");
    feed(&mut bal, &plan, &C, 1);
    let d = bal.decide(&plan).expect("decide");
    assert!(d.plan.is_none(), "{d:?}");
    assert!(d.stragglers.is_empty());
}

#[test]
fn a_persistent_straggler_is_refitted_fast_and_unloaded() {
    let mut bal = balancer(Policy::Dynamic, 235);
    let plan = [100, 70, 40, 25];
    feed(&mut bal, &plan, &C, 20);
    assert!(bal.decide(&plan).expect("decide").plan.is_none());
    let slow = [C[0] * 2.0, C[1], C[2], C[3]];
    feed(&mut bal, &plan, &slow, 3);
    let d = bal.decide(&plan).expect("decide");
    assert_eq!(d.stragglers, vec![0]);
    assert!(d.reason.contains("re-fitted fast: ranks 0"), "{}", d.reason);
    let p = plan_of(&d);
    // Rank 0 now runs at speed 0.5: optimum 0.5 : 0.7 : 0.4 : 0.25 of 235 ≈ 64/91/51/32.
    assert!((62..=66).contains(&p[0]), "{p:?}");
    assert!(p[1] > 70, "{p:?}");
}

#[test]
fn a_rank_that_stops_reporting_keeps_its_batch() {
    let mut bal = balancer(Policy::Dynamic, 235);
    let plan = [59, 59, 59, 58];
    feed(&mut bal, &plan, &C, 20);
    bal.observe_missing(2).expect("rank");
    let d = bal.decide(&plan).expect("decide");
    let p = plan_of(&d);
    assert_eq!(p[2], 59, "{p:?}");
    assert_eq!(d.stale_ranks, vec![2]);
    assert!(d.reason.contains("not reporting"), "{}", d.reason);
    assert_eq!(p.iter().sum::<u32>(), 235);

    // Silent for `stale_after_decisions` (2) decisions, without being told.
    let mut bal = balancer(Policy::Dynamic, 235);
    feed(&mut bal, &plan, &C, 20);
    let first = plan_of(&bal.decide(&plan).expect("decide"));
    let live = [C[0], C[1], C[2]];
    for _ in 0..20 {
        for (r, c) in live.iter().enumerate() {
            bal.observe_step(r, first[r], c * f64::from(first[r]))
                .expect("sample");
        }
    }
    // Rank 3 now silent; make it look like it deserves more (others slowed).
    let _ = bal.decide(&first).expect("decide"); // 1st silent decision
    let d = bal.decide(&first).expect("decide"); // 2nd: stale
    assert_eq!(d.stale_ranks, vec![3]);
    assert!(d.batches_or(&first)[3] <= first[3]);
}

#[test]
fn young_measurements_are_damped() {
    let mut bal = balancer(Policy::Dynamic, 235);
    let start = [59, 59, 59, 58];
    feed(&mut bal, &start, &C, 5); // 5 of the 10 samples needed for full confidence
    let d = bal.decide(&start).expect("decide");
    let p = plan_of(&d);
    assert!(d.reason.contains("damped to 50%"), "{}", d.reason);
    // Half way from 59 to 100 and from 58 to 25.
    assert!((78..=81).contains(&p[0]), "{p:?}");
    assert!((40..=43).contains(&p[3]), "{p:?}");
    assert_eq!(p.iter().sum::<u32>(), 235);
}

#[test]
fn an_invalid_current_plan_is_replaced() {
    let mut bal = balancer(Policy::Dynamic, 235);
    feed(&mut bal, &[59, 59, 59, 58], &C, 20);
    let d = bal.decide(&[100, 70, 40]).expect("decide");
    assert_eq!(plan_of(&d), vec![100, 70, 40, 25]);
    assert!(d.reason.contains("3 entries for 4 ranks"), "{}", d.reason);
    let d = bal.decide(&[100, 70, 40, 26]).expect("decide");
    assert!(d.reason.contains("sums to 236"), "{}", d.reason);
}

#[test]
fn a_joining_rank_gets_the_median_model_then_its_own() {
    let mut bal = balancer(Policy::Dynamic, 235);
    let plan = [100, 70, 40, 25];
    feed(&mut bal, &plan, &C, 20);
    assert_eq!(bal.add_rank(), 4);
    let d = bal.decide(&plan).expect("decide");
    let p = plan_of(&d);
    assert_eq!(p.len(), 5);
    assert!(
        d.reason
            .contains("1 rank(s) without data use the median model"),
        "{}",
        d.reason
    );
}

#[test]
fn proportional_uses_the_profile_and_memory_caps() {
    let mut bal = balancer(Policy::Proportional, 235);
    for (r, c) in C.iter().enumerate() {
        let pts: Vec<(u32, f64)> = [1, 4, 16]
            .iter()
            .map(|&b| (b, 0.001 + c * f64::from(b)))
            .collect();
        bal.observe_profile(r, &pts, if r == 0 { 80 } else { 200 })
            .expect("profile");
    }
    let d = bal.decide(&[]).expect("decide");
    let p = plan_of(&d);
    assert_eq!(p[0], 80, "{p:?}"); // memory cap binds
    assert_eq!(p.iter().sum::<u32>(), 235);
    assert!(p[1] > p[2] && p[2] > p[3], "{p:?}");
}

#[test]
fn static_is_the_equal_split() {
    let mut bal = balancer(Policy::Static, 10);
    assert_eq!(plan_of(&bal.decide(&[]).expect("decide")), vec![3, 3, 2, 2]);
    feed(&mut bal, &[3, 3, 2, 2], &C, 20);
    assert!(bal.decide(&[3, 3, 2, 2]).expect("decide").plan.is_none());
    let d = bal.decide(&[4, 2, 2, 2]).expect("decide");
    assert_eq!(plan_of(&d), vec![3, 3, 2, 2]);
}

#[test]
fn seed_formula_moves_load_but_punishes_busy_ranks() {
    let mut bal = balancer(Policy::SeedFormula, 235);
    for (r, c) in C.iter().enumerate() {
        bal.observe_compute_score(r, 1.0 / c).expect("score");
    }
    let p = plan_of(&bal.decide(&[]).expect("decide"));
    assert_eq!(p, vec![100, 70, 40, 25]); // scores alone are proportional to speed
    feed(&mut bal, &p, &C, 20);
    bal.observe_utilisation(0, 1.0, 1.0).expect("util");
    let d = bal.decide(&p).expect("decide");
    let q = plan_of(&d);
    assert!(q[0] < 90, "the busiest (fastest) rank loses load: {q:?}");
}

#[test]
fn errors_are_typed_and_labelled() {
    assert!(matches!(
        Balancer::new(
            BalancerConfig {
                window: 0,
                ..Default::default()
            },
            4
        ),
        Err(BalancerError::InvalidConfig(_))
    ));
    let mut bal = balancer(Policy::Dynamic, 3);
    let e = bal.decide(&[]).expect_err("infeasible");
    assert_eq!(
        e,
        BalancerError::BelowMinimum {
            global: 3,
            min_sum: 4,
            ranks: 4
        }
    );
    let mut bal = balancer(Policy::Proportional, 1000);
    for r in 0..4 {
        bal.observe_profile(r, &[(1, 0.1), (2, 0.2)], 100)
            .expect("profile");
    }
    let e = bal.decide(&[]).expect_err("infeasible");
    assert_eq!(e.metric_label(), "infeasible_above_caps");
    assert!(
        e.to_string().contains("1000") && e.to_string().contains("400"),
        "{e}"
    );
    let e = bal.observe_step(9, 1, 1.0).expect_err("range");
    assert_eq!(e.metric_label(), "rank_out_of_range");
    for (b, t) in [
        (0, 1.0),
        (1, f64::NAN),
        (1, -1.0),
        (1, 0.0),
        (1, f64::INFINITY),
    ] {
        assert_eq!(
            bal.observe_step(0, b, t).map_err(|e| e.metric_label()),
            Err("invalid_sample")
        );
    }
    assert!(bal.observe_profile(0, &[(0, 1.0)], 10).is_err());
    assert!(bal.observe_compute_score(0, f64::NAN).is_err());
    assert!(Balancer::new(BalancerConfig::default(), 0)
        .expect("config")
        .decide(&[])
        .is_err());
}

#[test]
fn decisions_serialise_camel_case() {
    let mut bal = balancer(Policy::Dynamic, 235);
    let d = bal.decide(&[]).expect("decide");
    let v = serde_json::to_value(&d).expect("json");
    for key in [
        "plan",
        "predictedStepSeconds",
        "currentPredictedStepSeconds",
        "gainPercent",
        "reason",
        "policy",
    ] {
        assert!(v.get(key).is_some(), "{key} missing in {v}");
    }
    assert_eq!(v["policy"], "dynamic");
}

#[test]
fn quality_of_the_latest_step() {
    let mut bal = balancer(Policy::Dynamic, 235);
    feed(&mut bal, &[100, 70, 40, 25], &C, 1);
    assert!(bal.quality().cv_percent < 1e-9);
    feed(&mut bal, &[59, 59, 59, 58], &C, 1);
    assert_eq!(bal.quality().class.to_string(), "Poor");
}

#[test]
fn communication_is_the_least_exposed_wait_smoothed_and_reported_with_decisions() {
    let mut bal = balancer(Policy::Dynamic, 235);
    assert_eq!(bal.communication_seconds(), 0.0, "nothing measured yet");
    feed(&mut bal, &[59, 59, 59, 58], &C, 20);
    // Rank 3 (slowest) waits for nobody: its exposed time is the exchange;
    // the faster ranks add their waiting for it.
    for (r, s) in [(0, 0.30), (1, 0.25), (2, 0.12), (3, 0.02)] {
        bal.observe_communication(r, s).expect("valid");
    }
    assert!((bal.communication_seconds() - 0.02).abs() < 1e-12);
    // Smoothed: one outlier moves it by 30% of the difference.
    bal.observe_communication(3, 0.12).expect("valid");
    assert!((bal.communication_seconds() - 0.05).abs() < 1e-12);
    let d = bal.decide(&[59, 59, 59, 58]).expect("decide");
    assert!((d.communication_seconds - 0.05).abs() < 1e-12, "{d:?}");
    // Bad samples are refused and change nothing.
    assert!(matches!(
        bal.observe_communication(0, -1.0),
        Err(BalancerError::InvalidSample { rank: 0, .. })
    ));
    assert!(bal.observe_communication(0, f64::NAN).is_err());
    assert!(bal.observe_communication(9, 0.1).is_err());
    assert!((bal.communication_seconds() - 0.05).abs() < 1e-12);
}
