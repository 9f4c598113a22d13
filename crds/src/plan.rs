//! The batch plan: the wire format the operator writes into `<job>-plan`
//! (key `plan.json`) and every trainer rank reads. See docs/design.md "Contracts".

use serde::{Deserialize, Serialize};

/// Key of the plan inside the plan ConfigMap.
pub const PLAN_KEY: &str = "plan.json";

/// One generation of the per-rank local batch sizes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchPlan {
    /// Monotonic generation; trainers switch only to a newer one.
    pub generation: u64,
    /// Global batch B; must equal the sum of `batch_sizes`.
    pub global_batch_size: u32,
    /// Local batch of each rank, indexed by rank. 0 leaves a rank out of
    /// this plan (no samples, no part in the gradient exchange); rank 0,
    /// which writes checkpoints, always trains.
    pub batch_sizes: Vec<u32>,
    /// Policy that produced the plan (`static`, `proportional`, ...).
    #[serde(default)]
    pub policy: String,
    /// Human-readable reason for this plan.
    #[serde(default)]
    pub reason: String,
    /// Step time the balancer predicts for this plan, in seconds
    /// (compute: the slowest rank's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_step_seconds: Option<f64>,
    /// Communication per step that no split removes, as measured so far
    /// (seconds): the achievable step is `predicted_step_seconds` plus this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_communication_seconds: Option<f64>,
}

/// Why a plan was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("plan is not valid JSON: {0}")]
    Parse(String),
    #[error("plan has {got} batch sizes but WORLD_SIZE is {world_size}")]
    WrongLength { got: usize, world_size: usize },
    #[error("plan gives rank 0 a local batch of 0; rank 0 writes checkpoints and must train (other ranks may get 0 to be left out)")]
    ZeroBatch { rank: usize },
    #[error("plan batch sizes sum to {sum} but globalBatchSize is {global}")]
    WrongSum { sum: u64, global: u32 },
    #[error("plan globalBatchSize is {got} but this job trains with {expected}")]
    GlobalMismatch { got: u32, expected: u32 },
}

impl PlanError {
    /// Stable short label for metrics and events.
    pub fn metric_label(&self) -> &'static str {
        match self {
            PlanError::Parse(_) => "parse",
            PlanError::WrongLength { .. } => "wrong_length",
            PlanError::ZeroBatch { .. } => "zero_batch",
            PlanError::WrongSum { .. } => "wrong_sum",
            PlanError::GlobalMismatch { .. } => "global_mismatch",
        }
    }
}

impl BatchPlan {
    /// An equal split of `global` over `world_size` ranks (the first
    /// `global % world_size` ranks get one more sample).
    pub fn equal(generation: u64, global: u32, world_size: usize) -> BatchPlan {
        let ws = world_size.max(1) as u32;
        let base = global / ws;
        let extra = (global % ws) as usize;
        let batch_sizes = (0..world_size)
            .map(|r| base + u32::from(r < extra))
            .collect();
        BatchPlan {
            generation,
            global_batch_size: global,
            batch_sizes,
            policy: "static".into(),
            reason: "equal split".into(),
            predicted_step_seconds: None,
            predicted_communication_seconds: None,
        }
    }

    /// Parse and validate a plan for a job with `world_size` ranks.
    pub fn parse(text: &str, world_size: usize) -> Result<BatchPlan, PlanError> {
        let plan: BatchPlan =
            serde_json::from_str(text).map_err(|e| PlanError::Parse(e.to_string()))?;
        plan.validate(world_size)?;
        Ok(plan)
    }

    /// Check the plan invariants (docs/design.md "Contracts"): one entry
    /// per rank, rank 0's ≥ 1 (others ≥ 0: 0 leaves the rank out), sum = B.
    pub fn validate(&self, world_size: usize) -> Result<(), PlanError> {
        if self.batch_sizes.len() != world_size {
            return Err(PlanError::WrongLength {
                got: self.batch_sizes.len(),
                world_size,
            });
        }
        if self.batch_sizes.first() == Some(&0) {
            return Err(PlanError::ZeroBatch { rank: 0 });
        }
        let sum: u64 = self.batch_sizes.iter().map(|&b| u64::from(b)).sum();
        if sum != u64::from(self.global_batch_size) {
            return Err(PlanError::WrongSum {
                sum,
                global: self.global_batch_size,
            });
        }
        Ok(())
    }

    /// Like [`validate`](Self::validate), and also require the job's global batch.
    pub fn validate_for(&self, world_size: usize, global: u32) -> Result<(), PlanError> {
        self.validate(world_size)?;
        if self.global_batch_size != global {
            return Err(PlanError::GlobalMismatch {
                got: self.global_batch_size,
                expected: global,
            });
        }
        Ok(())
    }

    /// Index of the first sample of `rank`'s slice within a global batch.
    pub fn offset_of(&self, rank: usize) -> usize {
        self.batch_sizes
            .iter()
            .take(rank)
            .map(|&b| b as usize)
            .sum()
    }

    /// The ranks that train under this plan (local batch ≥ 1), in order.
    pub fn members(&self) -> Vec<usize> {
        (0..self.batch_sizes.len())
            .filter(|&r| self.batch_sizes[r] > 0)
            .collect()
    }

    /// The ranks this plan leaves out (local batch 0), in order.
    pub fn left_out(&self) -> Vec<usize> {
        (0..self.batch_sizes.len())
            .filter(|&r| self.batch_sizes[r] == 0)
            .collect()
    }

    /// JSON text as stored in the ConfigMap.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_design_example() {
        let p = BatchPlan::parse(
            r#"{"generation":3,"globalBatchSize":32,"batchSizes":[20,9,3],"policy":"dynamic","reason":"r","predictedStepSeconds":0.5}"#,
            3,
        )
        .unwrap();
        assert_eq!(p.batch_sizes, vec![20, 9, 3]);
        assert_eq!(p.offset_of(2), 29);
        assert_eq!(p.predicted_step_seconds, Some(0.5));
    }

    #[test]
    fn refuses_bad_plans() {
        let bad = [
            ("garbage", "parse"),
            (
                r#"{"generation":1,"globalBatchSize":32,"batchSizes":[0,16,16]}"#,
                "zero_batch",
            ),
            (
                r#"{"generation":1,"globalBatchSize":32,"batchSizes":[16,16]}"#,
                "wrong_length",
            ),
            (
                r#"{"generation":1,"globalBatchSize":32,"batchSizes":[16,8,7]}"#,
                "wrong_sum",
            ),
            (
                r#"{"generation":-1,"globalBatchSize":32,"batchSizes":[16,8,8]}"#,
                "parse",
            ),
        ];
        for (text, label) in bad {
            let err = BatchPlan::parse(text, 3).unwrap_err();
            assert_eq!(err.metric_label(), label, "{text}: {err}");
        }
    }

    #[test]
    fn ranks_other_than_zero_may_be_left_out() {
        let p = BatchPlan::parse(
            r#"{"generation":2,"globalBatchSize":32,"batchSizes":[20,0,12,0]}"#,
            4,
        )
        .unwrap();
        assert_eq!(p.members(), vec![0, 2]);
        assert_eq!(p.left_out(), vec![1, 3]);
        let err = BatchPlan::parse(
            r#"{"generation":2,"globalBatchSize":32,"batchSizes":[0,32]}"#,
            2,
        )
        .unwrap_err();
        assert!(err.to_string().contains("rank 0"), "{err}");
    }

    proptest! {
        #[test]
        fn equal_split_is_valid(global in 1u32..100_000, ws in 1usize..300) {
            prop_assume!(global as usize >= ws);
            let p = BatchPlan::equal(0, global, ws);
            prop_assert!(p.validate(ws).is_ok());
            let max = *p.batch_sizes.iter().max().unwrap();
            let min = *p.batch_sizes.iter().min().unwrap();
            prop_assert!(max - min <= 1);
        }
    }
}
