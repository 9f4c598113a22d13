//! Build stage (pure): a validated job in, the desired Service, trainer
//! Role, NetworkPolicies and rank Pods out — no client, no clock. Unit-tested from YAML fixtures. (The
//! plan ConfigMap is rendered and written by [`crate::plan`].)

pub mod access;
pub mod args;
pub mod custom;
pub mod hash;
pub mod network;
pub mod pod;
pub mod service;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};

pub use access::trainer_access;

use crate::error::Result;
use crate::gang::{self, Wiring};
use crate::validate::ValidatedJob;
use kube::api::{ApiResource, DynamicObject};

/// What the build stage needs besides the job.
#[derive(Clone, Debug)]
pub struct BuildInputs {
    /// The operator's default trainer image.
    pub default_image: String,
    /// Gang generation (status.restarts); becomes the restart label and env.
    pub restart_count: u32,
    /// Namespaces whose pods may read the ranks' `/metrics` (the
    /// operator's, Prometheus's).
    pub metrics_from: Vec<String>,
    /// The gang scheduler the pods are wired to (chosen by
    /// [`crate::gang::choose`] from what the cluster serves); `None`: no
    /// PodGroup and no group labels.
    pub gang: Option<Wiring>,
}

/// The Service, the trainers' API access, the NetworkPolicies and the rank
/// Pods a job's gang needs.
#[derive(Clone, Debug)]
pub struct Desired {
    pub service: Service,
    /// The Role and RoleBinding that let rank 0 read its plan.
    pub access: (Role, RoleBinding),
    /// The job's NetworkPolicies; none when `isolation.networkPolicy` is off.
    pub policies: Vec<NetworkPolicy>,
    pub pods: Vec<Pod>,
    /// The job's PodGroup (Volcano, scheduler-plugins), when wired to one.
    pub pod_group: Option<(ApiResource, DynamicObject)>,
}

/// Desired Service and one Pod per rank, in rank order.
pub fn desired(v: &ValidatedJob, inputs: &BuildInputs) -> Result<Desired> {
    let mut pods = v
        .layout
        .iter()
        .enumerate()
        .map(|(rank, &(group, _))| pod::pod(v, inputs, rank as u32, group))
        .collect::<Result<Vec<_>>>()?;
    let scheduling = v.spec().run_policy.scheduling_policy.as_ref();
    if let Some(policy) = scheduling {
        for p in &mut pods {
            gang::wire_pod(v, policy, inputs.gang, p);
        }
    }
    let pod_group = scheduling
        .zip(inputs.gang)
        .and_then(|(policy, wiring)| gang::pod_group(v, policy, wiring));
    let policies = if v.spec().isolation.network_policy {
        network::policies(v, &inputs.metrics_from).into()
    } else {
        Vec::new()
    };
    Ok(Desired {
        service: service::service(v),
        access: access::for_job(v),
        policies,
        pods,
        pod_group,
    })
}

#[cfg(test)]
mod tests;
