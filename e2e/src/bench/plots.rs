//! PNG plots of a bench's results: throughput per policy with both ideals,
//! per-rank batches (a staircase) and compute times, each rank's time split
//! per step, and the throttle scenario's recovery against steps.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use plotters::prelude::*;

use super::chart::{
    axes, canvas, category_label, err, init_font, legend, line_chart, palette, stacked_bars,
    LineChart, StackedBars,
};
use super::{Results, RunResult};

/// Throughput per policy (bars) for each scenario, both ideals as lines.
pub fn throughput_chart(path: &Path, model: &str, runs: &[&RunResult]) -> Result<()> {
    let mut scenarios: Vec<&str> = Vec::new();
    let mut policies: Vec<&str> = Vec::new();
    for r in runs {
        if !scenarios.contains(&r.scenario.as_str()) {
            scenarios.push(&r.scenario);
        }
        if !policies.contains(&r.policy.as_str()) {
            policies.push(&r.policy);
        }
    }
    if runs.is_empty() {
        bail!("no runs for {model}");
    }
    let y_max = runs
        .iter()
        .map(|r| {
            r.ideal
                .max(r.summary.samples_per_second)
                .max(r.ideal_concurrent.unwrap_or(0.0))
        })
        .fold(0.0f64, f64::max)
        * 1.15;
    let root = canvas(path)?;
    let n = scenarios.len() as f64;
    let mut chart = axes(
        &root,
        format!("{model}: steady-state samples/s (dashed: ideal seq, black; ideal conc, red)"),
        n,
        y_max.max(1.0),
    )?;
    let names = scenarios.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(scenarios.len() * 2 + 1)
        .x_label_formatter(&|x| category_label(names.as_slice(), *x))
        .y_desc("samples/s")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    let width = 0.8 / policies.len().max(1) as f64;
    for (k, policy) in policies.iter().enumerate() {
        let color = palette(k);
        let bars: Vec<_> = runs
            .iter()
            .filter(|r| r.policy == *policy)
            .filter_map(|r| {
                let i = scenarios.iter().position(|s| *s == r.scenario)? as f64;
                let x0 = i + 0.1 + k as f64 * width;
                Some(Rectangle::new(
                    [(x0, 0.0), (x0 + width * 0.9, r.summary.samples_per_second)],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(err)?
            .label(*policy)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    for (i, sc) in scenarios.iter().enumerate() {
        if let Some(r) = runs.iter().find(|r| r.scenario == *sc) {
            let x = i as f64;
            let lines = [(Some(r.ideal), BLACK), (r.ideal_concurrent, RED)];
            for (y, color) in lines {
                let Some(y) = y else { continue };
                chart
                    .draw_series(DashedLineSeries::new(
                        vec![(x + 0.05, y), (x + 0.95, y)],
                        8,
                        4,
                        color.stroke_width(2),
                    ))
                    .map_err(err)?;
            }
        }
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(err)?;
    Ok(())
}

fn per_rank<T: Copy + Into<f64>>(
    run: &RunResult,
    pick: impl Fn(&super::Series) -> &Vec<Vec<T>>,
    scale: f64,
) -> Vec<(String, Vec<(f64, f64)>)> {
    let s = &run.series;
    pick(s)
        .iter()
        .enumerate()
        .map(|(r, ys)| {
            let node = run.nodes.get(r).cloned().unwrap_or_default();
            let speed = run.speeds.get(r).copied().unwrap_or(0.0);
            (
                format!("rank {r} ({node}, speed {speed})"),
                s.t.iter()
                    .zip(ys)
                    .map(|(t, y)| (*t, (*y).into() * scale))
                    .collect(),
            )
        })
        .collect()
}

/// Step numbers of a run's series (older results: 1, 2, ...).
fn steps_of(x: &RunResult) -> Vec<f64> {
    if x.series.step.len() == x.series.t.len() {
        x.series.step.iter().map(|s| *s as f64).collect()
    } else {
        (1..=x.series.t.len()).map(|s| s as f64).collect()
    }
}

/// The steps a run spent throttled: from the first step that ended after
/// the throttle to the last that ended before the restore.
fn throttled_steps(x: &RunResult) -> Option<(f64, f64)> {
    let (a, b) = x.throttle_window?;
    let steps = steps_of(x);
    let first = x.series.t.iter().position(|t| *t > a)?;
    let last = x.series.t.iter().rposition(|t| *t <= b)?;
    Some((steps[first], steps[last.max(first)]))
}

/// Per-rank compute, exposed communication and optimizer time per step,
/// for static and dynamic (first round) of one scenario.
fn time_split_chart(path: &Path, model: &str, scenario: &str, runs: &[&RunResult]) -> Result<bool> {
    let mut bars = Vec::new();
    for x in runs
        .iter()
        .filter(|x| x.scenario == scenario && x.round == 0)
    {
        if x.policy != "static" && x.policy != "dynamic" {
            continue;
        }
        for k in super::split::rank_splits(x) {
            bars.push((
                format!("{} r{} (b {})", x.policy, k.rank, k.batch),
                vec![k.compute_ms, k.comm_ms, k.optimizer_ms, k.other_ms],
            ));
        }
    }
    if bars.is_empty() {
        return Ok(false);
    }
    stacked_bars(
        path,
        &StackedBars {
            title: format!("{model}, {scenario}: time per step and rank, steady state"),
            y_label: "ms per step",
            parts: [
                "compute",
                "exposed communication",
                "optimizer update",
                "waiting / other",
            ]
            .map(String::from)
            .to_vec(),
            bars,
        },
    )?;
    Ok(true)
}

/// All plots for `r` into `dir`; returns the files written.
pub fn write_all(dir: &Path, r: &Results) -> Result<Vec<PathBuf>> {
    init_font()?;
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    let mut models: Vec<&str> = r.runs.iter().map(|x| x.model.as_str()).collect();
    models.dedup();
    for model in models {
        // The first round: one run per policy and scenario.
        let runs: Vec<&RunResult> = r
            .runs
            .iter()
            .filter(|x| x.model == model && x.round == 0)
            .collect();
        let p = dir.join(format!("throughput-{model}.png"));
        throughput_chart(&p, model, &runs)?;
        out.push(p);
        let mut scenarios: Vec<&str> = runs.iter().map(|x| x.scenario.as_str()).collect();
        scenarios.dedup();
        for sc in scenarios {
            let p = dir.join(format!("time-split-{model}-{sc}.png"));
            if time_split_chart(&p, model, sc, &runs)? {
                out.push(p);
            }
        }
        for run in runs.iter().filter(|x| x.policy == "dynamic") {
            let shade = run.throttle_window;
            let p = dir.join(format!("batches-{model}-{}.png", run.scenario));
            line_chart(
                &p,
                &LineChart {
                    title: format!("{model}, {}: local batch per rank (dynamic)", run.scenario),
                    x_label: "seconds",
                    y_label: "local batch",
                    series: per_rank(run, |s| &s.batches, 1.0),
                    hlines: vec![],
                    shade,
                    staircase: true,
                },
            )?;
            out.push(p);
            let p = dir.join(format!("step-times-{model}-{}.png", run.scenario));
            line_chart(
                &p,
                &LineChart {
                    title: format!(
                        "{model}, {}: compute time per step and rank (dynamic)",
                        run.scenario
                    ),
                    x_label: "seconds",
                    y_label: "ms",
                    series: per_rank(run, |s| &s.compute_seconds, 1000.0),
                    hlines: vec![],
                    shade,
                    staircase: false,
                },
            )?;
            out.push(p);
        }
        let throttled: Vec<&&RunResult> = runs.iter().filter(|x| x.recovery.is_some()).collect();
        if let Some(first) = throttled.first() {
            let ideal = first
                .recovery
                .as_ref()
                .map(|x| x.throttled_ideal)
                .unwrap_or(0.0);
            // Every policy is throttled at the same step (the bench slows
            // the node when rank 0 reaches it), so against steps one band
            // holds every policy's throttled phase.
            let bands: Vec<(f64, f64)> = throttled
                .iter()
                .filter_map(|x| throttled_steps(x))
                .collect();
            let shade = (!bands.is_empty()).then(|| {
                (
                    bands.iter().map(|b| b.0).fold(f64::INFINITY, f64::min),
                    bands.iter().map(|b| b.1).fold(0.0, f64::max),
                )
            });
            let p = dir.join(format!("recovery-{model}.png"));
            line_chart(
                &p,
                &LineChart {
                    title: format!(
                        "{model}: throttle scenario, 10-step samples/s (dashed: ideal while throttled)"
                    ),
                    x_label: "step",
                    y_label: "samples/s",
                    series: throttled
                        .iter()
                        .map(|x| {
                            (
                                x.policy.clone(),
                                steps_of(x)
                                    .into_iter()
                                    .zip(&x.series.rolling_rate)
                                    .filter(|(_, r)| **r > 0.0)
                                    .map(|(t, r)| (t, *r))
                                    .collect(),
                            )
                        })
                        .collect(),
                    hlines: vec![("ideal while throttled".into(), ideal)],
                    shade,
                    staircase: false,
                },
            )?;
            out.push(p);
        }
    }
    Ok(out)
}
