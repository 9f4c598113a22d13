//! Shared state of one operator replica: the API client, settings, metrics,
//! the Event recorder, the scrape client, the balancing state of every job
//! and the error-backoff counters.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use heterotrain_crds::HeteroTrainingJob;
use kube::runtime::events::{Recorder, Reporter};
use kube::Client;

use crate::children::Children;
use crate::config::OperatorConfig;
use crate::events::{self, EventSpec};
use crate::gang::Discovery;
use crate::leader::health::LeaseHealth;
use crate::metrics::Metrics;
use crate::rebalance::collect::Collector;
use crate::rebalance::{Deps, JobKey, Rebalancer};
use crate::scrape::Scraper;
use heterotrain_crds::labels;

/// Shared state of one operator replica.
pub struct Context {
    pub client: Client,
    pub config: OperatorConfig,
    pub metrics: Metrics,
    pub recorder: Recorder,
    pub scraper: Scraper,
    /// The watch caches of the jobs' pods and plan ConfigMaps.
    pub children: Children,
    /// Balancing state per job.
    pub(crate) rebalancer: Rebalancer,
    /// Metric reads in flight and done, per job.
    pub collector: Collector,
    /// Which gang schedulers the cluster serves.
    pub gang: Discovery,
    /// Consecutive failed reconciles per job (and when last counted).
    failures: Mutex<HashMap<JobKey, (u32, Instant)>>,
    /// The last refusal reported per job (`CreateRefused`), so one refusal
    /// is one Event however many reconciles meet it before the status
    /// that records it is read back (and when last met).
    refusals: Mutex<HashMap<JobKey, (String, Instant)>>,
    /// The leader Lease's renewals (for `/healthz`).
    pub lease: LeaseHealth,
    /// The CRD was found (for `/readyz`).
    pub ready: AtomicBool,
}

impl Context {
    /// A context for `client` (whose identity the operator acts as).
    /// Fails when the Prometheus CA or token file is unusable.
    pub fn new(
        client: Client,
        config: OperatorConfig,
        metrics: Metrics,
    ) -> crate::error::Result<Arc<Context>> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: labels::MANAGER.into(),
                instance: Some(config.identity.clone()),
            },
        );
        Ok(Arc::new(Context {
            lease: LeaseHealth::new(config.lease_duration),
            scraper: Scraper::with_prometheus_auth(config.scrape_timeout, &config.prometheus_auth)?
                .with_max_body(config.scrape_max_body_bytes),
            client,
            config,
            metrics,
            recorder,
            children: Children::new(),
            rebalancer: Rebalancer::new(),
            collector: Collector::new(),
            gang: Discovery::default(),
            failures: Mutex::new(HashMap::new()),
            refusals: Mutex::new(HashMap::new()),
            ready: AtomicBool::new(false),
        }))
    }

    /// Publish an Event on `job` (failures are logged, never fatal).
    pub async fn event(&self, job: &HeteroTrainingJob, e: &EventSpec) {
        events::publish(&self.recorder, job, e).await;
    }

    /// What a balancing round needs of this replica.
    pub(crate) fn rebalance_deps(&self) -> Deps<'_> {
        Deps {
            client: &self.client,
            config: &self.config,
            metrics: &self.metrics,
            scraper: &self.scraper,
            collector: &self.collector,
            recorder: &self.recorder,
        }
    }

    /// Count one more failed reconcile of `key`; the count so far.
    pub(crate) fn failed(&self, key: JobKey) -> u32 {
        self.failures
            .lock()
            .map(|mut f| {
                forget_stale(&mut f, PER_JOB_MEMORY);
                let e = f.entry(key).or_insert((0, Instant::now()));
                *e = (e.0.saturating_add(1), Instant::now());
                e.0
            })
            .unwrap_or(1)
    }

    /// Record that `key`'s objects were refused with `message`; whether
    /// that is new (not the refusal last recorded).
    pub(crate) fn refused(&self, key: &JobKey, message: &str) -> bool {
        self.refusals
            .lock()
            .map(|mut r| {
                forget_stale(&mut r, PER_JOB_MEMORY);
                let was = r.insert(key.clone(), (message.to_string(), Instant::now()));
                was.is_none_or(|(m, _)| m != message)
            })
            .unwrap_or(true)
    }

    /// `key`'s objects were written: a later refusal is news again.
    pub(crate) fn accepted(&self, key: &JobKey) {
        self.refusals.lock().map(|mut r| r.remove(key)).ok();
    }

    /// `key` reconciled: its failure count starts over.
    pub(crate) fn succeeded(&self, key: &JobKey) {
        self.failures.lock().map(|mut f| f.remove(key)).ok();
    }
}

/// How long a job's failure count or refusal is kept without being met
/// again. A job deleted while failing or refused is never reconciled again
/// (nothing else would remove it); a live one meets its entry at every
/// retry (at most every few minutes), so only deleted jobs' entries age out.
pub(crate) const PER_JOB_MEMORY: Duration = Duration::from_secs(3600);

/// Drop the entries of `map` not met for `ttl`.
fn forget_stale<V>(map: &mut HashMap<JobKey, (V, Instant)>, ttl: Duration) {
    map.retain(|_, (_, at)| at.elapsed() < ttl);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_not_met_for_the_ttl_are_forgotten() {
        let key = |n: &str| JobKey::new("ns", n);
        let mut m = HashMap::from([(key("a"), (1u32, Instant::now()))]);
        std::thread::sleep(Duration::from_millis(300));
        m.insert(key("b"), (2, Instant::now()));
        forget_stale(&mut m, PER_JOB_MEMORY);
        assert_eq!(m.len(), 2, "both met within the hour");
        forget_stale(&mut m, Duration::from_millis(150));
        assert_eq!(m.keys().collect::<Vec<_>>(), [&key("b")]);
    }
}
