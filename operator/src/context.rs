//! Shared state of one operator replica: the API client, settings, metrics,
//! the Event recorder, the scrape client, the balancing state of every job
//! and the error-backoff counters.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use heterotrain_crds::{HeteroTrainingJob, HeteroTrainingJobStatus};
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
    /// The status last written per job (see [`Context::status_ahead_of`]).
    written: WrittenStatus,
    /// The leader Lease's renewals (for `/healthz`).
    pub lease: LeaseHealth,
    /// The CRD was found (for `/readyz`).
    pub ready: AtomicBool,
    /// Which watches are failing, since when (for `/readyz`).
    pub watch_health: crate::watch_health::WatchHealth,
    /// Who may read `/metrics` (`None`: anyone who reaches the port).
    pub metrics_auth: Option<crate::metrics_auth::MetricsAuth>,
    /// The admission webhook is configured but not serving yet (no
    /// certificate, or its CA not yet in the webhook configuration).
    pub webhook_pending: AtomicBool,
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
        let metrics_auth = config
            .metrics_auth
            .then(|| crate::metrics_auth::MetricsAuth::new(client.clone()));
        Ok(Arc::new(Context {
            lease: LeaseHealth::new(config.lease_duration),
            scraper: Scraper::with_prometheus_auth(config.scrape_timeout, &config.prometheus_auth)?
                .with_max_body(config.scrape_max_body_bytes)
                .with_max_total(config.scrape_max_total_bytes),
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
            written: WrittenStatus::default(),
            ready: AtomicBool::new(false),
            watch_health: Default::default(),
            metrics_auth,
            webhook_pending: AtomicBool::new(false),
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

    /// This replica patched `status` on job `key` (of `uid`).
    pub(crate) fn wrote_status(&self, key: &JobKey, uid: &str, status: &HeteroTrainingJobStatus) {
        self.written.record(key, uid, status);
    }

    /// The status this replica wrote on job `key` (of `uid`) in the last
    /// [`STORE_LAG`], when the watched copy `seen` does not show it yet:
    /// the reflector store lags behind our own write, and a reconcile
    /// woken by another object's event (a pod we just deleted) would
    /// otherwise decide from the old status (a failed job would restart).
    pub(crate) fn status_ahead_of(
        &self,
        key: &JobKey,
        uid: &str,
        seen: Option<&HeteroTrainingJobStatus>,
    ) -> Option<HeteroTrainingJobStatus> {
        self.written.ahead_of(key, uid, seen)
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

/// A job's uid and the status written on it.
type Written = (String, HeteroTrainingJobStatus);

/// The status this replica last wrote per job, with the job's uid.
#[derive(Default)]
pub(crate) struct WrittenStatus(Mutex<HashMap<JobKey, (Written, Instant)>>);

impl WrittenStatus {
    fn record(&self, key: &JobKey, uid: &str, status: &HeteroTrainingJobStatus) {
        if let Ok(mut w) = self.0.lock() {
            forget_stale(&mut w, STORE_LAG);
            w.insert(
                key.clone(),
                ((uid.to_string(), status.clone()), Instant::now()),
            );
        }
    }

    fn ahead_of(
        &self,
        key: &JobKey,
        uid: &str,
        seen: Option<&HeteroTrainingJobStatus>,
    ) -> Option<HeteroTrainingJobStatus> {
        let mut w = self.0.lock().ok()?;
        forget_stale(&mut w, STORE_LAG);
        let ((u, s), _) = w.get(key)?;
        (u == uid && Some(s) != seen).then(|| s.clone())
    }
}

/// How long a status this replica wrote is trusted over the watched copy:
/// the store catches up within milliseconds; past this, the watched copy
/// wins (another replica may have written since).
pub(crate) const STORE_LAG: Duration = Duration::from_secs(5);

/// Drop the entries of `map` not met for `ttl`.
fn forget_stale<V>(map: &mut HashMap<JobKey, (V, Instant)>, ttl: Duration) {
    map.retain(|_, (_, at)| at.elapsed() < ttl);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_written_here_wins_over_an_older_watched_copy() {
        let ctx = WrittenStatus::default();
        let key = JobKey::new("ns", "a");
        let failed = HeteroTrainingJobStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        };
        let pending = HeteroTrainingJobStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        };
        assert_eq!(ctx.ahead_of(&key, "u1", Some(&pending)), None);
        ctx.record(&key, "u1", &failed);
        // The store still shows the old status: ours wins.
        assert_eq!(
            ctx.ahead_of(&key, "u1", Some(&pending)),
            Some(failed.clone())
        );
        assert_eq!(ctx.ahead_of(&key, "u1", None), Some(failed.clone()));
        // Caught up, or another job of the same name: the watched copy.
        assert_eq!(ctx.ahead_of(&key, "u1", Some(&failed)), None);
        assert_eq!(ctx.ahead_of(&key, "u2", Some(&pending)), None);
    }

    #[test]
    fn entries_not_met_for_the_ttl_are_forgotten() {
        let key = |n: &str| JobKey::new("ns", n);
        // Last met 10 s ago and just now: no sleep, so a preempted test
        // thread cannot age `b` past the TTL.
        let now = Instant::now();
        let long_ago = now
            .checked_sub(Duration::from_secs(10))
            .expect("an instant 10 s ago");
        let mut m = HashMap::from([(key("a"), (1u32, long_ago))]);
        m.insert(key("b"), (2, now));
        forget_stale(&mut m, PER_JOB_MEMORY);
        assert_eq!(m.len(), 2, "both met within the hour");
        forget_stale(&mut m, Duration::from_secs(5));
        assert_eq!(m.keys().collect::<Vec<_>>(), [&key("b")]);
    }
}
