//! Names, labels and annotations of the objects a job owns, in one place.

use std::collections::BTreeMap;

pub use heterotrain_crds::metrics::labels;

/// Field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "heterotrain-operator";
/// Pod label: the gang generation (status.restarts when the gang was created).
pub const RESTART_LABEL: &str = "heterotrain.dev/restart";
/// Pod annotation: hashes of the spec sections that cannot change while running.
pub const SPEC_HASH_ANNOTATION: &str = "heterotrain.dev/spec-hash";
/// Name of the trainer container.
pub const CONTAINER: &str = "trainer";
/// Default ServiceAccount of rank pods.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "heterotrain-trainer";
/// Writable scratch directory (the root filesystem is read-only).
pub const SCRATCH_DIR: &str = "/scratch";
/// Mount point of the dataset claim when `dataset.path` is not set.
pub const DEFAULT_DATA_DIR: &str = "/data";

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

/// Label selector matching every pod of `job`.
pub fn job_selector(job: &str) -> String {
    format!("{}={job}", labels::JOB)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_design() {
        assert_eq!(pod_name("j", 3), "j-3");
        assert_eq!(plan_configmap("j"), "j-plan");
        assert_eq!(master_addr("j", "ns"), "j-0.j.ns.svc");
        assert_eq!(job_selector("j"), "heterotrain.dev/job=j");
    }
}
