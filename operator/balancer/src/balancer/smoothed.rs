//! The smoothed per-rank measurements: exposed communication, compute
//! spread and CPU quota use.

use super::Balancer;
use crate::BalancerError;

impl Balancer {
    /// One live measurement of `rank`'s exposed communication per step
    /// (seconds of the step not spent computing: waiting for peers and the
    /// exchanges themselves), smoothed exponentially.
    pub fn observe_communication(
        &mut self,
        rank: usize,
        seconds: f64,
    ) -> Result<(), BalancerError> {
        let r = self.rank_mut(rank)?;
        let seconds = non_negative(rank, seconds, "communication seconds")?;
        r.communication = Some(smooth(
            r.communication,
            seconds,
            COMMUNICATION_SMOOTHING,
            COMMUNICATION_SMOOTHING,
        ));
        Ok(())
    }

    /// How far `rank`'s slow steps' compute runs over its typical one (the
    /// trainer's 90th percentile minus median of recent steps), smoothed
    /// exponentially: up fast, down slowly. A synchronous step waits for
    /// the slowest rank of *that* step, so the live policies (dynamic,
    /// hybrid) plan each rank at its typical compute plus this spread
    /// (weighted by [`crate::spread_weight`]): a rank whose compute
    /// jumps (a CPU quota's next period) gets fewer samples than its mean
    /// alone would give it, and holds the others up less often. Errors
    /// when `seconds` is not finite and ≥ 0.
    pub fn observe_compute_spread(
        &mut self,
        rank: usize,
        seconds: f64,
    ) -> Result<(), BalancerError> {
        let r = self.rank_mut(rank)?;
        let seconds = non_negative(rank, seconds, "compute spread seconds")?;
        r.spread = Some(smooth(r.spread, seconds, SPREAD_RISE, SPREAD_FALL));
        Ok(())
    }

    /// The share of its CPU quota `rank` used over a recent interval (CPU
    /// time over the quota's allowance; 1 = every period's quota spent),
    /// smoothed exponentially. A rank saturated on its quota cannot run
    /// faster, whatever it waits for: when it is also the slowest per
    /// sample and trains few samples, a leave-out trial needs no excess of
    /// the measured step over the predicted one (see `measured.rs`).
    /// Errors when `ratio` is not finite and ≥ 0.
    pub fn observe_quota_use(&mut self, rank: usize, ratio: f64) -> Result<(), BalancerError> {
        let r = self.rank_mut(rank)?;
        let ratio = non_negative(rank, ratio, "CPU quota use")?;
        r.quota_use = Some(smooth(
            r.quota_use,
            ratio,
            QUOTA_USE_SMOOTHING,
            QUOTA_USE_SMOOTHING,
        ));
        Ok(())
    }
}

/// `seconds` when finite and ≥ 0, else the sample error for `rank`.
fn non_negative(rank: usize, seconds: f64, what: &str) -> Result<f64, BalancerError> {
    if seconds.is_finite() && seconds >= 0.0 {
        Ok(seconds)
    } else {
        Err(BalancerError::InvalidSample {
            rank,
            reason: format!("{what} {seconds}"),
        })
    }
}

/// Exponential smoothing of `new` into `old`, with weight `rise` for a
/// sample above the smoothed value and `fall` for one below.
fn smooth(old: Option<f64>, new: f64, rise: f64, fall: f64) -> f64 {
    match old {
        Some(old) if new >= old => old + rise * (new - old),
        Some(old) => old + fall * (new - old),
        None => new,
    }
}

/// Weights of a new spread sample above and below the smoothed one. A
/// rank's spread depends on its batch: the smaller batch its spread earns
/// it shows a smaller spread (in the bench a 0.15-core rank's p90 − median
/// was 27.8 ms at 10 samples, 13.9 ms at 4), and a spread that fell as
/// fast as it rose would follow it down and hand samples back. With
/// symmetric smoothing that bench run went [62, 46, 16, 4] → [51, 41, 21,
/// 15] after nine seconds, at two thirds of the rate.
const SPREAD_RISE: f64 = 0.5;
const SPREAD_FALL: f64 = 0.05;

/// Weight of a new communication sample in the smoothed estimate.
const COMMUNICATION_SMOOTHING: f64 = 0.3;
/// Weight of a new CPU quota use sample.
const QUOTA_USE_SMOOTHING: f64 = 0.5;
