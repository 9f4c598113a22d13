//! Validate stage: the spec's semantic rules ([`rules`]) and the job's
//! identity, checked once. What comes out, a [`ValidatedJob`], is what the
//! later stages (lifecycle, build, plan, rebalancing, status) read instead
//! of re-checking `metadata` and re-deriving sizes from `spec`.

mod admission;
mod checkpoint_rules;
mod model_rules;
mod network_rules;
mod pod_rules;
mod rules;

use heterotrain_balancer::Policy;
use heterotrain_crds::{HeteroTrainingJob, HeteroTrainingJobSpec, HeteroTrainingJobStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};

pub use admission::{image_has_prefix, origin, Admission, PrometheusPolicy};
pub use rules::{summary, validate, Problem, MAX_RANKS, RESERVED_ENV};

use crate::error::{Error, Result};

/// A job whose spec passed validation, with its identity and the sizes
/// every stage needs.
#[derive(Clone, Debug)]
pub struct ValidatedJob<'a> {
    /// The job as watched (spec and status).
    pub job: &'a HeteroTrainingJob,
    pub name: String,
    pub namespace: String,
    /// Controller owner reference for every child (carries the job's UID).
    pub owner: OwnerReference,
    /// Number of ranks over all groups.
    pub world_size: u32,
    /// `(group index, rank within the group)` for each global rank.
    pub layout: Vec<(usize, u32)>,
    /// The balancer policy of `loadBalancing.policy`.
    pub policy: Policy,
    /// Global batch B (`training.globalBatchSize`).
    pub global_batch: u32,
}

/// The outcome of validation.
#[derive(Debug)]
pub enum Checked<'a> {
    Valid(ValidatedJob<'a>),
    /// The spec breaks the rules; the job waits for a spec change.
    Invalid {
        namespace: String,
        problems: Vec<Problem>,
    },
}

/// Every problem of job `name`'s `spec`: the spec's rules and the
/// operator's [`Admission`] flags. The one check that both reconcile
/// ([`check`]) and the admission webhook run.
pub fn problems(
    name: &str,
    spec: &HeteroTrainingJobSpec,
    admission: Admission<'_>,
) -> Vec<Problem> {
    let mut problems = validate(name, spec, admission.prometheus.default_url)
        .err()
        .unwrap_or_default();
    problems.extend(admission.problems(spec));
    problems
}

/// Validate `job` against the rules and the operator's [`Admission`] flags.
/// A missing namespace or UID (which the API server always sets) is an
/// error, not a verdict on the spec.
pub fn check<'a>(job: &'a HeteroTrainingJob, admission: Admission<'_>) -> Result<Checked<'a>> {
    let namespace = job
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let name = job.name_any();
    let problems = problems(&name, &job.spec, admission);
    if !problems.is_empty() {
        return Ok(Checked::Invalid {
            namespace,
            problems,
        });
    }
    let owner = job
        .controller_owner_ref(&())
        .ok_or(Error::MissingField("metadata.uid"))?;
    let spec = &job.spec;
    Ok(Checked::Valid(ValidatedJob {
        job,
        name,
        namespace,
        owner,
        world_size: spec.world_size(),
        layout: spec.rank_layout(),
        policy: policy_of(spec.load_balancing.policy),
        global_batch: spec.training.global_batch_size,
    }))
}

impl<'a> ValidatedJob<'a> {
    /// The job's spec.
    pub fn spec(&self) -> &'a HeteroTrainingJobSpec {
        &self.job.spec
    }

    /// The job's status as last written (empty when never written).
    pub fn status(&self) -> HeteroTrainingJobStatus {
        self.job.status.clone().unwrap_or_default()
    }

    /// The current gang's generation (`status.restarts`).
    pub fn gang(&self) -> u32 {
        self.job.status.as_ref().map_or(0, |s| s.restarts)
    }

    /// The job's UID.
    pub fn uid(&self) -> &str {
        &self.owner.uid
    }

    /// World size as a length.
    pub fn ranks(&self) -> usize {
        self.world_size as usize
    }

    /// This run's directory in the checkpoint claim: the one recorded in
    /// status; for a job that has a status without one (created by an
    /// operator from before per-run directories) the job's name, where its
    /// checkpoints already are; else `<job>/<UID>`.
    pub fn checkpoint_dir(&self) -> String {
        let status = self.job.status.as_ref();
        match status.and_then(|s| s.checkpoint_dir.clone()) {
            Some(dir) => dir,
            None if status.is_some_and(|s| s.phase.is_some()) => self.name.clone(),
            None => format!("{}/{}", self.name, self.uid()),
        }
    }

    /// The claim directory `checkpoint.resumeFrom` names: a bare UID is
    /// an earlier run of this job's name.
    pub fn resume_from_dir(&self) -> Option<String> {
        let from = self
            .spec()
            .checkpoint
            .resume_from
            .as_deref()?
            .trim_matches('/');
        Some(if from.contains('/') {
            from.to_string()
        } else {
            format!("{}/{from}", self.name)
        })
    }
}

/// The balancer policy for a job's policy.
pub fn policy_of(p: heterotrain_crds::BalancePolicy) -> Policy {
    match p {
        heterotrain_crds::BalancePolicy::Static => Policy::Static,
        heterotrain_crds::BalancePolicy::Proportional => Policy::Proportional,
        heterotrain_crds::BalancePolicy::Dynamic => Policy::Dynamic,
        heterotrain_crds::BalancePolicy::Hybrid => Policy::Hybrid,
        heterotrain_crds::BalancePolicy::SeedFormula => Policy::SeedFormula,
    }
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;
