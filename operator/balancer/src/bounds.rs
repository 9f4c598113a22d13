//! Per-rank batch bounds of one decision and the CPU quota caps: a leaf
//! module the decision's stages share.

use crate::StepModel;

/// A candidate that used at least this share of its CPU quota is saturated
/// on it (see `quota_bound` in [`crate::measured`]).
pub(crate) const QUOTA_SATURATED: f64 = 0.9;

/// Per-rank batch bounds for one decision.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bounds {
    /// The least batch each rank may get.
    pub lower: Vec<u32>,
    /// The most, with every soft bound: how far a batch may grow in one
    /// decision, and the quota caps ([`crate::Balancer::hold_quota_bound`]).
    pub upper: Vec<u32>,
    /// The most without the soft bounds: the rank's cap, `maxLocalBatch`,
    /// the global batch, a stale rank's pinned batch, 0 when held out.
    pub hard: Vec<u32>,
    /// The global batch the ranks share.
    pub global: u32,
}

impl Bounds {
    /// Bounds without soft ones: `upper` is also the hard bound.
    #[cfg(test)]
    pub(crate) fn fixed(lower: &[u32], upper: &[u32], global: u32) -> Self {
        Self {
            lower: lower.to_vec(),
            upper: upper.to_vec(),
            hard: upper.to_vec(),
            global,
        }
    }

    /// Holds rank `r` out: batch 0 whatever the split.
    pub(crate) fn hold_out(&mut self, r: usize) {
        for v in [&mut self.lower, &mut self.upper, &mut self.hard] {
            if let Some(b) = v.get_mut(r) {
                *b = 0;
            }
        }
    }

    /// `(lower, upper)` with the ranks in `out` left out (batch 0). When
    /// the others' upper bounds cannot then hold the global batch, the soft
    /// bounds yield to the hard ones: the leaving ranks' samples must go
    /// somewhere, and a rank with a small batch (under a growth bound of
    /// twice its batch) could otherwise never take them. Without this, a
    /// verdict holding out a rank that had most of the batch left no
    /// feasible split at all, at every later decision.
    pub(crate) fn without(&self, out: &[usize]) -> (Vec<u32>, Vec<u32>) {
        let (lo, mut hi, hard) = self.without_soft(out);
        let room: u64 = hi.iter().map(|&b| u64::from(b)).sum();
        if room < u64::from(self.global) {
            for (h, &top) in hi.iter_mut().zip(&hard) {
                *h = (*h).max(top);
            }
        }
        (lo, hi)
    }

    /// `(lower, upper, hard)` with the ranks in `out` left out, the soft
    /// bounds kept even when the others cannot then hold the global batch
    /// (a split within them is then infeasible).
    pub(crate) fn without_soft(&self, out: &[usize]) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
        let (mut lo, mut hi, mut hard) =
            (self.lower.clone(), self.upper.clone(), self.hard.clone());
        for &r in out {
            for v in [&mut lo, &mut hi, &mut hard] {
                if let Some(b) = v.get_mut(r) {
                    *b = 0;
                }
            }
        }
        (lo, hi, hard)
    }
}

/// The most samples a rank that used the share `used` of its CPU quota at
/// `batch` may take (see [`crate::Balancer::hold_quota_bound`]): its batch once
/// it is saturated, else ⌈batch / used⌉.
pub(crate) fn quota_cap(batch: u32, used: f64) -> u32 {
    if used >= QUOTA_SATURATED {
        return batch;
    }
    let cap = (f64::from(batch) / used).ceil();
    if cap.is_finite() && cap < f64::from(u32::MAX) {
        cap as u32
    } else {
        u32::MAX
    }
}

/// The note for the quota-held ranks (see [`crate::Balancer::hold_quota_bound`])
/// whose cap binds in `plan`: at their cap, with compute the model predicts
/// well below the plan's step (more samples would have been given to them).
pub(crate) fn quota_note(
    held: &[(usize, f64)],
    plan: &[u32],
    upper: &[u32],
    models: &[StepModel],
    predicted: f64,
) -> String {
    let binding: Vec<String> = held
        .iter()
        .filter(|&&(r, _)| {
            plan[r] > 0 && plan[r] == upper[r] && models[r].predict(plan[r]) < 0.95 * predicted
        })
        .map(|&(r, used)| {
            format!(
                "rank {r} at {} ({:.0}% of its quota used)",
                plan[r],
                used * 100.0
            )
        })
        .collect();
    if binding.is_empty() {
        return String::new();
    }
    format!(
        "held by their CPU quota (more samples would lengthen the step whatever their compute model predicts): {}",
        binding.join(", ")
    )
}
