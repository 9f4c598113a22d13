//! Discrete-event simulator of synchronous data-parallel training on
//! heterogeneous ranks, used to evaluate the balancing policies at scale.
//!
//! Each step every rank computes its local batch in
//! `(a_r + c_r·b_r) · noise` seconds, then all wait for the slowest and pay a
//! fixed all-reduce, lengthened by the largest non-compute cost of a rank
//! that takes part ([`SimRank::exchange_seconds`]). The balancer gets what
//! the operator gives it: compute times, exposed communication and whole
//! step times. The *ideal* is the oracle split (true models, every rank
//! finishing together, continuous water-filling, over the best membership)
//! run through the same noise; efficiency = throughput / ideal throughput.

pub mod devices;
mod engine;
mod report;
pub mod rng;
mod scenario;

pub use engine::{run, run_with, sim_config};
pub use report::{IntervalReport, RunReport, ScenarioReport, NEAR_IDEAL};
pub use scenario::{Event, EventKind, Scenario, SimRank, BUILTIN_SCENARIOS};

use crate::{BalancerError, Policy};

/// Runs each of `policies` on `scenario` with the same noise seed.
pub fn run_all(
    scenario: &Scenario,
    policies: &[Policy],
    seed: u64,
) -> Result<ScenarioReport, BalancerError> {
    let runs = policies
        .iter()
        .map(|&p| run(scenario, p, seed))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ScenarioReport {
        scenario: scenario.clone(),
        world_size: scenario.world_size(),
        seed,
        runs,
    })
}
