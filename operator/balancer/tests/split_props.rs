//! Property tests of the optimal split (also with ranks bounded to 0, i.e.
//! left out) and of the balancer's "no change when balanced" rule, with and
//! without leaving slow ranks out.

use heterotrain_balancer::{
    max_step, optimal_split, optimal_split_bounded, Balancer, BalancerConfig, Policy, StepModel,
};
use proptest::prelude::*;

fn model() -> impl Strategy<Value = StepModel> {
    (0.0..0.05f64, 1e-4..0.1f64).prop_map(|(a, c)| StepModel {
        fixed_seconds: a,
        per_sample_seconds: c,
    })
}

/// A model that is sometimes far slower than [`model`], with a fixed cost
/// that can exceed a fast rank's whole step.
fn wide_model() -> impl Strategy<Value = StepModel> {
    prop_oneof![
        3 => model(),
        1 => (0.1..2.0f64, 1e-3..0.5f64).prop_map(|(a, c)| StepModel {
            fixed_seconds: a,
            per_sample_seconds: c,
        }),
    ]
}

/// (models, lower, upper, global) with a feasible global batch; about one
/// rank in four (never rank 0) is bounded to [0, 0], some others have a
/// lower bound of 0.
fn bounded_problem(
    max_ranks: usize,
    max_extra: u32,
) -> impl Strategy<Value = (Vec<StepModel>, Vec<u32>, Vec<u32>, u32)> {
    prop::collection::vec(
        (wide_model(), 0..=2u32, 0..=max_extra, 0..4u8),
        1..=max_ranks,
    )
    .prop_flat_map(|ranks| {
        let (mut lower, mut upper) = (Vec::new(), Vec::new());
        for (r, (_, lo, extra, out)) in ranks.iter().enumerate() {
            let out = r > 0 && *out == 0;
            lower.push(if out { 0 } else { *lo });
            upper.push(if out { 0 } else { lo + extra.max(&1) });
        }
        let models: Vec<StepModel> = ranks.iter().map(|r| r.0).collect();
        let lo: u32 = lower.iter().sum();
        let hi: u32 = upper.iter().sum();
        (Just(models), Just(lower), Just(upper), lo..=hi)
    })
}

/// Smallest achievable max step time over every split within per-rank
/// bounds; a rank at 0 adds nothing to the step.
fn brute_force_bounded(models: &[StepModel], lower: &[u32], upper: &[u32], global: u32) -> f64 {
    match models.split_first() {
        None => {
            if global == 0 {
                0.0
            } else {
                f64::INFINITY
            }
        }
        Some((m, rest)) => {
            let mut best = f64::INFINITY;
            for b in lower[0]..=upper[0].min(global) {
                let t = if b == 0 { 0.0 } else { m.predict(b) };
                let others = brute_force_bounded(rest, &lower[1..], &upper[1..], global - b);
                best = best.min(t.max(others));
            }
            best
        }
    }
}

/// (models, floor, caps, global) with a feasible global batch.
fn problem(
    max_ranks: usize,
    max_extra: u32,
) -> impl Strategy<Value = (Vec<StepModel>, u32, Vec<u32>, u32)> {
    (1..=max_ranks, 0..=3u32)
        .prop_flat_map(move |(n, floor)| {
            (
                prop::collection::vec(model(), n),
                Just(floor),
                prop::collection::vec(floor..=floor + max_extra, n),
            )
        })
        .prop_flat_map(|(models, floor, caps)| {
            let lo = floor * models.len() as u32;
            let hi: u32 = caps.iter().sum();
            (Just(models), Just(floor), Just(caps), lo..=hi)
        })
}

/// Smallest achievable max step time, by enumerating every split.
fn brute_force(models: &[StepModel], floor: u32, caps: &[u32], global: u32) -> f64 {
    fn go(models: &[StepModel], floor: u32, caps: &[u32], left: u32, worst: f64) -> f64 {
        match models.split_first() {
            None => {
                if left == 0 {
                    worst
                } else {
                    f64::INFINITY
                }
            }
            Some((m, rest)) => {
                let mut best = f64::INFINITY;
                for b in floor..=caps[0].min(left) {
                    // A rank at 0 is left out: it adds nothing to the step.
                    let t = if b == 0 { 0.0 } else { m.predict(b) };
                    best = best.min(go(rest, floor, &caps[1..], left - b, worst.max(t)));
                }
                best
            }
        }
    }
    go(models, floor, caps, global, 0.0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn sum_is_exact_and_bounds_hold((models, floor, caps, global) in problem(64, 300)) {
        let s = optimal_split(&models, global, floor, &caps).expect("feasible");
        prop_assert_eq!(s.batches.iter().map(|&b| u64::from(b)).sum::<u64>(), u64::from(global));
        for (b, cap) in s.batches.iter().zip(&caps) {
            prop_assert!(*b >= floor && b <= cap, "{} not in [{}, {}]", b, floor, cap);
        }
        prop_assert!(s.step_seconds + 1e-12 >= s.water_level_seconds * (1.0 - 1e-9));
        prop_assert_eq!(s.step_seconds, max_step(&models, &s.batches));
    }

    #[test]
    fn ranks_bounded_to_zero_get_nothing_and_the_sum_is_exact(
        (models, lower, upper, global) in bounded_problem(48, 300),
    ) {
        let s = optimal_split_bounded(&models, global, &lower, &upper).expect("feasible");
        prop_assert_eq!(s.batches.iter().map(|&b| u64::from(b)).sum::<u64>(), u64::from(global));
        for (r, b) in s.batches.iter().enumerate() {
            prop_assert!(*b >= lower[r] && *b <= upper[r], "rank {}: {} not in [{}, {}]", r, b, lower[r], upper[r]);
        }
        prop_assert_eq!(s.step_seconds, max_step(&models, &s.batches));
    }

    #[test]
    fn bounded_optimum_matches_brute_force((models, lower, upper, global) in bounded_problem(4, 8)) {
        let s = optimal_split_bounded(&models, global, &lower, &upper).expect("feasible");
        let best = brute_force_bounded(&models, &lower, &upper, global);
        prop_assert!((s.step_seconds - best).abs() <= 1e-12 * best.max(1.0),
            "split {:?} max {} vs brute force {}", s.batches, s.step_seconds, best);
    }

    #[test]
    fn a_faster_rank_never_gets_fewer_samples(
        (models, floor, _caps, global) in problem(16, 200),
        cap in 50u32..400,
    ) {
        let n = models.len() as u32;
        let global = global.clamp(floor * n, cap.max(floor) * n);
        let caps = vec![cap.max(floor); models.len()];
        let s = optimal_split(&models, global, floor, &caps).expect("feasible");
        for (r, mr) in models.iter().enumerate() {
            for (q, mq) in models.iter().enumerate() {
                let dominates = mr.fixed_seconds <= mq.fixed_seconds
                    && mr.per_sample_seconds <= mq.per_sample_seconds
                    && (mr.fixed_seconds < mq.fixed_seconds || mr.per_sample_seconds < mq.per_sample_seconds);
                if dominates {
                    prop_assert!(s.batches[r] >= s.batches[q],
                        "rank {} ({:?}) got {} < rank {} ({:?}) {}", r, mr, s.batches[r], q, mq, s.batches[q]);
                }
            }
        }
    }

    #[test]
    fn integer_optimum_matches_brute_force((models, floor, caps, global) in problem(4, 10)) {
        let s = optimal_split(&models, global, floor, &caps).expect("feasible");
        let best = brute_force(&models, floor, &caps, global);
        prop_assert!((s.step_seconds - best).abs() <= 1e-12 * best.max(1.0),
            "split {:?} max {} vs brute force {}", s.batches, s.step_seconds, best);
    }

    #[test]
    fn garbage_models_give_errors_not_panics(
        raw in prop::collection::vec((any::<f64>(), any::<f64>()), 0..6),
        global in any::<u32>(),
        floor in any::<u32>(),
        caps in prop::collection::vec(any::<u32>(), 0..6),
    ) {
        let models: Vec<StepModel> = raw.iter().map(|&(a, c)| StepModel { fixed_seconds: a, per_sample_seconds: c }).collect();
        if let Ok(s) = optimal_split(&models, global, floor, &caps) {
            prop_assert_eq!(s.batches.iter().map(|&b| u64::from(b)).sum::<u64>(), u64::from(global));
        }
    }

    #[test]
    fn balanced_inputs_keep_the_plan(
        models in prop::collection::vec(model(), 1..12),
        per_rank in 2u32..64,
        dynamic in any::<bool>(),
    ) {
        let n = models.len();
        let global = per_rank * n as u32;
        // The all-ranks optimum; `leave_out_plans_are_valid_and_stable`
        // covers plans that leave ranks out.
        let cfg = BalancerConfig {
            policy: if dynamic { Policy::Dynamic } else { Policy::Proportional },
            global_batch_size: global,
            min_gain_percent: 0,
            leave_out_slow_ranks: false,
            ..BalancerConfig::default()
        };
        let mut bal = Balancer::new(cfg, n).expect("config");
        for (r, m) in models.iter().enumerate() {
            let pts: Vec<(u32, f64)> = [1u32, 8, 32].iter().map(|&b| (b, m.predict(b))).collect();
            bal.observe_profile(r, &pts, global).expect("profile");
        }
        let fitted: Vec<StepModel> = bal.models().into_iter().map(|m| m.expect("model")).collect();
        let balanced = optimal_split(&fitted, global, 1, &vec![global; n]).expect("split").batches;
        if dynamic {
            for _ in 0..20 {
                for (r, m) in fitted.iter().enumerate() {
                    bal.observe_step(r, balanced[r], m.predict(balanced[r])).expect("sample");
                }
            }
        }
        let d = bal.decide(&balanced).expect("decide");
        prop_assert!(d.plan.is_none(), "plan changed: {:?} -> {:?} ({})", balanced, d.plan, d.reason);
        prop_assert!(!d.reason.is_empty());
    }

    #[test]
    fn leave_out_plans_are_valid_and_stable(
        models in prop::collection::vec(wide_model(), 1..10),
        per_rank in 2u32..48,
        dynamic in any::<bool>(),
    ) {
        let n = models.len();
        let global = per_rank * n as u32;
        // No hysteresis: any predicted gain moves the plan, so the checks
        // below see the balancer's best plan, and stability is strict.
        let cfg = BalancerConfig {
            policy: if dynamic { Policy::Dynamic } else { Policy::Proportional },
            global_batch_size: global,
            min_gain_percent: 0,
            ..BalancerConfig::default()
        };
        let mut bal = Balancer::new(cfg, n).expect("config");
        for (r, m) in models.iter().enumerate() {
            let pts: Vec<(u32, f64)> = [1u32, 8, 32].iter().map(|&b| (b, m.predict(b))).collect();
            bal.observe_profile(r, &pts, global).expect("profile");
        }
        let fitted: Vec<StepModel> = bal.models().into_iter().map(|m| m.expect("model")).collect();
        let feed = |bal: &mut Balancer, plan: &[u32]| {
            for _ in 0..20 {
                for (r, m) in fitted.iter().enumerate().filter(|(r, _)| plan[*r] > 0) {
                    bal.observe_step(r, plan[r], m.predict(plan[r])).expect("sample");
                }
            }
        };
        let equal = optimal_split(&vec![fitted[0]; n], global, 1, &vec![global; n]).expect("split").batches;
        if dynamic {
            feed(&mut bal, &equal);
        }
        let mut d = bal.decide(&equal).expect("decide");
        let mut plan = d.batches_or(&equal).to_vec();
        // A live policy's rank at most doubles its batch per decision (plus
        // two): a few decisions may be needed to get there.
        for _ in 0..8 {
            if !dynamic || d.plan.is_none() {
                break;
            }
            feed(&mut bal, &plan);
            let next = bal.decide(&plan).expect("decide");
            if next.plan.is_none() {
                break;
            }
            plan = next.batches_or(&plan).to_vec();
            d = next;
        }
        prop_assert_eq!(plan.iter().map(|&b| u64::from(b)).sum::<u64>(), u64::from(global));
        prop_assert!(plan[0] >= 1, "rank 0 left out: {:?}", plan);
        prop_assert!(plan.iter().all(|&b| b == 0 || b >= 1));
        let zeros: Vec<usize> = (0..n).filter(|&r| plan[r] == 0).collect();
        prop_assert_eq!(&d.left_out, &zeros);
        for &r in &zeros {
            prop_assert!(d.reason.contains(&format!("rank {r} left out")), "{}", d.reason);
        }
        // Never slower (predicted) than the all-ranks optimum.
        let all = optimal_split(&fitted, global, 1, &vec![global; n]).expect("split");
        prop_assert!(max_step(&fitted, &plan) <= all.step_seconds * (1.0 + 1e-9));
        // The balancer's own choice is kept: no flapping membership.
        if dynamic {
            feed(&mut bal, &plan);
        }
        let again = bal.decide(&plan).expect("decide");
        prop_assert!(again.plan.is_none(), "{:?} -> {:?} ({})", plan, again.plan, again.reason);
        prop_assert_eq!(&again.left_out, &zeros);
    }

    #[test]
    fn balancer_survives_garbage_samples(
        samples in prop::collection::vec((0usize..6, any::<u32>(), any::<f64>()), 0..60),
        policy in prop::sample::select(Policy::ALL.to_vec()),
    ) {
        let cfg = BalancerConfig { policy, global_batch_size: 64, ..BalancerConfig::default() };
        let mut bal = Balancer::new(cfg, 4).expect("config");
        for (r, b, t) in samples {
            let _ = bal.observe_step(r, b, t);
            let _ = bal.observe_utilisation(r, t, t);
        }
        let d = bal.decide(&[16, 16, 16, 16]).expect("decide");
        if let Some(p) = d.plan {
            prop_assert_eq!(p.iter().sum::<u32>(), 64);
        }
        prop_assert!(d.predicted_step_seconds.is_finite());
    }
}
