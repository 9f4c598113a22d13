//! The operator's own Prometheus metrics: one `Registry` per binary with a
//! `heterotrain_operator` sub-registry; a drop-guard times each reconcile.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

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
        let m = Metrics {
            reconciles: Counter::default(),
            errors: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            rebalances: Family::default(),
            plan_propagation: Histogram::new(exponential_buckets(0.1, 2.0, 12)),
            scrape_failures: Counter::default(),
            leader: Gauge::default(),
            registry: Arc::new(Mutex::new(Registry::default())),
        };
        reg.register("reconciles", "Reconciles run", m.reconciles.clone());
        reg.register(
            "reconcile_errors",
            "Reconcile errors by reason",
            m.errors.clone(),
        );
        reg.register_with_unit(
            "reconcile_duration",
            "Duration of one reconcile",
            prometheus_client::registry::Unit::Seconds,
            m.reconcile_duration.clone(),
        );
        reg.register(
            "rebalances",
            "New plans written, by policy",
            m.rebalances.clone(),
        );
        reg.register_with_unit(
            "plan_propagation",
            "Time from writing a plan until every rank reports using it",
            prometheus_client::registry::Unit::Seconds,
            m.plan_propagation.clone(),
        );
        reg.register(
            "scrape_failures",
            "Rank metrics that could not be read",
            m.scrape_failures.clone(),
        );
        reg.register(
            "leader",
            "1 while this replica holds the leader Lease",
            m.leader.clone(),
        );
        Metrics {
            registry: Arc::new(Mutex::new(root)),
            ..m
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
