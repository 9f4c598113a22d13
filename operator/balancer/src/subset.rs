//! Leaving slow ranks out ("never slower than the best subset").
//!
//! Including a rank costs the step at least its time at the smallest batch
//! it may get. When that is longer than the step the other ranks reach
//! without it — a large fixed cost, or a device far slower than the rest —
//! every step waits for it, and the job is faster with the rank given 0
//! samples. [`choose`] compares the best split over all ranks with splits
//! that leave out the slowest ranks; the rest of this module keeps the
//! per-rank bookkeeping that brings left-out ranks back for measurement.
//!
//! Rank 0 (it writes checkpoints) is never left out, nor is a stale rank
//! (it stays pinned) or one without data of its own.

mod membership;
mod readmit;

use crate::split::round_to_sum;

pub(crate) use membership::choose;
pub use readmit::READMIT_COST_BUDGET;
pub(crate) use readmit::{
    count_left_out, count_probes, due_for_readmission, on_open_trial, readmit_wait, settle,
    start_trials, trial_samples_needed,
};

/// Damped move from `current` towards `plan`, `alpha` of the way, as
/// integers summing to `global` within the bounds. A rank whose membership
/// changes (left out, or back in) takes its target at once — a left-out
/// rank never keeps a fraction of its old batch — and the ranks that train
/// in both plans share the rest in proportion to their damped targets.
/// `None` when the rounding cannot be made exact.
pub(crate) fn damp(
    current: &[u32],
    plan: &[u32],
    alpha: f64,
    global: u32,
    lower: &[u32],
    upper: &[u32],
) -> Option<Vec<u32>> {
    let same = |r: usize| (current[r] == 0) == (plan[r] == 0);
    let n = plan.len().min(current.len());
    let mut x: Vec<f64> = (0..n)
        .map(|r| {
            let (c, p) = (f64::from(current[r]), f64::from(plan[r]));
            if same(r) {
                c + alpha * (p - c)
            } else {
                p
            }
        })
        .collect();
    if (0..n).any(|r| !same(r)) {
        let fixed: f64 = (0..n).filter(|&r| !same(r)).map(|r| x[r]).sum();
        let damped: f64 = (0..n).filter(|&r| same(r)).map(|r| x[r]).sum();
        if damped <= 0.0 {
            return None;
        }
        let scale = (f64::from(global) - fixed) / damped;
        for r in (0..n).filter(|&r| same(r)) {
            x[r] *= scale;
        }
    }
    let out = |r: usize, v: u32| if plan[r] == 0 { 0 } else { v };
    let lo: Vec<u32> = (0..n).map(|r| out(r, lower[r])).collect();
    let hi: Vec<u32> = (0..n).map(|r| out(r, upper[r])).collect();
    round_to_sum(&x, global, &lo, &hi)
}

#[cfg(test)]
mod tests;
