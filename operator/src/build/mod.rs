//! Build stage (pure): a validated job in, the desired Service and rank
//! Pods out — no client, no clock. Unit-tested from YAML fixtures. (The
//! plan ConfigMap is rendered and written by [`crate::plan`].)

pub mod args;
pub mod custom;
pub mod hash;
pub mod pod;
pub mod service;

use k8s_openapi::api::core::v1::{Pod, Service};

use crate::error::Result;
use crate::validate::ValidatedJob;

/// What the build stage needs besides the job.
#[derive(Clone, Debug)]
pub struct BuildInputs {
    /// The operator's default trainer image.
    pub default_image: String,
    /// Gang generation (status.restarts); becomes the restart label and env.
    pub restart_count: u32,
}

/// The Service and the rank Pods a job's gang needs.
#[derive(Clone, Debug)]
pub struct Desired {
    pub service: Service,
    pub pods: Vec<Pod>,
}

/// Desired Service and one Pod per rank, in rank order.
pub fn desired(v: &ValidatedJob, inputs: &BuildInputs) -> Result<Desired> {
    let pods = v
        .layout
        .iter()
        .enumerate()
        .map(|(rank, &(group, _))| pod::pod(v, inputs, rank as u32, group))
        .collect::<Result<Vec<_>>>()?;
    Ok(Desired {
        service: service::service(v),
        pods,
    })
}

#[cfg(test)]
mod tests;
