//! Step-boundary agreement: one small int64 SUM all-reduce per step carries
//! rank 0's plan (generation, B, b_0..b_{n-1}) and every rank's stop request,
//! so all ranks switch plans, and stop, at the same step.

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

/// Agree on the plan (rank 0's `proposed`) and on stopping.
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
    let ws = pg.world_size();
    let mut v = vec![0i64; 3 + ws];
    v[0] = i64::from(stop);
    if rank == 0 {
        v[1] = proposed.generation as i64;
        v[2] = i64::from(proposed.global_batch_size);
        for (r, b) in proposed.batch_sizes.iter().enumerate().take(ws) {
            v[3 + r] = i64::from(*b);
        }
    }
    let mut t = Tensor::from_slice(&v);
    pg.all_reduce_sum(&mut t)?;
    let out = Vec::<i64>::try_from(&t).unwrap_or(v);
    let mut plan = proposed.clone();
    if rank != 0 || plan.generation != out[1] as u64 {
        plan.generation = out[1] as u64;
        plan.global_batch_size = out[2] as u32;
        plan.batch_sizes = out[3..].iter().map(|&b| b as u32).collect();
        plan.policy = "agreed".into();
        plan.reason = "from rank 0".into();
    }
    Ok(Agreement {
        plan,
        stop: out[0] > 0,
    })
}
