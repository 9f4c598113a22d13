//! The margins a leave-out verdict reads: how much shorter a step must be,
//! and how much a rank's samples can save.

/// Whether `without` is at least `margin`% shorter than `with`.
pub(super) fn shorter(without: f64, with: f64, margin: u32) -> bool {
    shorter_by(without, with, f64::from(margin.min(100)) / 100.0)
}

/// Whether `without` is shorter than `with` by at least the fraction `m`.
pub(super) fn shorter_by(without: f64, with: f64, m: f64) -> bool {
    without < with * (1.0 - m)
}

/// How much shorter (a fraction) the step measured without `rank` must be
/// for it to stay out of `current`: `leaveOutMarginPercent`, or — when less
/// — the most its samples can save. With `b` of `total` samples, the
/// others take its `b` and their compute grows by at most `b / (total −
/// b)`, while the exchange loses a member, so leaving it out costs the step
/// at most that fraction; a wrong verdict on noise costs no more. The
/// margin guards against noise only where a wrong verdict could cost more:
/// on four quota-bound ranks (0.6 / 0.42 / 0.24 / 0.15 core, simple_cnn,
/// B 128) the 0.15-core rank at 2 samples made the step 9% longer than at
/// 0, under the 10% default margin, for a share worth 1.6%.
pub(crate) fn verdict_margin(current: &[u32], rank: usize, margin: u32) -> f64 {
    let m = f64::from(margin.min(100)) / 100.0;
    share_worth(current, rank).map_or(m, |w| m.min(w))
}

/// The most `rank`'s samples can save of the step under `current`, a
/// fraction: `b / (total − b)` (see [`verdict_margin`]); `None` when it
/// trains nothing or alone.
pub(super) fn share_worth(current: &[u32], rank: usize) -> Option<f64> {
    let b = f64::from(current.get(rank).copied().unwrap_or(0));
    let total: f64 = current.iter().map(|&x| f64::from(x)).sum();
    (b > 0.0 && total > b).then(|| b / (total - b))
}

/// The margin a verdict needed, for its note: "leaveOutMarginPercent 10%",
/// or "1.6% (the most its samples can save, under leaveOutMarginPercent
/// 10%)".
pub(super) fn margin_text(m: f64, margin: u32) -> String {
    if m < f64::from(margin.min(100)) / 100.0 {
        format!(
            "{:.1}% (the most its samples can save, under leaveOutMarginPercent {margin}%)",
            100.0 * m
        )
    } else {
        format!("leaveOutMarginPercent {margin}%")
    }
}

/// Whether `rank` trains at most half an equal share of `current`.
pub(super) fn small(current: &[u32], rank: usize) -> bool {
    let training = current.iter().filter(|&&x| x > 0).count() as u64;
    let total: u64 = current.iter().map(|&x| u64::from(x)).sum();
    current
        .get(rank)
        .is_some_and(|&b| b > 0 && 2 * training * u64::from(b) <= total)
}
