//! Shared state of one operator replica: the API client, settings, metrics,
//! the Event recorder, the scrape client, the balancing state of every job
//! and the error-backoff counters.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use heterotrain_crds::HeteroTrainingJob;
use kube::runtime::events::{Recorder, Reporter};
use kube::Client;

use crate::config::OperatorConfig;
use crate::events::{self, EventSpec};
use crate::leader::health::LeaseHealth;
use crate::metrics::Metrics;
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
    /// Balancing state per job.
    pub(crate) rebalancer: Rebalancer,
    /// Consecutive failed reconciles per job.
    failures: Mutex<HashMap<JobKey, u32>>,
    /// The last refusal reported per job (`CreateRefused`), so one refusal
    /// is one Event however many reconciles meet it before the status
    /// that records it is read back.
    refusals: Mutex<HashMap<JobKey, String>>,
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
            rebalancer: Rebalancer::new(),
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
            recorder: &self.recorder,
        }
    }

    /// Count one more failed reconcile of `key`; the count so far.
    pub(crate) fn failed(&self, key: JobKey) -> u32 {
        self.failures
            .lock()
            .map(|mut f| {
                let n = f.entry(key).or_insert(0);
                *n = n.saturating_add(1);
                *n
            })
            .unwrap_or(1)
    }

    /// Record that `key`'s objects were refused with `message`; whether
    /// that is new (not the refusal last recorded).
    pub(crate) fn refused(&self, key: &JobKey, message: &str) -> bool {
        self.refusals
            .lock()
            .map(|mut r| r.insert(key.clone(), message.to_string()).as_deref() != Some(message))
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
