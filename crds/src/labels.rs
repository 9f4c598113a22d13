//! Label and annotation keys, all in one place: those the operator sets on
//! the objects a job owns (the chart's PodMonitor turns the job, group and
//! rank labels into target labels), the node labels the profile cache and
//! the node simulator read or write, and the well-known Kubernetes keys the
//! project sets.

/// Prefix of every label and annotation key that belongs to HeteroTrain;
/// a job's `podLabels`/`podAnnotations` may not use it.
pub const PREFIX: &str = "heterotrain.dev/";

/// Pod label: job name.
pub const JOB: &str = "heterotrain.dev/job";
/// Pod label: worker group name.
pub const GROUP: &str = "heterotrain.dev/group";
/// Pod label: global rank.
pub const RANK: &str = "heterotrain.dev/rank";
/// Pod label: the job's `metadata.uid`; the job's NetworkPolicies select
/// its pods by it (a recreated job of the same name is another job).
pub const JOB_UID: &str = "heterotrain.dev/job-uid";
/// Pod label: the gang generation (`status.restarts` when the gang was created).
pub const RESTART: &str = "heterotrain.dev/restart";
/// Pod annotation: hashes of the spec sections that cannot change while running.
pub const SPEC_HASH_ANNOTATION: &str = "heterotrain.dev/spec-hash";

/// `app.kubernetes.io/managed-by`, on every object the operator creates.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The operator's name in [`MANAGED_BY`].
pub const MANAGER: &str = "heterotrain-operator";
/// `app.kubernetes.io/part-of`.
pub const PART_OF: &str = "app.kubernetes.io/part-of";

/// Node label naming the accelerator model (a profile-cache key unless it
/// is the generic `cpu` or `gpu`).
pub const ACCELERATOR: &str = "heterotrain.dev/accelerator";
/// Node label an administrator sets to name a node's hardware type (the
/// first choice of the profile-cache key).
pub const NODE_TYPE: &str = "heterotrain.dev/node-type";
/// Well-known node label: the cloud provider's instance type.
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Node labels of Node Feature Discovery: the CPU's vendor, family and model id.
pub const NFD_CPU_MODEL: [&str; 3] = [
    "feature.node.kubernetes.io/cpu-model.vendor_id",
    "feature.node.kubernetes.io/cpu-model.family",
    "feature.node.kubernetes.io/cpu-model.id",
];
/// Node label the node simulator puts on the nodes it registers (`"true"`).
pub const SIMULATED: &str = "heterotrain.dev/simulated";
/// Node label: a simulated node's speed factor.
pub const SPEED: &str = "heterotrain.dev/speed";

/// Well-known namespace label (set by Kubernetes 1.21+): the namespace's
/// name; NetworkPolicies select namespaces by it.
pub const NAMESPACE_NAME: &str = "kubernetes.io/metadata.name";
/// Well-known node label: the node's name.
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// Well-known node label: the node's operating system.
pub const OS: &str = "kubernetes.io/os";
/// Node label of NVIDIA's GPU feature discovery: the GPU model.
pub const GPU_PRODUCT: &str = "nvidia.com/gpu.product";

/// Label selector matching every pod of `job`.
pub fn job_selector(job: &str) -> String {
    format!("{JOB}={job}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_selector_selects_the_job_label() {
        assert_eq!(job_selector("j"), "heterotrain.dev/job=j");
    }

    #[test]
    fn heterotrain_keys_are_under_the_prefix() {
        for key in [
            JOB,
            GROUP,
            RANK,
            RESTART,
            SPEC_HASH_ANNOTATION,
            ACCELERATOR,
            SIMULATED,
            SPEED,
        ] {
            assert!(key.starts_with(PREFIX), "{key}");
        }
    }
}
