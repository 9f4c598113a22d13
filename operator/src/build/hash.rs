//! Hashes of the spec sections that cannot change while a gang runs,
//! stored on each pod so a later spec can be compared with the running one.

use heterotrain_crds::HeteroTrainingJobSpec;

/// Sections whose change would need a new gang.
pub const IMMUTABLE_SECTIONS: [&str; 5] = ["workers", "model", "dataset", "training", "backend"];

fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn section_json(spec: &HeteroTrainingJobSpec, section: &str) -> String {
    let v = match section {
        "workers" => serde_json::to_string(&spec.workers),
        "model" => serde_json::to_string(&spec.model),
        "dataset" => serde_json::to_string(&spec.dataset),
        "training" => serde_json::to_string(&spec.training),
        _ => serde_json::to_string(&spec.backend),
    };
    v.unwrap_or_default()
}

/// `workers=<hex>,model=<hex>,...` for the pod annotation.
pub fn spec_hash(spec: &HeteroTrainingJobSpec) -> String {
    IMMUTABLE_SECTIONS
        .iter()
        .map(|s| format!("{s}={:016x}", fnv1a(&section_json(spec, s))))
        .collect::<Vec<_>>()
        .join(",")
}

/// Sections that differ between a pod's annotation and `spec` (empty when
/// equal, or when the annotation cannot be read).
pub fn changed_sections(annotation: &str, spec: &HeteroTrainingJobSpec) -> Vec<&'static str> {
    let now = spec_hash(spec);
    let old: std::collections::BTreeMap<&str, &str> = annotation
        .split(',')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let new: std::collections::BTreeMap<&str, &str> =
        now.split(',').filter_map(|kv| kv.split_once('=')).collect();
    IMMUTABLE_SECTIONS
        .iter()
        .copied()
        .filter(|s| matches!((old.get(s), new.get(s)), (Some(a), Some(b)) if a != b))
        .collect()
}
