//! Text views of a job (pure: what was fetched in, text out), one module a
//! command, and the cell formats they share.

mod list;
mod plan;
mod profile;
mod status;

use k8s_openapi::jiff::Timestamp;

pub use list::{jobs, serialized, Output};
pub use plan::plan_history;
pub use profile::{fit, profile};
pub use status::{rank_batches, status};

use crate::fetch::JobView;
use crate::table::Table;

/// Age of `t` at `now`, kubectl style (`42s`, `5m`, `3h`, `2d`).
pub fn age(t: Option<Timestamp>, now: Timestamp) -> String {
    let Some(t) = t else { return "-".into() };
    let s = ((now.as_millisecond() - t.as_millisecond()) / 1000).max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// `v`, or `-` when absent.
fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// A rate with one decimal, or `-`.
fn rate(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

/// `[a, b, c]`.
fn list(v: &[u32]) -> String {
    format!(
        "[{}]",
        v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    )
}

/// "25.0 + 4.0 ms" (compute + communication), "25.0 ms", or "-".
fn predicted_step(step: Option<f64>, communication: Option<f64>) -> String {
    match (step, communication) {
        (Some(s), Some(c)) => format!("{:.1} + {:.1} ms", s * 1e3, c * 1e3),
        (Some(s), None) => format!("{:.1} ms", s * 1e3),
        _ => "-".into(),
    }
}

/// The last `last` rebalance decisions, oldest first.
fn decisions(v: &JobView, now: Timestamp, last: usize) -> String {
    let mut t = Table::new(&[
        "GENERATION",
        "AGE",
        "BATCHES",
        "PREDICTED GAIN",
        "PREDICTED STEP",
        "REASON",
    ]);
    let skip = v.rebalances.len().saturating_sub(last);
    for e in v.rebalances.iter().skip(skip) {
        t.row(vec![
            opt(e.generation),
            age(e.time, now),
            e.batches.as_deref().map_or_else(|| "-".into(), list),
            e.gain_percent
                .map_or_else(|| "-".into(), |g| format!("{g:.1} %")),
            predicted_step(e.predicted_step_seconds, e.predicted_communication_seconds),
            e.reason.clone(),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        let now = Timestamp::from_second(100_000).unwrap();
        let at = |s: i64| Some(Timestamp::from_second(100_000 - s).unwrap());
        assert_eq!(age(at(5), now), "5s");
        assert_eq!(age(at(600), now), "10m");
        assert_eq!(age(at(3 * 3600), now), "3h");
        assert_eq!(age(at(3 * 86400), now), "3d");
        assert_eq!(age(None, now), "-");
    }
}
