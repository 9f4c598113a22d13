//! `kubectl heterotrain`: what a HeteroTrainingJob is doing, from the API
//! server alone — the job's status, its rank pods, the plan ConfigMap,
//! `Rebalanced` Events and the operator's profile cache. `fetch` reads,
//! `render` turns what was read into text (pure, unit-tested).

pub mod fetch;
pub mod render;
pub mod table;

pub use fetch::{JobView, RebalanceEvent};
