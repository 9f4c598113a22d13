//! Property tests of the optimal split and of the balancer's "no change when
//! balanced" rule.

use heterotrain_balancer::{max_step, optimal_split, Balancer, BalancerConfig, Policy, StepModel};
use proptest::prelude::*;

fn model() -> impl Strategy<Value = StepModel> {
    (0.0..0.05f64, 1e-4..0.1f64).prop_map(|(a, c)| StepModel {
        fixed_seconds: a,
        per_sample_seconds: c,
    })
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
                    best = best.min(go(
                        rest,
                        floor,
                        &caps[1..],
                        left - b,
                        worst.max(m.predict(b)),
                    ));
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
