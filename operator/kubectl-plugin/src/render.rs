//! Text views of a job (pure: what was fetched in, text out).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use heterotrain_crds::HeteroTrainingJob;
use heterotrain_operator::profile_cache::{self, CachedProfile};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::fetch::{JobView, LiveProfile};
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

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn rate(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

fn list(v: &[u32]) -> String {
    format!(
        "[{}]",
        v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
    )
}

fn phase(p: &Pod) -> String {
    let st = p.status.as_ref();
    if p.metadata.deletion_timestamp.is_some() {
        return "Terminating".into();
    }
    st.and_then(|s| s.phase.clone())
        .unwrap_or_else(|| "Pending".into())
}

/// Local batch of each rank: the plan ConfigMap, else the last rebalance,
/// else the groups' batches.
pub fn rank_batches(v: &JobView) -> Vec<Option<u32>> {
    let world = v.job.spec.world_size() as usize;
    if let Some(p) = &v.plan {
        return p.batch_sizes.iter().copied().map(Some).collect();
    }
    let st = v.job.status.clone().unwrap_or_default();
    if let Some(r) = st.last_rebalance.filter(|r| r.batch_sizes.len() == world) {
        return r.batch_sizes.into_iter().map(Some).collect();
    }
    let flat: Vec<u32> = st
        .groups
        .iter()
        .flat_map(|g| g.batch_sizes.clone())
        .collect();
    if flat.len() == world {
        return flat.into_iter().map(Some).collect();
    }
    vec![None; world]
}

fn policy(job: &HeteroTrainingJob) -> &'static str {
    job.spec.load_balancing.policy.as_str()
}

/// `kubectl heterotrain status`: the seeds' "Load Balancer Status" box.
pub fn status(v: &JobView, now: Timestamp) -> String {
    let job = &v.job;
    let st = job.status.clone().unwrap_or_default();
    let ns = job.metadata.namespace.clone().unwrap_or_default();
    let mut out = String::new();
    let created = job.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let _ = writeln!(
        out,
        "Job:             {} (namespace {ns}, age {})",
        v.name(),
        age(created, now)
    );
    let _ = writeln!(
        out,
        "Phase:           {}   restarts {}",
        st.phase.clone().unwrap_or_else(|| "Pending".into()),
        st.restarts
    );
    let done = st.progress.as_ref().map_or(String::new(), |p| {
        format!(
            " of {} ({}%, ETA {})",
            p.total_steps,
            p.percent,
            p.eta.as_deref().unwrap_or("unknown")
        )
    });
    let _ = writeln!(
        out,
        "Progress:        step {}{done}   epoch {}",
        st.step, st.epoch
    );
    let _ = writeln!(
        out,
        "Ranks:           {} in {} group(s)",
        job.spec.world_size(),
        job.spec.workers.len()
    );
    if !st.left_out_ranks.is_empty() {
        let _ = writeln!(
            out,
            "Left out:        ranks {} (no samples under this plan; re-admitted to be measured)",
            list(&st.left_out_ranks)
        );
    }
    let _ = writeln!(
        out,
        "Throughput:      {} samples/s",
        rate(st.cluster_samples_per_second)
    );
    let _ = writeln!(out, "Policy:          {}", policy(job));
    match &v.plan {
        Some(p) => {
            let _ = writeln!(
                out,
                "Plan:            generation {}   global batch {}   batches {}",
                p.generation,
                p.global_batch_size,
                list(&p.batch_sizes)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "Plan:            generation {}   ({})",
                st.plan_generation,
                v.plan_error.clone().unwrap_or_default()
            );
        }
    }
    let _ = writeln!(
        out,
        "Balance:         {}",
        st.balance.as_ref().map_or_else(
            || "-".to_string(),
            |b| format!("CV {:.1} %  {}", b.cv_percent, b.class)
        )
    );
    let _ = writeln!(
        out,
        "Last rebalance:  {}",
        st.last_rebalance.as_ref().map_or_else(
            || "none".to_string(),
            |r| format!(
                "generation {} {} ago, predicted gain {:.1} %: {}",
                r.generation,
                age(r.time.as_ref().map(|t| t.0), now),
                r.predicted_gain_percent,
                r.reason
            )
        )
    );

    let mut groups = Table::new(&["GROUP", "DEVICE", "READY", "BATCHES", "SAMPLES/S"]);
    for (i, g) in job.spec.workers.iter().enumerate() {
        let gs = st
            .groups
            .iter()
            .find(|s| s.name == g.name)
            .or(st.groups.get(i));
        let device = match g.device {
            heterotrain_crds::Device::Cpu => "cpu",
            heterotrain_crds::Device::Cuda => "cuda",
        };
        groups.row(vec![
            g.name.clone(),
            device.into(),
            format!("{}/{}", gs.map_or(0, |s| s.ready), g.replicas),
            gs.map_or_else(|| "-".into(), |s| list(&s.batch_sizes)),
            rate(gs.and_then(|s| s.samples_per_second)),
        ]);
    }
    out.push('\n');
    out.push_str(&groups.render());

    let batches = rank_batches(v);
    let mut ranks = Table::new(&["RANK", "GROUP", "POD", "NODE", "PHASE", "BATCH"]);
    for (rank, (gi, _)) in job.spec.rank_layout().into_iter().enumerate() {
        let rank = rank as u32;
        let pod = v.pod_of(rank);
        ranks.row(vec![
            rank.to_string(),
            job.spec.workers[gi].name.clone(),
            pod.and_then(|p| p.metadata.name.clone())
                .unwrap_or_else(|| "-".into()),
            opt(pod.and_then(|p| p.spec.as_ref()?.node_name.clone())),
            pod.map_or_else(|| "-".into(), phase),
            opt(batches.get(rank as usize).copied().flatten()),
        ]);
    }
    out.push('\n');
    out.push_str(&ranks.render());

    if !v.rebalances.is_empty() {
        out.push_str("\nLast decisions:\n");
        out.push_str(&decisions(v, now, 5));
    }
    if !st.conditions.is_empty() {
        let mut c = Table::new(&["CONDITION", "STATUS", "REASON", "MESSAGE"]);
        for cond in &st.conditions {
            c.row(vec![
                cond.type_.clone(),
                cond.status.clone(),
                cond.reason.clone(),
                cond.message.clone(),
            ]);
        }
        out.push('\n');
        out.push_str(&c.render());
    }
    out
}

fn decisions(v: &JobView, now: Timestamp, last: usize) -> String {
    let mut t = Table::new(&["GENERATION", "AGE", "BATCHES", "PREDICTED GAIN", "REASON"]);
    let skip = v.rebalances.len().saturating_sub(last);
    for e in v.rebalances.iter().skip(skip) {
        t.row(vec![
            opt(e.generation),
            age(e.time, now),
            e.batches.as_deref().map_or_else(|| "-".into(), list),
            e.gain_percent
                .map_or_else(|| "-".into(), |g| format!("{g:.1} %")),
            e.reason.clone(),
        ]);
    }
    t.render()
}

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
    out.push_str("\nHistory (Rebalanced events, oldest first):\n");
    if v.rebalances.is_empty() {
        out.push_str("no rebalances yet (generation 0 is the initial plan)\n");
    } else {
        out.push_str(&decisions(v, now, usize::MAX));
    }
    out
}

/// Least-squares fit of t(b) = a + c·b through (b, t) points.
pub fn fit(points: &[(u32, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    match points.len() {
        0 => None,
        1 => {
            let (b, t) = points[0];
            Some((0.0, t / f64::from(b.max(1))))
        }
        _ => {
            let mb = points.iter().map(|p| f64::from(p.0)).sum::<f64>() / n;
            let mt = points.iter().map(|p| p.1).sum::<f64>() / n;
            let sbb: f64 = points.iter().map(|p| (f64::from(p.0) - mb).powi(2)).sum();
            if sbb == 0.0 {
                return Some((0.0, mt / mb.max(1.0)));
            }
            let sbt: f64 = points
                .iter()
                .map(|p| (f64::from(p.0) - mb) * (p.1 - mt))
                .sum();
            let c = sbt / sbb;
            Some(((mt - c * mb).max(0.0), c))
        }
    }
}

fn sci(v: Option<f64>, unit: &str) -> String {
    match v {
        None => "-".into(),
        Some(v) => {
            let (div, prefix) = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
                .into_iter()
                .find(|(d, _)| v.abs() >= *d)
                .unwrap_or((1.0, ""));
            format!("{:.1} {prefix}{unit}", v / div)
        }
    }
}

/// `kubectl heterotrain profile`: each rank's hardware, side by side — from
/// the ranks' own profile gauges when reachable, else the operator's cache.
pub fn profile(
    v: &JobView,
    cache: &BTreeMap<String, CachedProfile>,
    live: &BTreeMap<u32, LiveProfile>,
) -> String {
    let spec = &v.job.spec;
    let share = f64::from(spec.training.global_batch_size) / f64::from(spec.world_size().max(1));
    struct Row {
        cells: Vec<String>,
        samples_per_s: Option<f64>,
    }
    let mut rows = Vec::new();
    for (rank, (gi, _)) in spec.rank_layout().into_iter().enumerate() {
        let g = &spec.workers[gi];
        let pod = v.pod_of(rank as u32);
        let node = pod.and_then(|p| p.spec.as_ref()?.node_name.clone());
        let accel = node
            .as_ref()
            .and_then(|n| v.accelerators.get(n).cloned())
            .or_else(|| profile_cache::group_accelerator(g).map(str::to_string));
        let cached = accel
            .as_ref()
            .and_then(|a| cache.get(&profile_cache::key(a, g.device, &spec.model)));
        let lp = live.get(&(rank as u32));
        let (a, c, max_batch, source) = match (lp, cached) {
            (Some(lp), _) if lp.per_sample_seconds.is_some() => (
                lp.fixed_seconds,
                lp.per_sample_seconds,
                lp.max_batch.map(|m| m as u64),
                "live",
            ),
            (_, Some(cp)) => {
                let f = fit(&cp.points);
                (
                    f.map(|f| f.0),
                    f.map(|f| f.1),
                    Some(u64::from(cp.max_batch)),
                    "cache",
                )
            }
            _ => (None, None, None, "-"),
        };
        let samples_per_s = c.map(|c| share / (a.unwrap_or(0.0) + c * share));
        rows.push(Row {
            cells: vec![
                rank.to_string(),
                g.name.clone(),
                opt(node),
                accel
                    .or_else(|| lp.and_then(|l| l.device.clone()))
                    .unwrap_or_else(|| "-".into()),
                sci(lp.and_then(|l| l.matmul_flops), "FLOP/s"),
                sci(lp.and_then(|l| l.memory_bandwidth), "B/s"),
                a.map_or_else(|| "-".into(), |a| format!("{a:.4}")),
                c.map_or_else(|| "-".into(), |c| format!("{c:.6}")),
                opt(max_batch),
                rate(samples_per_s),
            ],
            samples_per_s,
        });
        let _ = source;
    }
    let slowest = rows
        .iter()
        .filter_map(|r| r.samples_per_s)
        .fold(f64::INFINITY, f64::min);
    let mut t = Table::new(&[
        "RANK",
        "GROUP",
        "NODE",
        "ACCELERATOR",
        "MATMUL",
        "MEMORY BW",
        "FIXED S/STEP",
        "S/SAMPLE",
        "MAX BATCH",
        "SAMPLES/S",
        "SPEED",
    ]);
    for r in rows {
        let mut cells = r.cells;
        cells.push(match r.samples_per_s {
            Some(s) if slowest.is_finite() && slowest > 0.0 => format!("{:.2}x", s / slowest),
            _ => "-".into(),
        });
        t.row(cells);
    }
    let mut out = format!(
        "Hardware of {} (model {}; samples/s at an equal share of {:.0} per rank; SPEED relative to the slowest)\n",
        v.name(),
        profile_cache::model_key(&spec.model),
        share
    );
    out.push_str(&t.render());
    let model = profile_cache::model_key(&spec.model);
    let mut known = Table::new(&[
        "CACHED PROFILE",
        "FIXED S/STEP",
        "S/SAMPLE",
        "MAX BATCH",
        "POINTS",
    ]);
    for (k, p) in cache.iter().filter(|(k, _)| {
        k.ends_with(&format!(
            "_{}",
            model.replace(
                |c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '.'),
                "_"
            )
        ))
    }) {
        let f = fit(&p.points);
        known.row(vec![
            k.clone(),
            f.map_or_else(|| "-".into(), |f| format!("{:.4}", f.0)),
            f.map_or_else(|| "-".into(), |f| format!("{:.6}", f.1)),
            p.max_batch.to_string(),
            p.points.len().to_string(),
        ]);
    }
    if !known.is_empty() {
        out.push_str("\nProfile cache entries for this model:\n");
        out.push_str(&known.render());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fits_a_line() {
        let (a, c) = fit(&[(8, 0.1 + 0.01 * 8.0), (32, 0.1 + 0.01 * 32.0)]).unwrap();
        assert!((a - 0.1).abs() < 1e-9 && (c - 0.01).abs() < 1e-9);
        assert_eq!(fit(&[]), None);
        assert_eq!(fit(&[(10, 1.0)]), Some((0.0, 0.1)));
    }

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
