//! PNG plots of a bench's results (plotters, bitmap backend). Text needs a
//! TrueType font: DejaVu Sans is looked up in the usual places (Debian's
//! `fonts-dejavu-core`, installed by `make setup`), or `HETEROTRAIN_FONT`.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::{Results, RunResult};

const W: u32 = 1000;
const H: u32 = 560;

/// Register a font for the charts' text; errors when none is found.
pub fn init_font() -> Result<()> {
    static DONE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        let mut candidates: Vec<PathBuf> = Vec::new();
        if let Some(p) = std::env::var_os("HETEROTRAIN_FONT") {
            candidates.push(p.into());
        }
        for p in [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        ] {
            candidates.push(p.into());
        }
        for c in candidates {
            if let Ok(bytes) = std::fs::read(&c) {
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Ok(());
                }
            }
        }
        Err("no TrueType font found (install fonts-dejavu-core or set HETEROTRAIN_FONT)".into())
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

fn palette(i: usize) -> RGBColor {
    const C: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    C[i % C.len()]
}

fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e}")
}

/// A line chart: named series of (x, y), horizontal reference lines, and
/// an optional shaded x range.
pub struct LineChart<'a> {
    pub title: String,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
    pub hlines: Vec<(String, f64)>,
    pub shade: Option<(f64, f64)>,
}

/// Draw `c` into `path`.
pub fn line_chart(path: &Path, c: &LineChart) -> Result<()> {
    let xs = c.series.iter().flat_map(|s| s.1.iter().map(|p| p.0));
    let ys = c
        .series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .chain(c.hlines.iter().map(|h| h.1));
    let x_max = xs.fold(0.0f64, f64::max).max(1e-6);
    let y_max = ys
        .filter(|y| y.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-6)
        * 1.1;
    if c.series.iter().all(|s| s.1.is_empty()) {
        bail!("{}: nothing to plot", c.title);
    }
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(&c.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(c.x_label)
        .y_desc(c.y_label)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    if let Some((a, b)) = c.shade {
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(a, 0.0), (b, y_max)],
                RGBColor(230, 230, 230).filled(),
            )))
            .map_err(err)?
            .label("throttled")
            .legend(|(x, y)| {
                Rectangle::new(
                    [(x, y - 5), (x + 16, y + 5)],
                    RGBColor(210, 210, 210).filled(),
                )
            });
    }
    for (i, (name, pts)) in c.series.iter().enumerate() {
        let color = palette(i);
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(err)?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
    }
    for (i, (name, y)) in c.hlines.iter().enumerate() {
        let color = if c.hlines.len() == 1 {
            BLACK
        } else {
            palette(i)
        };
        let y = *y;
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, y), (x_max, y)],
                8,
                5,
                color.stroke_width(1),
            ))
            .map_err(err)?
            .label(name)
            .legend(move |(x, yy)| PathElement::new(vec![(x, yy), (x + 16, yy)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Throughput per policy (bars) for each scenario, the ideal as a line.
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
        .map(|r| r.ideal.max(r.summary.samples_per_second))
        .fold(0.0f64, f64::max)
        * 1.15;
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let n = scenarios.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{model}: steady-state samples/s per policy (dashed: ideal)"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..n, 0.0..y_max.max(1.0))
        .map_err(err)?;
    let names = scenarios.clone();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(scenarios.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 && i < names.len() {
                names[i].to_string()
            } else {
                String::new()
            }
        })
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
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(x + 0.05, r.ideal), (x + 0.95, r.ideal)],
                    8,
                    4,
                    BLACK.stroke_width(2),
                ))
                .map_err(err)?;
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
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

/// All plots for `r` into `dir`; returns the files written.
pub fn write_all(dir: &Path, r: &Results) -> Result<Vec<PathBuf>> {
    init_font()?;
    std::fs::create_dir_all(dir)?;
    let mut out = Vec::new();
    let mut models: Vec<&str> = r.runs.iter().map(|x| x.model.as_str()).collect();
    models.dedup();
    for model in models {
        let runs: Vec<&RunResult> = r.runs.iter().filter(|x| x.model == model).collect();
        let p = dir.join(format!("throughput-{model}.png"));
        throughput_chart(&p, model, &runs)?;
        out.push(p);
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
            let p = dir.join(format!("recovery-{model}.png"));
            line_chart(
                &p,
                &LineChart {
                    title: format!(
                        "{model}: throttle scenario, 10-step samples/s (dashed: ideal while throttled)"
                    ),
                    x_label: "seconds",
                    y_label: "samples/s",
                    series: throttled
                        .iter()
                        .map(|x| {
                            (
                                x.policy.clone(),
                                x.series
                                    .t
                                    .iter()
                                    .zip(&x.series.rolling_rate)
                                    .filter(|(_, r)| **r > 0.0)
                                    .map(|(t, r)| (*t, *r))
                                    .collect(),
                            )
                        })
                        .collect(),
                    hlines: vec![("ideal while throttled".into(), ideal)],
                    shade: first.throttle_window,
                },
            )?;
            out.push(p);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_line_chart_png() {
        if init_font().is_err() {
            eprintln!("skipping: no font on this machine");
            return;
        }
        let dir = std::env::temp_dir().join(format!("ht-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.png");
        line_chart(
            &p,
            &LineChart {
                title: "t".into(),
                x_label: "s",
                y_label: "y",
                series: vec![("a".into(), vec![(0.0, 1.0), (1.0, 2.0)])],
                hlines: vec![("ideal".into(), 2.5)],
                shade: Some((0.2, 0.4)),
            },
        )
        .unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        let empty = line_chart(
            &dir.join("y.png"),
            &LineChart {
                title: "t".into(),
                x_label: "s",
                y_label: "y",
                series: vec![("a".into(), vec![])],
                hlines: vec![],
                shade: None,
            },
        );
        assert!(
            empty.is_err(),
            "an empty chart is an error, not a blank image"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
