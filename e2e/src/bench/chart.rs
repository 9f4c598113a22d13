//! Chart primitives for the bench's PNG plots (plotters, bitmap backend):
//! line charts and stacked bars. Text needs a TrueType font: DejaVu Sans is
//! looked up in the usual places (Debian's `fonts-dejavu-core`, installed
//! by `make setup`), or `HETEROTRAIN_FONT`.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

pub const W: u32 = 1000;
pub const H: u32 = 560;

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

pub fn palette(i: usize) -> RGBColor {
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

pub fn err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e}")
}

/// A W×H bitmap image, drawn into its file by `present`.
pub type Canvas<'b> = DrawingArea<BitMapBackend<'b>, Shift>;

/// A chart with numeric x and y axes on a [`Canvas`].
pub type Plot<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A white W×H canvas for `path`.
pub fn canvas(path: &Path) -> Result<Canvas<'_>> {
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    Ok(root)
}

/// A chart on `root` captioned `title`, x from 0 to `x_max`, y from 0 to `y_max`.
pub fn axes<'a, 'b>(
    root: &'a Canvas<'b>,
    title: impl AsRef<str>,
    x_max: f64,
    y_max: f64,
) -> Result<Plot<'a, 'b>> {
    ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(err)
}

/// The legend box, at `pos`.
pub fn legend<'a, 'b: 'a>(chart: &mut Plot<'a, 'b>, pos: SeriesLabelPosition) -> Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .position(pos)
        .draw()
        .map_err(err)
}

/// Label of an x axis of categories, category i spanning [i, i + 1): its
/// name at the middle, nothing elsewhere.
pub fn category_label<S: AsRef<str>>(names: &[S], x: f64) -> String {
    let i = x.floor() as usize;
    if (x - x.floor() - 0.5).abs() < 0.01 && i < names.len() {
        names[i].as_ref().to_string()
    } else {
        String::new()
    }
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
    /// Draw each series as steps (a value holds until the next point)
    /// rather than slopes between points.
    pub staircase: bool,
}

/// `pts` as a staircase: each value held until the next point's x.
pub fn staircase(pts: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(pts.len() * 2);
    for (i, p) in pts.iter().enumerate() {
        if i > 0 {
            out.push((p.0, pts[i - 1].1));
        }
        out.push(*p);
    }
    out
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
    let root = canvas(path)?;
    let mut chart = axes(&root, &c.title, x_max, y_max)?;
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
        let pts = if c.staircase {
            staircase(pts)
        } else {
            pts.clone()
        };
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
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
    legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    root.present().map_err(err)?;
    Ok(())
}

/// Stacked bars: one bar per `(label, values)`, value k of every bar
/// drawn in colour k and named `parts[k]` in the legend.
pub struct StackedBars<'a> {
    pub title: String,
    pub y_label: &'a str,
    pub parts: Vec<String>,
    pub bars: Vec<(String, Vec<f64>)>,
}

/// Draw `c` into `path`.
pub fn stacked_bars(path: &Path, c: &StackedBars) -> Result<()> {
    if c.bars.is_empty() {
        bail!("{}: nothing to plot", c.title);
    }
    let y_max = c
        .bars
        .iter()
        .map(|b| b.1.iter().filter(|v| v.is_finite()).sum::<f64>())
        .fold(0.0f64, f64::max)
        .max(1e-6)
        * 1.25;
    let n = c.bars.len();
    let root = canvas(path)?;
    let mut chart = axes(&root, &c.title, n as f64, y_max)?;
    let names: Vec<&str> = c.bars.iter().map(|b| b.0.as_str()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| category_label(names.as_slice(), *x))
        .y_desc(c.y_label)
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    for (k, part) in c.parts.iter().enumerate() {
        let color = palette(k);
        let rects: Vec<_> = c
            .bars
            .iter()
            .enumerate()
            .filter_map(|(i, (_, vals))| {
                let below: f64 = vals.iter().take(k).sum();
                let v = *vals.get(k)?;
                let x = i as f64;
                Some(Rectangle::new(
                    [(x + 0.15, below), (x + 0.85, below + v)],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(rects)
            .map_err(err)?
            .label(part)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
#[path = "tests/chart.rs"]
mod tests;
