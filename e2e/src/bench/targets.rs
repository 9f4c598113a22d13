//! The targets checked against what the bench measured (reported,
//! never asserted).

use super::split::Spread;
use super::{Results, RunResult, TargetCheck};

fn find<'a>(r: &'a Results, model: &str, scenario: &str, policy: &str) -> Option<&'a RunResult> {
    r.runs
        .iter()
        .find(|x| x.model == model && x.scenario == scenario && x.policy == policy)
}

/// The targets against what was measured.
pub fn check_targets(r: &Results, rebalance_interval: f64) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    let models: Vec<String> = {
        let mut m: Vec<String> = r.runs.iter().map(|x| x.model.clone()).collect();
        m.dedup();
        m
    };
    for model in &models {
        if let Some(d) = find(r, model, "two-node", "dynamic") {
            let sp = d.speedup_vs_static;
            out.push(TargetCheck {
                target: format!(
                    "{model}, 2 nodes 1.0/0.33: dynamic ≥ 0.95 × ideal and ≥ 1.8 × static"
                ),
                measured: format!(
                    "{:.2} × ideal seq ({} × ideal conc), {} × static",
                    d.efficiency,
                    d.efficiency_concurrent
                        .map(|s| format!("{s:.2}"))
                        .unwrap_or_else(|| "?".into()),
                    sp.map(|s| format!("{s:.2}")).unwrap_or_else(|| "?".into())
                ),
                met: Some(d.efficiency >= 0.95 && sp.is_some_and(|s| s >= 1.8)),
            });
        }
        if let Some(d) = find(r, model, "throttle", "dynamic") {
            let rec = d.recovery.as_ref();
            let t = rec.and_then(|x| x.seconds_to_ideal_95);
            out.push(TargetCheck {
                target: format!(
                    "{model}, throttle: within 5% of the new ideal within 2 rebalance intervals ({:.0} s)",
                    2.0 * rebalance_interval
                ),
                measured: match (t, rec) {
                    (Some(t), _) => format!("{t:.1} s"),
                    (None, Some(x)) => format!(
                        "never (throttled steady {:.0} = {:.2} × the new ideal {:.0}; settled in {})",
                        x.throttled_samples_per_second,
                        x.throttled_samples_per_second / x.throttled_ideal.max(1e-9),
                        x.throttled_ideal,
                        x.seconds_to_settle
                            .map(|s| format!("{s:.1} s"))
                            .unwrap_or_else(|| "-".into())
                    ),
                    _ => "-".into(),
                },
                met: rec.map(|_| t.is_some_and(|t| t <= 2.0 * rebalance_interval)),
            });
        }
        // Each round's dynamic run against that round's best subset; the
        // median over the rounds decides.
        let slow: Vec<&RunResult> = r
            .runs
            .iter()
            .filter(|x| x.model == *model && x.scenario == "slow-node" && x.policy == "dynamic")
            .filter(|x| x.best_subset.is_some_and(|b| b > 0.0))
            .collect();
        let ratios: Vec<f64> = slow
            .iter()
            .map(|x| x.summary.samples_per_second / x.best_subset.unwrap_or(f64::NAN))
            .collect();
        if let Some(last) = slow.last() {
            let spread = Spread::of(&ratios);
            out.push(TargetCheck {
                target: format!("{model}, one node at 0.05: dynamic ≥ the best subset's rate"),
                measured: format!(
                    "{} × the best subset (the fast node alone, measured each round), last round's plan {:?}",
                    Spread::show(&spread),
                    last.summary.final_plan
                ),
                met: Some(spread.is_some_and(|s| s.median >= 1.0)),
            });
        }
        if let (Some(d), Some(s)) = (
            find(r, model, "homogeneous", "dynamic"),
            find(r, model, "homogeneous", "static"),
        ) {
            let ratio = d.summary.samples_per_second / s.summary.samples_per_second.max(1e-9);
            out.push(TargetCheck {
                target: format!("{model}, homogeneous control: dynamic within 2% of static"),
                measured: format!("dynamic / static = {ratio:.3}"),
                met: Some(ratio >= 0.98),
            });
        }
    }
    if let Some(p) = r.scale.iter().max_by_key(|p| p.jobs) {
        out.push(TargetCheck {
            target: format!(
                "operator at {} jobs / {} pods: reconcile p99 < 500 ms (steady), RSS < 150 MiB",
                p.jobs, p.pods
            ),
            measured: format!(
                "p99 {} , RSS {}",
                p.reconcile_p99_seconds
                    .map(|s| format!("{:.0} ms", s * 1000.0))
                    .unwrap_or_else(|| "?".into()),
                p.rss_mib
                    .map(|m| format!("{m:.0} MiB"))
                    .unwrap_or_else(|| "?".into())
            ),
            met: match (p.reconcile_p99_seconds, p.rss_mib) {
                (Some(q), Some(m)) => Some(q < 0.5 && m < 150.0),
                _ => None,
            },
        });
    }
    if !r.ddp.is_empty() {
        for d in &r.ddp {
            out.push(TargetCheck {
                target: format!("trainer vs PyTorch DDP, {}: ratio ≥ 1.0", d.model),
                measured: format!("{:.2}", d.ratio),
                met: Some(d.ratio >= 1.0),
            });
        }
    }
    out
}
