//! Fuzzing spec validation: start from a valid job fixture, put arbitrary
//! JSON at keys the CRD schema knows (and a few it does not), deserialise
//! (refusals are fine) and validate; nothing may panic, and a job that
//! passes must give a consistent world size and layout.

use std::sync::OnceLock;

use heterotrain_crds::HeteroTrainingJob;
use proptest::prelude::*;
use serde_json::Value;

use super::{check, validate, Checked};
use crate::fuzzing;

/// One step of a path into the spec.
#[derive(Clone, Debug)]
enum Seg {
    Key(String),
    /// An array element; the index is taken modulo the length (+1: append).
    Item,
}

/// Every path of the CRD's `spec` schema (properties, array items and map
/// values), found once.
fn schema_paths() -> &'static [Vec<Seg>] {
    static PATHS: OnceLock<Vec<Vec<Seg>>> = OnceLock::new();
    PATHS.get_or_init(|| {
        let yaml = heterotrain_crds::crd_yaml().expect("crd");
        let crd: Value = serde_yaml::from_str(&yaml).expect("crd yaml");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let mut out = Vec::new();
        walk(spec, &mut Vec::new(), &mut out);
        assert!(out.len() > 50, "schema has {} paths", out.len());
        out
    })
}

fn walk(schema: &Value, path: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    if path.len() > 10 {
        return;
    }
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (k, s) in props {
            path.push(Seg::Key(k.clone()));
            out.push(path.clone());
            walk(s, path, out);
            path.pop();
        }
    }
    if let Some(items) = schema.get("items") {
        path.push(Seg::Item);
        out.push(path.clone());
        walk(items, path, out);
        path.pop();
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        path.push(Seg::Key("extra".into()));
        out.push(path.clone());
        walk(values, path, out);
        path.pop();
    }
}

/// Set `value` at `path` under `root`, making objects and arrays on the way.
fn put(root: &mut Value, path: &[Seg], pick: usize, value: Value) {
    let Some((first, rest)) = path.split_first() else {
        *root = value;
        return;
    };
    let next = match first {
        Seg::Key(k) => {
            if !root.is_object() {
                *root = Value::Object(Default::default());
            }
            let Value::Object(m) = root else { return };
            m.entry(k.clone()).or_insert(Value::Null)
        }
        Seg::Item => {
            if !root.is_array() {
                *root = Value::Array(Vec::new());
            }
            let Value::Array(a) = root else { return };
            let i = pick % (a.len() + 1);
            if i == a.len() {
                a.push(Value::Null);
            }
            &mut a[i]
        }
    };
    put(next, rest, pick, value);
}

const BASES: &[&str] = &[
    include_str!("../../tests/fixtures/minimal.yaml"),
    include_str!("../../tests/fixtures/mixed.yaml"),
    include_str!("../../tests/fixtures/custom.yaml"),
];

fn bases() -> &'static [Value] {
    static B: OnceLock<Vec<Value>> = OnceLock::new();
    B.get_or_init(|| {
        BASES
            .iter()
            .map(|t| serde_yaml::from_str(t).expect("fixture"))
            .collect()
    })
}

/// What to put where: (path index, element pick, value).
fn edits() -> impl Strategy<Value = Vec<(usize, usize, Value)>> {
    prop::collection::vec((any::<usize>(), any::<usize>(), fuzzing::json()), 1..6)
}

fn run(base: usize, name: &str, edits: &[(usize, usize, Value)]) {
    let paths = schema_paths();
    let mut job = bases()[base % bases().len()].clone();
    job["metadata"]["name"] = Value::String(name.to_string());
    for (p, pick, value) in edits {
        put(
            &mut job["spec"],
            &paths[p % paths.len()],
            *pick,
            value.clone(),
        );
    }
    let Ok(job) = serde_json::from_value::<HeteroTrainingJob>(job) else {
        return;
    };
    let plain = validate(name, &job.spec, None);
    let with_prom = validate(name, &job.spec, Some("http://prometheus:9090"));
    if plain.is_ok() {
        assert!(
            with_prom.is_ok(),
            "a default Prometheus URL made a valid job invalid"
        );
    }
    if let Ok(Checked::Valid(v)) = check(&job, Default::default()) {
        assert_eq!(v.layout.len(), v.ranks());
        assert!(v.world_size >= 1);
    }
}

proptest! {
    #![proptest_config(fuzzing::config())]

    #[test]
    fn fuzz_validate_known_keys(
        base in any::<usize>(),
        name in prop_oneof!["[a-z][a-z0-9-]{0,70}", any::<String>()],
        e in edits(),
    ) {
        run(base, &name, &e);
    }
}

#[test]
fn schema_paths_reach_into_groups() {
    let paths = schema_paths();
    let has = |want: &[&str]| {
        paths.iter().any(|p| {
            p.len() == want.len()
                && p.iter().zip(want).all(|(s, w)| match s {
                    Seg::Key(k) => k == w,
                    Seg::Item => *w == "[]",
                })
        })
    };
    assert!(has(&["workers", "[]", "replicas"]));
    assert!(has(&["training", "globalBatchSize"]));
}
