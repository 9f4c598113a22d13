//! Step-time models: `t(b) = a + c·b` per rank, fitted robustly from profile
//! points (Theil–Sen) and from a window of live measurements (median of the
//! per-sample rate), with fast re-fitting when a rank drifts away from its
//! model.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::BalancerError;

/// Smallest per-sample time a fitted model may have, in seconds (keeps the
/// maths finite when measurements are absurdly small).
pub const MIN_PER_SAMPLE_SECONDS: f64 = 1e-12;

/// The smallest share of a measured step a live re-fit puts on its samples
/// (`θ` in [`LiveModel`]): a step within this share of the profile's fixed
/// cost, or under it, cannot tell the per-sample rate at one batch size.
pub const MIN_PER_SAMPLE_SHARE: f64 = 0.1;

/// Linear step-time model of one rank: `t(b) = fixed_seconds + per_sample_seconds · b`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepModel {
    /// Fixed cost per step `a` in seconds (kernel launches, optimizer step), ≥ 0.
    pub fixed_seconds: f64,
    /// Cost per sample `c` in seconds, > 0.
    pub per_sample_seconds: f64,
}

impl StepModel {
    /// A model, checked: `a` finite and ≥ 0, `c` finite and > 0.
    pub fn new(fixed_seconds: f64, per_sample_seconds: f64) -> Result<Self, BalancerError> {
        let m = StepModel {
            fixed_seconds,
            per_sample_seconds,
        };
        if m.is_valid() {
            Ok(m)
        } else {
            Err(BalancerError::InvalidModel {
                rank: 0,
                fixed_seconds,
                per_sample_seconds,
            })
        }
    }

    /// True when `a` is finite and ≥ 0 and `c` is finite and > 0.
    pub fn is_valid(&self) -> bool {
        self.fixed_seconds.is_finite()
            && self.fixed_seconds >= 0.0
            && self.per_sample_seconds.is_finite()
            && self.per_sample_seconds > 0.0
    }

    /// Predicted step (compute) time at local batch `batch`, in seconds.
    pub fn predict(&self, batch: u32) -> f64 {
        self.fixed_seconds + self.per_sample_seconds * f64::from(batch)
    }

    /// The (real) batch this rank finishes in exactly `seconds`: `(t − a) / c`.
    pub fn batch_at(&self, seconds: f64) -> f64 {
        (seconds - self.fixed_seconds) / self.per_sample_seconds
    }
}

/// Median of a slice (reorders it). `None` when empty.
pub(crate) fn median(values: &mut [f64]) -> Option<f64> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let mid = n / 2;
    let (lower, m, _) = values.select_nth_unstable_by(mid, f64::total_cmp);
    let m = *m;
    if n % 2 == 1 {
        Some(m)
    } else {
        let lo = lower.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some((lo + m) / 2.0)
    }
}

/// The most profile points [`fit_profile`] uses (a profile has a handful).
pub const MAX_FIT_POINTS: usize = 256;

/// True for a usable measurement: positive batch, finite positive time.
pub(crate) fn valid_sample(batch: u32, seconds: f64) -> bool {
    batch > 0 && seconds.is_finite() && seconds > 0.0
}

/// Fits `t = a + c·b` to profile points `(batch, seconds)` with the Theil–Sen
/// estimator (median of pairwise slopes, median intercept), which ignores up
/// to ~29% outliers. Invalid points are skipped. With one distinct batch size,
/// or when the fit is not physical (slope ≤ 0, intercept < 0), falls back to
/// `a = 0, c = median(t/b)`. `None` when no point is usable. Only the first
/// [`MAX_FIT_POINTS`] usable points count (the fit compares every pair).
pub fn fit_profile(points: &[(u32, f64)]) -> Option<StepModel> {
    let pts: Vec<(f64, f64)> = points
        .iter()
        .filter(|(b, t)| valid_sample(*b, *t))
        .take(MAX_FIT_POINTS)
        .map(|(b, t)| (f64::from(*b), *t))
        .collect();
    if pts.is_empty() {
        return None;
    }
    let mut rates: Vec<f64> = pts.iter().map(|(b, t)| t / b).collect();
    let rate_only = StepModel {
        fixed_seconds: 0.0,
        per_sample_seconds: median(&mut rates)?.max(MIN_PER_SAMPLE_SECONDS),
    };
    let mut slopes = Vec::new();
    for (i, (bi, ti)) in pts.iter().enumerate() {
        for (bj, tj) in &pts[i + 1..] {
            if bj != bi {
                slopes.push((tj - ti) / (bj - bi));
            }
        }
    }
    let Some(c) = median(&mut slopes) else {
        return Some(rate_only);
    };
    if !(c.is_finite() && c > 0.0) {
        return Some(rate_only);
    }
    let mut intercepts: Vec<f64> = pts.iter().map(|(b, t)| t - c * b).collect();
    match median(&mut intercepts) {
        Some(a) if a.is_finite() && a >= 0.0 => Some(StepModel {
            fixed_seconds: a,
            per_sample_seconds: c.max(MIN_PER_SAMPLE_SECONDS),
        }),
        _ => Some(rate_only),
    }
}

/// What [`LiveModel::push`] concluded about one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome {
    /// The sample agrees with the model (or there is no model yet).
    InLine,
    /// The sample is off by more than the straggler factor; not yet persistent.
    Off,
    /// Persistently off: the window was cut to the recent samples and re-fitted.
    Refitted,
}

/// Windowed live estimator of one rank's per-sample time.
///
/// Keeps the last `capacity` `(batch, compute seconds)` samples. The fit is
/// `c = median(max(t_i − a, θ·t_i) / b_i)` for a given fixed cost `a` (the
/// profile's, or 0) and `θ` = [`MIN_PER_SAMPLE_SHARE`]: the median makes a
/// single wild sample harmless, and since the fitted rate absorbs any
/// unmodelled fixed cost at the current batch, re-planning from it is a
/// fixed-point iteration that converges to equal finish times. The floor
/// `θ·t_i` matters only when a step comes within `θ` of the fixed cost or
/// under it (a small batch on a rank whose profile over-estimated `a`):
/// live steps mostly come at one batch, which cannot tell a fixed cost from
/// a rate there, and `(t − a) / b` would go to zero and hand that rank the
/// whole batch. The fitted fixed cost is then `min(a, (1 − θ)·median(t_i))`,
/// so the model still predicts the measured step at the measured batch.
/// When `patience` consecutive samples are more than `factor`× away from the
/// model (slower or faster), the window is cut to those samples and
/// re-fitted at once.
#[derive(Debug, Clone)]
pub struct LiveModel {
    samples: VecDeque<(u32, f64)>,
    capacity: usize,
    total: u64,
    off_streak: u32,
    fast_refit: bool,
    fitted: Option<StepModel>,
    fitted_fixed: f64,
    relative_error: f64,
    dirty: bool,
    /// Reused buffer for the fit (no allocation per re-fit).
    scratch: Vec<f64>,
}

/// Scale from the median absolute deviation to a normal standard deviation.
const MAD_TO_SIGMA: f64 = 1.4826;
/// Standard error of a sample median relative to that of a mean (normal data).
const MEDIAN_EFFICIENCY: f64 = 1.2533;

impl LiveModel {
    /// An empty estimator keeping `capacity` samples (at least 1).
    pub fn new(capacity: usize) -> Self {
        LiveModel {
            samples: VecDeque::with_capacity(capacity.max(1)),
            capacity: capacity.max(1),
            total: 0,
            off_streak: 0,
            fast_refit: false,
            fitted: None,
            fitted_fixed: 0.0,
            relative_error: 0.0,
            dirty: false,
            scratch: Vec::with_capacity(capacity.max(1)),
        }
    }

    /// Relative standard error of the last fitted per-sample time (robust:
    /// from the median absolute deviation of the window); 0 with fewer than
    /// 3 samples.
    pub fn relative_error(&self) -> f64 {
        self.relative_error
    }

    /// Samples currently in the window.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True when no sample is in the window.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Valid samples pushed since creation or the last fast re-fit.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// True after a straggler re-fit, until the window has filled again.
    pub fn fast_refit(&self) -> bool {
        self.fast_refit
    }

    /// The most recent sample.
    pub fn last(&self) -> Option<(u32, f64)> {
        self.samples.back().copied()
    }

    /// Mean compute seconds over the window (used by the seed formula).
    pub fn mean_seconds(&self) -> Option<f64> {
        if self.samples.is_empty() {
            return None;
        }
        Some(self.samples.iter().map(|s| s.1).sum::<f64>() / self.samples.len() as f64)
    }

    /// Adds a sample (invalid ones must be filtered by the caller). `reference`
    /// is the model to judge it against (the last fit, else the profile);
    /// `fixed` is the fixed cost used when re-fitting.
    pub fn push(
        &mut self,
        batch: u32,
        seconds: f64,
        reference: Option<StepModel>,
        fixed: f64,
        factor: f64,
        patience: u32,
    ) -> PushOutcome {
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back((batch, seconds));
        self.total += 1;
        self.dirty = true;
        if self.fast_refit && self.samples.len() == self.capacity {
            self.fast_refit = false;
        }
        let Some(model) = self.fitted.or(reference) else {
            return PushOutcome::InLine;
        };
        let predicted = model.predict(batch);
        let off = predicted > 0.0 && (seconds > factor * predicted || seconds * factor < predicted);
        if !off {
            self.off_streak = 0;
            return PushOutcome::InLine;
        }
        self.off_streak += 1;
        if self.off_streak < patience.max(1) {
            return PushOutcome::Off;
        }
        let keep = (self.off_streak as usize).min(self.samples.len());
        let drop = self.samples.len() - keep;
        self.samples.drain(..drop);
        self.total = keep as u64;
        self.off_streak = 0;
        self.fast_refit = true;
        self.refit(fixed);
        PushOutcome::Refitted
    }

    /// The fitted model for fixed cost `fixed`, re-fitting if new samples
    /// arrived or `fixed` changed. `None` with no samples.
    pub fn model(&mut self, fixed: f64) -> Option<StepModel> {
        if self.dirty || self.fitted.is_none() || self.fitted_fixed != fixed {
            self.refit(fixed);
        }
        self.fitted
    }

    /// The last fitted model, without re-fitting.
    pub fn last_model(&self) -> Option<StepModel> {
        self.fitted
    }

    fn refit(&mut self, fixed: f64) {
        self.fitted_fixed = fixed;
        self.dirty = false;
        let fixed = if fixed.is_finite() && fixed >= 0.0 {
            fixed
        } else {
            0.0
        };
        let rates = &mut self.scratch;
        rates.clear();
        rates.extend(self.samples.iter().map(|(_, t)| *t));
        let Some(typical) = median(rates) else {
            self.fitted = None;
            self.relative_error = 0.0;
            return;
        };
        rates.clear();
        rates.extend(self.samples.iter().map(|(b, t)| {
            ((t - fixed).max(MIN_PER_SAMPLE_SHARE * t) / f64::from(*b)).max(MIN_PER_SAMPLE_SECONDS)
        }));
        self.fitted = median(rates).map(|c| StepModel {
            fixed_seconds: fixed.min((1.0 - MIN_PER_SAMPLE_SHARE) * typical),
            per_sample_seconds: c,
        });
        self.relative_error = match self.fitted {
            Some(m) if rates.len() >= 3 => {
                let c = m.per_sample_seconds;
                for r in rates.iter_mut() {
                    *r = (*r - c).abs();
                }
                let mad = median(rates).unwrap_or(0.0);
                MAD_TO_SIGMA * MEDIAN_EFFICIENCY * mad / c / (rates.len() as f64).sqrt()
            }
            _ => 0.0,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_fit_recovers_a_line_despite_an_outlier() {
        let mut pts: Vec<(u32, f64)> = [1u32, 2, 4, 8, 16, 32]
            .iter()
            .map(|&b| (b, 0.01 + 0.002 * f64::from(b)))
            .collect();
        pts.push((8, 5.0)); // wild
        pts.push((0, 1.0)); // invalid
        pts.push((4, f64::NAN)); // invalid
        let m = fit_profile(&pts).expect("fit");
        assert!((m.per_sample_seconds - 0.002).abs() < 1e-9, "{m:?}");
        assert!((m.fixed_seconds - 0.01).abs() < 1e-9, "{m:?}");
    }

    #[test]
    fn profile_fit_uses_only_the_first_max_fit_points() {
        let line = |b: u32| (b, 0.01 + 0.002 * f64::from(b));
        let mut pts: Vec<(u32, f64)> = (1..=MAX_FIT_POINTS as u32).map(line).collect();
        // Past the limit, points on another line do not count.
        pts.extend((1..=10_000u32).map(|b| (b, 1.0 + 0.5 * f64::from(b))));
        let m = fit_profile(&pts).expect("fit");
        assert!((m.per_sample_seconds - 0.002).abs() < 1e-9, "{m:?}");
        assert!((m.fixed_seconds - 0.01).abs() < 1e-9, "{m:?}");
    }

    #[test]
    fn profile_fit_single_batch_size_uses_rate() {
        let m = fit_profile(&[(10, 1.0), (10, 1.2), (10, 0.8)]).expect("fit");
        assert_eq!(m.fixed_seconds, 0.0);
        assert!((m.per_sample_seconds - 0.1).abs() < 1e-12);
        assert!(fit_profile(&[]).is_none());
        assert!(fit_profile(&[(0, 1.0), (3, -1.0)]).is_none());
    }

    #[test]
    fn live_median_ignores_a_single_wild_sample() {
        let mut lm = LiveModel::new(20);
        for _ in 0..19 {
            lm.push(10, 1.0, None, 0.0, 1.5, 3);
        }
        lm.push(10, 100.0, None, 0.0, 1.5, 3);
        let m = lm.model(0.0).expect("model");
        assert!((m.per_sample_seconds - 0.1).abs() < 1e-12);
    }

    #[test]
    fn persistent_slowdown_triggers_fast_refit() {
        let mut lm = LiveModel::new(20);
        for _ in 0..20 {
            lm.push(10, 1.0, None, 0.0, 1.5, 3);
        }
        let _ = lm.model(0.0);
        assert_eq!(lm.push(10, 2.0, None, 0.0, 1.5, 3), PushOutcome::Off);
        assert_eq!(lm.push(10, 2.0, None, 0.0, 1.5, 3), PushOutcome::Off);
        assert_eq!(lm.push(10, 2.0, None, 0.0, 1.5, 3), PushOutcome::Refitted);
        assert_eq!(lm.len(), 3);
        assert!(lm.fast_refit());
        let m = lm.model(0.0).expect("model");
        assert!((m.per_sample_seconds - 0.2).abs() < 1e-12);
        // A faster-than-model streak (recovery) also re-fits.
        for _ in 0..2 {
            assert_eq!(lm.push(10, 1.0, None, 0.0, 1.5, 3), PushOutcome::Off);
        }
        assert_eq!(lm.push(10, 1.0, None, 0.0, 1.5, 3), PushOutcome::Refitted);
    }

    #[test]
    fn a_step_near_or_under_the_fixed_cost_keeps_a_share_on_its_samples() {
        // Profile fixed cost 20 ms; steps at batch 2 of 19 ms and 20.5 ms
        // (the profile over-estimated it). Without the floor the rate
        // would be (t − a) / b ≈ 0 and 126 samples would cost nothing.
        for t in [0.019, 0.0205] {
            let mut lm = LiveModel::new(20);
            for _ in 0..5 {
                lm.push(2, t, None, 0.02, 1.5, 3);
            }
            let m = lm.model(0.02).expect("model");
            assert!(
                (m.per_sample_seconds - MIN_PER_SAMPLE_SHARE * t / 2.0).abs() < 1e-12,
                "{m:?}"
            );
            assert!((m.predict(2) - t).abs() < 1e-12, "{m:?}");
            assert!(m.predict(126) > 7.0 * t, "{m:?}");
        }
        // A step well above the fixed cost keeps it and the plain rate.
        let mut lm = LiveModel::new(20);
        for _ in 0..5 {
            lm.push(2, 0.03, None, 0.02, 1.5, 3);
        }
        let m = lm.model(0.02).expect("model");
        assert_eq!(m.fixed_seconds, 0.02);
        assert!((m.per_sample_seconds - 0.005).abs() < 1e-12, "{m:?}");
    }

    #[test]
    fn relative_error_tracks_noise() {
        let mut quiet = LiveModel::new(20);
        let mut noisy = LiveModel::new(20);
        for i in 0..20 {
            let wiggle = if i % 2 == 0 { 1.0 } else { -1.0 };
            quiet.push(10, 1.0, None, 0.0, 1.5, 3);
            noisy.push(10, 1.0 + 0.1 * wiggle, None, 0.0, 1.5, 3);
        }
        let _ = (quiet.model(0.0), noisy.model(0.0));
        assert_eq!(quiet.relative_error(), 0.0);
        // MAD 0.1 on a median of 1.0 (mean of 0.9 and 1.1): 1.4826·1.2533·0.1/√20.
        assert!((noisy.relative_error() - 1.4826 * 1.2533 * 0.1 / 20f64.sqrt()).abs() < 1e-9);
    }

    #[test]
    fn median_even_and_odd() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }
}
