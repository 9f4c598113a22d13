//! Our trainer against PyTorch DDP (`trainer-image/scripts/bench_trainer.sh`,
//! torchrun with Gloo, 2 ranks, same model and batch).

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::session::say;
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

/// Rows `| model | batch | threads | ours | ddp | ratio |` of bench_trainer.sh.
pub fn parse_ddp(text: &str) -> Vec<DdpRow> {
    text.lines()
        .filter_map(|l| {
            let c: Vec<&str> = l
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            if c.len() != 6 {
                return None;
            }
            let ours: f64 = c[3].parse().ok()?;
            let ddp: f64 = c[4].parse().ok()?;
            (ddp > 0.0).then(|| DdpRow {
                model: c[0].to_string(),
                ours,
                ddp,
                ratio: ours / ddp,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_ddp_script_table() {
        let t = "| model | global batch | threads/rank | ours samples/s | DDP samples/s | ratio |\n|---|---|---|---|---|---|\n| resnet18 | 64 | 1 | 110.5 | 100.0 | 1.10 |\n| mlp | 256 | 1 | 8000.0 | 10000.0 | 0.80 |\n";
        let r = parse_ddp(t);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].model, "resnet18");
        assert!((r[1].ratio - 0.8).abs() < 1e-12);
    }
}
