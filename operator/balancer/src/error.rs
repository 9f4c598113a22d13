//! The crate's one error type. Every variant has a stable
//! [`BalancerError::metric_label`] for metrics labels and Kubernetes Events.

/// Everything that can go wrong in the balancer. Nothing in this crate panics
/// on bad input; it returns one of these or ignores the bad sample.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BalancerError {
    /// There are no ranks to split a batch over.
    #[error("no ranks to balance")]
    NoRanks,
    /// Two per-rank inputs disagree on the number of ranks.
    #[error("{what}: expected {expected} entries, got {got}")]
    LengthMismatch {
        /// Which input was the wrong length.
        what: &'static str,
        /// Entries expected (the number of ranks).
        expected: usize,
        /// Entries given.
        got: usize,
    },
    /// A rank index is not below the world size.
    #[error("rank {rank} out of range (world size {world_size})")]
    RankOutOfRange {
        /// The rank given.
        rank: usize,
        /// Ranks the balancer knows.
        world_size: usize,
    },
    /// A step model is not usable (NaN, infinite, negative, or zero per-sample time).
    #[error("rank {rank}: invalid step model (fixed {fixed_seconds} s, per-sample {per_sample_seconds} s)")]
    InvalidModel {
        /// The rank whose model is bad.
        rank: usize,
        /// Its fixed cost `a`.
        fixed_seconds: f64,
        /// Its per-sample cost `c`.
        per_sample_seconds: f64,
    },
    /// A measurement was rejected (and ignored).
    #[error("rank {rank}: sample ignored: {reason}")]
    InvalidSample {
        /// The rank that reported it.
        rank: usize,
        /// Why it was rejected.
        reason: String,
    },
    /// A rank's minimum local batch exceeds its cap.
    #[error("rank {rank}: minimum local batch {min} exceeds its cap {cap}")]
    EmptyBounds {
        /// The rank.
        rank: usize,
        /// Its minimum local batch.
        min: u32,
        /// Its cap (memory or configured maximum).
        cap: u32,
    },
    /// The global batch is smaller than the sum of the minimum local batches.
    #[error("global batch {global} is below the sum of minimum local batches {min_sum} over {ranks} ranks")]
    BelowMinimum {
        /// Requested global batch.
        global: u64,
        /// Sum of per-rank minimums.
        min_sum: u64,
        /// Number of ranks.
        ranks: usize,
    },
    /// The global batch is larger than the sum of the per-rank caps.
    #[error("global batch {global} exceeds the sum of per-rank caps {cap_sum} over {ranks} ranks")]
    AboveCaps {
        /// Requested global batch.
        global: u64,
        /// Sum of per-rank caps.
        cap_sum: u64,
        /// Number of ranks.
        ranks: usize,
    },
    /// A configuration value is out of range.
    #[error("invalid balancer config: {0}")]
    InvalidConfig(String),
    /// A policy name that is not one of the known policies.
    #[error(
        "unknown policy {0:?}; expected one of static, proportional, dynamic, hybrid, seed-formula"
    )]
    UnknownPolicy(String),
}

impl BalancerError {
    /// Stable, lower-snake-case label for metrics and Event reasons.
    pub fn metric_label(&self) -> &'static str {
        match self {
            BalancerError::NoRanks => "no_ranks",
            BalancerError::LengthMismatch { .. } => "length_mismatch",
            BalancerError::RankOutOfRange { .. } => "rank_out_of_range",
            BalancerError::InvalidModel { .. } => "invalid_model",
            BalancerError::InvalidSample { .. } => "invalid_sample",
            BalancerError::EmptyBounds { .. } => "empty_bounds",
            BalancerError::BelowMinimum { .. } => "infeasible_below_minimum",
            BalancerError::AboveCaps { .. } => "infeasible_above_caps",
            BalancerError::InvalidConfig(_) => "invalid_config",
            BalancerError::UnknownPolicy(_) => "unknown_policy",
        }
    }
}

/// The error of [`crate::optimal_split`]; the same enum as the rest of the crate.
pub type SplitError = BalancerError;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn infeasible_messages_name_the_numbers() {
        let e = BalancerError::BelowMinimum {
            global: 3,
            min_sum: 4,
            ranks: 4,
        };
        assert_eq!(
            e.to_string(),
            "global batch 3 is below the sum of minimum local batches 4 over 4 ranks"
        );
        assert_eq!(e.metric_label(), "infeasible_below_minimum");
        let e = BalancerError::AboveCaps {
            global: 100,
            cap_sum: 64,
            ranks: 2,
        };
        assert!(e.to_string().contains("100") && e.to_string().contains("64"));
        assert_eq!(e.metric_label(), "infeasible_above_caps");
    }
}
