//! A worker group's pod customisation (extra volumes and mounts, `/dev/shm`,
//! pull secrets, labels and annotations), and the volumes and mount paths
//! the operator keeps for itself, which validation protects.

use std::collections::BTreeMap;

use heterotrain_crds::{HeteroTrainingJobSpec, WorkerGroup};
use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Volume, VolumeMount};

use super::args::data_dir;
use crate::names;

/// Name of the memory-backed volume mounted at `/dev/shm` with `shmSize`.
pub const SHM_VOLUME: &str = "dshm";
/// Where the shared-memory volume is mounted.
pub const SHM_PATH: &str = "/dev/shm";
/// Volume names the operator may add to a rank pod.
pub const OPERATOR_VOLUMES: [&str; 4] = ["scratch", "checkpoints", "data", SHM_VOLUME];
/// Label and annotation key prefix that belongs to the operator.
pub const OPERATOR_KEY_PREFIX: &str = "heterotrain.dev/";

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
    if let (Some(_), Some(dir)) = (&spec.dataset.claim_name, data_dir(spec)) {
        m.push(("data", dir));
    }
    if g.shm_size.is_some() {
        m.push((SHM_VOLUME, SHM_PATH.to_string()));
    }
    m
}

/// The memory-backed `/dev/shm` volume of group `g`, when it sets `shmSize`.
pub fn shm_volume(g: &WorkerGroup) -> Option<Volume> {
    g.shm_size.as_ref().map(|size| Volume {
        name: SHM_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(size.clone()),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The operator's volumes and mounts followed by the group's own.
pub fn with_user_volumes(
    g: &WorkerGroup,
    mut volumes: Vec<Volume>,
    mut mounts: Vec<VolumeMount>,
) -> (Vec<Volume>, Vec<VolumeMount>) {
    if let Some(shm) = shm_volume(g) {
        volumes.push(shm);
        mounts.push(VolumeMount {
            name: SHM_VOLUME.into(),
            mount_path: SHM_PATH.into(),
            ..Default::default()
        });
    }
    volumes.extend(g.volumes.iter().cloned());
    mounts.extend(g.volume_mounts.iter().cloned());
    (volumes, mounts)
}

/// `user` with `own` laid over it: the operator's keys always win.
pub fn merged(
    user: &BTreeMap<String, String>,
    own: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut m = user.clone();
    m.extend(own);
    m
}

/// Whether a label key is one the operator sets on its pods.
pub fn is_operator_label(key: &str) -> bool {
    key.starts_with(OPERATOR_KEY_PREFIX) || key == names::labels::MANAGED_BY
}

/// Whether an annotation key is one the operator owns.
pub fn is_operator_annotation(key: &str) -> bool {
    key.starts_with(OPERATOR_KEY_PREFIX)
}
