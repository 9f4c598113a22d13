//! What a bench session carries from run to run, and its printing: a
//! leaf module the session and the ideals share.

use std::collections::BTreeMap;

use super::Results;

/// Results so far and the measurements later runs reuse.
pub struct State {
    pub results: Results,
    /// (model, node, speed bits, batch) → samples/s alone.
    pub standalone: BTreeMap<(String, String, u64, u32), f64>,
    /// Each node's speed outside throttles and ideals.
    pub base_speed: BTreeMap<String, f64>,
    pub(super) done: usize,
    pub(super) total: usize,
}

impl State {
    pub fn new(results: Results) -> State {
        State {
            results,
            standalone: BTreeMap::new(),
            base_speed: BTreeMap::new(),
            done: 0,
            total: 0,
        }
    }
}

pub fn say(msg: &str) {
    println!("{msg}");
}

/// A model's name in job names.
pub fn short(model: &str) -> &str {
    match model {
        "simple_cnn" => "cnn",
        m => m,
    }
}
