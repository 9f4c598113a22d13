//! Per-job balancing state and the key it is kept under.

use std::time::Instant;

use heterotrain_crds::bottleneck::PhaseTimes;
use heterotrain_crds::HeteroTrainingJob;
use kube::ResourceExt;

use super::clock::DecisionClock;
use crate::balance::JobBalancer;
use crate::status::Extras;
use crate::validate::ValidatedJob;

/// A job's key: `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JobKey(String);

impl JobKey {
    /// The key of job `name` in `namespace`.
    pub fn new(namespace: &str, name: &str) -> JobKey {
        JobKey(format!("{namespace}/{name}"))
    }

    /// `(namespace, name)`.
    pub fn parts(&self) -> Option<(&str, &str)> {
        self.0.split_once('/')
    }

    /// The key of a validated job.
    pub fn of(v: &ValidatedJob) -> JobKey {
        JobKey::new(&v.namespace, &v.name)
    }

    /// The key of any watched job (an empty namespace when it has none).
    pub fn of_job(job: &HeteroTrainingJob) -> JobKey {
        JobKey::new(&job.namespace().unwrap_or_default(), &job.name_any())
    }
}

/// Balancing state of one job's current gang.
pub struct JobState {
    uid: String,
    gang: u32,
    pub(super) balancer: JobBalancer,
    pub(super) last_scrape: Option<Instant>,
    pub(super) last_decision: DecisionClock,
    pub(super) last_samples: Vec<Option<(f64, Instant)>>,
    /// Each rank's phase seconds and steps at the last reading.
    pub(super) last_phases: Vec<Option<(PhaseTimes, f64)>>,
    /// Plan written and not yet reported by every rank: (generation, when).
    pub(super) pending: Option<(u64, Instant)>,
    /// Ranks whose profile is already in the profile cache.
    pub(super) cached: Vec<bool>,
    pub(super) extras: Extras,
}

impl JobState {
    /// Fresh state for the current gang of `v`, its first decision one
    /// interval after `now`.
    pub fn new(v: &ValidatedJob, balancer: JobBalancer, now: Instant) -> JobState {
        JobState {
            uid: v.uid().to_string(),
            gang: v.gang(),
            balancer,
            last_scrape: None,
            last_decision: DecisionClock::new(now),
            last_samples: vec![None; v.ranks()],
            last_phases: vec![None; v.ranks()],
            pending: None,
            cached: vec![false; v.ranks()],
            extras: Extras::default(),
        }
    }

    /// Whether this state is of `v`'s current gang (not of an earlier job
    /// with the same name, nor of a gang before a restart) at `v`'s world
    /// size (a changed `replicas` gets fresh per-rank state, never an
    /// index past the old one's).
    pub fn belongs_to(&self, v: &ValidatedJob) -> bool {
        self.uid == v.uid() && self.gang == v.gang() && self.last_samples.len() == v.ranks()
    }

    /// Names this gang in metric reads ([`super::collect`]).
    pub fn tag(&self) -> String {
        format!("{}/{}", self.uid, self.gang)
    }

    /// Last measured figures, over `base` (whose plan wins).
    pub fn carry(&self, base: Extras) -> Extras {
        Extras {
            plan: base.plan.or_else(|| self.extras.plan.clone()),
            ..self.extras.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{fixture, valid};

    #[test]
    fn state_of_another_world_size_is_not_reused() {
        let job = fixture("minimal.yaml");
        let v = valid(&job);
        let b = JobBalancer::new(&v, 8).expect("balancer");
        let st = JobState::new(&v, b, Instant::now());
        assert!(st.belongs_to(&v));
        // replicas raised on the same gang: per-rank state is sized anew.
        let mut grown = job.clone();
        grown.spec.workers[0].replicas += 1;
        let w = valid(&grown);
        assert_eq!(w.ranks(), v.ranks() + 1);
        assert!(!st.belongs_to(&w));
    }
}
