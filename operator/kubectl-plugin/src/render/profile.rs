//! `kubectl heterotrain profile`: each rank's hardware and fitted step-time
//! model, and the operator's cached profiles for the job's model.

use std::collections::BTreeMap;

use heterotrain_operator::profile_cache::{self, CachedProfile};

use super::{opt, rate};
use crate::fetch::{JobView, LiveProfile};
use crate::table::Table;

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
    let namespace = v.job.metadata.namespace.clone().unwrap_or_default();
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
        let hardware = node
            .as_ref()
            .and_then(|n| v.node_labels.get(n))
            .and_then(|l| profile_cache::hardware_class(l, g.device))
            .or_else(|| profile_cache::group_hardware(g));
        let cached = hardware
            .as_ref()
            .and_then(|h| cache.get(&profile_cache::key(&namespace, h, g, spec.model.as_ref())));
        let lp = live.get(&(rank as u32));
        let (a, c, max_batch, source) = match (lp, cached) {
            (Some(lp), _) if lp.per_sample_seconds.is_some() => (
                lp.fixed_seconds,
                lp.per_sample_seconds,
                lp.max_batch.map(|m| m as u64),
                "measured",
            ),
            (_, Some(cp)) => {
                let f = fit(&cp.points);
                (
                    f.map(|f| f.0),
                    f.map(|f| f.1),
                    Some(u64::from(cp.max_batch)),
                    "cached",
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
                hardware
                    .or_else(|| lp.and_then(|l| l.device.clone()))
                    .unwrap_or_else(|| "-".into()),
                source.to_string(),
                sci(lp.and_then(|l| l.matmul_flops), "FLOP/s"),
                sci(lp.and_then(|l| l.memory_bandwidth), "B/s"),
                a.map_or_else(|| "-".into(), |a| format!("{a:.4}")),
                c.map_or_else(|| "-".into(), |c| format!("{c:.6}")),
                opt(max_batch),
                rate(samples_per_s),
            ],
            samples_per_s,
        });
    }
    let slowest = rows
        .iter()
        .filter_map(|r| r.samples_per_s)
        .fold(f64::INFINITY, f64::min);
    let mut t = Table::new(&[
        "RANK",
        "GROUP",
        "NODE",
        "HARDWARE",
        "SOURCE",
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
        "Hardware of {} (model {}; samples/s at an equal share of {:.0} per rank; SPEED relative to the slowest; SOURCE: measured by the running rank, or cached from an earlier job on the same hardware)\n",
        v.name(),
        profile_cache::model_key(spec.model.as_ref()),
        share
    );
    out.push_str(&t.render());
    let model = profile_cache::model_key(spec.model.as_ref());
    let mut known = Table::new(&[
        "CACHED PROFILE",
        "FIXED S/STEP",
        "S/SAMPLE",
        "MAX BATCH",
        "POINTS",
    ]);
    let mine = format!("{namespace}.");
    for (k, p) in cache.iter().filter(|(k, _)| {
        k.starts_with(&mine)
            && k.ends_with(&format!(
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
        out.push_str("\nProfile cache entries for this model in this namespace:\n");
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
}
