//! The bench's outputs: `results.json`, `results.csv`, `results.md`, and the
//! checks of the targets (reported, never asserted).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::split::{rank_splits, step_split, RankSplit};
pub use super::targets::check_targets;
use super::{Results, RunResult, Spread};

/// Seconds since the Unix epoch.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

pub(super) fn yes_no(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "not measured",
    }
}

/// What the bench prints after a run.
pub fn run_line(x: &RunResult) -> String {
    let mut line = format!(
        "    {:.0} samples/s = {:.2} × ideal seq ({:.0}), {} × ideal conc ({}){}; plan {:?} after {} change(s); balance CV {:.1}%; held-out accuracy {}; {:.0} s",
        x.summary.samples_per_second,
        x.efficiency,
        x.ideal,
        opt(x.efficiency_concurrent, 2),
        opt(x.ideal_concurrent, 0),
        x.speedup_vs_static
            .map(|s| format!(", {s:.2} × static"))
            .into_iter()
            .chain(x.best_subset.filter(|b| *b > 0.0).map(|b| {
                format!(
                    ", {:.2} × the best subset ({b:.0})",
                    x.summary.samples_per_second / b
                )
            }))
            .collect::<String>(),
        x.summary.final_plan,
        x.summary.plan_changes,
        x.summary.balance_cv_percent,
        x.summary
            .final_accuracy
            .map(|a| format!("{:.1}%", a * 100.0))
            .unwrap_or_else(|| "-".into()),
        x.wall_seconds
    );
    if x.summary.samples_per_second_longest_rank > 0.0 {
        let _ = write!(
            line,
            "; {:.0} samples/s by the longest rank's step time (the measure before the union of step intervals)",
            x.summary.samples_per_second_longest_rank
        );
    }
    if let Some(rc) = &x.recovery {
        let secs =
            |v: Option<f64>, none: &str| v.map(|s| format!("{s:.1} s")).unwrap_or(none.into());
        let _ = write!(
            line,
            "\n    throttled: {:.0} samples/s vs new ideal {:.0}; within 5% of it after {}; settled after {}",
            rc.throttled_samples_per_second,
            rc.throttled_ideal,
            secs(rc.seconds_to_ideal_95, "never"),
            secs(rc.seconds_to_settle, "-")
        );
    }
    line
}

/// Median and range of the paired ratios of the interleaved runs.
fn paired_section(s: &mut String, r: &Results) {
    if r.paired.is_empty() {
        return;
    }
    table_head(
        s,
        "Interleaved runs: paired ratios",
        "In the 2- and 4-node scenarios every round runs the concurrent ideal (and, in `slow-node`, the best subset), then static, then dynamic (round 1 also the other policies), and the concurrent ideal runs once more after the last round, so that a ratio compares runs measured minutes apart under the same load (a round's runs against the mean of the concurrent ideals just before and after them); median (min–max, n rounds).",
        "| model | scenario | rounds | dynamic / static | dynamic / ideal conc | static / ideal conc | dynamic / best subset |",
        "|---|---|---:|---:|---:|---:|---:|",
    );
    for p in &r.paired {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            p.model,
            p.scenario,
            p.rounds,
            Spread::show(&p.dynamic_vs_static),
            Spread::show(&p.dynamic_vs_concurrent),
            Spread::show(&p.static_vs_concurrent),
            Spread::show(&p.dynamic_vs_best_subset)
        );
    }
    let ab: Vec<_> = r
        .paired
        .iter()
        .filter(|p| p.uncapped_vs_dynamic.is_some())
        .collect();
    if ab.is_empty() {
        return;
    }
    table_head(
        s,
        "The quota cap: dynamic with and without it",
        "`dynamic-uncapped` is `dynamic` with `capQuotaBoundRanks: false` (a rank that spent its CPU quota may get more samples), run in every round beside `dynamic`, the two swapping places every other round; median (min–max, n rounds).",
        "| model | scenario | uncapped / dynamic | uncapped / ideal conc | dynamic / ideal conc |",
        "|---|---|---:|---:|---:|",
    );
    for p in ab {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            p.model,
            p.scenario,
            Spread::show(&p.uncapped_vs_dynamic),
            Spread::show(&p.uncapped_vs_concurrent),
            Spread::show(&p.dynamic_vs_concurrent)
        );
    }
}

/// Per rank: compute, exposed communication and optimizer time per step.
fn time_split_section(s: &mut String, r: &Results) {
    let rows: Vec<(&RunResult, Vec<RankSplit>)> = r
        .runs
        .iter()
        .filter(|x| x.round == 0)
        .map(|x| (x, rank_splits(x)))
        .filter(|(_, v)| !v.is_empty())
        .collect();
    if rows.is_empty() {
        return;
    }
    table_head(
        s,
        "Time per step and rank (first round, steady state)",
        "Means over the last half of the steps, ms: compute = data, forward and backward; exposed comm = time blocked in the gradient all-reduce (what overlapping with backward did not hide, including waiting there for a slower rank); optimizer = the update of this rank's shard (elements = parameters it updated); other = the rest of the step (waiting for the slowest rank, plan agreement).",
        "| model | scenario | policy | rank | node | local batch | step | compute | exposed comm | optimizer | other | optimizer elements |",
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    );
    for (x, splits) in rows {
        for k in splits {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
                x.model,
                x.scenario,
                x.policy,
                k.rank,
                k.node,
                k.batch,
                k.step_ms,
                k.compute_ms,
                k.comm_ms,
                k.optimizer_ms,
                k.other_ms,
                k.optimizer_elements
            );
        }
    }
}

/// Every plan the operator wrote for the runs of the measuring policies
/// (their jobs' `status.planHistory`, the last 20), with its reason.
fn plans_section(s: &mut String, r: &Results) {
    let runs: Vec<&RunResult> = r.runs.iter().filter(|x| !x.plans.is_empty()).collect();
    if runs.is_empty() {
        return;
    }
    table_head(
        s,
        "Plans written",
        "The plans the operator wrote for each run that changed its plan (the job's last 20), with the predicted step and the decision's reason.",
        "| model | scenario | policy | round | generation | batches | predicted step, ms | reason |",
        "|---|---|---|---:|---:|---|---:|---|",
    );
    for x in runs {
        for p in &x.plans {
            let batches: Vec<String> = p.batches.iter().map(u32::to_string).collect();
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | [{}] | {} | {} |",
                x.model,
                x.scenario,
                x.policy,
                x.round + 1,
                p.generation,
                batches.join(", "),
                opt(p.predicted_step_seconds.map(|t| t * 1000.0), 1),
                p.reason.replace('|', "/").replace('\n', " ")
            );
        }
    }
}

/// A section's heading, introduction, table header and alignment row.
fn table_head(s: &mut String, title: &str, intro: &str, header: &str, align: &str) {
    let _ = writeln!(s, "\n## {title}\n");
    let _ = writeln!(s, "{intro}\n");
    let _ = writeln!(s, "{header}");
    let _ = writeln!(s, "{align}");
}

/// What names a cluster run in the tables: model, scenario, policy and
/// round (counted from 1).
fn run_key(x: &RunResult) -> [String; 4] {
    [
        x.model.clone(),
        x.scenario.clone(),
        x.policy.clone(),
        (x.round + 1).to_string(),
    ]
}

/// The concurrent ideal a run is held to, with the measurements before
/// and after its round when it is their mean: `2750 (2500, 3000)`.
fn ideal_conc(x: &RunResult) -> String {
    match x.ideal_concurrent_bracket {
        Some((before, after)) => {
            format!("{} ({before:.0}, {after:.0})", opt(x.ideal_concurrent, 0))
        }
        None => opt(x.ideal_concurrent, 0),
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

/// The markdown report.
pub fn markdown(r: &Results) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# HeteroTrain benchmark\n");
    let _ = writeln!(
        s,
        "Started {}, {:.0} s in all, on {}. Settings: `{}`.\n",
        r.started, r.total_seconds, r.machine, r.settings
    );
    let _ = writeln!(s, "## Throughput per policy and scenario\n");
    let _ = writeln!(
        s,
        "Samples/s over the steady state (the last half of the steps). Two ideals, both without communication: **ideal seq** = Σ of each rank's samples/s alone on its node, one rank after another (no other load on the machine); **ideal conc** = Σ of the ranks' samples/s when they all train alone at the same time (the same CPU contention as a cluster run; measured just before and just after each round's runs, and a round's runs are held to the mean of the two, shown with the two in brackets); × = samples/s over that ideal. × static = against the equal split of the same round; round = the place in the interleaved runs of a 2-node scenario; step = the steady step time, of which compute = the slowest rank's compute (mean over steps), the rest being all-reduce and synchronisation; accuracy = rank 0's last held-out evaluation (the models train on scikit-learn's digits, 1,497 train and 300 held-out images from `make setup`: 3×32×32 CIFAR-10 binaries for the conv nets, 8×8 MNIST IDX for the mlp).\n"
    );
    let _ = writeln!(
        s,
        "| model | scenario | policy | round | samples/s | ideal seq | ideal conc | × ideal seq | × ideal conc | × static | step | compute | steps to 95% | plan changes | balance CV | final plan | final loss | accuracy |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"
    );
    for x in &r.runs {
        let split = step_split(x);
        let ms = |v: Option<f64>| {
            v.map(|v| format!("{v:.1} ms"))
                .unwrap_or_else(|| "-".into())
        };
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.0} | {} | {:.2} | {} | {} | {} | {} | {} | {} | {:.1}% | {:?} | {} | {} |",
            run_key(x).join(" | "),
            x.summary.samples_per_second,
            x.ideal,
            ideal_conc(x),
            x.efficiency,
            opt(x.efficiency_concurrent, 2),
            opt(x.speedup_vs_static, 2),
            ms(split.map(|v| v.0)),
            ms(split.map(|v| v.1)),
            x.summary
                .steps_to_95
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into()),
            x.summary.plan_changes,
            x.summary.balance_cv_percent,
            x.summary.final_plan,
            opt(x.summary.final_loss, 3),
            opt(x.summary.final_accuracy, 3),
        );
    }
    paired_section(&mut s, r);
    time_split_section(&mut s, r);
    let throttled: Vec<&RunResult> = r.runs.iter().filter(|x| x.recovery.is_some()).collect();
    if !throttled.is_empty() {
        let _ = writeln!(s, "\n## Throttle scenario: recovery\n");
        let _ = writeln!(
            s,
            "For the throttle scenario, samples/s above is over the whole run and the ideal is that of the same work at the ideal rate of each phase.\n"
        );
        let _ = writeln!(s, "| model | policy | before | throttled | new ideal | throttled / ideal | to within 5% of ideal | settled | plan changes while throttled | restored |");
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for x in throttled {
            if let Some(rc) = &x.recovery {
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.0} | {:.0} | {:.0} | {:.2} | {} | {} | {} | {:.0} |",
                    x.model,
                    x.policy,
                    rc.before_samples_per_second,
                    rc.throttled_samples_per_second,
                    rc.throttled_ideal,
                    rc.throttled_samples_per_second / rc.throttled_ideal.max(1e-9),
                    rc.seconds_to_ideal_95
                        .map(|v| format!("{v:.1} s"))
                        .unwrap_or_else(|| "never".into()),
                    rc.seconds_to_settle
                        .map(|v| format!("{v:.1} s"))
                        .unwrap_or_else(|| "-".into()),
                    rc.plan_changes_throttled,
                    rc.restored_samples_per_second,
                );
            }
        }
    }
    if !r.standalone.is_empty() {
        let _ = writeln!(
            s,
            "\n## Each rank without communication (the ideals' terms)\n"
        );
        let _ = writeln!(s, "Alone = one rank after another (ideal seq); together = all ranks of the scenario at once (ideal conc), measured before the first round and after each round; best subset = the subset's ranks alone, measured again in round n.\n");
        let _ = writeln!(
            s,
            "| model | node | speed | local batch | run | samples/s |"
        );
        let _ = writeln!(s, "|---|---|---:|---:|---|---:|");
        for a in &r.standalone {
            let run = if a.together && a.round == 0 {
                "together, before round 1".to_string()
            } else if a.together {
                format!("together, after round {}", a.round)
            } else if a.best_subset {
                format!("best subset, round {}", a.round + 1)
            } else {
                "alone".into()
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {run} | {:.0} |",
                a.model, a.node, a.speed, a.batch, a.samples_per_second
            );
        }
    }
    plans_section(&mut s, r);
    let _ = writeln!(s, "\n## Plan propagation\n");
    let _ = writeln!(
        s,
        "Operator writes the plan ConfigMap → every rank runs its first step on it: p50 {}, max {} over {} plan changes.",
        opt(r.propagation_p50_seconds.map(|x| x * 1000.0), 0) + " ms",
        opt(r.propagation_max_seconds.map(|x| x * 1000.0), 0) + " ms",
        r.propagation_samples
    );
    if !r.ddp.is_empty() {
        let _ = writeln!(
            s,
            "\n## Trainer vs PyTorch DDP (2 ranks, Gloo, same model and batch)\n"
        );
        let _ = writeln!(s, "| model | ours samples/s | DDP samples/s | ratio |");
        let _ = writeln!(s, "|---|---:|---:|---:|");
        for d in &r.ddp {
            let _ = writeln!(
                s,
                "| {} | {:.1} | {:.1} | {:.2} |",
                d.model, d.ours, d.ddp, d.ratio
            );
        }
    }
    if !r.scale.is_empty() {
        table_head(
            &mut s,
            "Operator scale (8 ranks per job, nodes that don't run processes)",
            "Steady: while holding the jobs with every pod Running. Creating: from creating the new jobs until the operator reported all of them Running. Quantiles from the operator's reconcile histogram (bounds 5 ms × 2ⁿ), interpolated.",
            "| jobs | pods | steady reconciles | p50 | p99 | creating: reconciles | p50 | p99 | operator RSS | all jobs Running after |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        );
        for p in &r.scale {
            let [p50, p99, burst_p50, burst_p99] = p.latencies_ms().map(|v| opt(v, 0) + " ms");
            let _ = writeln!(
                s,
                "| {} | {} | {} | {p50} | {p99} | {} | {burst_p50} | {burst_p99} | {} MiB | {:.0} s |",
                p.jobs,
                p.pods,
                p.reconciles,
                p.burst_reconciles,
                opt(p.rss_mib, 1),
                p.seconds_to_running
            );
        }
        for p in r
            .scale
            .iter()
            .filter(|p| !p.burst_stage_p99_seconds.is_empty())
        {
            let stages: Vec<String> = p
                .burst_stage_p99_seconds
                .iter()
                .map(|(k, v)| format!("{k} {:.0} ms", v * 1000.0))
                .collect();
            let api: Vec<String> = p
                .slowest_api(6)
                .into_iter()
                .map(|(k, (n, v))| format!("{k} {:.0} ms ({n} requests)", v * 1000.0))
                .collect();
            let _ = writeln!(
                s,
                "\nWhile creating {} jobs, p99 per reconcile stage: {}; the API server's slowest p99s: {}.",
                p.jobs,
                stages.join(", "),
                if api.is_empty() { "not read".into() } else { api.join(", ") }
            );
        }
    }
    if !r.targets.is_empty() {
        let _ = writeln!(s, "\n## Targets\n");
        let _ = writeln!(s, "| target | measured | |");
        let _ = writeln!(s, "|---|---|---|");
        for t in &r.targets {
            let _ = writeln!(s, "| {} | {} | {} |", t.target, t.measured, yes_no(t.met));
        }
    }
    if !(r.notes.is_empty() && r.cautions.is_empty()) {
        let _ = writeln!(s, "\n## Notes\n");
        for n in r.notes.iter().chain(&r.cautions) {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

/// One CSV row per cluster run.
pub fn csv(r: &Results) -> String {
    let mut s = String::from(
        "model,scenario,policy,round,samples_per_second,ideal,efficiency,ideal_concurrent,efficiency_concurrent,speedup_vs_static,steps_to_95,plan_changes,balance_cv_percent,final_plan,final_loss,final_accuracy,wall_seconds\n",
    );
    for x in &r.runs {
        let plan: Vec<String> = x.summary.final_plan.iter().map(|b| b.to_string()).collect();
        let _ = writeln!(
            s,
            "{},{:.3},{:.3},{:.4},{},{},{},{},{},{:.3},{},{},{},{:.1}",
            run_key(x).join(","),
            x.summary.samples_per_second,
            x.ideal,
            x.efficiency,
            x.ideal_concurrent
                .map(|v| format!("{v:.3}"))
                .unwrap_or_default(),
            x.efficiency_concurrent
                .map(|v| format!("{v:.4}"))
                .unwrap_or_default(),
            x.speedup_vs_static
                .map(|v| format!("{v:.4}"))
                .unwrap_or_default(),
            x.summary
                .steps_to_95
                .map(|v| v.to_string())
                .unwrap_or_default(),
            x.summary.plan_changes,
            x.summary.balance_cv_percent,
            plan.join(" "),
            x.summary
                .final_loss
                .map(|v| format!("{v:.4}"))
                .unwrap_or_default(),
            x.summary
                .final_accuracy
                .map(|v| format!("{v:.4}"))
                .unwrap_or_default(),
            x.wall_seconds
        );
    }
    s
}

/// Write results.json, results.csv and results.md into `dir`.
pub fn write_all(dir: &Path, r: &Results) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(dir.join("results.json"), serde_json::to_vec_pretty(r)?)?;
    std::fs::write(dir.join("results.csv"), csv(r))?;
    std::fs::write(dir.join("results.md"), markdown(r))?;
    Ok(())
}

#[cfg(test)]
#[path = "tests/report.rs"]
mod tests;
