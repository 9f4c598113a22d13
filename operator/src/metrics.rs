//! The operator's own Prometheus metrics: one `Registry` per binary with a
//! `heterotrain_operator` sub-registry; a drop-guard times each reconcile.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry, Unit};

/// Label set of the error counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

/// Label set of the rebalance counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabel {
    pub policy: String,
}

/// Label set of the per-namespace lifecycle counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespacePhaseLabel {
    pub namespace: String,
    pub phase: String,
}

/// Label set of the per-namespace restart counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabel {
    pub namespace: String,
}

/// Label set of the per-stage reconcile histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabel {
    pub resource: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    pub stage: &'static str,
}

fn stage_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// The reconcile stages timed apart (bounded: four values).
pub mod stages {
    /// Validation, the children from the caches, the lifecycle decision.
    pub const FETCH: &str = "fetch";
    /// Deletes, the gang's objects and pods, Events.
    pub const APPLY: &str = "apply";
    /// The balancing round (starts metric reads, decides, writes plans).
    pub const BALANCE: &str = "balance";
    /// The status patch.
    pub const STATUS: &str = "status";
}

/// Every metric the operator exports.
#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Counter,
    pub errors: Family<ReasonLabel, Counter>,
    pub reconcile_duration: Histogram,
    /// Time per reconcile stage ([`stages`]).
    pub reconcile_stage_duration: Family<StageLabel, Histogram, fn() -> Histogram>,
    pub rebalances: Family<PolicyLabel, Counter>,
    pub plan_propagation: Histogram,
    pub scrape_failures: Counter,
    /// Errors of the operator's watches (each retried with back-off), by
    /// watched resource.
    pub watch_errors: Family<ResourceLabel, Counter>,
    pub leader: Gauge,
    /// Jobs entering a phase, by namespace (bounded: namespaces × 5).
    pub phase_transitions: Family<NamespacePhaseLabel, Counter>,
    /// Gang restarts counted toward backoffLimit, by namespace.
    pub restarts: Family<NamespaceLabel, Counter>,
    registry: Arc<Mutex<Registry>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Metrics {
        let mut root = Registry::default();
        let reg = root.sub_registry_with_prefix("heterotrain_operator");
        let (reconciles, errors, reconcile_duration, reconcile_stage_duration) =
            reconcile_metrics(reg);
        let (rebalances, plan_propagation, scrape_failures) = balancing_metrics(reg);
        let (watch_errors, leader, phase_transitions, restarts) = cluster_metrics(reg);
        Metrics {
            reconciles,
            errors,
            reconcile_duration,
            reconcile_stage_duration,
            rebalances,
            plan_propagation,
            scrape_failures,
            watch_errors,
            leader,
            phase_transitions,
            restarts,
            registry: Arc::new(Mutex::new(root)),
        }
    }

    /// OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(reg) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
        }
        out
    }

    /// Record that `stage` of a reconcile took `seconds`.
    pub fn stage(&self, stage: &'static str, seconds: f64) {
        self.reconcile_stage_duration
            .get_or_create(&StageLabel { stage })
            .observe(seconds);
    }

    /// Count a reconcile and time it until the guard drops.
    pub fn reconcile_timer(&self) -> ReconcileTimer {
        self.reconciles.inc();
        ReconcileTimer {
            start: Instant::now(),
            histogram: self.reconcile_duration.clone(),
        }
    }

    /// Count a job entering `phase` in `namespace`.
    pub fn entered(&self, namespace: &str, phase: &str) {
        self.phase_transitions
            .get_or_create(&NamespacePhaseLabel {
                namespace: namespace.to_string(),
                phase: phase.to_string(),
            })
            .inc();
    }

    /// Count `n` gang restarts in `namespace`.
    pub fn restarted(&self, namespace: &str, n: u32) {
        if n > 0 {
            self.restarts
                .get_or_create(&NamespaceLabel {
                    namespace: namespace.to_string(),
                })
                .inc_by(u64::from(n));
        }
    }

    /// Count an error by its stable label.
    pub fn error(&self, label: &str) {
        self.errors
            .get_or_create(&ReasonLabel {
                reason: label.to_string(),
            })
            .inc();
    }
}

/// Register a clone of `metric` as `name` (in `unit`, when it has one) and
/// hand the metric back.
fn add<M: Metric + Clone>(
    reg: &mut Registry,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    metric: M,
) -> M {
    match unit {
        Some(unit) => reg.register_with_unit(name, help, unit, metric.clone()),
        None => reg.register(name, help, metric.clone()),
    }
    metric
}

/// Observes the reconcile duration when dropped.
pub struct ReconcileTimer {
    start: Instant,
    histogram: Histogram,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}

/// The reconcile's: runs, errors, durations (whole and by stage).
#[allow(clippy::type_complexity)]
fn reconcile_metrics(
    reg: &mut Registry,
) -> (
    Counter,
    Family<ReasonLabel, Counter>,
    Histogram,
    Family<StageLabel, Histogram, fn() -> Histogram>,
) {
    let seconds = || Some(Unit::Seconds);
    (
        add(
            reg,
            "reconciles",
            "Reconciles run",
            None,
            Counter::default(),
        ),
        add(
            reg,
            "reconcile_errors",
            "Reconcile errors by reason",
            None,
            Family::default(),
        ),
        add(
            reg,
            "reconcile_duration",
            "Duration of one reconcile",
            seconds(),
            Histogram::new(exponential_buckets(0.005, 2.0, 14)),
        ),
        add(
            reg,
            "reconcile_stage_duration",
            "Duration of one stage of a reconcile (fetch, apply, balance, status)",
            seconds(),
            Family::new_with_constructor(stage_histogram as fn() -> Histogram),
        ),
    )
}

/// Balancing's: plans written, their propagation, unread metrics.
#[allow(clippy::type_complexity)]
fn balancing_metrics(reg: &mut Registry) -> (Family<PolicyLabel, Counter>, Histogram, Counter) {
    let seconds = || Some(Unit::Seconds);
    (
        add(
            reg,
            "rebalances",
            "New plans written, by policy",
            None,
            Family::default(),
        ),
        add(
            reg,
            "plan_propagation",
            "Time from writing a plan until every rank reports using it",
            seconds(),
            Histogram::new(exponential_buckets(0.1, 2.0, 12)),
        ),
        add(
            reg,
            "scrape_failures",
            "Rank metrics that could not be read",
            None,
            Counter::default(),
        ),
    )
}

/// The cluster's: watch errors, leadership, phases, restarts.
#[allow(clippy::type_complexity)]
fn cluster_metrics(
    reg: &mut Registry,
) -> (
    Family<ResourceLabel, Counter>,
    Gauge,
    Family<NamespacePhaseLabel, Counter>,
    Family<NamespaceLabel, Counter>,
) {
    (
        add(
            reg,
            "watch_errors",
            "Errors of the operator's watches (retried with back-off), by resource",
            None,
            Family::default(),
        ),
        add(
            reg,
            "leader",
            "1 while this replica holds the leader Lease",
            None,
            Gauge::default(),
        ),
        add(
            reg,
            "job_phase_transitions",
            "Jobs entering a phase (Pending, Running, Succeeded, Failed, Suspended), by namespace; counted when the status write lands",
            None,
            Family::default(),
        ),
        add(
            reg,
            "gang_restarts",
            "Gang restarts counted toward backoffLimit, by namespace",
            None,
            Family::default(),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_every_metric() {
        let m = Metrics::new();
        {
            let _t = m.reconcile_timer();
        }
        m.error("kube");
        m.entered("team-a", "Failed");
        m.restarted("team-a", 2);
        m.restarted("team-b", 0);
        let text = m.encode();
        assert!(!text.contains("team-b"), "no restart, no series:\n{text}");
        for name in [
            "heterotrain_operator_reconciles_total 1",
            "heterotrain_operator_reconcile_errors_total{reason=\"kube\"} 1",
            "heterotrain_operator_reconcile_duration_seconds_count 1",
            "heterotrain_operator_plan_propagation_seconds_count 0",
            "heterotrain_operator_job_phase_transitions_total{namespace=\"team-a\",phase=\"Failed\"} 1",
            "heterotrain_operator_gang_restarts_total{namespace=\"team-a\"} 2",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
    }
}
