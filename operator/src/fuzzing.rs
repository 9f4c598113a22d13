//! Shared by the fuzz tests (`fuzz_*`): the case count and arbitrary JSON.
//! `HETEROTRAIN_FUZZ_CASES` sets the cases of each fuzz test (default
//! 2 000, what `make test` runs; `make fuzz` runs 1 000 000).

use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::Value;

/// Cases per fuzz test.
pub fn cases() -> u32 {
    std::env::var("HETEROTRAIN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(2_000)
}

/// A proptest config with [`cases`] cases and no regression files.
pub fn config() -> Config {
    Config {
        cases: cases(),
        failure_persistence: None,
        ..Config::default()
    }
}

/// Numbers at and around the edges serde and the rules care about.
pub fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-3i64..70_000).prop_map(Value::from),
        prop::sample::select(vec![
            0i128,
            1,
            -1,
            i128::from(u32::MAX),
            i128::from(u32::MAX) + 1,
            i128::from(i32::MAX),
            i128::from(i32::MIN),
            i128::from(u64::MAX),
            i128::from(i64::MIN),
        ])
        .prop_map(|n| serde_json::from_str(&n.to_string()).unwrap_or(Value::Null)),
        any::<f64>().prop_map(Value::from),
    ]
}

/// Any JSON value, small and nested a few levels, with edge numbers and
/// short strings.
pub fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        "[a-z0-9./:-]{0,12}".prop_map(Value::String),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
