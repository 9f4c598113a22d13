//! Unit tests of the parent module.

use super::*;

fn m(a: f64, c: f64) -> StepModel {
    StepModel {
        fixed_seconds: a,
        per_sample_seconds: c,
    }
}

#[test]
fn proportional_to_speed_without_fixed_cost() {
    let models = [m(0.0, 1.0), m(0.0, 1.0 / 0.7), m(0.0, 2.5), m(0.0, 4.0)];
    let s = optimal_split(&models, 235, 1, &[1000; 4]).expect("split");
    assert_eq!(s.batches, vec![100, 70, 40, 25]);
    assert!((s.step_seconds - 100.0).abs() < 1e-9);
    assert!((s.water_level_seconds - 100.0).abs() < 1e-6);
}

#[test]
fn caps_and_floor_bind() {
    let models = [m(0.0, 1.0), m(0.0, 100.0)];
    let s = optimal_split(&models, 100, 5, &[60, 100]).expect("split");
    assert_eq!(s.batches, vec![60, 40]);
    let s = optimal_split(&models, 100, 5, &[100, 100]).expect("split");
    assert_eq!(s.batches, vec![95, 5]);
}

#[test]
fn fixed_cost_shifts_work_to_the_rank_without_it() {
    // t0 = 10 + b, t1 = b: equal finish at b0 = 45, b1 = 55.
    let s = optimal_split(&[m(10.0, 1.0), m(0.0, 1.0)], 100, 1, &[100, 100]).expect("split");
    assert_eq!(s.batches, vec![45, 55]);
    assert_eq!(s.step_seconds, 55.0);
}

#[test]
fn equal_models_split_evenly_with_low_ranks_taking_the_remainder() {
    let s = optimal_split(&[m(0.0, 1.0); 4], 10, 1, &[10; 4]).expect("split");
    assert_eq!(s.batches, vec![3, 3, 2, 2]);
}

#[test]
fn infeasible_requests_name_the_numbers() {
    let models = [m(0.0, 1.0); 4];
    assert_eq!(
        optimal_split(&models, 3, 1, &[10; 4]),
        Err(BalancerError::BelowMinimum {
            global: 3,
            min_sum: 4,
            ranks: 4
        })
    );
    assert_eq!(
        optimal_split(&models, 41, 1, &[10; 4]),
        Err(BalancerError::AboveCaps {
            global: 41,
            cap_sum: 40,
            ranks: 4
        })
    );
    assert_eq!(
        optimal_split(&models, 8, 3, &[10, 2, 10, 10]),
        Err(BalancerError::EmptyBounds {
            rank: 1,
            min: 3,
            cap: 2
        })
    );
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    assert_eq!(optimal_split(&[], 10, 1, &[]), Err(BalancerError::NoRanks));
    assert!(matches!(
        optimal_split(&[m(0.0, 1.0)], 10, 1, &[10, 10]),
        Err(BalancerError::LengthMismatch { .. })
    ));
    for bad in [
        m(f64::NAN, 1.0),
        m(0.0, 0.0),
        m(0.0, -1.0),
        m(-1.0, 1.0),
        m(0.0, f64::INFINITY),
    ] {
        assert!(matches!(
            optimal_split(&[m(0.0, 1.0), bad], 10, 1, &[10, 10]),
            Err(BalancerError::InvalidModel { rank: 1, .. })
        ));
    }
}

#[test]
fn extreme_speed_ratios_stay_exact() {
    let models = [m(0.0, 1e-9), m(1e3, 1e6), m(0.0, 1.0)];
    let s = optimal_split(&models, u32::MAX, 1, &[u32::MAX; 3]).expect("split");
    let sum: u64 = s.batches.iter().map(|&b| u64::from(b)).sum();
    assert_eq!(sum, u64::from(u32::MAX));
}

#[test]
fn a_rank_capped_at_zero_gets_nothing_and_adds_nothing() {
    // Rank 1's fixed cost alone (5 s) is longer than rank 0's whole step.
    let models = [m(0.1, 0.01), m(5.0, 1.0), m(0.1, 0.02)];
    let s = optimal_split_bounded(&models, 30, &[1, 0, 1], &[30, 0, 30]).expect("split");
    assert_eq!(s.batches[1], 0);
    assert_eq!(s.batches.iter().sum::<u32>(), 30);
    assert_eq!(s.batches, vec![20, 0, 10]);
    assert!((s.step_seconds - 0.3).abs() < 1e-12, "{s:?}");
    assert_eq!(max_step(&models, &[20, 0, 10]), s.step_seconds);
    // With it at batch 1 its fixed cost dominates the step.
    assert!((max_step(&models, &[19, 1, 10]) - 6.0).abs() < 1e-12);
    let (x, _) = continuous_split(&models, 30, &[1, 0, 1], &[30, 0, 30]).expect("split");
    assert_eq!(x[1], 0.0);
}

#[test]
fn round_to_sum_is_exact() {
    let b = round_to_sum(&[1.5, 1.5, 2.0], 5, &[1; 3], &[5; 3]).expect("round");
    assert_eq!(b, vec![2, 1, 2]);
    // A rank bounded to [0, 0] stays at 0 even with a fractional target.
    let b = round_to_sum(&[2.6, 0.4, 2.0], 5, &[1, 0, 1], &[5, 0, 5]).expect("round");
    assert_eq!(b, vec![3, 0, 2]);
}

/// Models whose scales are far apart leave the water level's floats
/// millions of samples off; the split still places them in a few rounds,
/// the same as one at a time.
#[test]
fn models_far_apart_in_scale_split_fast_and_exactly() {
    let cases: [(&[StepModel], u32); 3] = [
        (&[m(1e20, 1e-10), m(0.01, 0.001)], u32::MAX - 1),
        (
            &[m(1e20, 1e-10), m(1e20, 2e-10), m(0.0, 1e-300)],
            u32::MAX - 7,
        ),
        (&[m(0.0, 1e-300), m(1e-300, 1e-300)], u32::MAX - 3),
    ];
    for (models, global) in cases {
        let caps = vec![u32::MAX; models.len()];
        let s = optimal_split(models, global, 0, &caps).expect("split");
        let sum: u64 = s.batches.iter().map(|&b| u64::from(b)).sum();
        assert_eq!(sum, u64::from(global), "{:?}", s.batches);
    }
    // The same greedy, one sample at a time, on a small case.
    let models = [m(0.5, 0.01), m(0.0, 0.03), m(0.2, 0.02)];
    let s = optimal_split(&models, 500, 0, &[1000; 3]).expect("split");
    let mut b = [0u32; 3];
    for _ in 0..500 {
        let r = (0..3)
            .min_by(|&p, &q| {
                Key(models[p].predict(b[p] + 1), models[p].per_sample_seconds, p).cmp(&Key(
                    models[q].predict(b[q] + 1),
                    models[q].per_sample_seconds,
                    q,
                ))
            })
            .expect("ranks");
        b[r] += 1;
    }
    assert_eq!(s.batches, b.to_vec());
}
