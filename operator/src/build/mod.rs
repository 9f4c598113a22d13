//! Build stage (pure): a validated job in, the desired child objects out —
//! no client, no clock. Unit-tested from YAML fixtures.

pub mod args;
pub mod hash;
pub mod plan;
pub mod pod;
pub mod service;

use std::collections::BTreeMap;

use heterotrain_crds::{BatchPlan, HeteroTrainingJob};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::{Resource, ResourceExt};

use crate::error::{Error, Result};
use crate::names::{self, labels};

/// What the build stage needs besides the job.
#[derive(Clone, Debug)]
pub struct BuildInputs {
    /// The operator's default trainer image.
    pub default_image: String,
    /// Gang generation (status.restarts); becomes the restart label and env.
    pub restart_count: u32,
    /// Plan generation 0 (equal split or a cached-profile split).
    pub initial_plan: BatchPlan,
}

/// Every object a job owns.
#[derive(Clone, Debug)]
pub struct Desired {
    pub service: Service,
    pub plan: ConfigMap,
    pub pods: Vec<Pod>,
}

/// The job's identity, checked once.
#[derive(Clone, Debug)]
pub struct JobRef {
    pub name: String,
    pub namespace: String,
    pub owner: OwnerReference,
}

impl JobRef {
    /// Name, namespace and controller owner reference of `job`.
    pub fn of(job: &HeteroTrainingJob) -> Result<JobRef> {
        let namespace = job
            .namespace()
            .ok_or(Error::MissingField("metadata.namespace"))?;
        let owner = job
            .controller_owner_ref(&())
            .ok_or(Error::MissingField("metadata.uid"))?;
        Ok(JobRef {
            name: job.name_any(),
            namespace,
            owner,
        })
    }
}

/// Labels every child of `job` carries.
pub fn common_labels(job: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::JOB.to_string(), job.to_string()),
        (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
    ])
}

/// Desired Service, plan ConfigMap (generation 0) and one Pod per rank.
pub fn desired(job: &HeteroTrainingJob, inputs: &BuildInputs) -> Result<Desired> {
    let r = JobRef::of(job)?;
    let pods = job
        .spec
        .rank_layout()
        .into_iter()
        .enumerate()
        .map(|(rank, (group, _))| pod::pod(job, &r, inputs, rank as u32, group))
        .collect::<Result<Vec<_>>>()?;
    Ok(Desired {
        service: service::service(job, &r),
        plan: plan::plan_configmap(&r, &inputs.initial_plan),
        pods,
    })
}

/// Name of the plan ConfigMap of `job`.
pub fn plan_name(job: &HeteroTrainingJob) -> String {
    names::plan_configmap(&job.name_any())
}

#[cfg(test)]
mod tests;
