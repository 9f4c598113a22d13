//! A worker group's pod customisation (extra volumes and mounts, `/dev/shm`,
//! pull secrets, labels and annotations), and the volumes and mount paths
//! the operator keeps for itself, which validation protects.

use std::collections::BTreeMap;

use heterotrain_crds::WorkerGroup;
use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Volume, VolumeMount};

pub use crate::rank_pod::{
    is_operator_annotation, is_operator_label, operator_mounts, OPERATOR_VOLUMES, SHM_PATH,
    SHM_VOLUME,
};

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
