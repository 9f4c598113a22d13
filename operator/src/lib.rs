//! HeteroTrain operator: reconciles `HeteroTrainingJob`s into a running,
//! self-balancing, self-healing gang of trainer pods.
//!
//! Reconcile ([`reconcile`]) is a pipeline of stages, one module each:
//! [`guard`] (deserialise the watched object) → [`validate`] (semantics
//! beyond the schema, once; out comes a `ValidatedJob` the later stages
//! read) → [`fetch`] (children, from the watch caches of [`children`]) → [`lifecycle`] (pure: what the gang needs
//! next) → [`build`] (pure: desired Service and Pods) and [`plan`] (the
//! batch plan: born, checked, advanced, written) → [`apply`] (server-side
//! apply, one field manager) → [`rebalance`] (metrics via [`scrape`] →
//! [`balance`] → next plan) → [`status`] (pure next status, patched only on
//! change). [`rank_pod`] holds what validation and build both know of a
//! rank pod (reserved volumes, keys, mount paths). [`context`] holds a replica's shared state; [`controller`]
//! wires the pipeline to kube-runtime; [`leader`] makes two replicas safe;
//! [`server`] serves `/metrics`, `/healthz`, `/readyz`.

pub mod apply;
pub mod balance;
pub mod build;
pub mod children;
pub mod conditions;
pub mod config;
pub mod context;
pub mod controller;
pub mod error;
pub mod events;
pub mod fetch;
pub mod gang;
pub mod guard;
pub mod leader;
pub mod lifecycle;
pub mod metrics;
pub mod metrics_auth;
pub mod names;
pub mod plan;
pub mod profile_cache;
pub mod rank_pod;
pub mod rbac;
pub mod rebalance;
pub mod reconcile;
pub mod scrape;
pub mod server;
pub mod status;
pub mod validate;
pub mod watch_health;
pub mod webhook;

#[cfg(test)]
mod fuzzing;
#[cfg(test)]
mod testing;

pub use config::OperatorConfig;
pub use context::Context;
pub use controller::run;
pub use error::{Error, Result};
