//! Fuzzing [`BatchPlan::parse`]: arbitrary strings, and near-valid plans
//! (the known keys with arbitrary or edge values, then a few byte edits).
//! Nothing may panic, and a plan that parses must hold the invariants.
//! `HETEROTRAIN_FUZZ_CASES` sets the cases (default 2 000; `make fuzz`:
//! 1 000 000).

use proptest::prelude::*;
use serde_json::{Map, Value};

use crate::BatchPlan;

fn config() -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases: std::env::var("HETEROTRAIN_FUZZ_CASES")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(2_000),
        failure_persistence: None,
        ..Default::default()
    }
}

/// Parse, and check what parses.
fn run(text: &str, world_size: usize) {
    if let Ok(p) = BatchPlan::parse(text, world_size) {
        assert_eq!(p.batch_sizes.len(), world_size);
        // World size 0 never reaches a plan (a job has ≥ 1 rank); it must
        // still not panic.
        assert!(world_size == 0 || p.batch_sizes[0] >= 1);
        let sum: u64 = p.batch_sizes.iter().map(|&b| u64::from(b)).sum();
        assert_eq!(sum, u64::from(p.global_batch_size));
        assert_eq!(p.members().len() + p.left_out().len(), world_size);
        let again = BatchPlan::parse(&p.to_json(), world_size).expect("own JSON parses");
        assert_eq!(again.batch_sizes, p.batch_sizes);
        assert_eq!(again.generation, p.generation);
    }
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..64).prop_map(Value::from),
        any::<u32>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        Just(Value::from(u64::from(u32::MAX) + 1)),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => number(),
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        1 => ".{0,8}".prop_map(Value::String),
        3 => prop::collection::vec(number(), 0..6).prop_map(Value::Array),
        1 => prop::collection::vec(".{0,3}".prop_map(Value::String), 0..3).prop_map(Value::Array),
    ]
}

const KEYS: &[&str] = &[
    "generation",
    "globalBatchSize",
    "batchSizes",
    "policy",
    "reason",
    "predictedStepSeconds",
    "predictedCommunicationSeconds",
    "unknownKey",
];

/// A plan object: a valid one for `sizes`, then some keys overwritten or
/// dropped.
fn near_valid() -> impl Strategy<Value = (String, usize)> {
    (
        prop::collection::vec(0u32..40, 1..8),
        prop::collection::vec((0..KEYS.len(), prop::option::weighted(0.8, value())), 0..4),
        prop::collection::vec((any::<usize>(), any::<u8>(), any::<bool>()), 0..3),
        0usize..3,
    )
        .prop_map(|(sizes, changes, edits, ws_delta)| {
            let global: u32 = sizes.iter().sum();
            let mut m = Map::new();
            m.insert("generation".into(), Value::from(3));
            m.insert("globalBatchSize".into(), Value::from(global));
            m.insert("batchSizes".into(), Value::from(sizes.clone()));
            m.insert("policy".into(), Value::from("dynamic"));
            for (k, v) in changes {
                match v {
                    Some(v) => m.insert(KEYS[k].into(), v),
                    None => m.remove(KEYS[k]),
                };
            }
            let mut b = Value::Object(m).to_string().into_bytes();
            for (pos, byte, insert) in edits {
                let at = pos % (b.len() + 1);
                if insert || at == b.len() {
                    b.insert(at, byte);
                } else {
                    b[at] = byte;
                }
            }
            let world = (sizes.len() + ws_delta).saturating_sub(1);
            (String::from_utf8_lossy(&b).into_owned(), world)
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn fuzz_plan_arbitrary_strings(text in any::<String>(), ws in 0usize..9) {
        run(&text, ws);
    }

    #[test]
    fn fuzz_plan_near_valid_json((text, ws) in near_valid()) {
        run(&text, ws);
    }
}
