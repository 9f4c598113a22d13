//! HeteroTrain balancer (pure library): decides every rank's local batch so
//! that heterogeneous ranks finish each synchronous step together while the
//! global batch `B` stays fixed.
//!
//! - [`model`]: per-rank step-time model `t_r(b) = a_r + c_r·b`, fitted
//!   robustly from profiles and live measurements.
//! - [`split`]: the optimal integer split (water-filling + greedy fix-up).
//! - [`Balancer`]: policies (`static`, `proportional`, `dynamic`, `hybrid`,
//!   `seed-formula`) with hysteresis, damping, straggler and staleness rules;
//!   the measurement policies leave out ranks that only slow the step down
//!   (local batch 0; never rank 0) and re-admit them for measurement.
//! - `exchange`: the gradient exchange's seconds per membership, from the
//!   ranks' start-up latency and link bandwidth, in the step-time model.
//! - [`quality`]: coefficient of variation of per-rank compute time.
//! - [`sim`]: a discrete-event simulator of synchronous ranks that runs the
//!   policies at scale (used by the `heterotrain-sim` and
//!   `heterotrain-bench-balancer` binaries and by the tests).
//!
//! No I/O, no clocks, no async, and no panics on bad input: errors are
//! [`BalancerError`] values, each with a stable `metric_label()`.

mod balancer;
mod bounds;
mod config;
mod decide;
mod decision;
mod error;
mod exchange;
mod measured;
pub mod model;
mod policy;
pub mod quality;
mod rank;
mod rules;
pub mod sim;
pub mod split;
mod subset;
mod text;

pub use balancer::Balancer;
pub use config::{BalancerConfig, Policy, MAX_READMIT_FACTOR};
pub use decision::Decision;
pub use error::{BalancerError, SplitError};
pub use model::{fit_profile, StepModel, MIN_PER_SAMPLE_SHARE};
pub use policy::{seed_scores, spread_weight};
pub use quality::{balance_quality, Quality, QualityClass};
pub use split::{continuous_split, max_step, optimal_split, optimal_split_bounded, Split};
pub use subset::READMIT_COST_BUDGET;
