//! Our trainer against PyTorch DDP (`trainer-image/scripts/bench_trainer.sh`,
//! torchrun with Gloo, 2 ranks, same model and batch).

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::state::say;
use super::DdpRow;

/// Run `bench_trainer.sh` (`runs` runs per side) with the trainer built
/// next to this binary.
pub fn run(runs: u32) -> Result<Vec<DdpRow>> {
    let script = Path::new("trainer-image/scripts/bench_trainer.sh");
    if !script.exists() {
        bail!(
            "{} not found (run from the repository root)",
            script.display()
        );
    }
    let exe = std::env::current_exe()?;
    let trainer = exe
        .parent()
        .map(|d| d.join("heterotrain-trainer"))
        .filter(|p| p.exists())
        .context("heterotrain-trainer is not built next to heterotrain-bench")?;
    say(&format!(
        "==> trainer vs PyTorch DDP ({} run(s) each, 2 ranks, Gloo)",
        runs
    ));
    let out = Command::new("bash")
        .arg(script)
        .env("TRAINER", &trainer)
        .env("RUNS", runs.to_string())
        .output()
        .context("running bench_trainer.sh")?;
    if !out.status.success() {
        bail!(
            "bench_trainer.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let rows = parse_ddp(&text);
    if rows.is_empty() {
        bail!("bench_trainer.sh printed no results:\n{text}");
    }
    for r in &rows {
        say(&format!(
            "    {}: ours {:.1}, DDP {:.1} samples/s → {:.2}",
            r.model, r.ours, r.ddp, r.ratio
        ));
    }
    Ok(rows)
}

/// The first table of bench_trainer.sh (after its "ours vs PyTorch DDP"
/// title): rows `| model, batch | ours | DDP | paired ratio (median) |
/// min–max |`. The script's later tables (BatchNorm, sharding) compare
/// ours with ours and are not read.
pub fn parse_ddp(text: &str) -> Vec<DdpRow> {
    text.lines()
        .skip_while(|l| !l.starts_with("ours vs PyTorch DDP"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let c: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            if c.len() != 5 {
                return None;
            }
            let ours: f64 = c[1].parse().ok()?;
            let ddp: f64 = c[2].parse().ok()?;
            let ratio: f64 = c[3].parse().ok()?;
            (ddp > 0.0).then(|| DdpRow {
                model: c[0].to_string(),
                ours,
                ddp,
                ratio,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_ddp_script_table() {
        let t = "ours vs PyTorch DDP (2 ranks, 1 thread(s) each, 3 interleaved pairs)\n\
| model, global batch | ours samples/s | DDP samples/s | ratio (median) | ratio (min–max) |\n\
|---|---|---|---|---|\n\
| resnet18, 64 | 110.5 | 100.0 | 1.12 | 0.93–1.25 |\n\
| mlp (hidden 512), 256 | 8000.0 | 10000.0 | 0.80 | 0.74–1.06 |\n\
\n\
synchronised BatchNorm vs per-rank\n\
| split | sync samples/s | local samples/s | ratio (median) | ratio (min–max) |\n\
|---|---|---|---|---|\n\
| 32 / 32 | 80.5 | 122.3 | 0.64 | 0.51–0.83 |\n";
        let r = parse_ddp(t);
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[0].model, "resnet18, 64");
        assert!((r[0].ratio - 1.12).abs() < 1e-12);
        assert!((r[1].ratio - 0.8).abs() < 1e-12);
        assert_eq!(r[1].ddp, 10000.0);
    }
}
