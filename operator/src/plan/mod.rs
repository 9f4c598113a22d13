//! One home for a job's batch plan: how it is born (an equal split, or a
//! split of cached profiles), read back and checked against the job,
//! advanced to the next generation, and written to the ConfigMap
//! `<job>-plan` ([`configmap`]). The invariants are the plan contract of
//! docs/design.md: one entry per rank, rank 0's ≥ 1 (others ≥ 0: 0 leaves
//! a rank out), Σ = B, generations grow.

mod configmap;

use heterotrain_balancer::Policy;
use heterotrain_crds::{BatchPlan, PlanError, PLAN_KEY};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;

pub use configmap::{configmap, write};

use crate::balance::{split_from_profiles, NewPlan};
use crate::config::OperatorConfig;
use crate::profile_cache;
use crate::scrape::RankProfile;
use crate::validate::ValidatedJob;

/// What the plan ConfigMap holds, as read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stored {
    /// The ConfigMap exists.
    pub exists: bool,
    /// Its plan, when it parses (validity for the job is checked by [`current`]).
    pub plan: Option<BatchPlan>,
    /// Generation found in the ConfigMap even when the plan is invalid.
    pub generation: Option<u64>,
}

/// Read the plan out of the job's plan ConfigMap (`None`: not there).
pub fn read(cm: Option<&ConfigMap>) -> Stored {
    let text = cm
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get(PLAN_KEY).cloned());
    let plan = text
        .as_deref()
        .and_then(|t| serde_json::from_str::<BatchPlan>(t).ok());
    let generation = plan.as_ref().map(|p| p.generation).or_else(|| {
        text.as_deref()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
            .and_then(|v| v.get("generation").and_then(serde_json::Value::as_u64))
    });
    Stored {
        exists: cm.is_some(),
        plan,
        generation,
    }
}

/// Check `plan` against the job: one entry per rank, rank 0's ≥ 1, Σ = B.
pub fn check(v: &ValidatedJob, plan: &BatchPlan) -> Result<(), PlanError> {
    plan.validate_for(v.ranks(), v.global_batch)
}

/// The stored plan, when it is valid for the job.
pub fn current(v: &ValidatedJob, stored: &Stored) -> Option<BatchPlan> {
    stored.plan.clone().filter(|p| check(v, p).is_ok())
}

/// The plan the job's status records (its generation and each group's
/// batches), when it is valid for the job: what the trainers run when the
/// plan ConfigMap was deleted or overwritten with something unusable.
pub fn from_status(v: &ValidatedJob) -> Option<BatchPlan> {
    let status = v.job.status.as_ref()?;
    let workers = &v.spec().workers;
    let batch_sizes = v
        .layout
        .iter()
        .map(|&(g, k)| {
            let name = &workers.get(g)?.name;
            let group = status.groups.iter().find(|s| &s.name == name)?;
            group.batch_sizes.get(k as usize).copied()
        })
        .collect::<Option<Vec<u32>>>()?;
    let plan = BatchPlan {
        generation: status.plan_generation,
        global_batch_size: v.global_batch,
        batch_sizes,
        policy: v.policy.as_str().to_string(),
        reason: "restored from the job's status: the plan ConfigMap was missing or unusable".into(),
        predicted_step_seconds: None,
        predicted_communication_seconds: None,
    };
    check(v, &plan).ok().map(|_| plan)
}

/// The equal split of B over the job's ranks, at `generation`.
pub fn equal(v: &ValidatedJob, generation: u64) -> BatchPlan {
    BatchPlan::equal(generation, v.global_batch, v.ranks())
}

/// The plan in force: `current` when there is one, else the equal split at
/// generation 0 (what a gang trains on before any plan reaches it).
pub fn current_or_equal(v: &ValidatedJob, current: Option<&BatchPlan>) -> BatchPlan {
    current.cloned().unwrap_or_else(|| equal(v, 0))
}

/// The plan a new gang starts from: the `current` one if any; else the next
/// generation after an unusable stored one (0 when none), as a split of
/// cached `profiles` when every rank has one and the policy is not static,
/// else equal.
pub fn born(
    v: &ValidatedJob,
    current: Option<&BatchPlan>,
    stored_generation: Option<u64>,
    profiles: Option<&[Option<RankProfile>]>,
) -> BatchPlan {
    if let Some(p) = current {
        return p.clone();
    }
    let status_generation = v
        .job
        .status
        .as_ref()
        .map(|s| s.plan_generation)
        .filter(|&g| g > 0);
    let last = stored_generation.max(status_generation);
    let mut plan = equal(v, last.map_or(0, |g| g.saturating_add(1)));
    if v.policy == Policy::Static {
        return plan;
    }
    if let Some((batches, reason)) = profiles.and_then(|p| split_from_profiles(v.spec(), p)) {
        plan.batch_sizes = batches;
        plan.policy = "proportional".into();
        plan.reason = format!("cached profiles: {reason}");
    }
    plan
}

/// [`born`], with the profiles looked up in the operator's profile cache
/// when it is enabled (a cache that cannot be read counts as empty).
pub async fn initial(
    client: &Client,
    config: &OperatorConfig,
    v: &ValidatedJob<'_>,
    stored: &Stored,
) -> BatchPlan {
    let current = current(v, stored);
    let mut profiles = None;
    if current.is_none() && config.profile_cache && v.policy != Policy::Static {
        if let Ok(cache) = profile_cache::load(client, &config.operator_namespace).await {
            profiles = profile_cache::lookup(&v.namespace, v.spec(), &cache);
        }
    }
    born(v, current.as_ref(), stored.generation, profiles.as_deref())
}

/// The balancer's `new` split as the generation after `current`, checked.
pub fn advance(
    v: &ValidatedJob,
    current: &BatchPlan,
    new: NewPlan,
) -> Result<BatchPlan, PlanError> {
    let plan = BatchPlan {
        generation: current.generation.saturating_add(1),
        global_batch_size: current.global_batch_size,
        batch_sizes: new.batch_sizes,
        policy: new.policy.to_string(),
        reason: new.reason,
        predicted_step_seconds: new
            .predicted_step_seconds
            .is_finite()
            .then_some(new.predicted_step_seconds),
        predicted_communication_seconds: (new.communication_seconds > 0.0
            && new.communication_seconds.is_finite())
        .then_some(new.communication_seconds),
    };
    check(v, &plan)?;
    Ok(plan)
}

#[cfg(test)]
mod tests;
