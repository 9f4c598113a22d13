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
    /// Most bytes of rank bodies read at once, over every job.
    pub scrape_max_total_bytes: usize,
    /// Least time between two balancing decisions of one job: a floor on top
    /// of the job's `loadBalancing.rebalanceIntervalSteps` (a decision needs
    /// both), checked at each scrape.
    pub rebalance_interval: Duration,
    /// Jobs reconciled at the same time.
    pub concurrency: u16,
    /// Quiet time a job's triggers must leave before it is reconciled: the
    /// pod, ConfigMap and status changes of one gang start (a dozen within a
    /// second) then make one reconcile and one status write, not one each.
    /// Zero (the default) reconciles at every trigger.
    pub debounce: Duration,
    /// Live samples the balancer keeps per rank (each sample is one scrape
    /// interval's mean step, so fewer than the balancer's default suffice).
    pub balancer_window: usize,
    /// Metrics source override.
    pub metrics_source: MetricsSourceMode,
    /// Prometheus URL for jobs that ask for Prometheus without their own URL.
    pub prometheus_url: Option<String>,
    /// The CA and bearer token for an https Prometheus.
    pub prometheus_auth: crate::scrape::PrometheusAuth,
    /// Origins (`scheme://host[:port]`) besides `prometheus_url`'s that a
    /// job's own `loadBalancing.prometheusUrl` may name.
    pub allowed_prometheus: Vec<String>,
    /// ServiceAccounts a job's `serviceAccountName` may name (`*`: any;
    /// empty: any).
    pub allowed_service_accounts: Vec<String>,
    /// Image prefixes a job's images must start with (empty: any).
    pub allowed_images: Vec<String>,
    /// `--allow-secret`: Secrets jobs may read (empty or `*`: any).
    pub allowed_secrets: Vec<String>,
    /// `--no-custom-command`: refuse jobs with a `command` of their own.
    pub no_custom_command: bool,
    /// Only watch these namespaces, one watcher each (all namespaces when
    /// empty).
    pub watch_namespaces: Vec<String>,
    /// Namespace of the operator itself: Lease and profile cache live here.
    pub operator_namespace: String,
    /// Namespaces besides the operator's own whose pods may read the ranks'
    /// `/metrics` through the jobs' NetworkPolicies (Prometheus's).
    pub metrics_namespaces: Vec<String>,
    /// Store and reuse hardware profiles across jobs.
    pub profile_cache: bool,
    /// This replica's identity (Lease holder, Event reportingInstance).
    pub identity: String,
    /// Name of the leader-election Lease.
    pub lease_name: String,
    /// A Lease not renewed for this long may be taken over.
    pub lease_duration: Duration,
    /// `/readyz` fails while a watch has been failing longer than this.
    pub watch_unready_after: Duration,
    /// `/metrics` only for bearer tokens allowed `get /metrics`
    /// (TokenReview + SubjectAccessReview).
    pub metrics_auth: bool,
    /// How often the leader renews (and a standby retries).
    pub lease_renew_interval: Duration,
    /// How long to wait for the CRD at start before giving up.
    pub crd_wait: Duration,
}

impl OperatorConfig {
    /// The admission flags (allow-lists) jobs are checked against, in
    /// reconcile and in the admission webhook alike.
    pub fn admission(&self) -> crate::validate::Admission<'_> {
        crate::validate::Admission {
            prometheus: crate::validate::PrometheusPolicy {
                default_url: self.prometheus_url.as_deref(),
                allowed: &self.allowed_prometheus,
            },
            service_accounts: &self.allowed_service_accounts,
            images: &self.allowed_images,
            secrets: &self.allowed_secrets,
            no_custom_command: self.no_custom_command,
        }
    }

    /// Namespaces whose pods may read the ranks' `/metrics`: the operator's,
    /// then `metrics_namespaces`, without repeats.
    pub fn metrics_from(&self) -> Vec<String> {
        let mut out = vec![self.operator_namespace.clone()];
        for ns in &self.metrics_namespaces {
            if !out.contains(ns) {
                out.push(ns.clone());
            }
        }
        out
    }
}

/// The namespaces of `--namespace`, checked: trimmed, blanks dropped, each a
/// DNS-1123 label, in the given order without repeats.
pub fn watch_namespaces(given: &[String]) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for ns in given.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let ok = ns.len() <= 63
            && ns
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !ns.starts_with('-')
            && !ns.ends_with('-');
        if !ok {
            return Err(format!(
                "--namespace {ns:?} is not a namespace name (lower-case letters, digits and '-', at most 63)"
            ));
        }
        if !out.iter().any(|o| o == ns) {
            out.push(ns.to_string());
        }
    }
    Ok(out)
}

/// The origins of `--allow-prometheus-url`, checked: each an http(s) URL
/// without user information; blanks dropped, no repeats.
pub fn allowed_prometheus(given: &[String]) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for url in given.iter().map(|u| u.trim()).filter(|u| !u.is_empty()) {
        let o = crate::validate::origin(url).ok_or_else(|| {
            format!("--allow-prometheus-url {url:?} is not an http(s) URL like http://prometheus.monitoring:9090")
        })?;
        if !out.contains(&o) {
            out.push(o);
        }
    }
    Ok(out)
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
            scrape_max_total_bytes: crate::scrape::DEFAULT_MAX_TOTAL_BYTES,
            rebalance_interval: Duration::from_secs(30),
            concurrency: 1,
            debounce: Duration::ZERO,
            balancer_window: 8,
            metrics_source: MetricsSourceMode::Job,
            prometheus_url: None,
            prometheus_auth: Default::default(),
            allowed_prometheus: Vec::new(),
            allowed_service_accounts: Vec::new(),
            allowed_images: Vec::new(),
            allowed_secrets: Vec::new(),
            no_custom_command: false,
            watch_namespaces: Vec::new(),
            operator_namespace: "heterotrain-system".into(),
            metrics_namespaces: Vec::new(),
            profile_cache: true,
            identity: "heterotrain-operator".into(),
            lease_name: "heterotrain-operator".into(),
            lease_duration: Duration::from_secs(15),
            watch_unready_after: Duration::from_secs(60),
            metrics_auth: false,
            lease_renew_interval: Duration::from_secs(5),
            crd_wait: Duration::from_secs(60),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watched_namespaces_are_checked_and_listed_once() {
        let given = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            watch_namespaces(&given(&["team-a", " team-b", "", "team-a"])),
            Ok(vec!["team-a".to_string(), "team-b".to_string()])
        );
        assert_eq!(watch_namespaces(&given(&[])), Ok(vec![]));
        for bad in ["Team", "a_b", "-a", "a-", &"x".repeat(64)] {
            let err = watch_namespaces(&given(&[bad])).expect_err(bad);
            assert!(err.contains("--namespace"), "{err}");
        }
    }

    #[test]
    fn allowed_prometheus_urls_are_origins() {
        let given = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            allowed_prometheus(&given(&[
                "http://Prom.Monitoring:9090/api",
                " https://thanos:443 ",
                "http://prom.monitoring:9090"
            ])),
            Ok(vec![
                "http://prom.monitoring:9090".to_string(),
                "https://thanos:443".to_string()
            ])
        );
        for bad in [
            "prom:9090",
            "ftp://prom",
            "http://user@prom:9090",
            "http://",
        ] {
            let err = allowed_prometheus(&given(&[bad])).expect_err(bad);
            assert!(err.contains("--allow-prometheus-url"), "{err}");
        }
    }

    #[test]
    fn metrics_come_from_the_operators_namespace_and_the_named_ones_once() {
        let cfg = OperatorConfig {
            operator_namespace: "ht".into(),
            metrics_namespaces: vec!["monitoring".into(), "ht".into(), "monitoring".into()],
            ..OperatorConfig::default()
        };
        assert_eq!(cfg.metrics_from(), ["ht", "monitoring"]);
    }
}
