//! The optimizer update sharded across ranks in proportion to their local
//! batches (ZeRO stage 1 with unequal shards).
//!
//! Every trainable parameter lives in one flat buffer (each parameter's
//! data is a view of it, so the model is unchanged). Rank r owns the
//! contiguous range `[lo_r, hi_r)` of that buffer, its length proportional
//! to its weight ([`owner_weights`]: b_r, or under `fastest` 0 for a rank
//! well below the largest batch): after the gradient all-reduce every rank
//! holds the whole summed gradient, but only the owner updates (and keeps
//! optimizer state for) each element; the owners then broadcast their
//! ranges. A rank with a small batch (a slow rank, under a balanced plan)
//! updates little or nothing, one with no samples nothing. The update is element-wise, so each element
//! sees the same arithmetic as in one process: the maths stays exact.
//! When the plan changes the ranges move with it ([`Layout::for_plan`]).

use tch::{Device, Kind, Tensor};

use crate::c10d::{PendingWork, ProcessGroup};
use crate::cli::OptimizerSharding;
use crate::error::{Result, TrainerError};

/// Every trainable parameter in one contiguous 1-D buffer.
pub struct FlatParams {
    flat: Tensor,
    /// The parameters (the same tensors the model uses), in order.
    params: Vec<Tensor>,
    /// Where each parameter starts in `flat`, and its element count.
    spans: Vec<(i64, i64)>,
}

impl FlatParams {
    /// Move `params` into one buffer; each parameter's data becomes a view
    /// of it, so every holder of the parameter (the model, the Reducer, the
    /// checkpoint code) sees the buffer. All parameters must share a dtype
    /// and device. The buffer holds them last first, roughly the order in
    /// which their gradients become ready (and the Reducer's buckets fill):
    /// a bucket then covers few runs of the buffer, and the first owner's
    /// range holds the gradients that come first, which it can update
    /// while backward still runs.
    pub fn new(params: &[Tensor]) -> Result<FlatParams> {
        let (kind, device) = match params.first() {
            Some(p) => (p.kind(), p.device()),
            None => (Kind::Float, Device::Cpu),
        };
        if params
            .iter()
            .any(|p| p.kind() != kind || p.device() != device)
        {
            return Err(TrainerError::Config(
                "the optimizer needs every trainable parameter on one device with one dtype".into(),
            ));
        }
        let mut spans = vec![(0i64, 0i64); params.len()];
        let mut total = 0i64;
        for (i, p) in params.iter().enumerate().rev() {
            let n = p.numel() as i64;
            spans[i] = (total, n);
            total += n;
        }
        let flat = Tensor::zeros([total], (kind, device));
        let _guard = tch::no_grad_guard();
        for (p, &(off, n)) in params.iter().zip(&spans) {
            let mut view = flat.narrow(0, off, n).view(p.size().as_slice());
            view.copy_(p);
            p.shallow_clone().set_data(&view);
        }
        Ok(FlatParams {
            flat,
            params: params.iter().map(Tensor::shallow_clone).collect(),
            spans,
        })
    }

    /// Number of elements over all parameters.
    pub fn len(&self) -> i64 {
        self.spans.iter().map(|&(_, n)| n).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn kind(&self) -> Kind {
        self.flat.kind()
    }

    pub fn device(&self) -> Device {
        self.flat.device()
    }

    /// The elements `[lo, hi)` of the buffer (a view).
    pub fn range(&self, (lo, hi): (i64, i64)) -> Tensor {
        self.flat.narrow(0, lo, hi - lo)
    }

    /// For each parameter overlapping `[lo, hi)`: the parameter's index,
    /// the overlap's offset inside the parameter, its offset inside the
    /// range, and its length.
    pub fn pieces(&self, (lo, hi): (i64, i64)) -> impl Iterator<Item = Piece> + '_ {
        self.spans
            .iter()
            .enumerate()
            .filter_map(move |(i, &(off, n))| {
                let a = lo.max(off);
                let b = hi.min(off + n);
                (a < b).then_some(Piece {
                    param: i,
                    in_param: a - off,
                    in_range: a - lo,
                    len: b - a,
                })
            })
    }

    pub fn param(&self, i: usize) -> &Tensor {
        &self.params[i]
    }

    /// Views of a flat tensor shaped like each parameter, named `prefix.<name>`.
    pub fn unflatten(
        &self,
        flat: &Tensor,
        names: &[String],
        prefix: &str,
    ) -> Vec<(String, Tensor)> {
        self.params
            .iter()
            .zip(&self.spans)
            .zip(names)
            .map(|((p, &(off, n)), name)| {
                (
                    format!("{prefix}.{name}"),
                    flat.narrow(0, off, n).view(p.size().as_slice()),
                )
            })
            .collect()
    }
}

/// Part of one parameter inside a range (see [`FlatParams::pieces`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub param: usize,
    pub in_param: i64,
    pub in_range: i64,
    pub len: i64,
}

/// Who updates which elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Every rank updates everything (one process, or sharding off).
    Replicated { len: i64 },
    /// Rank r updates `bounds[r]`; the ranges tile `[0, len)` in rank order.
    Sharded { bounds: Vec<(i64, i64)> },
}

impl Layout {
    /// The ranges for a plan under `sharding`: in proportion to the owners'
    /// local batches ([`owner_weights`]), or the whole buffer on every rank.
    pub fn for_plan(len: i64, batch_sizes: &[u32], sharding: OptimizerSharding) -> Layout {
        if sharding != OptimizerSharding::Replicated && batch_sizes.len() > 1 {
            Layout::Sharded {
                bounds: proportional_bounds(len, &owner_weights(batch_sizes, sharding)),
            }
        } else {
            Layout::Replicated { len }
        }
    }

    /// The range `rank` updates.
    pub fn own(&self, rank: usize) -> (i64, i64) {
        match self {
            Layout::Replicated { len } => (0, *len),
            Layout::Sharded { bounds } => bounds.get(rank).copied().unwrap_or((0, 0)),
        }
    }

    /// Ranges with at least one element, with their owners.
    fn owners(&self) -> Vec<(usize, (i64, i64))> {
        match self {
            Layout::Replicated { .. } => Vec::new(),
            Layout::Sharded { bounds } => bounds
                .iter()
                .copied()
                .enumerate()
                .filter(|(_, (lo, hi))| hi > lo)
                .collect(),
        }
    }

    /// After each owner updated its range: every owner broadcasts it, so
    /// all ranks hold the whole updated buffer. Collective: every rank
    /// calls it at the same step.
    pub fn share(&self, pg: Option<&ProcessGroup>, flat: &Tensor) -> Result<()> {
        let all: Vec<usize> = (0..pg.map_or(1, ProcessGroup::world_size)).collect();
        self.share_among(pg, &all, flat)
    }

    /// [`share`](Self::share) within a group of the ranks `members` (its
    /// rank i is `members[i]`); every owner must be a member.
    pub fn share_among(
        &self,
        pg: Option<&ProcessGroup>,
        members: &[usize],
        flat: &Tensor,
    ) -> Result<()> {
        let Some(pg) = pg else { return Ok(()) };
        let mut owners = Vec::new();
        for (owner, range) in self.owners() {
            let root = members.iter().position(|&m| m == owner).ok_or_else(|| {
                TrainerError::Collective {
                    op: "broadcast",
                    msg: format!("rank {owner} owns optimizer elements but is not training"),
                }
            })?;
            owners.push((root, range));
        }
        if owners.is_empty() {
            return Ok(());
        }
        let mut parts: Vec<Tensor> = owners
            .iter()
            .map(|&(_, (lo, hi))| flat.narrow(0, lo, hi - lo))
            .collect();
        if flat.device() != Device::Cpu && !pg.has_nccl() {
            // Staged through host memory: one at a time.
            for (part, &(root, _)) in parts.iter_mut().zip(&owners) {
                pg.broadcast(part, root)?;
            }
            return Ok(());
        }
        let mut works: Vec<PendingWork<'_>> = Vec::with_capacity(parts.len());
        for (part, &(root, _)) in parts.iter_mut().zip(&owners) {
            works.push(pg.broadcast_async(part, root)?);
        }
        for w in works {
            w.wait()?;
        }
        Ok(())
    }

    /// The whole flat tensor of which this rank holds `own` (its range of
    /// `local`, a tensor of the own range's length), assembled on every rank.
    pub fn gather(
        &self,
        pg: Option<&ProcessGroup>,
        rank: usize,
        local: &Tensor,
        len: i64,
    ) -> Result<Tensor> {
        match self {
            Layout::Replicated { .. } => Ok(local.shallow_clone()),
            Layout::Sharded { .. } => {
                let full = Tensor::zeros([len], (local.kind(), local.device()));
                let (lo, hi) = self.own(rank);
                if hi > lo {
                    full.narrow(0, lo, hi - lo).copy_(local);
                }
                self.share(pg, &full)?;
                Ok(full)
            }
        }
    }
}

/// Contiguous ranges of `len` elements, rank r's of length ≈ len·b_r/B
/// (boundaries floor(len·Σ_{q<r} b_q / B); equal ranges when B is 0).
/// Under `fastest`, a rank owns a share only if its local batch is at least
/// this fraction of the largest.
pub const FASTEST_FRACTION: f64 = 0.9;

/// Each rank's weight in the shares of the update: its local batch, or 0
/// under `fastest` for a rank whose batch is under [`FASTEST_FRACTION`] of
/// the largest. Every owner adds a round trip to the end of the step (the
/// gradient sums to it, its updated values back), and a slow rank's round
/// trip is the longest: its CPU is the scarcest (a CPU quota's next period,
/// or a busy device), so under a balanced plan the update goes to the
/// fastest ranks.
pub fn owner_weights(batch_sizes: &[u32], sharding: OptimizerSharding) -> Vec<u32> {
    let largest = f64::from(batch_sizes.iter().copied().max().unwrap_or(0));
    batch_sizes
        .iter()
        .map(|&b| match sharding {
            OptimizerSharding::Fastest if f64::from(b) < FASTEST_FRACTION * largest => 0,
            _ => b,
        })
        .collect()
}

pub fn proportional_bounds(len: i64, weights: &[u32]) -> Vec<(i64, i64)> {
    let n = weights.len();
    let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    let cut = |k: usize| -> i64 {
        let num: u128 = if sum == 0 {
            k as u128
        } else {
            weights[..k].iter().map(|&w| u128::from(w)).sum()
        };
        let den = if sum == 0 { n as u128 } else { sum };
        (len.max(0) as u128 * num / den.max(1)) as i64
    };
    (0..n).map(|r| (cut(r), cut(r + 1))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_tile_the_buffer_in_proportion() {
        let b = proportional_bounds(1000, &[20, 9, 3]);
        assert_eq!(b, vec![(0, 625), (625, 906), (906, 1000)]);
        let b = proportional_bounds(10, &[1, 0, 1]);
        assert_eq!(b, vec![(0, 5), (5, 5), (5, 10)]);
        let b = proportional_bounds(7, &[0, 0]);
        assert_eq!(b, vec![(0, 3), (3, 7)]);
        assert_eq!(proportional_bounds(0, &[3, 1]), vec![(0, 0), (0, 0)]);
    }

    #[test]
    fn layout_for_plan() {
        use OptimizerSharding::{Fastest, Proportional, Replicated};
        assert_eq!(
            Layout::for_plan(100, &[3, 1], Replicated),
            Layout::Replicated { len: 100 }
        );
        assert_eq!(
            Layout::for_plan(100, &[4], Fastest),
            Layout::Replicated { len: 100 }
        );
        let l = Layout::for_plan(100, &[3, 1], Proportional);
        assert_eq!(l.own(0), (0, 75));
        assert_eq!(l.own(1), (75, 100));
        assert_eq!(l.own(7), (0, 0));
        // Fastest: the rank at a third of the largest batch owns nothing.
        let l = Layout::for_plan(100, &[3, 1], Fastest);
        assert_eq!((l.own(0), l.own(1)), ((0, 100), (100, 100)));
        // Ranks within 10% of the largest share in proportion.
        let l = Layout::for_plan(100, &[50, 46, 4], Fastest);
        assert_eq!(
            (l.own(0), l.own(1), l.own(2)),
            ((0, 52), (52, 100), (100, 100))
        );
        let l = Layout::for_plan(128, &[64, 64], Fastest);
        assert_eq!((l.own(0), l.own(1)), ((0, 64), (64, 128)));
    }

    #[test]
    fn owner_weights_keep_ranks_near_the_largest_batch() {
        use OptimizerSharding::{Fastest, Proportional};
        assert_eq!(owner_weights(&[104, 24], Fastest), vec![104, 0]);
        assert_eq!(owner_weights(&[104, 24], Proportional), vec![104, 24]);
        // 90% of the largest is in, just under it is out.
        assert_eq!(
            owner_weights(&[100, 90, 89, 0], Fastest),
            vec![100, 90, 0, 0]
        );
        // A rank left out (0) and equal ranks.
        assert_eq!(owner_weights(&[0, 7, 7], Fastest), vec![0, 7, 7]);
    }

    #[test]
    fn parameters_become_views_of_one_buffer() {
        let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0])
            .view([2, 2])
            .set_requires_grad(true);
        let b = Tensor::from_slice(&[5.0f32, 6.0]).set_requires_grad(true);
        let held = a.shallow_clone();
        let flat = FlatParams::new(&[a.shallow_clone(), b.shallow_clone()]).unwrap();
        assert_eq!(flat.len(), 6);
        // Last parameter first: b is [0, 2), a is [2, 6).
        // Writing the buffer changes what the model's handles see.
        let _ = flat.range((1, 3)).fill_(0.0);
        assert_eq!(
            Vec::<f32>::try_from(held.view(-1)).unwrap(),
            vec![0.0, 2.0, 3.0, 4.0]
        );
        assert_eq!(Vec::<f32>::try_from(&b).unwrap(), vec![5.0, 0.0]);
        assert!(held.requires_grad());
        let pieces: Vec<Piece> = flat.pieces((1, 3)).collect();
        assert_eq!(
            pieces,
            vec![
                Piece {
                    param: 0,
                    in_param: 0,
                    in_range: 1,
                    len: 1
                },
                Piece {
                    param: 1,
                    in_param: 1,
                    in_range: 0,
                    len: 1
                },
            ]
        );
        let named = flat.unflatten(&flat.range((0, 6)), &["a".into(), "b".into()], "m");
        assert_eq!(named[0].0, "m.a");
        assert_eq!(named[0].1.size(), vec![2, 2]);
        assert_eq!(
            Vec::<f32>::try_from(named[0].1.view(-1)).unwrap(),
            vec![0.0, 2.0, 3.0, 4.0]
        );
        // Gradients still reach the parameters after the move.
        (&held * 2.0).sum(Kind::Float).backward();
        assert_eq!(
            Vec::<f32>::try_from(held.grad().view(-1)).unwrap(),
            vec![2.0; 4]
        );
    }
}
