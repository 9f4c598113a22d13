//! Names of the objects a job owns and the operator's own fixed names, in
//! one place. Label and annotation keys are `heterotrain_crds::labels`.

use std::collections::BTreeMap;

use heterotrain_crds::labels;

/// Field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "heterotrain-operator";
/// Name of the trainer container.
pub const CONTAINER: &str = "trainer";
/// Default ServiceAccount of rank pods.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "heterotrain-trainer";
/// Writable scratch directory (the root filesystem is read-only).
pub const SCRATCH_DIR: &str = "/scratch";
/// Mount point of the dataset claim when `dataset.path` is not set.
pub const DEFAULT_DATA_DIR: &str = "/data";
/// Where rank 0 finds the earlier run `checkpoint.resumeFrom` names (read only).
pub const RESUME_FROM_DIR: &str = "/resume-from";

/// Pod of `rank`: `<job>-<rank>`.
pub fn pod_name(job: &str, rank: u32) -> String {
    format!("{job}-{rank}")
}

/// Headless Service: `<job>`.
pub fn service_name(job: &str) -> String {
    job.to_string()
}

/// Plan ConfigMap: `<job>-plan`.
pub fn plan_configmap(job: &str) -> String {
    format!("{job}-plan")
}

/// Rank 0's stable DNS name: `<job>-0.<job>.<namespace>.svc`.
pub fn master_addr(job: &str, namespace: &str) -> String {
    format!("{job}-0.{job}.{namespace}.svc")
}

/// Labels every child of `job` carries.
pub fn common_labels(job: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (labels::JOB.to_string(), job.to_string()),
        (labels::MANAGED_BY.to_string(), labels::MANAGER.to_string()),
    ])
}

/// The trainers' Role and RoleBinding: `<job>-trainer`.
pub fn trainer_role(job: &str) -> String {
    format!("{job}-trainer")
}

/// The NetworkPolicy isolating the job's ranks: `<job>`.
pub fn network_policy(job: &str) -> String {
    job.to_string()
}

/// The NetworkPolicy letting rank 0 reach the API server: `<job>-api`.
pub fn api_network_policy(job: &str) -> String {
    format!("{job}-api")
}

/// The ServiceAccount the job's rank pods run as.
pub fn service_account(spec: &heterotrain_crds::HeteroTrainingJobSpec) -> String {
    spec.service_account_name
        .clone()
        .unwrap_or_else(|| DEFAULT_SERVICE_ACCOUNT.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_design() {
        assert_eq!(pod_name("j", 3), "j-3");
        assert_eq!(plan_configmap("j"), "j-plan");
        assert_eq!(master_addr("j", "ns"), "j-0.j.ns.svc");
    }
}
