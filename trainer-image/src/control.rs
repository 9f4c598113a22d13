//! Step-boundary agreement. A small int64 control word
//! `[stop, generation, B, b_0..b_{n-1}]` — rank 0's proposed plan and every
//! rank's stop request — is SUM-all-reduced so that all ranks switch plans,
//! and stop, at the same step. Before the first step it is a blocking
//! collective of its own ([`agree`]); during training it rides with the
//! gradient buckets of step t (started asynchronously beside them, no round
//! trip of its own) and every rank applies it at the boundary of step t+1
//! ([`encode`] / [`decode`]).

use heterotrain_crds::BatchPlan;
use tch::Tensor;

use crate::c10d::ProcessGroup;
use crate::error::Result;

/// What the ranks agreed on for the coming step.
#[derive(Debug, Clone, PartialEq)]
pub struct Agreement {
    pub plan: BatchPlan,
    /// Some rank asked to stop (SIGTERM).
    pub stop: bool,
}

/// This rank's control word: its stop request and, on rank 0, the plan.
pub fn encode(rank: usize, world: usize, proposed: &BatchPlan, stop: bool) -> Tensor {
    let mut v = vec![0i64; 3 + world];
    v[0] = i64::from(stop);
    if rank == 0 {
        v[1] = proposed.generation as i64;
        v[2] = i64::from(proposed.global_batch_size);
        for (r, b) in proposed.batch_sizes.iter().enumerate().take(world) {
            v[3 + r] = i64::from(*b);
        }
    }
    Tensor::from_slice(&v)
}

/// The agreement in a SUM-reduced control word; `proposed` is this rank's
/// own proposal (rank 0 keeps its plan's policy and reason).
pub fn decode(word: &Tensor, rank: usize, proposed: &BatchPlan) -> Agreement {
    let out = Vec::<i64>::try_from(word).unwrap_or_default();
    if out.len() < 3 {
        return Agreement {
            plan: proposed.clone(),
            stop: false,
        };
    }
    let mut plan = proposed.clone();
    if rank != 0 || plan.generation != out[1] as u64 {
        plan.generation = out[1] as u64;
        plan.global_batch_size = out[2] as u32;
        plan.batch_sizes = out[3..].iter().map(|&b| b as u32).collect();
        plan.policy = "agreed".into();
        plan.reason = "from rank 0".into();
    }
    Agreement {
        plan,
        stop: out[0] > 0,
    }
}

/// Agree on the plan (rank 0's `proposed`) and on stopping, now (one
/// blocking collective).
pub fn agree(
    pg: Option<&ProcessGroup>,
    rank: usize,
    proposed: &BatchPlan,
    stop: bool,
) -> Result<Agreement> {
    let Some(pg) = pg else {
        return Ok(Agreement {
            plan: proposed.clone(),
            stop,
        });
    };
    let mut t = encode(rank, pg.world_size(), proposed, stop);
    pg.all_reduce_sum(&mut t)?;
    Ok(decode(&t, rank, proposed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_of_words_carries_rank_zero_plan_and_any_stop() {
        let mut p0 = BatchPlan::equal(3, 32, 3);
        p0.batch_sizes = vec![20, 9, 3];
        let p1 = BatchPlan::equal(2, 32, 3);
        let sum = encode(0, 3, &p0, false) + encode(1, 3, &p1, true) + encode(2, 3, &p1, false);
        let a = decode(&sum, 1, &p1);
        assert!(a.stop);
        assert_eq!(a.plan.generation, 3);
        assert_eq!(a.plan.batch_sizes, vec![20, 9, 3]);
        let a0 = decode(&sum, 0, &p0);
        assert_eq!(a0.plan, p0, "rank 0 keeps its own plan's text");
        let calm = encode(0, 3, &p0, false) + encode(1, 3, &p1, false);
        assert!(!decode(&calm, 2, &p1).stop);
    }
}
