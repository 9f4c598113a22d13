//! The API reference (`docs/api-reference.md`), generated from the CRD's
//! OpenAPI schema, so the reference says what the API server enforces:
//! every field of `spec` and `status` with its type, default, allowed values,
//! whether it is required, and its description (the Rust doc comment).
//!
//! Fields whose type is a Kubernetes core type (a worker group's
//! `resources`, `volumes`, `affinity`, …) are listed with the type's name
//! and not expanded; `kubectl explain htj.spec.workers.affinity` shows them.

use serde_json::Value;
use std::fmt::Write as _;

/// Kubernetes core types embedded in the spec, by field name: the reference
/// names them instead of repeating their schema.
const KUBERNETES_TYPES: &[(&str, &str)] = &[
    ("affinity", "core/v1 Affinity"),
    ("env", "core/v1 EnvVar"),
    ("envFrom", "core/v1 EnvFromSource"),
    ("imagePullSecrets", "core/v1 LocalObjectReference"),
    ("resources", "core/v1 ResourceRequirements"),
    ("tolerations", "core/v1 Toleration"),
    ("volumeMounts", "core/v1 VolumeMount"),
    ("volumes", "core/v1 Volume"),
];

/// One row of the reference.
struct Row {
    path: String,
    kind: String,
    required: bool,
    default: Option<String>,
    values: Option<String>,
    description: String,
}

/// The reference as Markdown, exactly as `make crds` writes it to
/// `docs/api-reference.md`.
pub fn api_reference_markdown() -> Result<String, serde_json::Error> {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(crate::HeteroTrainingJob::crd())?;
    let version = &crd["spec"]["versions"][0];
    let schema = &version["schema"]["openAPIV3Schema"];
    let mut out = String::new();
    let group = crd["spec"]["group"].as_str().unwrap_or_default();
    let name = version["name"].as_str().unwrap_or_default();
    let kind = crd["spec"]["names"]["kind"].as_str().unwrap_or_default();
    let _ = write!(
        out,
        "# API reference: `{kind}` ({group}/{name})\n\n\
         Generated from the CRD schema (`crds/src/job.rs`) by `make crds`; a test\n\
         fails when this file is stale. `kubectl explain htj.spec --recursive` shows\n\
         the same on a cluster. Short name: `htj`. Kubernetes types inside a worker\n\
         group (`resources`, `volumes`, `affinity`, …) are named, not expanded.\n\n\
         Rules that span fields (the global batch against the ranks, NCCL with a\n\
         CPU group, unique group names, …) are checked by the operator: a job that\n\
         breaks one gets the condition `Failed` with reason `Invalid` and a\n\
         message naming the field ([user guide](user-guide.md#writing-a-job)).\n"
    );
    for section in ["spec", "status"] {
        let mut rows = Vec::new();
        let node = &schema["properties"][section];
        collect(node, section, &mut rows);
        let _ = write!(out, "\n## `{section}`\n\n");
        if let Some(d) = node["description"].as_str() {
            let _ = writeln!(out, "{}\n", one_line(d));
        }
        out.push_str("| field | type | required | default | values | description |\n");
        out.push_str("| --- | --- | --- | --- | --- | --- |\n");
        for r in rows {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} | {} | {} |",
                r.path,
                r.kind,
                if r.required { "yes" } else { "" },
                r.default.map(|d| format!("`{d}`")).unwrap_or_default(),
                r.values.unwrap_or_default(),
                cell(&r.description),
            );
        }
    }
    Ok(out)
}

/// Walks `node`'s properties depth first, in the schema's (alphabetical) order.
fn collect(node: &Value, path: &str, rows: &mut Vec<Row>) {
    let Some(props) = node["properties"].as_object() else {
        return;
    };
    let required: Vec<&str> = node["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, child) in props {
        let child_path = format!("{path}.{name}");
        let core = KUBERNETES_TYPES
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| *t);
        let is_array = child["type"] == "array";
        let kind = match core {
            Some(t) if is_array => format!("[]{t}"),
            Some(t) => t.to_string(),
            None => type_name(child),
        };
        rows.push(Row {
            path: child_path.clone(),
            kind,
            required: required.contains(&name.as_str()),
            default: child.get("default").map(compact),
            values: child["enum"].as_array().map(|v| {
                v.iter()
                    .map(|e| {
                        format!(
                            "`{}`",
                            e.as_str().map_or_else(|| e.to_string(), str::to_string)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            }),
            description: child["description"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        });
        if core.is_some() {
            continue;
        }
        if is_array {
            collect(&child["items"], &format!("{child_path}[]"), rows);
        } else {
            collect(child, &child_path, rows);
        }
    }
}

fn type_name(node: &Value) -> String {
    if node["x-kubernetes-int-or-string"] == true {
        return "int or string".into();
    }
    match node["type"].as_str() {
        Some("array") => format!("[]{}", type_name(&node["items"])),
        Some("object") if node.get("additionalProperties").is_some() => {
            format!("map[string]{}", type_name(&node["additionalProperties"]))
        }
        Some(t) => t.to_string(),
        None => "any".into(),
    }
}

fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A description as one table cell: on one line, pipes escaped.
fn cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_nested_fields_with_type_default_and_values() {
        let md = api_reference_markdown().unwrap();
        assert!(md.contains("| `spec.training.globalBatchSize` | integer | yes |"));
        let bn = md
            .lines()
            .find(|l| l.starts_with("| `spec.training.batchNorm`"))
            .expect("batchNorm row");
        assert!(
            bn.contains("`sync`, `local`") && bn.contains("| `sync` |"),
            "{bn}"
        );
        assert!(md.contains("| `spec.workers[].name` |"));
        assert!(md.contains("| `status.progress.eta` |"));
    }

    #[test]
    fn names_kubernetes_types_without_expanding_them() {
        let md = api_reference_markdown().unwrap();
        assert!(md.contains("| `spec.workers[].affinity` | core/v1 Affinity |"));
        assert!(md.contains("| `spec.workers[].volumes` | []core/v1 Volume |"));
        assert!(!md.contains("spec.workers[].affinity.nodeAffinity"));
        assert!(!md.contains("spec.workers[].volumes[]."));
    }

    #[test]
    fn type_names_cover_maps_arrays_and_int_or_string() {
        let map = serde_json::json!({"type": "object", "additionalProperties": {"type": "string"}});
        assert_eq!(type_name(&map), "map[string]string");
        let arr = serde_json::json!({"type": "array", "items": {"type": "integer"}});
        assert_eq!(type_name(&arr), "[]integer");
        assert_eq!(
            type_name(&serde_json::json!({"x-kubernetes-int-or-string": true})),
            "int or string"
        );
        assert_eq!(cell("a |\n b"), "a \\| b");
    }
}
