//! Rules for a worker group's pod customisation: extra volumes and mounts
//! that would collide with the operator's or break PodSecurity
//! `restricted`, labels and annotations that would override the operator's
//! keys, and a `/dev/shm` size that is not a quantity.

use std::collections::BTreeSet;

use heterotrain_crds::{GangScheduler, HeteroTrainingJobSpec, SchedulingPolicy, WorkerGroup};

use crate::rank_pod::{
    is_operator_annotation, is_operator_label, operator_mounts, OPERATOR_VOLUMES, SHM_PATH,
};

/// Volume kinds PodSecurity `restricted` allows, as the Volume's JSON keys.
pub const RESTRICTED_VOLUME_KINDS: [&str; 8] = [
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Bytes in a Kubernetes quantity ("2Gi", "512M", "1e9", "0.5Gi"); `None`
/// when the text is not a quantity or is negative.
pub fn quantity_bytes(q: &str) -> Option<f64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let num = num.strip_prefix('+').unwrap_or(num);
    if num.is_empty() || !num.starts_with(|c: char| c.is_ascii_digit()) || num.ends_with('.') {
        return None;
    }
    let value: f64 = num.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        e if e.starts_with(['e', 'E']) => {
            let exp = &e[1..];
            let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            10f64.powi(exp.parse().ok()?)
        }
        _ => return None,
    };
    Some(value * scale).filter(|v| v.is_finite())
}

/// A DNS-1123 subdomain (PriorityClass and RuntimeClass names).
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// A label value: at most 63 characters, alphanumeric at both ends, `-_.` inside.
fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    b.is_empty()
        || (b.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')))
}

fn normalise(path: &str) -> &str {
    match path.trim_end_matches('/') {
        "" => "/",
        p => p,
    }
}

/// Check the pod customisation of `spec.workers[i]`, reporting each problem
/// through `bad(field, message)`.
pub fn check_group(
    spec: &HeteroTrainingJobSpec,
    i: usize,
    g: &WorkerGroup,
    bad: &mut dyn FnMut(&str, String),
) {
    let user_volumes = volumes(i, g, bad);
    mounts(spec, i, g, &user_volumes, bad);
    metadata(i, g, bad);
}

/// The group's volumes: names (unique, none of the operator's) and kinds
/// that PodSecurity restricted allows. Returns the volumes' names.
fn volumes<'g>(
    i: usize,
    g: &'g WorkerGroup,
    bad: &mut dyn FnMut(&str, String),
) -> BTreeSet<&'g str> {
    let f = |x: &str| format!("spec.workers[{i}].{x}");
    let mut user_volumes = BTreeSet::new();
    for (j, v) in g.volumes.iter().enumerate() {
        let field = f(&format!("volumes[{j}]"));
        if OPERATOR_VOLUMES.contains(&v.name.as_str()) {
            bad(
                &format!("{field}.name"),
                format!(
                    "volume name {:?} is one the operator adds ({}); rename the volume and its mounts",
                    v.name,
                    OPERATOR_VOLUMES.join(", ")
                ),
            );
        } else if !user_volumes.insert(v.name.as_str()) {
            bad(
                &format!("{field}.name"),
                format!("volume name {:?} is used twice in this group", v.name),
            );
        }
        if v.host_path.is_some() {
            bad(
                &format!("{field}.hostPath"),
                format!(
                    "volume {:?} is a hostPath volume, which rank pods may not use (they run under PodSecurity restricted); use a persistentVolumeClaim, csi or ephemeral volume instead",
                    v.name
                ),
            );
            continue;
        }
        let kinds = serde_json::to_value(v).ok();
        let kinds = kinds.as_ref().and_then(|j| j.as_object());
        for kind in kinds.into_iter().flat_map(|o| o.keys()) {
            if kind != "name" && !RESTRICTED_VOLUME_KINDS.contains(&kind.as_str()) {
                bad(
                    &format!("{field}.{kind}"),
                    format!(
                        "volume {:?} is of kind {kind}, which PodSecurity restricted refuses; use one of {}",
                        v.name,
                        RESTRICTED_VOLUME_KINDS.join(", ")
                    ),
                );
            }
        }
    }
    user_volumes
}

/// The group's mounts: absolute, not where the operator mounts, not twice,
/// and of a volume the group has.
fn mounts(
    spec: &HeteroTrainingJobSpec,
    i: usize,
    g: &WorkerGroup,
    user_volumes: &BTreeSet<&str>,
    bad: &mut dyn FnMut(&str, String),
) {
    let f = |x: &str| format!("spec.workers[{i}].{x}");
    let own = operator_mounts(spec, g);
    let mut paths = BTreeSet::new();
    for (j, m) in g.volume_mounts.iter().enumerate() {
        let field = f(&format!("volumeMounts[{j}]"));
        let path = normalise(&m.mount_path);
        if !m.mount_path.starts_with('/') {
            bad(
                &format!("{field}.mountPath"),
                format!("mountPath {:?} must be an absolute path", m.mount_path),
            );
        } else if let Some((name, _)) = own.iter().find(|(_, p)| normalise(p) == path) {
            let hint = if path == SHM_PATH {
                "shmSize already mounts /dev/shm; drop this mount or shmSize"
            } else {
                "choose another mountPath"
            };
            bad(
                &format!("{field}.mountPath"),
                format!(
                    "mountPath {:?} is where the operator mounts its {name:?} volume; {hint}",
                    m.mount_path
                ),
            );
        } else if !paths.insert(path) {
            bad(
                &format!("{field}.mountPath"),
                format!(
                    "mountPath {:?} is mounted twice in this group",
                    m.mount_path
                ),
            );
        }
        if !user_volumes.contains(m.name.as_str()) {
            bad(
                &format!("{field}.name"),
                format!(
                    "mount names volume {:?}, which is not among spec.workers[{i}].volumes; add a volume of that name",
                    m.name
                ),
            );
        }
    }
}

/// Labels, annotations, /dev/shm size, class names and pull secrets.
fn metadata(i: usize, g: &WorkerGroup, bad: &mut dyn FnMut(&str, String)) {
    let f = |x: &str| format!("spec.workers[{i}].{x}");
    for (key, value) in &g.pod_labels {
        if is_operator_label(key) {
            bad(
                &f("podLabels"),
                format!("label {key:?} is set by the operator and cannot be overridden; use a key outside heterotrain.dev/"),
            );
        } else if !is_label_value(value) {
            bad(
                &f("podLabels"),
                format!("label {key:?} has value {value:?}, which is not a valid label value (at most 63 characters: letters, digits, '-', '_', '.', alphanumeric at both ends)"),
            );
        }
    }
    for key in g
        .pod_annotations
        .keys()
        .filter(|k| is_operator_annotation(k))
    {
        bad(
            &f("podAnnotations"),
            format!("annotation {key:?} is set by the operator and cannot be overridden; use a key outside heterotrain.dev/"),
        );
    }
    if let Some(q) = &g.shm_size {
        if !quantity_bytes(&q.0).is_some_and(|b| b >= 1.0) {
            bad(
                &f("shmSize"),
                format!(
                    "shmSize {:?} is not a positive Kubernetes quantity; write e.g. 1Gi or 512Mi",
                    q.0
                ),
            );
        }
    }
    for (field, name) in [
        ("priorityClassName", &g.priority_class_name),
        ("runtimeClassName", &g.runtime_class_name),
    ] {
        if let Some(n) = name.as_ref().filter(|n| !is_dns_subdomain(n)) {
            bad(
                &f(field),
                format!("{n:?} is not a valid object name (lower-case letters, digits, '-', '.')"),
            );
        }
    }
    for (j, s) in g.image_pull_secrets.iter().enumerate() {
        if !is_dns_subdomain(&s.name) {
            bad(
                &f(&format!("imagePullSecrets[{j}].name")),
                format!("{:?} is not a valid Secret name", s.name),
            );
        }
    }
}

/// Check `runPolicy.schedulingPolicy` of a job with `ranks` ranks.
pub fn check_scheduling(policy: &SchedulingPolicy, ranks: u64, bad: &mut dyn FnMut(&str, String)) {
    let f = |x: &str| format!("spec.runPolicy.schedulingPolicy.{x}");
    for (field, name) in [
        ("schedulerName", &policy.scheduler_name),
        ("queue", &policy.queue),
        ("priorityClass", &policy.priority_class),
    ] {
        if let Some(n) = name.as_ref().filter(|n| !is_dns_subdomain(n)) {
            bad(
                &f(field),
                format!("{n:?} is not a valid name (lower-case letters, digits, '-', '.')"),
            );
        }
    }
    if let Some(m) = policy.min_available {
        if m == 0 || u64::from(m) > ranks {
            bad(
                &f("minAvailable"),
                format!("minAvailable {m} must be between 1 and the job's {ranks} ranks"),
            );
        }
    }
    if policy.gang_scheduler == GangScheduler::Kueue && policy.queue.is_none() {
        bad(
            &f("queue"),
            "gangScheduler Kueue needs the LocalQueue that admits the gang: set queue".into(),
        );
    }
    if let Some(q) = policy.queue.as_ref().filter(|q| q.len() > 63) {
        bad(
            &f("queue"),
            format!("queue {q:?} is longer than 63 characters, too long for a label value"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_kubernetes_writes_them() {
        assert_eq!(quantity_bytes("2Gi"), Some(2.0 * 1024f64.powi(3)));
        assert_eq!(quantity_bytes("512Mi"), Some(512.0 * 1024f64.powi(2)));
        assert_eq!(quantity_bytes("1G"), Some(1e9));
        assert_eq!(quantity_bytes("1e9"), Some(1e9));
        assert_eq!(quantity_bytes("0.5Gi"), Some(0.5 * 1024f64.powi(3)));
        assert_eq!(quantity_bytes("100"), Some(100.0));
        for bad in ["", "Gi", "2GB", "-1Gi", "two", "1.Gi", "1e", "2 Gi"] {
            assert_eq!(quantity_bytes(bad), None, "{bad:?}");
        }
    }
}
