//! HeteroTrain operator: reconciles `HeteroTrainingJob`s into a running,
//! self-balancing, self-healing gang of trainer pods.
//!
//! Reconcile is a pipeline of stages, one file each:
//! [`guard`] (deserialise the watched object) → [`fetch`] (children) →
//! [`validate`] (semantics beyond the schema) → [`lifecycle`] (pure: what
//! the gang needs next) → [`build`] (pure: desired objects) → [`apply`]
//! (server-side apply, one field manager) → [`balance`] / [`scrape`]
//! (metrics → balancer → next plan) → [`status`] (conditions, patched only
//! on change). [`controller`] wires them to kube-runtime; [`leader`] makes
//! two replicas safe; [`server`] serves `/metrics`, `/healthz`, `/readyz`.

pub mod apply;
pub mod balance;
pub mod build;
pub mod conditions;
pub mod config;
pub mod controller;
pub mod error;
pub mod fetch;
pub mod guard;
pub mod leader;
pub mod lifecycle;
pub mod metrics;
pub mod names;
pub mod profile_cache;
pub mod rbac;
pub mod rebalance;
pub mod scrape;
pub mod server;
pub mod status;
pub mod validate;

pub use config::OperatorConfig;
pub use controller::{run, Context};
pub use error::{Error, Result};
