//! Operator-wide settings (from flags/env in the binary, set directly by tests).

use std::time::Duration;

/// Which metrics source the operator uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MetricsSourceMode {
    /// Follow each job's `loadBalancing.metricsSource`.
    #[default]
    Job,
    /// Always scrape pods directly.
    Pods,
    /// Always query Prometheus (`--prometheus-url` or the job's `prometheusUrl`).
    Prometheus,
}

/// Operator configuration.
#[derive(Clone, Debug)]
pub struct OperatorConfig {
    /// Trainer image for jobs and groups without their own `image`.
    pub trainer_image: String,
    /// How often running jobs' metrics are read.
    pub scrape_interval: Duration,
    /// Timeout of one scrape / Prometheus query.
    pub scrape_timeout: Duration,
    /// Largest `/metrics` (or Prometheus answer) body read, in bytes; a
    /// larger one is cut off and counts as no metrics for that round.
    pub scrape_max_body_bytes: usize,
    /// Least time between two balancing decisions of one job: a floor on top
    /// of the job's `loadBalancing.rebalanceIntervalSteps` (a decision needs
    /// both), checked at each scrape.
    pub rebalance_interval: Duration,
    /// Jobs reconciled at the same time.
    pub concurrency: u16,
    /// Live samples the balancer keeps per rank (each sample is one scrape
    /// interval's mean step, so fewer than the balancer's default suffice).
    pub balancer_window: usize,
    /// Metrics source override.
    pub metrics_source: MetricsSourceMode,
    /// Prometheus URL for jobs that ask for Prometheus without their own URL.
    pub prometheus_url: Option<String>,
    /// Only watch this namespace (all namespaces when `None`).
    pub watch_namespace: Option<String>,
    /// Namespace of the operator itself: Lease and profile cache live here.
    pub operator_namespace: String,
    /// Store and reuse hardware profiles across jobs.
    pub profile_cache: bool,
    /// This replica's identity (Lease holder, Event reportingInstance).
    pub identity: String,
    /// Name of the leader-election Lease.
    pub lease_name: String,
    /// A Lease not renewed for this long may be taken over.
    pub lease_duration: Duration,
    /// How often the leader renews (and a standby retries).
    pub lease_renew_interval: Duration,
    /// How long to wait for the CRD at start before giving up.
    pub crd_wait: Duration,
}

impl Default for OperatorConfig {
    fn default() -> Self {
        OperatorConfig {
            trainer_image: concat!(
                "ghcr.io/heterotrain/heterotrain-trainer:",
                env!("CARGO_PKG_VERSION")
            )
            .into(),
            scrape_interval: Duration::from_secs(10),
            scrape_timeout: Duration::from_secs(3),
            scrape_max_body_bytes: crate::scrape::DEFAULT_MAX_BODY_BYTES,
            rebalance_interval: Duration::from_secs(30),
            concurrency: 16,
            balancer_window: 8,
            metrics_source: MetricsSourceMode::Job,
            prometheus_url: None,
            watch_namespace: None,
            operator_namespace: "heterotrain-system".into(),
            profile_cache: true,
            identity: "heterotrain-operator".into(),
            lease_name: "heterotrain-operator".into(),
            lease_duration: Duration::from_secs(15),
            lease_renew_interval: Duration::from_secs(5),
            crd_wait: Duration::from_secs(60),
        }
    }
}
