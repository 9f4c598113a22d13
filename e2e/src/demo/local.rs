//! The demo's control plane: `heterotrain-local --name <cluster>` (`demo`
//! unless told otherwise), run as the binary that sits next to
//! `heterotrain-demo`.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{anyhow, bail, Result};

fn local_bin() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().ok_or_else(|| anyhow!("no exe dir"))?;
    let p = dir.join("heterotrain-local");
    if p.exists() {
        Ok(p)
    } else {
        bail!("heterotrain-local not found next to {}", exe.display())
    }
}

/// Run `heterotrain-local --name <cluster> <args>`; its stdout.
pub fn local(cluster: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(local_bin()?)
        .args(["--name", cluster])
        .args(args)
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("heterotrain-local {} failed", args.join(" "));
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}
