//! Simulation scenarios: ranks with true step-time models, scripted events,
//! and the built-in scenarios the CLI, benchmark and tests use.

use serde::Serialize;

use super::devices::{DeviceType, ALL_DEVICES, BIG_MIX};

/// The true behaviour of one simulated rank (unknown to the balancer).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SimRank {
    /// Label (device name).
    pub name: String,
    /// True fixed cost per step `a`, seconds.
    pub fixed_seconds: f64,
    /// True per-sample cost `c`, seconds.
    pub per_sample_seconds: f64,
    /// Largest local batch that fits.
    pub max_batch: u32,
    /// Hardware score handed to the seed formula (e.g. TFLOPS).
    pub compute_score: f64,
    /// Seconds this rank adds to every step it takes part in that are not
    /// compute (its share of the exchange or optimizer update on a
    /// throttled CPU): the step's exchange lasts as long as the largest of
    /// these among the ranks that train. 0 for a healthy rank.
    pub exchange_seconds: f64,
}

impl SimRank {
    /// A rank on a device from the table.
    pub fn from_device(d: &DeviceType) -> Self {
        SimRank {
            name: d.name.to_string(),
            fixed_seconds: d.fixed_seconds,
            per_sample_seconds: d.per_sample_seconds(),
            max_batch: d.max_batch(),
            compute_score: d.fp32_tflops,
            exchange_seconds: 0.0,
        }
    }

    /// An abstract rank with relative `speed` (1 = reference).
    pub fn with_speed(speed: f64, reference_per_sample: f64, fixed: f64, max_batch: u32) -> Self {
        SimRank {
            name: format!("x{speed}"),
            fixed_seconds: fixed,
            per_sample_seconds: reference_per_sample / speed,
            max_batch,
            compute_score: speed,
            exchange_seconds: 0.0,
        }
    }
}

/// Something that happens before a given step.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum EventKind {
    /// The rank's true step time becomes `factor` × nominal (2.0 = twice as
    /// slow, e.g. thermal throttling; 1.0 = recovered).
    Slowdown {
        /// Rank index.
        rank: usize,
        /// Multiplier on both `a` and `c`.
        factor: f64,
    },
    /// A new rank joins the job (world size + 1); the plan is recomputed at once.
    Join {
        /// The new rank.
        rank: SimRank,
    },
}

/// An event at a step.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// Step before which it happens (0-based).
    pub step: u64,
    /// What happens.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// A complete scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Scenario {
    /// Name (see [`Scenario::builtin`]).
    pub name: String,
    /// One-line description.
    pub description: String,
    /// The ranks at the start.
    #[serde(skip)]
    pub ranks: Vec<SimRank>,
    /// Global batch `B`.
    pub global_batch: u32,
    /// Fixed all-reduce cost per step, seconds.
    pub allreduce_seconds: f64,
    /// Steps to simulate.
    pub steps: u64,
    /// Steps between balancing decisions.
    pub interval: u64,
    /// Relative standard deviation of per-step compute-time noise.
    pub noise: f64,
    /// Probability that a rank's step is a wild outlier (5× slower).
    pub outlier_rate: f64,
    /// Scripted events.
    pub events: Vec<Event>,
}

/// Names of the built-in scenarios.
pub const BUILTIN_SCENARIOS: [&str; 8] = [
    "four-rank",
    "throttle",
    "homogeneous",
    "join",
    "mixed",
    "big",
    "slow-node",
    "slow-comm",
];

/// Per-sample seconds of the fastest rank in the abstract scenarios.
const REF_PER_SAMPLE: f64 = 0.002;
/// Fixed cost in the abstract scenarios.
const REF_FIXED: f64 = 0.010;
/// Seconds the throttled rank of `slow-comm` adds to every exchange.
const SLOW_EXCHANGE: f64 = 0.3;

impl Scenario {
    /// A built-in scenario by name:
    /// - `four-rank`: speeds 1 : 0.7 : 0.4 : 0.25, B = 256;
    /// - `throttle`: `four-rank` where rank 0 slows 2× at step 200 and recovers at 400;
    /// - `homogeneous`: 8 identical A100s, 5% noise;
    /// - `join`: `four-rank`, and a rank of speed 0.8 joins at step 200;
    /// - `mixed`: one rank of each of the 9 device types, B = 576;
    /// - `big`: 1,024 ranks, 128 of each of 8 device types, B = 131,072, 5% noise;
    /// - `slow-node`: four ranks of speed 1 and one of speed 0.05, B = 64: even
    ///   at batch 1 the slow rank's step is longer than the others' whole
    ///   step, so the best plan leaves it out;
    /// - `slow-comm`: four ranks of speed 1 and one of speed 0.1 whose
    ///   presence adds 0.3 s to every exchange (a pod throttled to 0.1 core:
    ///   its share of the all-reduce), B = 64: its compute alone fits one
    ///   sample in the others' step, so only the measured step shows that
    ///   the best plan leaves it out.
    pub fn builtin(name: &str) -> Option<Scenario> {
        let four: Vec<SimRank> = [1.0, 0.7, 0.4, 0.25]
            .iter()
            .map(|&s| SimRank::with_speed(s, REF_PER_SAMPLE, REF_FIXED, 1024))
            .collect();
        let base = Scenario {
            name: name.to_string(),
            description: String::new(),
            ranks: four,
            global_batch: 256,
            allreduce_seconds: 0.030,
            steps: 400,
            interval: 20,
            noise: 0.02,
            outlier_rate: 0.0,
            events: Vec::new(),
        };
        let s = match name {
            "four-rank" => four_rank(base),
            "throttle" => throttle(base),
            "homogeneous" => homogeneous(base),
            "join" => join(base),
            "mixed" => mixed(base),
            "big" => big(base),
            "slow-node" => slow_node(base),
            "slow-comm" => slow_comm(base),
            _ => return None,
        };
        Some(s)
    }

    /// Number of ranks at the start.
    pub fn world_size(&self) -> usize {
        self.ranks.len()
    }
}

/// `four-rank`: the base scenario as it is.
fn four_rank(base: Scenario) -> Scenario {
    Scenario {
        description: "4 ranks, speeds 1 : 0.7 : 0.4 : 0.25, B = 256".into(),
        ..base
    }
}

/// `throttle`: `four-rank` where rank 0 slows 2× at step 200 and recovers
/// at 400.
fn throttle(base: Scenario) -> Scenario {
    Scenario {
        description: "four-rank; rank 0 slows 2x at step 200, recovers at step 400".into(),
        steps: 600,
        events: vec![
            Event {
                step: 200,
                kind: EventKind::Slowdown {
                    rank: 0,
                    factor: 2.0,
                },
            },
            Event {
                step: 400,
                kind: EventKind::Slowdown {
                    rank: 0,
                    factor: 1.0,
                },
            },
        ],
        ..base
    }
}

/// `homogeneous`: 8 identical A100s, 5% noise.
fn homogeneous(base: Scenario) -> Scenario {
    Scenario {
        description: "8 identical A100 ranks, 5% noise (nothing to balance)".into(),
        ranks: vec![SimRank::from_device(&super::devices::A100); 8],
        noise: 0.05,
        ..base
    }
}

/// `join`: `four-rank`, and a rank of speed 0.8 joins at step 200.
fn join(base: Scenario) -> Scenario {
    Scenario {
        description: "four-rank; a rank of speed 0.8 joins at step 200".into(),
        events: vec![Event {
            step: 200,
            kind: EventKind::Join {
                rank: SimRank::with_speed(0.8, REF_PER_SAMPLE, REF_FIXED, 1024),
            },
        }],
        ..base
    }
}

/// `mixed`: one rank of each of the 9 device types, B = 576.
fn mixed(base: Scenario) -> Scenario {
    Scenario {
        description: "one rank of each of 9 device types, B = 576".into(),
        ranks: ALL_DEVICES.iter().map(SimRank::from_device).collect(),
        global_batch: 576,
        allreduce_seconds: 0.020,
        ..base
    }
}

/// `big`: 1,024 ranks, 128 of each of 8 device types, B = 131,072, 5% noise.
fn big(base: Scenario) -> Scenario {
    Scenario {
        description: "1,024 ranks, 128 each of 8 device types, B = 131,072, 5% noise".into(),
        ranks: (0..1024)
            .map(|i| SimRank::from_device(&BIG_MIX[i % BIG_MIX.len()]))
            .collect(),
        global_batch: 131_072,
        allreduce_seconds: 0.050,
        noise: 0.05,
        ..base
    }
}

/// `slow-node`: four ranks of speed 1 and one of speed 0.05, B = 64: even
/// at batch 1 the slow rank's step is longer than the others' whole step,
/// so the best plan leaves it out.
fn slow_node(base: Scenario) -> Scenario {
    Scenario {
        description: "4 ranks of speed 1 and one of speed 0.05, B = 64 (best without it)".into(),
        ranks: [1.0, 1.0, 1.0, 1.0, 0.05]
            .iter()
            .map(|&s| SimRank::with_speed(s, REF_PER_SAMPLE, REF_FIXED, 1024))
            .collect(),
        global_batch: 64,
        ..base
    }
}

/// `slow-comm`: four ranks of speed 1 and one of speed 0.1 whose presence
/// adds [`SLOW_EXCHANGE`] to every exchange (a pod throttled to 0.1 core:
/// its share of the all-reduce), B = 64: its compute alone fits one sample
/// in the others' step, so only the measured step shows that the best plan
/// leaves it out.
fn slow_comm(base: Scenario) -> Scenario {
    Scenario {
        description:
            "4 ranks of speed 1 and one of speed 0.1 adding 0.3 s to every exchange, B = 64 (best without it)"
                .into(),
        ranks: [1.0, 1.0, 1.0, 1.0, 0.1]
            .iter()
            .map(|&s| SimRank {
                exchange_seconds: if s < 1.0 { SLOW_EXCHANGE } else { 0.0 },
                ..SimRank::with_speed(s, REF_PER_SAMPLE, REF_FIXED, 1024)
            })
            .collect(),
        global_batch: 64,
        ..base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_exists_and_is_feasible() {
        for name in BUILTIN_SCENARIOS {
            let s = Scenario::builtin(name).expect(name);
            let caps: u64 = s.ranks.iter().map(|r| u64::from(r.max_batch)).sum();
            assert!(caps >= u64::from(s.global_batch), "{name}");
            assert!(s.global_batch as usize >= s.ranks.len(), "{name}");
        }
        assert!(Scenario::builtin("nope").is_none());
        assert_eq!(Scenario::builtin("big").map(|s| s.world_size()), Some(1024));
    }
}
