//! One rank's Pod `<job>-<rank>`: identity, placement, env, the trainer
//! command, a restricted security context and the volumes it writes to.

use std::collections::BTreeMap;

use heterotrain_crds::labels;
use heterotrain_crds::trainer::env as envs;
use heterotrain_crds::{HeteroTrainingJobSpec, WorkerGroup};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec,
    SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::args::{data_dir, trainer_args, TRAINER_BINARY};
use super::custom::{merged, with_user_volumes};
use super::hash::spec_hash;
use super::BuildInputs;
use crate::error::{Error, Result};
use crate::names::{self, common_labels};
use crate::validate::ValidatedJob;

/// UID/GID the trainer runs as (non-root).
pub const RUN_AS: i64 = 65532;

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        value_from: None,
    }
}

fn env_field(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: Some("v1".into()),
                field_path: path.into(),
            }),
            ..Default::default()
        }),
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

fn claim(name: &str, claim: &str, read_only: bool) -> Volume {
    Volume {
        name: name.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.into(),
            read_only: read_only.then_some(true),
        }),
        ..Default::default()
    }
}

/// The training fields a job's own script reads from the environment (the
/// `heterotrain` Python library does), so the length of a run, its seed and
/// its checkpoints are written once, in the spec.
fn script_env(spec: &HeteroTrainingJobSpec, g: &WorkerGroup) -> Vec<EnvVar> {
    let t = &spec.training;
    let mut vars = vec![env(envs::SEED, t.seed.to_string())];
    if let Some(n) = t.max_steps {
        vars.push(env(envs::MAX_STEPS, n.to_string()));
    }
    if let Some(n) = t.epochs {
        vars.push(env(envs::EPOCHS, n.to_string()));
    }
    vars.push(env(envs::CHECKPOINT_DIR, spec.checkpoint.path.clone()));
    vars.push(env(
        envs::CHECKPOINT_EVERY,
        spec.checkpoint.every_steps.to_string(),
    ));
    if let Some(n) = g.threads {
        vars.push(env("OMP_NUM_THREADS", n.to_string()));
    }
    vars
}

/// Pod of global `rank`, which belongs to `spec.workers[group]`.
pub fn pod(v: &ValidatedJob, inputs: &BuildInputs, rank: u32, group: usize) -> Result<Pod> {
    let spec = v.spec();
    let g = spec
        .workers
        .get(group)
        .ok_or(Error::Invalid(format!("rank {rank} has no worker group")))?;
    let name = names::pod_name(&v.name, rank);
    let mut pod_labels = common_labels(&v.name);
    pod_labels.insert(labels::GROUP.into(), g.name.clone());
    pod_labels.insert(labels::RANK.into(), rank.to_string());
    pod_labels.insert(labels::RESTART.into(), inputs.restart_count.to_string());
    pod_labels.insert(labels::JOB_UID.into(), v.owner.uid.clone());
    let (volumes, mounts) = storage(v, g, rank);
    let container = container(v, inputs, g, rank, mounts)?;
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(v.namespace.clone()),
            labels: Some(merged(&g.pod_labels, pod_labels)),
            annotations: Some(merged(
                &g.pod_annotations,
                BTreeMap::from([(labels::SPEC_HASH_ANNOTATION.to_string(), spec_hash(spec))]),
            )),
            owner_references: Some(vec![v.owner.clone()]),
            ..Default::default()
        },
        spec: Some(pod_spec(v, g, rank, name, container, volumes)),
        status: None,
    })
}

/// The environment of `rank`'s trainer: its place in the gang, where to
/// meet, the plan, and the group's own variables last.
fn rank_env(v: &ValidatedJob, inputs: &BuildInputs, g: &WorkerGroup, rank: u32) -> Vec<EnvVar> {
    let spec = v.spec();
    let mut env_vars = vec![
        env(envs::RANK, rank.to_string()),
        env(envs::WORLD_SIZE, v.world_size.to_string()),
        env(envs::LOCAL_RANK, "0"),
        env(envs::MASTER_ADDR, names::master_addr(&v.name, &v.namespace)),
        env(envs::MASTER_PORT, spec.master_port.to_string()),
        env_field(envs::POD_IP, "status.podIP"),
        // Gloo binds the pod IP, not whatever the host name resolves to.
        env_field(envs::BIND_ADDR, "status.podIP"),
        env_field(envs::NAMESPACE, "metadata.namespace"),
        env(envs::PLAN_CONFIGMAP, names::plan_configmap(&v.name)),
        env(envs::RESTART_COUNT, inputs.restart_count.to_string()),
        env(envs::JOB_UID, v.uid()),
        env(
            envs::BATCH_SIZE,
            spec.training.global_batch_size.to_string(),
        ),
        env(envs::METRICS_PORT, spec.metrics_port.to_string()),
        env("HOME", names::SCRATCH_DIR),
        env("TMPDIR", names::SCRATCH_DIR),
    ];
    if spec.custom_command(g).is_some() {
        env_vars.extend(script_env(spec, g));
    }
    env_vars.extend(g.env.iter().cloned());

    env_vars
}

/// The volumes and mounts of `rank`: scratch, checkpoints, data and the
/// group's own.
fn storage(v: &ValidatedJob, g: &WorkerGroup, rank: u32) -> (Vec<Volume>, Vec<VolumeMount>) {
    let spec = v.spec();
    let mut volumes = vec![empty_dir("scratch")];
    let mut mounts = vec![mount("scratch", names::SCRATCH_DIR, false)];
    // Only rank 0 reads and writes checkpoints (resumed state reaches the
    // other ranks over c10d), so only rank 0 mounts the claim: a
    // ReadWriteOnce claim then works for a gang spread over nodes.
    // Each run has its own directory in the claim (`subPath: <job>/<UID>`),
    // so jobs sharing a claim, and a job created again under the same
    // name, never see or overwrite each other's checkpoints. An earlier
    // run to continue (`resumeFrom`) is mounted beside it, read only.
    let shared_claim = spec.checkpoint.claim_name.is_some() && rank == 0;
    volumes.push(match (&spec.checkpoint.claim_name, rank) {
        (Some(c), 0) => claim("checkpoints", c, false),
        _ => empty_dir("checkpoints"),
    });
    let mut ckpt = mount("checkpoints", &spec.checkpoint.path, false);
    if shared_claim {
        ckpt.sub_path = Some(v.checkpoint_dir());
    }
    mounts.push(ckpt);
    if let (true, Some(from)) = (shared_claim, v.resume_from_dir()) {
        let mut earlier = mount("checkpoints", names::RESUME_FROM_DIR, true);
        earlier.sub_path = Some(from);
        mounts.push(earlier);
    }
    if let (Some(c), Some(dir)) = (crate::rank_pod::data_claim(spec), data_dir(spec)) {
        volumes.push(claim("data", c, true));
        mounts.push(mount("data", &dir, true));
    }
    let (volumes, mounts) = with_user_volumes(g, volumes, mounts);

    (volumes, mounts)
}

/// The trainer container of `rank`: the built-in trainer or the group's
/// command, locked down (no privilege, read-only root, no capabilities).
fn container(
    v: &ValidatedJob,
    inputs: &BuildInputs,
    g: &WorkerGroup,
    rank: u32,
    mounts: Vec<VolumeMount>,
) -> Result<Container> {
    let spec = v.spec();
    let env_vars = rank_env(v, inputs, g, rank);
    let port = |n: &str, p: u16| ContainerPort {
        name: Some(n.into()),
        container_port: i32::from(p),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    let (command, args) = match spec.custom_command(g) {
        Some((command, args)) => (command.to_vec(), args.to_vec()),
        None => (vec![TRAINER_BINARY.into()], trainer_args(spec, g)?),
    };
    Ok(Container {
        name: names::CONTAINER.into(),
        image: Some(
            g.image
                .clone()
                .or_else(|| spec.image.clone())
                .unwrap_or_else(|| inputs.default_image.clone()),
        ),
        command: Some(command),
        args: (!args.is_empty()).then_some(args),
        env: Some(env_vars),
        env_from: (!g.env_from.is_empty()).then(|| g.env_from.clone()),
        ports: Some(vec![
            port("metrics", spec.metrics_port),
            port("rendezvous", spec.master_port),
        ]),
        resources: g.resources.clone(),
        volume_mounts: Some(mounts),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                add: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// The pod spec around `container`: hostname in the job's Service,
/// scheduling fields of the group, the restricted security context.
fn pod_spec(
    v: &ValidatedJob,
    g: &WorkerGroup,
    rank: u32,
    name: String,
    container: Container,
    volumes: Vec<Volume>,
) -> PodSpec {
    let spec = v.spec();
    PodSpec {
        hostname: Some(name),
        subdomain: Some(names::service_name(&v.name)),
        restart_policy: Some("Never".into()),
        service_account_name: Some(names::service_account(spec)),
        // Only rank 0 reads the plan ConfigMap: the others get no token.
        automount_service_account_token: Some(rank == 0),
        node_selector: (!g.node_selector.is_empty()).then(|| g.node_selector.clone()),
        affinity: g.affinity.clone(),
        tolerations: (!g.tolerations.is_empty()).then(|| g.tolerations.clone()),
        image_pull_secrets: (!g.image_pull_secrets.is_empty())
            .then(|| g.image_pull_secrets.clone()),
        priority_class_name: g.priority_class_name.clone(),
        runtime_class_name: g.runtime_class_name.clone(),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            fs_group: Some(RUN_AS),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..Default::default()
        }),
        termination_grace_period_seconds: Some(30),
        containers: vec![container],
        volumes: Some(volumes),
        ..Default::default()
    }
}
