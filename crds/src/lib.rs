//! HeteroTrain API types shared by every part: the `HeteroTrainingJob`
//! custom resource, the batch-plan wire format, the hardware profile, the
//! trainer's command line, metric names and label/annotation keys.

pub mod bottleneck;
pub mod job;
pub mod labels;
pub mod metrics;
pub mod plan;
pub mod profile;
pub mod reference;
pub mod resources;
pub mod run_policy;
pub mod trainer;

pub use job::*;
pub use plan::{BatchPlan, PlanError, PLAN_KEY};
pub use profile::{DeviceInfo, DeviceKind, HardwareProfile, ProfileError, ProfilePoint};
pub use reference::api_reference_markdown;
pub use run_policy::{finished_step, FINISHED_AT_STEP, STOPPED_BY_SIGNAL};
pub use trainer::TrainerArgs;

/// The CustomResourceDefinition as YAML, exactly as `make crds` writes it to
/// `crds/heterotrainingjob.yaml`.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    use kube::CustomResourceExt;
    let body = serde_yaml::to_string(&HeteroTrainingJob::crd())?;
    Ok(format!(
        "# Generated from crds/src/job.rs by `make crds`; do not edit by hand.\n{body}"
    ))
}

#[cfg(test)]
mod plan_fuzz;
