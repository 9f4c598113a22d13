//! Balancer configuration (from the job spec's `loadBalancing` section) and
//! the policy names.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::BalancerError;

/// How local batches are decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Equal split (subject to caps); the baseline every result is compared with.
    Static,
    /// Water-filling on the start-up profile models only.
    Proportional,
    /// Water-filling on live measurements, with hysteresis, damping and
    /// straggler handling.
    #[default]
    Dynamic,
    /// Profile as a prior, live measurements weighted in as they accrue.
    Hybrid,
    /// The seeds' scoring formula (seed 003); a comparison baseline for
    /// benchmarks, not meant for production jobs.
    SeedFormula,
}

impl Policy {
    /// Every policy, in display order.
    pub const ALL: [Policy; 5] = [
        Policy::Static,
        Policy::Proportional,
        Policy::Dynamic,
        Policy::Hybrid,
        Policy::SeedFormula,
    ];

    /// Kebab-case name, as in job specs and plans ("seed-formula").
    pub fn as_str(&self) -> &'static str {
        match self {
            Policy::Static => "static",
            Policy::Proportional => "proportional",
            Policy::Dynamic => "dynamic",
            Policy::Hybrid => "hybrid",
            Policy::SeedFormula => "seed-formula",
        }
    }

    /// Whether the policy fits live measurements (dynamic, hybrid).
    pub fn is_live(&self) -> bool {
        matches!(self, Policy::Dynamic | Policy::Hybrid)
    }

    /// Whether the policy plans from measured step models (profiles or
    /// live steps): proportional, dynamic and hybrid. Only these may leave
    /// ranks out.
    pub fn measures(&self) -> bool {
        matches!(
            self,
            Policy::Proportional | Policy::Dynamic | Policy::Hybrid
        )
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Policy {
    type Err = BalancerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| BalancerError::UnknownPolicy(s.to_string()))
    }
}

/// Balancer settings. Serde camelCase; every field has a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BalancerConfig {
    /// The policy.
    pub policy: Policy,
    /// Global batch `B`; every plan sums to it exactly.
    pub global_batch_size: u32,
    /// Smallest local batch any rank gets (docs/design.md: plans need ≥ 1).
    pub min_local_batch: u32,
    /// Largest local batch any rank gets, on top of each rank's memory cap.
    pub max_local_batch: Option<u32>,
    /// Hysteresis: a new plan only when its predicted step time is at least
    /// this many percent lower than the current plan's.
    pub min_gain_percent: u32,
    /// `k`: a sample more than `k`× slower (or faster) than its model
    /// predicts counts towards a fast re-fit. The CRD's
    /// `stragglerThresholdPercent` / 100.
    pub straggler_factor: f64,
    /// Consecutive off-model samples that trigger a fast re-fit.
    pub straggler_patience: u32,
    /// Live samples kept per rank (the fitting window).
    pub window: usize,
    /// A rank that reported nothing for this many decisions is stale: it
    /// keeps its last batch and never gets more.
    pub stale_after_decisions: u32,
    /// Hybrid: the profile counts as this many live samples.
    pub prior_weight: f64,
    /// Smallest fraction of the way to the optimum a damped plan moves.
    pub min_damping: f64,
    /// Measurement policies (proportional, dynamic, hybrid) may give a slow
    /// rank other than rank 0 a local batch of 0 — leave it out — when the
    /// others alone finish each step sooner than with it.
    pub leave_out_slow_ranks: bool,
    /// Live policies (dynamic, hybrid): a training rank that used at least
    /// 90% of its CPU quota gets no more samples than it trains now (see
    /// `Balancer::hold_quota_bound`).
    pub cap_quota_bound_ranks: bool,
    /// Leaving a rank out must also predict a step at least this many
    /// percent shorter than the best plan that leaves out no further rank,
    /// so that noise never flaps membership.
    pub leave_out_margin_percent: u32,
    /// A left-out rank is re-admitted for measurement after this many
    /// decisions; each time fresh measurements leave it out again the wait
    /// doubles (up to [`MAX_READMIT_FACTOR`]×), and it resets once the rank
    /// stays in.
    pub readmit_after_decisions: u32,
}

/// Largest multiple of `readmitAfterDecisions` a rank left out again and
/// again waits before its next re-admission.
pub const MAX_READMIT_FACTOR: u32 = 8;

impl Default for BalancerConfig {
    fn default() -> Self {
        BalancerConfig {
            policy: Policy::default(),
            global_batch_size: 256,
            min_local_batch: 1,
            max_local_batch: None,
            min_gain_percent: 5,
            straggler_factor: 1.5,
            straggler_patience: 3,
            window: 20,
            stale_after_decisions: 2,
            prior_weight: 20.0,
            min_damping: 0.25,
            leave_out_slow_ranks: true,
            cap_quota_bound_ranks: true,
            leave_out_margin_percent: 10,
            readmit_after_decisions: 20,
        }
    }
}

impl BalancerConfig {
    /// Checks ranges: `straggler_factor > 1`, `window ≥ 1`,
    /// `prior_weight ≥ 0`, `0 < min_damping ≤ 1`, `min_local_batch ≤ max_local_batch`,
    /// `min_gain_percent ≤ 100`, `leave_out_margin_percent ≤ 100`,
    /// `readmit_after_decisions ≥ 1`.
    pub fn validate(&self) -> Result<(), BalancerError> {
        let bad = |m: String| Err(BalancerError::InvalidConfig(m));
        if !(self.straggler_factor.is_finite() && self.straggler_factor > 1.0) {
            return bad(format!(
                "stragglerFactor must be > 1, got {}",
                self.straggler_factor
            ));
        }
        if self.window == 0 {
            return bad("window must be ≥ 1".into());
        }
        if !(self.prior_weight.is_finite() && self.prior_weight >= 0.0) {
            return bad(format!(
                "priorWeight must be ≥ 0, got {}",
                self.prior_weight
            ));
        }
        if !(self.min_damping > 0.0 && self.min_damping <= 1.0) {
            return bad(format!(
                "minDamping must be in (0, 1], got {}",
                self.min_damping
            ));
        }
        if self.min_gain_percent > 100 {
            return bad(format!(
                "minGainPercent must be ≤ 100, got {}",
                self.min_gain_percent
            ));
        }
        if self.leave_out_margin_percent > 100 {
            return bad(format!(
                "leaveOutMarginPercent must be ≤ 100, got {}",
                self.leave_out_margin_percent
            ));
        }
        if self.readmit_after_decisions == 0 {
            return bad(
                "readmitAfterDecisions must be ≥ 1 (a left-out rank must be able to come back)"
                    .into(),
            );
        }
        if let Some(max) = self.max_local_batch {
            if max < self.min_local_batch {
                return bad(format!(
                    "maxLocalBatch {max} is below minLocalBatch {}",
                    self.min_local_batch
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_names_round_trip() {
        for p in Policy::ALL {
            assert_eq!(p.to_string().parse::<Policy>(), Ok(p));
            let json = serde_json::to_string(&p).expect("json");
            assert_eq!(json, format!("\"{p}\""));
        }
        assert_eq!("seed-formula".parse::<Policy>(), Ok(Policy::SeedFormula));
        assert!(matches!(
            "fastest".parse::<Policy>(),
            Err(BalancerError::UnknownPolicy(_))
        ));
    }

    #[test]
    fn config_is_camel_case_with_defaults() {
        let c: BalancerConfig = serde_json::from_str(
            r#"{"policy":"hybrid","globalBatchSize":512,"minGainPercent":10}"#,
        )
        .expect("parse");
        assert_eq!(c.policy, Policy::Hybrid);
        assert_eq!(c.global_batch_size, 512);
        assert_eq!(c.min_gain_percent, 10);
        assert_eq!(c.straggler_factor, 1.5);
        assert_eq!(c.window, 20);
        assert!(c.leave_out_slow_ranks);
        assert!(c.cap_quota_bound_ranks);
        assert_eq!(c.leave_out_margin_percent, 10);
        assert_eq!(c.readmit_after_decisions, 20);
        let v = serde_json::to_value(&c).expect("json");
        assert!(v.get("stragglerFactor").is_some());
        for key in [
            "leaveOutSlowRanks",
            "capQuotaBoundRanks",
            "leaveOutMarginPercent",
            "readmitAfterDecisions",
        ] {
            assert!(v.get(key).is_some(), "{key} missing in {v}");
        }
        assert!(c.validate().is_ok());
    }

    #[test]
    fn validate_rejects_out_of_range() {
        let mut c = BalancerConfig {
            straggler_factor: 1.0,
            ..Default::default()
        };
        assert!(c.validate().is_err());
        c.straggler_factor = f64::NAN;
        assert!(c.validate().is_err());
        let c = BalancerConfig {
            window: 0,
            ..Default::default()
        };
        assert_eq!(
            c.validate().map_err(|e| e.metric_label()),
            Err("invalid_config")
        );
        let c = BalancerConfig {
            min_local_batch: 8,
            max_local_batch: Some(4),
            ..Default::default()
        };
        assert!(c.validate().is_err());
        let c = BalancerConfig {
            readmit_after_decisions: 0,
            ..Default::default()
        };
        let e = c.validate().expect_err("readmit 0");
        assert!(e.to_string().contains("readmitAfterDecisions"), "{e}");
        let c = BalancerConfig {
            leave_out_margin_percent: 101,
            ..Default::default()
        };
        let e = c.validate().expect_err("margin 101");
        assert!(e.to_string().contains("leaveOutMarginPercent"), "{e}");
    }
}
