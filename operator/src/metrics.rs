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

/// Every metric the operator exports.
#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Counter,
    pub errors: Family<ReasonLabel, Counter>,
    pub reconcile_duration: Histogram,
    pub rebalances: Family<PolicyLabel, Counter>,
    pub plan_propagation: Histogram,
    pub scrape_failures: Counter,
    pub leader: Gauge,
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
        let seconds = || Some(Unit::Seconds);
        Metrics {
            reconciles: add(
                reg,
                "reconciles",
                "Reconciles run",
                None,
                Counter::default(),
            ),
            errors: add(
                reg,
                "reconcile_errors",
                "Reconcile errors by reason",
                None,
                Family::default(),
            ),
            reconcile_duration: add(
                reg,
                "reconcile_duration",
                "Duration of one reconcile",
                seconds(),
                Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            ),
            rebalances: add(
                reg,
                "rebalances",
                "New plans written, by policy",
                None,
                Family::default(),
            ),
            plan_propagation: add(
                reg,
                "plan_propagation",
                "Time from writing a plan until every rank reports using it",
                seconds(),
                Histogram::new(exponential_buckets(0.1, 2.0, 12)),
            ),
            scrape_failures: add(
                reg,
                "scrape_failures",
                "Rank metrics that could not be read",
                None,
                Counter::default(),
            ),
            leader: add(
                reg,
                "leader",
                "1 while this replica holds the leader Lease",
                None,
                Gauge::default(),
            ),
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

    /// Count a reconcile and time it until the guard drops.
    pub fn reconcile_timer(&self) -> ReconcileTimer {
        self.reconciles.inc();
        ReconcileTimer {
            start: Instant::now(),
            histogram: self.reconcile_duration.clone(),
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
        let text = m.encode();
        for name in [
            "heterotrain_operator_reconciles_total 1",
            "heterotrain_operator_reconcile_errors_total{reason=\"kube\"} 1",
            "heterotrain_operator_reconcile_duration_seconds_count 1",
            "heterotrain_operator_plan_propagation_seconds_count 0",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
    }
}
