//! The balancing loop of running jobs: every scrape interval start a read
//! of each rank's metrics ([`source`]) in its own task ([`collect`]), and
//! when it is done (the job is woken) feed the job's balancer; once the job has
//! trained `loadBalancing.rebalanceIntervalSteps` steps since the last
//! decision and at least `--rebalance-interval` has passed
//! ([`clock::decision_due`]) decide, and when a new plan comes out write
//! generation+1, emit `Rebalanced` (and `RanksLeftOut` / `RanksReadmitted`
//! when the ranks that train change, [`membership`]) and record the
//! decision and balance quality for status ([`step`]). [`Rebalancer`] owns the per-job state,
//! keyed by [`JobKey`]; it is dropped when the job or its gang goes away.

pub mod clock;
pub mod collect;
mod fold;
mod membership;
mod profiles;
pub mod source;
mod state;
mod step;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use kube::runtime::events::Recorder;
use kube::Client;
use tracing::warn;

pub use clock::{decision_due, DecisionClock};
pub use state::JobKey;

use crate::balance::JobBalancer;
use crate::config::OperatorConfig;
use crate::fetch::Observed;
use crate::metrics::Metrics;
use crate::scrape::Scraper;
use crate::status::Extras;
use crate::validate::ValidatedJob;
use state::JobState;

/// What a balancing round uses of the operator.
pub struct Deps<'a> {
    pub client: &'a Client,
    pub config: &'a OperatorConfig,
    pub metrics: &'a Metrics,
    /// The HTTP client for pod scrapes and Prometheus queries.
    pub scraper: &'a Scraper,
    /// Runs those reads off the reconcile path.
    pub collector: &'a collect::Collector,
    pub recorder: &'a Recorder,
}

/// Balancing state of every job this replica balances.
#[derive(Default)]
pub struct Rebalancer {
    jobs: Mutex<HashMap<JobKey, JobState>>,
}

impl Rebalancer {
    /// No jobs yet.
    pub fn new() -> Rebalancer {
        Rebalancer::default()
    }

    /// One balancing round for a job whose ranks all run. Never fails:
    /// problems are logged and counted, and the figures from before are kept.
    pub async fn round(
        &self,
        deps: &Deps<'_>,
        v: &ValidatedJob<'_>,
        obs: &Observed,
        base: Extras,
    ) -> Extras {
        let key = JobKey::of(v);
        let taken = self.jobs.lock().ok().and_then(|mut j| j.remove(&key));
        let mut state = match taken {
            Some(s) if s.belongs_to(v) => s,
            _ => match JobBalancer::new(v, deps.config.balancer_window) {
                // The first decision waits one interval for live data.
                Ok(balancer) => JobState::new(v, balancer, Instant::now()),
                Err(e) => {
                    warn!(error = %e, "balancer refused the job's settings");
                    deps.metrics.error("balancer");
                    return base;
                }
            },
        };
        let out = step::step(deps, v, obs, base, &mut state).await;
        state.extras = out.clone();
        if let Ok(mut j) = self.jobs.lock() {
            j.insert(key, state);
        }
        out
    }

    /// The job's last measured figures over `base` (whose plan wins), or
    /// `base` when the job is not being balanced.
    pub fn carry(&self, key: &JobKey, base: Extras) -> Extras {
        match self.jobs.lock() {
            Ok(jobs) => match jobs.get(key) {
                Some(s) => s.carry(base),
                None => base,
            },
            Err(_) => base,
        }
    }

    /// Drop a job's state (the job is gone).
    pub fn forget(&self, key: &JobKey) {
        self.jobs.lock().map(|mut j| j.remove(key)).ok();
    }

    /// Drop every job's state (leadership lost).
    pub fn clear(&self) {
        self.jobs.lock().map(|mut j| j.clear()).ok();
    }
}
