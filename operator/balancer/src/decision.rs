//! What one balancing round decided ([`Decision`]) and the small helpers
//! its reason texts share.

use serde::{Deserialize, Serialize};

use crate::Policy;

/// Outcome of one balancing round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// The new plan, or `None` to keep the current one.
    pub plan: Option<Vec<u32>>,
    /// Predicted step (compute) seconds of the best plan found — the new
    /// plan when `plan` is `Some`, else the candidate that was turned down
    /// (equal to the current prediction when nothing better exists).
    pub predicted_step_seconds: f64,
    /// Predicted step seconds of the current plan (0 when it is unusable).
    pub current_predicted_step_seconds: f64,
    /// `100 · (current − predicted) / current` (0 when not computable).
    pub gain_percent: f64,
    /// Why, in one line, for Events and status.
    pub reason: String,
    /// The policy that decided.
    pub policy: Policy,
    /// Ranks re-fitted fast since the previous decision (stragglers, or
    /// ranks that recovered).
    pub stragglers: Vec<usize>,
    /// Ranks that stopped reporting; each kept its last batch.
    pub stale_ranks: Vec<usize>,
    /// Communication per step no split removes (seconds; 0 before any
    /// measurement), see [`crate::Balancer::communication_seconds`]. The
    /// step achievable under a plan is its predicted compute step plus this.
    #[serde(default)]
    pub communication_seconds: f64,
    /// Ranks left out of the plan to run (local batch 0: they train on no
    /// samples and take no part in the step), in order; never rank 0.
    #[serde(default)]
    pub left_out: Vec<usize>,
    /// Wall-clock step measured over the interval that ran the current plan
    /// (seconds, median over its ranks; 0 when not measured), see
    /// [`crate::Balancer::observe_step_time`]. The live policies compare it
    /// between memberships to leave out a rank whose cost is not compute.
    #[serde(default)]
    pub measured_step_seconds: f64,
}

impl Decision {
    /// The plan to run: the new one if any, else `current`.
    pub fn batches_or<'a>(&'a self, current: &'a [u32]) -> &'a [u32] {
        self.plan.as_deref().unwrap_or(current)
    }
}

/// `100 · (current − predicted) / current`, 0 when not computable.
pub(crate) fn gain_percent(current: f64, predicted: f64) -> f64 {
    if current > 0.0 {
        100.0 * (current - predicted) / current
    } else {
        0.0
    }
}

/// Part of a predicted gain that estimation noise alone would produce: the
/// current plan's predicted maximum is inflated by the largest of `n` model
/// errors, about `√(2 ln n)` standard errors, while the candidate's is not.
pub(crate) fn noise_margin_percent(relative_error: f64, n: usize) -> f64 {
    let n = n.max(2) as f64;
    let m = 100.0 * (2.0 * n.ln()).sqrt() * relative_error;
    if m.is_finite() {
        m.max(0.0)
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::{list, ranks_named};

    #[test]
    fn lists_and_names() {
        assert_eq!(list(&[1, 2, 3]), "1, 2, 3");
        assert_eq!(
            list(&(0..10).collect::<Vec<_>>()),
            "0, 1, 2, 3, 4, 5, 6, 7 +2 more"
        );
        assert_eq!(ranks_named(&[3]), "rank 3");
        assert_eq!(ranks_named(&[3, 5]), "ranks 3, 5");
        assert_eq!(gain_percent(0.0, 1.0), 0.0);
        assert!((gain_percent(2.0, 1.0) - 50.0).abs() < 1e-12);
    }
}
