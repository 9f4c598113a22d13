//! The operator's command line: flags, their environment variables and
//! defaults, and the [`OperatorConfig`] they make.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use heterotrain_operator::config::{self, MetricsSourceMode};
use heterotrain_operator::{webhook, OperatorConfig};

/// HeteroTrain operator: reconciles HeteroTrainingJobs into self-balancing,
/// self-healing gangs of trainer pods.
#[derive(Parser, Debug, Clone)]
#[command(version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Cmd>,
    /// Trainer image for jobs without their own.
    #[arg(
        long,
        env = "HETEROTRAIN_TRAINER_IMAGE",
        default_value = concat!("ghcr.io/heterotrain/heterotrain-trainer:", env!("CARGO_PKG_VERSION"))
    )]
    trainer_image: String,
    /// Where live metrics come from: `job` (each job's metricsSource), `pods`, `prometheus`.
    #[arg(
        long,
        env = "HETEROTRAIN_METRICS_SOURCE",
        value_enum,
        default_value = "job"
    )]
    metrics_source: MetricsSourceMode,
    /// Prometheus base URL for jobs that use Prometheus without their own prometheusUrl.
    #[arg(long, env = "HETEROTRAIN_PROMETHEUS_URL")]
    prometheus_url: Option<String>,
    /// PEM file of CAs to trust for an https Prometheus, besides the
    /// system's roots (e.g. a mounted Secret's ca.crt).
    #[arg(long, env = "HETEROTRAIN_PROMETHEUS_CA_FILE")]
    prometheus_ca_file: Option<std::path::PathBuf>,
    /// File holding a bearer token sent to Prometheus with every query
    /// (re-read each time, so a rotated token is used; never logged). Sent
    /// to --prometheus-url and the --allow-prometheus-url origins only.
    #[arg(long, env = "HETEROTRAIN_PROMETHEUS_BEARER_TOKEN_FILE")]
    prometheus_bearer_token_file: Option<std::path::PathBuf>,
    /// A Prometheus (its scheme://host:port) a job's own
    /// loadBalancing.prometheusUrl may name besides --prometheus-url; repeat
    /// or separate with commas. A job naming any other is refused (Invalid),
    /// so job authors cannot point the operator at arbitrary addresses.
    #[arg(
        long = "allow-prometheus-url",
        env = "HETEROTRAIN_ALLOW_PROMETHEUS_URLS",
        value_delimiter = ','
    )]
    allowed_prometheus: Vec<String>,
    /// A ServiceAccount a job's spec.serviceAccountName may name; repeat or
    /// separate with commas; `*` allows any. Jobs that name none run as
    /// heterotrain-trainer. A job naming another is refused (Invalid), so
    /// creating a job does not let its author run pods as any account of
    /// the namespace.
    #[arg(
        long = "allow-service-account",
        env = "HETEROTRAIN_ALLOW_SERVICE_ACCOUNTS",
        value_delimiter = ',',
        default_value = "heterotrain-trainer"
    )]
    allowed_service_accounts: Vec<String>,
    /// An image prefix (registry or repository, e.g. ghcr.io/my-team/) every
    /// image a job names must start with; repeat or separate with commas.
    /// Unset: any image (the cluster's own admission still applies).
    #[arg(
        long = "allow-image",
        env = "HETEROTRAIN_ALLOW_IMAGES",
        value_delimiter = ','
    )]
    allowed_images: Vec<String>,
    /// Secrets of its namespace a job may read through env, envFrom or
    /// volumes (comma-separated names; `*` or unset: any). Creating a job
    /// should not grant more than creating its pods would.
    #[arg(
        long = "allow-secret",
        env = "HETEROTRAIN_ALLOW_SECRETS",
        value_delimiter = ','
    )]
    allowed_secrets: Vec<String>,
    /// Refuse jobs that run a command of their own: only the built-in
    /// trainer runs.
    #[arg(long, env = "HETEROTRAIN_NO_CUSTOM_COMMAND")]
    no_custom_command: bool,
    /// Seconds between metric reads of a running job.
    #[arg(long, env = "HETEROTRAIN_SCRAPE_INTERVAL", default_value_t = 10.0)]
    scrape_interval: f64,
    /// Timeout of one scrape or Prometheus query, seconds.
    #[arg(long, env = "HETEROTRAIN_SCRAPE_TIMEOUT", default_value_t = 3.0)]
    scrape_timeout: f64,
    /// Largest /metrics or Prometheus answer read, in bytes (a larger one is
    /// cut off and that rank has no metrics this round).
    #[arg(long, env = "HETEROTRAIN_SCRAPE_MAX_BYTES", default_value_t = heterotrain_operator::scrape::DEFAULT_MAX_BODY_BYTES)]
    scrape_max_bytes: usize,
    /// Most bytes of rank /metrics bodies held at once, over all jobs:
    /// scrapes beyond it wait their turn (at least one body's worth).
    #[arg(long, env = "HETEROTRAIN_SCRAPE_MAX_TOTAL_BYTES", default_value_t = heterotrain_operator::scrape::DEFAULT_MAX_TOTAL_BYTES)]
    scrape_max_total_bytes: usize,
    /// Least seconds between two balancing decisions of one job: a floor on
    /// top of each job's loadBalancing.rebalanceIntervalSteps (a job's plan is
    /// reconsidered once it has trained that many steps AND this long has
    /// passed, checked at each scrape).
    #[arg(long, env = "HETEROTRAIN_REBALANCE_INTERVAL", default_value_t = 30.0)]
    rebalance_interval: f64,
    /// Jobs reconciled at the same time (1, as in controller-runtime). A
    /// reconcile reads from the watch caches; a new job's is a dozen
    /// writes, and more of those at once do not create jobs faster on a
    /// busy API server, they queue there and slow every reconcile (300 jobs
    /// created at once on a 2-core control plane: every pod running after
    /// 48–54 s at 1, 2, 4 or 16; reconcile p99 0.24 s at 1, 0.45–0.51 s at
    /// 2, 0.97 s at 4, 2.4 s at 16). Raise it for an API server with cores
    /// to spare.
    #[arg(long, env = "HETEROTRAIN_CONCURRENCY", default_value_t = 1)]
    concurrency: u16,
    /// Seconds a job's triggers (its pods', plan's and own changes) must
    /// stay quiet before it is reconciled: the dozen changes of one gang
    /// start then make fewer reconciles and status writes. 0 (the default)
    /// reconciles at every change: a job's own status writes also reset the
    /// wait, so a debounce slows how often a short job's progress is read.
    #[arg(long, env = "HETEROTRAIN_DEBOUNCE", default_value_t = 0.0)]
    debounce: f64,
    /// Only reconcile jobs in this namespace (default: all namespaces);
    /// repeat the flag or separate names with commas. One watcher per
    /// namespace, so namespaced RBAC (a Role in each) is enough.
    #[arg(
        long = "namespace",
        env = "HETEROTRAIN_WATCH_NAMESPACES",
        value_delimiter = ','
    )]
    namespaces: Vec<String>,
    /// The operator's own namespace (Lease, profile cache).
    #[arg(long, env = "POD_NAMESPACE", default_value = "heterotrain-system")]
    operator_namespace: String,
    /// This replica's identity for leader election (default: hostname).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// A namespace (besides the operator's own) whose pods may read the
    /// ranks' /metrics through the jobs' NetworkPolicies, e.g. Prometheus's;
    /// repeat the flag or separate names with commas.
    #[arg(
        long = "metrics-from-namespace",
        env = "HETEROTRAIN_METRICS_FROM_NAMESPACES",
        value_delimiter = ','
    )]
    metrics_namespaces: Vec<String>,
    /// Disable the profile cache.
    #[arg(long, env = "HETEROTRAIN_NO_PROFILE_CACHE")]
    no_profile_cache: bool,
    /// /readyz fails while a watch (jobs, pods, ConfigMaps) has been failing
    /// for longer than this many seconds: the operator works from stale data.
    #[arg(long, env = "HETEROTRAIN_WATCH_UNREADY_AFTER", default_value_t = 60.0)]
    watch_unready_after: f64,
    /// Serve /metrics only to bearer tokens allowed `get` on the
    /// non-resource URL /metrics (checked with a TokenReview and a
    /// SubjectAccessReview; needs `create` on both). /healthz and /readyz
    /// stay open.
    #[arg(long, env = "HETEROTRAIN_METRICS_AUTH")]
    metrics_auth: bool,
    /// Address of the /metrics, /healthz, /readyz server.
    #[arg(long, env = "HETEROTRAIN_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub http_addr: SocketAddr,
    /// Serve the validating admission webhook (HTTPS, path /validate) on
    /// this address; unset: no webhook (reconcile still reports invalid
    /// specs as a condition).
    #[arg(long, env = "HETEROTRAIN_WEBHOOK_ADDR")]
    webhook_addr: Option<SocketAddr>,
    /// Directory with the webhook's `tls.crt` and `tls.key`, kept by a
    /// certificate manager (reread when they change). Unset: the operator
    /// makes a self-signed certificate (needs --webhook-service,
    /// --webhook-secret and --webhook-configuration).
    #[arg(long, env = "HETEROTRAIN_WEBHOOK_CERT_DIR")]
    webhook_cert_dir: Option<std::path::PathBuf>,
    /// The webhook's Service in the operator's namespace (the self-signed
    /// certificate's names).
    #[arg(long, env = "HETEROTRAIN_WEBHOOK_SERVICE")]
    webhook_service: Option<String>,
    /// Secret in the operator's namespace that keeps the self-signed
    /// certificate (shared by replicas; the chart creates it empty).
    #[arg(long, env = "HETEROTRAIN_WEBHOOK_SECRET")]
    webhook_secret: Option<String>,
    /// ValidatingWebhookConfiguration whose caBundle the operator fills
    /// with its self-signed CA.
    #[arg(long, env = "HETEROTRAIN_WEBHOOK_CONFIGURATION")]
    webhook_configuration: Option<String>,
}

#[derive(Subcommand, Debug, Clone)]
pub enum Cmd {
    /// Print the ClusterRole with every RBAC rule the operator needs.
    Rbac,
}

/// A list flag's entries, trimmed, blanks dropped.
/// The webhook's options from the flags, or why they do not fit together.
pub fn webhook_options(cli: &Cli) -> anyhow::Result<Option<webhook::Options>> {
    let Some(addr) = cli.webhook_addr else {
        return Ok(None);
    };
    let certs = match &cli.webhook_cert_dir {
        Some(dir) => webhook::CertSource::Files(dir.clone()),
        None => {
            let need = |v: &Option<String>, flag: &str| {
                v.clone().filter(|s| !s.is_empty()).with_context(|| {
                    format!("--webhook-addr without --webhook-cert-dir makes a self-signed certificate and needs --{flag}")
                })
            };
            webhook::CertSource::SelfSigned {
                namespace: cli.operator_namespace.clone(),
                service: need(&cli.webhook_service, "webhook-service")?,
                secret: need(&cli.webhook_secret, "webhook-secret")?,
                configuration: need(&cli.webhook_configuration, "webhook-configuration")?,
            }
        }
    };
    Ok(Some(webhook::Options { addr, certs }))
}

fn nonblank(list: Vec<String>) -> Vec<String> {
    list.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// A positive number of seconds: an interval of 0 would spin (scrape,
/// requeue) without pause.
fn secs(v: f64, what: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("--{what} must be a positive number of seconds, got {v}"))
}

/// Seconds that may be 0 (`--debounce 0`: no debounce).
fn secs_or_zero(v: f64, what: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v)
        .with_context(|| format!("--{what} must be 0 or a positive number of seconds, got {v}"))
}

impl Cli {
    /// The operator's configuration from the flags (an error names the
    /// flag and what it takes).
    pub fn config(&self) -> anyhow::Result<OperatorConfig> {
        let cli = self.clone();
        let identity = cli.identity.clone().unwrap_or_else(|| {
            std::env::var("HOSTNAME")
                .unwrap_or_else(|_| format!("heterotrain-operator-{}", std::process::id()))
        });
        let config = OperatorConfig {
            trainer_image: cli.trainer_image,
            metrics_namespaces: cli.metrics_namespaces,
            scrape_interval: secs(cli.scrape_interval, "scrape-interval")?,
            scrape_timeout: secs(cli.scrape_timeout, "scrape-timeout")?,
            scrape_max_body_bytes: cli.scrape_max_bytes,
            scrape_max_total_bytes: cli.scrape_max_total_bytes,
            rebalance_interval: secs(cli.rebalance_interval, "rebalance-interval")?,
            concurrency: if cli.concurrency == 0 {
                anyhow::bail!("--concurrency must be at least 1")
            } else {
                cli.concurrency
            },
            debounce: secs_or_zero(cli.debounce, "debounce")?,
            watch_unready_after: secs(cli.watch_unready_after, "watch-unready-after")?,
            metrics_auth: cli.metrics_auth,
            metrics_source: cli.metrics_source,
            prometheus_url: cli.prometheus_url,
            prometheus_auth: heterotrain_operator::scrape::PrometheusAuth {
                ca_file: cli.prometheus_ca_file,
                bearer_token_file: cli.prometheus_bearer_token_file,
            },
            allowed_prometheus: config::allowed_prometheus(&cli.allowed_prometheus)
                .map_err(anyhow::Error::msg)?,
            allowed_service_accounts: nonblank(cli.allowed_service_accounts),
            allowed_images: nonblank(cli.allowed_images),
            allowed_secrets: nonblank(cli.allowed_secrets),
            no_custom_command: cli.no_custom_command,
            watch_namespaces: config::watch_namespaces(&cli.namespaces)
                .map_err(anyhow::Error::msg)?,
            operator_namespace: cli.operator_namespace,
            profile_cache: !cli.no_profile_cache,
            identity,
            ..OperatorConfig::default()
        };
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_must_be_positive_and_a_debounce_may_be_zero() {
        assert_eq!(secs(1.5, "x").ok(), Some(Duration::from_millis(1500)));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = secs(bad, "scrape-interval").expect_err("refused");
            assert!(
                e.to_string()
                    .contains("--scrape-interval must be a positive number of seconds"),
                "{e}"
            );
        }
        assert_eq!(secs_or_zero(0.0, "debounce").ok(), Some(Duration::ZERO));
        assert!(secs_or_zero(-0.5, "debounce").is_err());
    }
}
