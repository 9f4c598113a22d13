//! Unit tests of the parent module.

use super::membership::Choice;
use super::*;
use crate::bounds::Bounds;
use crate::exchange;
use crate::text::secs;
use crate::StepModel;

fn m(a: f64, c: f64) -> StepModel {
    StepModel {
        fixed_seconds: a,
        per_sample_seconds: c,
    }
}

/// Three fast ranks and one whose fixed cost alone exceeds their step.
fn slow_fixed() -> Vec<StepModel> {
    vec![m(0.01, 0.001), m(0.01, 0.001), m(0.01, 0.001), m(0.4, 0.02)]
}

#[test]
fn a_rank_slower_at_batch_one_than_the_others_step_is_left_out() {
    let models = slow_fixed();
    let c = four(&models, &[1, 2, 3], None);
    assert_eq!(c.left_out, vec![3]);
    assert_eq!(c.batches, vec![40, 40, 40, 0]);
    assert!((c.step_seconds - 0.05).abs() < 1e-12, "{c:?}");
    assert!((c.all_ranks_step_seconds - 0.42).abs() < 1e-12, "{c:?}");
    let note = c.leave_out_note(&models, &[1; 4], 10, None);
    assert!(
        note.starts_with(
            "rank 3 left out: its fixed cost 0.400 s/step exceeds the 0.0500 s step the others reach without it; predicted step 0.0500 s vs 0.420 s with it"
        ),
        "{note}"
    );
}

#[test]
fn ineligible_ranks_stay_in() {
    let models = slow_fixed();
    let c = four(&models, &[1, 2], None);
    assert!(c.left_out.is_empty());
    assert_eq!(c.batches[3], 1);
    // Rank 0 is never left out, even when slowest and listed.
    let mut models = slow_fixed();
    models.swap(0, 3);
    let c = four(&models, &[0, 1, 2, 3], None);
    assert!(c.left_out.is_empty(), "{c:?}");
    assert!(c.batches[0] >= 1);
}

#[test]
fn the_margin_guards_new_leave_outs_but_not_staying_out() {
    // Rank 1 at batch 1 takes 0.205 s; rank 0 alone 0.2 s: about 2.4% faster.
    let models = [m(0.0, 0.01), m(0.195, 0.01)];
    let c = choose(
        &models,
        &Bounds::fixed(&[1; 2], &[20; 2], 20),
        &[1],
        &[],
        10,
        None,
    )
    .expect("choose");
    assert!(c.left_out.is_empty(), "2.4% < 10% margin: {c:?}");
    let c = choose(
        &models,
        &Bounds::fixed(&[1; 2], &[20; 2], 20),
        &[1],
        &[],
        0,
        None,
    )
    .expect("choose");
    assert_eq!(c.left_out, vec![1]);
    // Already out: it stays out as long as leaving it out is faster.
    let c = choose(
        &models,
        &Bounds::fixed(&[1; 2], &[20; 2], 20),
        &[1],
        &[1],
        10,
        None,
    )
    .expect("choose");
    assert_eq!(c.left_out, vec![1]);
    assert_eq!(c.batches, vec![20, 0]);
}

#[test]
fn an_infeasible_subset_is_skipped() {
    // Without rank 3 the others cannot hold the batch (caps 30 each).
    let models = slow_fixed();
    let c = choose(
        &models,
        &Bounds::fixed(&[1; 4], &[30, 30, 30, 100], 100),
        &[3],
        &[],
        10,
        None,
    )
    .expect("x");
    assert!(c.left_out.is_empty());
    assert_eq!(c.batches.iter().sum::<u32>(), 100);
}

#[test]
fn damping_never_leaves_a_fraction_to_a_left_out_rank() {
    let cur = [30, 30, 30, 30];
    let plan = [40, 40, 40, 0];
    let d = damp(&cur, &plan, 0.5, 120, &[1; 4], &[120; 4]).expect("damp");
    assert_eq!(d, vec![40, 40, 40, 0]);
    let plan = [60, 30, 30, 0];
    let d = damp(&cur, &plan, 0.5, 120, &[1; 4], &[120; 4]).expect("damp");
    assert_eq!(d[3], 0);
    assert_eq!(d.iter().sum::<u32>(), 120);
    assert!(d[0] > 30 && d[0] < 60, "{d:?}");
    // Back in: the re-admitted rank takes its target at once.
    let d = damp(
        &[40, 40, 40, 0],
        &[30, 40, 40, 10],
        0.25,
        120,
        &[1; 4],
        &[120; 4],
    )
    .expect("damp");
    assert_eq!(d[3], 10);
    assert_eq!(d.iter().sum::<u32>(), 120);
}

#[test]
fn seconds_have_three_significant_digits() {
    assert_eq!(secs(0.41234), "0.412 s");
    assert_eq!(secs(0.0012345), "0.00123 s");
    assert_eq!(secs(12.345), "12.3 s");
    assert_eq!(secs(0.0), "0 s");
}

fn links(bandwidths: &[f64]) -> Vec<Option<exchange::Link>> {
    bandwidths
        .iter()
        .map(|&b| {
            Some(exchange::Link {
                latency_seconds: 1e-4,
                bandwidth_bytes_per_second: b,
            })
        })
        .collect()
}

/// `choose` over four ranks sharing 120 samples, ranks 1–3 eligible to
/// leave, with the exchange model `ex` if any.
fn four_equal(models: &[StepModel], ex: Option<&exchange::Model>) -> Choice {
    four(models, &[1, 2, 3], ex)
}

/// `choose` over four ranks sharing 120 samples (bounds 1 and 120), the
/// `eligible` ranks allowed to leave, margin 10%.
fn four(models: &[StepModel], eligible: &[usize], ex: Option<&exchange::Model>) -> Choice {
    choose(
        models,
        &Bounds::fixed(&[1; 4], &[120; 4], 120),
        eligible,
        &[],
        10,
        ex,
    )
    .expect("choose")
}

/// Four equally fast devices; rank 2 sits behind a link 100× slower. Its
/// compute alone would keep it in, its share of the exchange leaves it out.
#[test]
fn a_fast_rank_on_a_slow_link_is_left_out_when_the_exchange_says_so() {
    let models = vec![m(0.01, 0.001); 4];
    // 10 MB of gradient: 15 ms over 1 GB/s among 4, 1.5 s over 10 MB/s.
    let ex = exchange::model(Some(1e7), links(&[1e9, 1e9, 1e7, 1e9])).unwrap();
    let without = four(&models, &[1, 2, 3], None);
    assert!(without.left_out.is_empty(), "compute alone: {without:?}");
    let c = four_equal(&models, Some(&ex));
    assert_eq!(c.left_out, vec![2]);
    assert_eq!(c.batches, vec![40, 40, 0, 40]);
    // 3 ranks of 40: 0.05 s compute + 4/3 × 1e7 / 1e9 + latency.
    let expected = 0.05 + 4.0 / 3.0 * 1e-2 + 1e-4;
    assert!((c.step_seconds - expected).abs() < 1e-9, "{c:?}");
    assert!(c.all_ranks_step_seconds > 1.0, "{c:?}");
    let note = c.leave_out_note(&models, &[1; 4], 10, Some(&ex));
    assert!(
        note.starts_with("rank 2 left out: its link (0.010 GB/s) slows the gradient exchange"),
        "{note}"
    );
}

/// Equal links: the exchange is there for every membership of two or more
/// ranks, and a cheap one changes nothing.
#[test]
fn equal_fast_links_keep_every_rank() {
    let models = vec![m(0.01, 0.001); 4];
    let ex = exchange::model(Some(1e5), links(&[1e9; 4])).unwrap();
    let c = four_equal(&models, Some(&ex));
    assert!(c.left_out.is_empty(), "{c:?}");
    assert!(
        (c.step_seconds - (0.04 + 1.5e-4 + 1e-4)).abs() < 1e-9,
        "{c:?}"
    );
}

/// Two ranks: the second's slower device and the exchange together cost
/// more than its samples save, though its compute alone would not.
#[test]
fn the_exchange_tips_a_two_rank_job_to_one_rank() {
    let models = vec![m(0.0, 0.001), m(0.0, 0.002)];
    let compute_only = choose(
        &models,
        &Bounds::fixed(&[1; 2], &[60; 2], 60),
        &[1],
        &[],
        10,
        None,
    )
    .unwrap();
    assert!(compute_only.left_out.is_empty(), "{compute_only:?}");
    // Split 40/20: 0.04 s; alone 0.06 s. An exchange of 0.03 s tips it.
    let ex = exchange::model(Some(3e7), links(&[1e9, 1e9])).unwrap();
    let c = choose(
        &models,
        &Bounds::fixed(&[1; 2], &[60; 2], 60),
        &[1],
        &[],
        10,
        Some(&ex),
    )
    .unwrap();
    assert_eq!(c.left_out, vec![1], "{c:?}");
    assert_eq!(c.batches, vec![60, 0]);
}
