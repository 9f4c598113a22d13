//! `kubectl heterotrain plan`: the plan in use and the decisions before it.

use std::fmt::Write as _;

use k8s_openapi::jiff::Timestamp;

use super::decisions;
use crate::fetch::JobView;
use crate::table::Table;

/// `kubectl heterotrain plan`: the plan in use and every decision before it.
pub fn plan_history(v: &JobView, now: Timestamp) -> String {
    let mut out = String::new();
    match &v.plan {
        Some(p) => {
            let _ = writeln!(
                out,
                "Current plan of {}: generation {}, global batch {}, policy {}",
                v.name(),
                p.generation,
                p.global_batch_size,
                if p.policy.is_empty() { "-" } else { &p.policy }
            );
            let _ = writeln!(
                out,
                "Reason: {}",
                if p.reason.is_empty() { "-" } else { &p.reason }
            );
            if let Some(s) = p.predicted_step_seconds {
                let _ = writeln!(out, "Predicted step time: {s:.4} s");
            }
            let mut t = Table::new(&["RANK", "GROUP", "BATCH", "SHARE"]);
            for (rank, (gi, _)) in v.job.spec.rank_layout().into_iter().enumerate() {
                let b = p.batch_sizes.get(rank).copied().unwrap_or(0);
                t.row(vec![
                    rank.to_string(),
                    v.job.spec.workers[gi].name.clone(),
                    b.to_string(),
                    format!(
                        "{:.1} %",
                        100.0 * f64::from(b) / f64::from(p.global_batch_size.max(1))
                    ),
                ]);
            }
            out.push_str(&t.render());
        }
        None => {
            let _ = writeln!(
                out,
                "No plan for {}: {}",
                v.name(),
                v.plan_error.clone().unwrap_or_default()
            );
        }
    }
    out.push_str("\nHistory (status.planHistory, else Rebalanced events; oldest first):\n");
    if v.rebalances.is_empty() {
        out.push_str("no rebalances yet (generation 0 is the initial plan)\n");
    } else {
        out.push_str(&decisions(v, now, usize::MAX));
    }
    out
}
