//! Leaving ranks out on the *measured* step.
//!
//! The step models see compute only. A rank can also cost every step time
//! that is not compute — its share of the gradient exchange or of the
//! optimizer update on a CPU throttled to a fraction of a core — which the
//! other ranks spend waiting inside the all-reduce. Its compute model then
//! looks cheap, the model-based choice ([`crate::subset::choose`]) keeps it
//! at one sample, and every measured step is far longer than predicted.
//!
//! So the live policies (dynamic, hybrid) also take the measured wall-clock
//! step of each decision interval ([`crate::Balancer::observe_step_time`];
//! the median over the ranks that train, counted only from ranks running
//! the plan decided last). When it is at least [`TRIAL_EXCESS_FACTOR`]× the
//! predicted compute step — or, when leaving the rank out would leave one
//! rank training alone (no exchange at all), merely longer than predicted —
//! a *leave-out trial* starts: the eligible rank
//! slowest per sample (never rank 0, a stale rank, one without data) is
//! left out for one interval, provided it is not waiting out a lost trial
//! and its absence could win at all. At the next decision the two
//! measurements are compared: when the step without it is at least
//! `leaveOutMarginPercent` shorter, the rank stays out ([`Presence`]) —
//! re-admitted for measurement after `readmitAfterDecisions` like any
//! left-out rank, and out again (its wait doubling) while the step measured
//! with it stays that much longer; otherwise it is back at once and not
//! tried again for `readmitAfterDecisions` × 1, 2, 4, 8 decisions (doubling
//! with each lost trial), and no rank is tried for `readmitAfterDecisions`
//! decisions. One trial runs at a time; measured verdicts change membership
//! without the compute hysteresis.
//!
//! [`TRIAL_EXCESS_FACTOR`]: trials::TRIAL_EXCESS_FACTOR
//! [`Presence`]: crate::rank::Presence

mod gates;
mod margins;
mod state;
mod trials;
mod verdicts;

use crate::model::median;
use crate::rank::RankState;

pub(crate) use gates::{compute_outrun, outrun_note, steady, unsteady_note};
pub(crate) use state::{Measured, Review, Trial};
pub(crate) use trials::{trial_reason, trial_start, Models, TrialStart};
pub(crate) use verdicts::review;

/// The step measured over the decision interval that ran `current`: the
/// median over its training ranks of each one's mean step time. `None`
/// unless `current` is the plan decided last and at least `needed` samples
/// came in.
pub(crate) fn window_step(
    ranks: &[RankState],
    decided: Option<&[u32]>,
    current: &[u32],
    needed: u32,
) -> Option<f64> {
    if decided != Some(current) {
        return None;
    }
    let training = ranks.iter().zip(current).filter(|(_, &b)| b > 0);
    let total: u64 = training
        .clone()
        .map(|(r, _)| u64::from(r.step_time.1))
        .sum();
    if total < u64::from(needed.max(1)) {
        return None;
    }
    let mut means: Vec<f64> = training
        .filter(|(r, _)| r.step_time.1 > 0)
        .map(|(r, _)| r.step_time.0 / f64::from(r.step_time.1))
        .filter(|t| t.is_finite() && *t > 0.0)
        .collect();
    median(&mut means)
}

#[cfg(test)]
mod tests {
    use super::margins::{shorter, shorter_by, verdict_margin};
    use super::*;

    fn rank_with(times: &[f64]) -> RankState {
        let mut r = RankState::new(4);
        r.step_time = (times.iter().sum(), times.len() as u32);
        r
    }

    #[test]
    fn the_verdict_margin_is_the_smaller_of_the_margin_and_what_the_samples_save() {
        // 2 of 128: the other ranks take 2 more samples over their 126.
        let m = verdict_margin(&[64, 44, 18, 2], 3, 10);
        assert!((m - 2.0 / 126.0).abs() < 1e-12, "{m}");
        // 18 of 128 can save 18 / 110 > 10%.
        assert_eq!(verdict_margin(&[64, 44, 18, 2], 2, 10), 0.10);
        // Not training, or alone: the margin.
        assert_eq!(verdict_margin(&[64, 44, 20, 0], 3, 10), 0.10);
        assert_eq!(verdict_margin(&[128], 0, 10), 0.10);
        assert!(shorter_by(0.97, 1.0, 2.0 / 126.0));
        assert!(!shorter_by(0.99, 1.0, 2.0 / 126.0));
    }

    #[test]
    fn the_window_step_is_the_median_over_training_ranks_of_the_plan_decided_last() {
        let ranks = vec![rank_with(&[1.0, 1.0]), rank_with(&[1.2]), rank_with(&[9.0])];
        let plan = [4, 4, 4];
        assert_eq!(window_step(&ranks, Some(&plan), &plan, 3), Some(1.2));
        // Another plan ran, or too few samples: nothing measured.
        assert_eq!(window_step(&ranks, Some(&[4, 4, 5]), &plan, 3), None);
        assert_eq!(window_step(&ranks, None, &plan, 3), None);
        assert_eq!(window_step(&ranks, Some(&plan), &plan, 5), None);
        // A left-out rank's samples do not count.
        let out = [6, 6, 0];
        assert_eq!(window_step(&ranks, Some(&out), &out, 3), Some(1.1));
    }

    #[test]
    fn margins_are_strict() {
        assert!(shorter(0.89, 1.0, 10));
        assert!(!shorter(0.9, 1.0, 10));
        assert!(!shorter(1.0, 1.0, 0));
        assert!(!shorter(0.0, 1.0, 100));
    }
}
