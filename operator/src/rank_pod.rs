//! What validation checks and the build stage produces about a rank pod,
//! in one place both read: the volumes, mount paths and label/annotation
//! keys (under `heterotrain_crds::labels::PREFIX`) the operator reserves for itself, where the dataset is mounted, and
//! how many threads a group's CPU limit gives.

use heterotrain_crds::resources::{cpu_limit, whole_cpus};
use heterotrain_crds::{labels, HeteroTrainingJobSpec, WorkerGroup};

use crate::names;

/// Name of the memory-backed volume mounted at `/dev/shm` with `shmSize`.
pub const SHM_VOLUME: &str = "dshm";
/// Where the shared-memory volume is mounted.
pub const SHM_PATH: &str = "/dev/shm";
/// Volume names the operator may add to a rank pod.
pub const OPERATOR_VOLUMES: [&str; 4] = ["scratch", "checkpoints", "data", SHM_VOLUME];

/// `(volume name, mount path)` of each mount the operator adds to a pod of
/// group `g`, in the order it adds them.
pub fn operator_mounts(
    spec: &HeteroTrainingJobSpec,
    g: &WorkerGroup,
) -> Vec<(&'static str, String)> {
    let mut m = vec![
        ("scratch", names::SCRATCH_DIR.to_string()),
        ("checkpoints", spec.checkpoint.path.clone()),
    ];
    if spec.checkpoint.claim_name.is_some() && spec.checkpoint.resume_from.is_some() {
        // Rank 0's only.
        m.push(("checkpoints", names::RESUME_FROM_DIR.to_string()));
    }
    if let (Some(_), Some(dir)) = (data_claim(spec), data_dir(spec)) {
        m.push(("data", dir));
    }
    if g.shm_size.is_some() {
        m.push((SHM_VOLUME, SHM_PATH.to_string()));
    }
    m
}

/// Directory the dataset is read from inside the pod, if any.
pub fn data_dir(spec: &HeteroTrainingJobSpec) -> Option<String> {
    let dataset = spec.dataset.as_ref()?;
    dataset.path.clone().or_else(|| {
        dataset
            .claim_name
            .as_ref()
            .map(|_| names::DEFAULT_DATA_DIR.to_string())
    })
}

/// The claim holding the dataset, mounted read-only at [`data_dir`].
pub fn data_claim(spec: &HeteroTrainingJobSpec) -> Option<&String> {
    spec.dataset.as_ref()?.claim_name.as_ref()
}

/// Whether a label key is one the operator sets on its pods.
pub fn is_operator_label(key: &str) -> bool {
    key.starts_with(labels::PREFIX) || key == labels::MANAGED_BY
}

/// Whether an annotation key is one the operator owns.
pub fn is_operator_annotation(key: &str) -> bool {
    key.starts_with(labels::PREFIX)
}

/// Threads for a group: `threads`, else the CPU limit rounded up, else 1.
pub fn group_threads(group: &WorkerGroup) -> u32 {
    group
        .threads
        .or_else(|| cpu_limit(group.resources.as_ref()).and_then(|q| whole_cpus(&q.0)))
        .unwrap_or(1)
        .max(1)
}
