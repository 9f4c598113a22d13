//! The optimal split: minimise `max_r t_r(b_r)` subject to `Σ b_r = B` and
//! `lo_r ≤ b_r ≤ hi_r`. Water-filling finds the common finish time `T` of the
//! continuous problem by bisection; integers are then taken as
//! `⌊(T − a_r)/c_r⌋` (every increment costing ≤ T) and the few missing samples
//! are handed out greedily, cheapest next step time first, from a heap. That
//! reproduces the greedy "give the next sample to whoever finishes it
//! soonest", which is exactly optimal for increasing costs, in
//! `O(n·log(range) + n·log n)` instead of `O(B·log n)`.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use crate::{BalancerError, StepModel};

/// An integer split of the global batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Split {
    /// Local batch per rank; sums exactly to the global batch.
    pub batches: Vec<u32>,
    /// Predicted step time of this split, `max_r t_r(b_r)`, in seconds.
    pub step_seconds: f64,
    /// Common finish time of the continuous (real-valued) optimum, in seconds;
    /// a lower bound on `step_seconds`.
    pub water_level_seconds: f64,
}

/// Optimal split of `global` samples over ranks with the given models, every
/// rank getting at least `floor` and at most `caps[r]`.
///
/// Errors: no ranks, `caps` of the wrong length, an invalid model, a cap below
/// the floor, or an infeasible global batch (below `n·floor`, above `Σ caps`).
pub fn optimal_split(
    models: &[StepModel],
    global: u32,
    floor: u32,
    caps: &[u32],
) -> Result<Split, BalancerError> {
    let lower = vec![floor; models.len()];
    optimal_split_bounded(models, global, &lower, caps)
}

/// Like [`optimal_split`] with a per-rank lower bound.
pub fn optimal_split_bounded(
    models: &[StepModel],
    global: u32,
    lower: &[u32],
    upper: &[u32],
) -> Result<Split, BalancerError> {
    let level = water_level(models, global, lower, upper)?;
    let batches = integer_split(models, global, lower, upper, level.lo);
    let step_seconds = max_step(models, &batches);
    Ok(Split {
        batches,
        step_seconds,
        water_level_seconds: level.hi,
    })
}

/// Predicted step time of `batches` under `models`: `max_r t_r(b_r)` over
/// the ranks that train. A rank with batch 0 is left out of the step and
/// adds nothing, not even its fixed cost (0 for no ranks; extra entries of
/// the longer slice are ignored).
pub fn max_step(models: &[StepModel], batches: &[u32]) -> f64 {
    models
        .iter()
        .zip(batches)
        .filter(|(_, &b)| b > 0)
        .map(|(m, &b)| m.predict(b))
        .fold(0.0, f64::max)
}

/// Real-valued optimal local batches `clamp((T − a_r)/c_r, lo_r, hi_r)` at the
/// water level `T`, summing to `global` (up to float rounding), together
/// with `T`. This is the ideal "everyone finishes together" split.
pub fn continuous_split(
    models: &[StepModel],
    global: u32,
    lower: &[u32],
    upper: &[u32],
) -> Result<(Vec<f64>, f64), BalancerError> {
    let level = water_level(models, global, lower, upper)?;
    let t = level.hi;
    let x = models
        .iter()
        .zip(lower.iter().zip(upper))
        .map(|(m, (&lo, &hi))| clamp_real(m.batch_at(t), lo, hi))
        .collect();
    Ok((x, t))
}

/// Bracket of the water level: `Σ x(lo) ≤ B ≤ Σ x(hi)`, `hi − lo` tiny.
struct Level {
    lo: f64,
    hi: f64,
}

fn clamp_real(x: f64, lo: u32, hi: u32) -> f64 {
    x.max(f64::from(lo)).min(f64::from(hi))
}

fn validate(
    models: &[StepModel],
    global: u32,
    lower: &[u32],
    upper: &[u32],
) -> Result<(), BalancerError> {
    let n = models.len();
    if n == 0 {
        return Err(BalancerError::NoRanks);
    }
    for (what, len) in [("lower bounds", lower.len()), ("caps", upper.len())] {
        if len != n {
            return Err(BalancerError::LengthMismatch {
                what,
                expected: n,
                got: len,
            });
        }
    }
    for (rank, m) in models.iter().enumerate() {
        if !m.is_valid() {
            return Err(BalancerError::InvalidModel {
                rank,
                fixed_seconds: m.fixed_seconds,
                per_sample_seconds: m.per_sample_seconds,
            });
        }
        if lower[rank] > upper[rank] {
            return Err(BalancerError::EmptyBounds {
                rank,
                min: lower[rank],
                cap: upper[rank],
            });
        }
    }
    let min_sum: u64 = lower.iter().map(|&x| u64::from(x)).sum();
    let cap_sum: u64 = upper.iter().map(|&x| u64::from(x)).sum();
    let global = u64::from(global);
    if global < min_sum {
        return Err(BalancerError::BelowMinimum {
            global,
            min_sum,
            ranks: n,
        });
    }
    if global > cap_sum {
        return Err(BalancerError::AboveCaps {
            global,
            cap_sum,
            ranks: n,
        });
    }
    Ok(())
}

fn water_level(
    models: &[StepModel],
    global: u32,
    lower: &[u32],
    upper: &[u32],
) -> Result<Level, BalancerError> {
    validate(models, global, lower, upper)?;
    if global == 0 {
        // Every rank at 0 (only possible with lower bounds of 0): nobody trains.
        return Ok(Level { lo: 0.0, hi: 0.0 });
    }
    let target = f64::from(global);
    let fill = |t: f64| -> f64 {
        models
            .iter()
            .zip(lower.iter().zip(upper))
            .map(|(m, (&lo, &hi))| clamp_real(m.batch_at(t), lo, hi))
            .sum()
    };
    // At lo every rank sits at its lower bound, at hi at its cap. Ranks
    // capped at 0 (left out) take no part: they stay at 0 whatever the level.
    let taking_part = || {
        models
            .iter()
            .zip(lower.iter().zip(upper))
            .filter(|(_, (_, &hi))| hi > 0)
    };
    // Some rank takes part: Σ caps ≥ global > 0 was checked.
    let mut lo = taking_part()
        .map(|(m, (&l, _))| m.predict(l))
        .fold(f64::INFINITY, f64::min);
    let mut hi = taking_part()
        .map(|(m, (_, &u))| m.predict(u))
        .fold(0.0, f64::max);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if !(mid > lo && mid < hi) {
            break;
        }
        if fill(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Level { lo, hi })
}

/// Heap key: next (or current) step time, then per-sample cost, then rank —
/// ties go to the faster rank, then to the lower index.
#[derive(PartialEq)]
struct Key(f64, f64, usize);

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0
            .total_cmp(&other.0)
            .then(self.1.total_cmp(&other.1))
            .then(self.2.cmp(&other.2))
    }
}

fn integer_split(
    models: &[StepModel],
    global: u32,
    lower: &[u32],
    upper: &[u32],
    level: f64,
) -> Vec<u32> {
    let mut b: Vec<u32> = models
        .iter()
        .zip(lower.iter().zip(upper))
        .map(|(m, (&lo, &hi))| {
            // Clamped in f64 first, so the cast never saturates wrongly.
            clamp_real(m.batch_at(level).floor(), lo, hi) as u32
        })
        .collect();
    let sum: u64 = b.iter().map(|&x| u64::from(x)).sum();
    let global = u64::from(global);
    if sum < global {
        let mut heap: BinaryHeap<Reverse<Key>> = b
            .iter()
            .enumerate()
            .filter(|(r, &x)| x < upper[*r])
            .map(|(r, &x)| {
                Reverse(Key(
                    models[r].predict(x + 1),
                    models[r].per_sample_seconds,
                    r,
                ))
            })
            .collect();
        let mut missing = global - sum;
        while missing > 0 {
            let Some(Reverse(Key(_, _, r))) = heap.pop() else {
                break; // unreachable: Σ caps ≥ global was checked
            };
            let m = &models[r];
            // The samples this rank would take one at a time before another
            // rank's next sample comes first, all at once: the same split,
            // in a few rounds even when the level's floats left millions
            // of samples to place (models far apart in scale).
            let lim = missing.min(u64::from(upper[r] - b[r]));
            let next = heap.peek().map(|Reverse(k)| k);
            let k = run_length(lim, |j| {
                next.is_none_or(|t| Key(m.predict(add(b[r], j)), m.per_sample_seconds, r) < *t)
            });
            b[r] = add(b[r], k);
            missing -= k;
            if b[r] < upper[r] {
                heap.push(Reverse(Key(m.predict(b[r] + 1), m.per_sample_seconds, r)));
            }
        }
    } else if sum > global {
        // Float safety net: take back from the slowest finishers.
        let mut heap: BinaryHeap<Key> = b
            .iter()
            .enumerate()
            .filter(|(r, &x)| x > lower[*r])
            .map(|(r, &x)| Key(models[r].predict(x), models[r].per_sample_seconds, r))
            .collect();
        let mut extra = sum - global;
        while extra > 0 {
            let Some(Key(_, _, r)) = heap.pop() else {
                break;
            };
            let m = &models[r];
            let lim = extra.min(u64::from(b[r] - lower[r]));
            let next = heap.peek();
            let k = run_length(lim, |j| {
                next.is_none_or(|t| Key(m.predict(sub(b[r], j - 1)), m.per_sample_seconds, r) > *t)
            });
            b[r] = sub(b[r], k);
            extra -= k;
            if b[r] > lower[r] {
                heap.push(Key(m.predict(b[r]), m.per_sample_seconds, r));
            }
        }
    }
    b
}

/// The largest `k` in `1..=lim` (0 when `lim` is 0) such that `still(j)`
/// holds for every `j` in `2..=k`; `still` must hold for a prefix of the
/// `j`s (the keys move one way as samples are added or taken back), so a
/// binary search finds it.
fn run_length(lim: u64, still: impl Fn(u64) -> bool) -> u64 {
    if lim == 0 {
        return 0;
    }
    let (mut ok, mut bad) = (1u64, lim + 1);
    while bad - ok > 1 {
        let mid = ok + (bad - ok) / 2;
        if still(mid) {
            ok = mid;
        } else {
            bad = mid;
        }
    }
    ok
}

/// `b + j` for a `j` bounded by a cap above `b` (saturating, never wraps).
fn add(b: u32, j: u64) -> u32 {
    u32::try_from(u64::from(b) + j).unwrap_or(u32::MAX)
}

/// `b - j` for a `j` bounded by `b` (saturating).
fn sub(b: u32, j: u64) -> u32 {
    u32::try_from(u64::from(b).saturating_sub(j)).unwrap_or(0)
}

/// Splits `global` in proportion to the real targets `x` (which must sum to
/// `global` and lie within the bounds) by largest remainder; ties go to the
/// lower rank. Used for damping. Returns `None` when the rounding cannot be
/// made exact (inputs inconsistent).
pub(crate) fn round_to_sum(
    x: &[f64],
    global: u32,
    lower: &[u32],
    upper: &[u32],
) -> Option<Vec<u32>> {
    let mut b: Vec<u32> = x
        .iter()
        .zip(lower.iter().zip(upper))
        .map(|(&v, (&lo, &hi))| clamp_real(v.floor(), lo, hi) as u32)
        .collect();
    let sum: u64 = b.iter().map(|&v| u64::from(v)).sum();
    let global = u64::from(global);
    if sum > global {
        return None;
    }
    let mut order: Vec<usize> = (0..x.len()).filter(|&r| b[r] < upper[r]).collect();
    order.sort_by(|&p, &q| {
        let fp = x[p] - x[p].floor();
        let fq = x[q] - x[q].floor();
        fq.total_cmp(&fp).then(p.cmp(&q))
    });
    let mut missing = global - sum;
    for r in order {
        if missing == 0 {
            break;
        }
        b[r] += 1;
        missing -= 1;
    }
    (missing == 0).then_some(b)
}

#[cfg(test)]
mod tests;
