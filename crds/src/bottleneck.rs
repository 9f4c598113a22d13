//! What bounds a rank's step: the rule the trainer (its own
//! `heterotrain_bottleneck` gauge), the operator (`status.rankBottlenecks`)
//! and the dashboard share.
//!
//! A step is spent loading data, computing (forward and backward),
//! communicating (the gradient exchange, including the wait for the other
//! ranks) and updating (the optimizer). A rank is bound by whichever of
//! these takes the largest part of its step — unless its compute per step
//! is over `straggler_factor` times the median of the job's other training
//! ranks', which makes it the job's straggler: every other rank waits for it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The gauge the trainer exports: 1 for the kind that bounds its step now,
/// 0 for the others (label `kind`).
pub const METRIC: &str = "heterotrain_bottleneck";

/// What bounds a rank's step.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Bottleneck {
    /// Loading and preparing batches (the dataset's volume, decoding).
    Data,
    /// Forward and backward passes: the hardware is the limit.
    Compute,
    /// The gradient exchange, including waiting for slower ranks.
    Communication,
    /// The optimizer update.
    Update,
    /// Its compute per step is well above the other ranks': they wait for it.
    Straggler,
}

impl Bottleneck {
    /// The kinds a rank's own phase times can show (all but `Straggler`).
    pub const PHASES: [Bottleneck; 4] = [
        Bottleneck::Data,
        Bottleneck::Compute,
        Bottleneck::Communication,
        Bottleneck::Update,
    ];

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Bottleneck::Data => "data",
            Bottleneck::Compute => "compute",
            Bottleneck::Communication => "communication",
            Bottleneck::Update => "update",
            Bottleneck::Straggler => "straggler",
        }
    }
}

/// Seconds of one step (or of many, summed) by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseTimes {
    pub data: f64,
    /// Forward and backward.
    pub compute: f64,
    pub communication: f64,
    pub update: f64,
}

impl PhaseTimes {
    /// The sum of the phases.
    pub fn total(&self) -> f64 {
        self.data + self.compute + self.communication + self.update
    }

    /// `self - earlier`, per step over `steps` steps; `None` when not a
    /// valid interval (no step, a counter that went back, a non-finite value).
    pub fn per_step_since(&self, earlier: &PhaseTimes, steps: f64) -> Option<PhaseTimes> {
        let d = |a: f64, b: f64| {
            let v = (a - b) / steps;
            (v.is_finite() && v >= 0.0).then_some(v)
        };
        if !(steps.is_finite() && steps > 0.0) {
            return None;
        }
        Some(PhaseTimes {
            data: d(self.data, earlier.data)?,
            compute: d(self.compute, earlier.compute)?,
            communication: d(self.communication, earlier.communication)?,
            update: d(self.update, earlier.update)?,
        })
    }

    /// The phase with the largest part of the step; `None` for an empty one.
    pub fn dominant(&self) -> Option<Bottleneck> {
        let parts = [
            (Bottleneck::Data, self.data),
            (Bottleneck::Compute, self.compute),
            (Bottleneck::Communication, self.communication),
            (Bottleneck::Update, self.update),
        ];
        if !parts.iter().all(|(_, v)| v.is_finite() && *v >= 0.0) || self.total() <= 0.0 {
            return None;
        }
        parts
            .into_iter()
            .fold(None::<(Bottleneck, f64)>, |best, (k, v)| match best {
                Some((_, b)) if b >= v => best,
                _ => Some((k, v)),
            })
            .map(|(k, _)| k)
    }
}

/// Each rank's bottleneck from its per-step phase times (`None`: not
/// measured, or left out of training: no compute). A rank whose compute is
/// over `straggler_factor` × the median of the other training ranks' is the
/// `Straggler` (in a two-rank job: over the factor × the other rank's); the
/// others get their dominant phase.
pub fn classify(ranks: &[Option<PhaseTimes>], straggler_factor: f64) -> Vec<Option<Bottleneck>> {
    let training = |p: &&PhaseTimes| p.compute > 0.0 && p.compute.is_finite();
    let computes: Vec<(usize, f64)> = ranks
        .iter()
        .enumerate()
        .filter_map(|(r, p)| p.as_ref().filter(training).map(|p| (r, p.compute)))
        .collect();
    let median_of_others = |rank: usize| {
        let mut others: Vec<f64> = computes
            .iter()
            .filter(|(r, _)| *r != rank)
            .map(|(_, c)| *c)
            .collect();
        others.sort_by(f64::total_cmp);
        let n = others.len();
        match n {
            0 => None,
            _ if n % 2 == 1 => Some(others[n / 2]),
            _ => Some((others[n / 2 - 1] + others[n / 2]) / 2.0),
        }
    };
    ranks
        .iter()
        .enumerate()
        .map(|(rank, p)| {
            let p = p.as_ref().filter(training)?;
            match median_of_others(rank) {
                Some(m) if p.compute > straggler_factor * m => Some(Bottleneck::Straggler),
                _ => p.dominant(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(data: f64, compute: f64, communication: f64, update: f64) -> PhaseTimes {
        PhaseTimes {
            data,
            compute,
            communication,
            update,
        }
    }

    #[test]
    fn the_largest_phase_bounds_the_step() {
        assert_eq!(p(0.5, 0.2, 0.1, 0.1).dominant(), Some(Bottleneck::Data));
        assert_eq!(p(0.0, 0.2, 0.1, 0.1).dominant(), Some(Bottleneck::Compute));
        assert_eq!(
            p(0.0, 0.2, 0.3, 0.1).dominant(),
            Some(Bottleneck::Communication)
        );
        assert_eq!(p(0.0, 0.2, 0.1, 0.4).dominant(), Some(Bottleneck::Update));
        assert_eq!(p(0.0, 0.0, 0.0, 0.0).dominant(), None);
        assert_eq!(p(f64::NAN, 1.0, 0.0, 0.0).dominant(), None);
    }

    #[test]
    fn a_rank_well_above_the_median_compute_is_the_straggler() {
        // Three ranks; rank 2 computes ~3× the others: they wait for it in
        // the exchange (communication-bound).
        let ranks = [
            Some(p(0.0, 0.10, 0.20, 0.01)),
            Some(p(0.0, 0.11, 0.19, 0.01)),
            Some(p(0.0, 0.30, 0.01, 0.01)),
            None,
            // Left out: no compute, not classified.
            Some(p(0.0, 0.0, 0.0, 0.0)),
        ];
        assert_eq!(
            classify(&ranks, 1.5),
            [
                Some(Bottleneck::Communication),
                Some(Bottleneck::Communication),
                Some(Bottleneck::Straggler),
                None,
                None
            ]
        );
        // Under the factor: no straggler, each its own phase.
        assert_eq!(classify(&ranks, 3.5)[2], Some(Bottleneck::Compute));
        // Two ranks: measured against the other one (2× at 1.5).
        let pair = [Some(p(0.0, 0.1, 0.1, 0.0)), Some(p(0.0, 0.2, 0.0, 0.0))];
        assert_eq!(classify(&pair, 1.5)[1], Some(Bottleneck::Straggler));
        assert_eq!(classify(&pair, 2.5)[1], Some(Bottleneck::Compute));
        // One training rank has no peers to straggle behind.
        assert_eq!(
            classify(&[Some(p(0.0, 0.3, 0.0, 0.0))], 1.5),
            [Some(Bottleneck::Compute)]
        );
    }

    #[test]
    fn per_step_rates_come_from_two_readings() {
        let a = p(1.0, 10.0, 4.0, 1.0);
        let b = p(1.5, 14.0, 6.0, 1.5);
        assert_eq!(b.per_step_since(&a, 10.0), Some(p(0.05, 0.4, 0.2, 0.05)));
        assert_eq!(a.per_step_since(&b, 10.0), None, "a counter went back");
        assert_eq!(b.per_step_since(&a, 0.0), None);
    }
}
