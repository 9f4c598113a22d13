//! Step-boundary agreement. A small control word
//! `[stop, generation, B, b_0..b_{n-1}, loss]` — rank 0's proposed plan,
//! every rank's stop request and its weighted loss (b_r/B · mean loss) — is
//! SUM-all-reduced so that all ranks switch plans, and stop, at the same
//! step, and learn the global batch's loss. Before the first step it is a
//! blocking collective of its own ([`agree`]); during training it is the
//! step's only collective besides the gradient buckets: started
//! asynchronously once forward has the loss, overlapped with backward, and
//! applied at the boundary of step t+1 ([`encode`] / [`decode`]). The word
//! is f64: plan numbers are integers far below 2^53, so they stay exact.

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
    /// Σ_r b_r/B · loss_r: the global batch's mean loss (0 before training).
    pub loss: f64,
}

/// This rank's control word: its stop request, its weighted loss and, on
/// rank 0, the plan.
pub fn encode(rank: usize, world: usize, proposed: &BatchPlan, stop: bool, loss: f64) -> Tensor {
    let mut v = vec![0f64; 4 + world];
    v[0] = f64::from(u8::from(stop));
    if rank == 0 {
        v[1] = proposed.generation as f64;
        v[2] = f64::from(proposed.global_batch_size);
        for (r, b) in proposed.batch_sizes.iter().enumerate().take(world) {
            v[3 + r] = f64::from(*b);
        }
    }
    v[3 + world] = loss;
    Tensor::from_slice(&v)
}

/// The agreement in a SUM-reduced control word; `proposed` is this rank's
/// own proposal (rank 0 keeps its plan's policy and reason).
pub fn decode(word: &Tensor, rank: usize, proposed: &BatchPlan) -> Agreement {
    let out = Vec::<f64>::try_from(word).unwrap_or_default();
    if out.len() < 4 {
        return Agreement {
            plan: proposed.clone(),
            stop: false,
            loss: f64::NAN,
        };
    }
    let (batches, loss) = (&out[3..out.len() - 1], out[out.len() - 1]);
    let generation = out[1] as u64;
    let mut plan = proposed.clone();
    if rank != 0 || plan.generation != generation {
        plan.generation = generation;
        plan.global_batch_size = out[2] as u32;
        plan.batch_sizes = batches.iter().map(|&b| b as u32).collect();
        plan.policy = "agreed".into();
        plan.reason = "from rank 0".into();
    }
    Agreement {
        plan,
        stop: out[0] > 0.0,
        loss,
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
            loss: 0.0,
        });
    };
    let mut t = encode(rank, pg.world_size(), proposed, stop, 0.0);
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
        let sum = encode(0, 3, &p0, false, 0.25)
            + encode(1, 3, &p1, true, 0.5)
            + encode(2, 3, &p1, false, 0.125);
        let a = decode(&sum, 1, &p1);
        assert!(a.stop);
        assert_eq!(a.plan.generation, 3);
        assert_eq!(a.plan.batch_sizes, vec![20, 9, 3]);
        assert_eq!(a.loss, 0.875, "the weighted losses add up");
        let a0 = decode(&sum, 0, &p0);
        assert_eq!(a0.plan, p0, "rank 0 keeps its own plan's text");
        let calm = encode(0, 3, &p0, false, 0.0) + encode(1, 3, &p1, false, 0.0);
        assert!(!decode(&calm, 2, &p1).stop);
    }

    #[test]
    fn large_generations_and_batches_survive_the_float_word() {
        let mut p = BatchPlan::equal(1 << 40, 1 << 20, 2);
        p.batch_sizes = vec![(1 << 20) - 1, 1];
        let a = decode(&encode(0, 2, &p, false, 0.0), 1, &BatchPlan::equal(0, 2, 2));
        assert_eq!(a.plan.generation, 1 << 40);
        assert_eq!(a.plan.global_batch_size, 1 << 20);
        assert_eq!(a.plan.batch_sizes, p.batch_sizes);
    }
}
