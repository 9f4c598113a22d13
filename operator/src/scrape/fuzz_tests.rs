//! Fuzzing the exposition parser: arbitrary text, exposition-like tokens and
//! a valid trainer exposition mutated byte by byte; none may panic, and
//! whatever parses must also go through [`RankMetrics::from_series`].

use proptest::prelude::*;

use super::{parse_exposition, RankMetrics};
use crate::fuzzing;

const VALID: &str = r#"# HELP heterotrain_steps Optimizer steps taken.
# TYPE heterotrain_steps counter
heterotrain_steps_total 12
# TYPE heterotrain_compute_seconds counter
heterotrain_compute_seconds_total 3.5 1700000000000
heterotrain_phase_seconds_total{phase="allreduce"} 0.25
heterotrain_local_batch_size 16
heterotrain_profile_step_seconds{batch_size="16",rank="0"} 0.2
heterotrain_profile_max_batch_size 512
# TYPE heterotrain_step_seconds histogram
heterotrain_step_seconds_bucket{le="0.1"} 3
heterotrain_step_seconds_bucket{le="+Inf"} 4
heterotrain_step_seconds_sum 0.9
heterotrain_step_seconds_count 4
# TYPE q summary
q{quantile="0.5"} NaN
heterotrain_finished 0
# EOF
"#;

/// Bytes that matter to the grammar, and a few that do not.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "\"",
    "=",
    ",",
    "\n",
    "#",
    " ",
    "\t",
    "\\",
    "e",
    "+",
    "-",
    ".",
    "0",
    "9",
    "NaN",
    "+Inf",
    "-Inf",
    "le",
    "quantile",
    "_bucket",
    "_sum",
    "_count",
    "TYPE",
    "HELP",
    "EOF",
    "counter",
    "gauge",
    "histogram",
    "summary",
    "untyped",
    "é",
    "\u{0}",
    "\r",
];

fn run(text: &str) {
    if let Ok(series) = parse_exposition(text) {
        let _ = RankMetrics::from_series(&series);
    }
}

/// An edit of the valid text: (position, kind, token).
fn edits() -> impl Strategy<Value = Vec<(usize, u8, usize)>> {
    prop::collection::vec((any::<usize>(), 0u8..4, 0..TOKENS.len()), 1..8)
}

fn mutate(edits: &[(usize, u8, usize)]) -> String {
    let mut b: Vec<u8> = VALID.as_bytes().to_vec();
    for &(pos, kind, tok) in edits {
        let at = pos % (b.len() + 1);
        let token = TOKENS[tok].as_bytes();
        match kind {
            0 => {
                b.splice(at..at, token.iter().copied());
            }
            1 if at < b.len() => {
                b.remove(at);
            }
            2 => {
                let end = (at + token.len()).min(b.len());
                b.splice(at..end, token.iter().copied());
            }
            _ => b.truncate(at),
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

proptest! {
    #![proptest_config(fuzzing::config())]

    #[test]
    fn fuzz_exposition_arbitrary_text(text in any::<String>()) {
        run(&text);
    }

    #[test]
    fn fuzz_exposition_token_soup(toks in prop::collection::vec(0..TOKENS.len(), 0..64)) {
        let text: String = toks.iter().map(|&t| TOKENS[t]).collect();
        run(&text);
    }

    #[test]
    fn fuzz_exposition_mutated_valid(e in edits()) {
        run(&mutate(&e));
    }
}

#[test]
fn valid_text_parses() {
    let s = parse_exposition(VALID).expect("valid");
    assert_eq!(RankMetrics::from_series(&s).local_batch, Some(16));
}
