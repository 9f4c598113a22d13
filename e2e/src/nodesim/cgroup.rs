//! CPU quotas that make a simulated node slow: each pod's processes run in a
//! cgroup whose quota is `node speed × the pod's CPU limit` cores. Handles
//! cgroup v1 (`cpu.cfs_quota_us`) and v2 (`cpu.max`).

use std::ffi::CString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A short period (10 ms) spreads the throttling evenly over steps of a few
/// milliseconds; with the default 100 ms it lands in bursts.
/// `HETEROTRAIN_NODESIM_CPU_PERIOD_US` sets another (1,000–1,000,000).
const PERIOD_US: u64 = 10_000;

/// The smallest quota the kernel takes, µs.
const MIN_QUOTA_US: u64 = 1_000;

/// The longest period the kernel takes, µs.
const MAX_PERIOD_US: u64 = 1_000_000;

/// The period quotas are set over: [`PERIOD_US`] unless
/// `HETEROTRAIN_NODESIM_CPU_PERIOD_US` names another in range.
fn base_period_us() -> u64 {
    static P: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *P.get_or_init(|| {
        let Ok(v) = std::env::var("HETEROTRAIN_NODESIM_CPU_PERIOD_US") else {
            return PERIOD_US;
        };
        match v.trim().parse::<u64>() {
            Ok(p) if (MIN_QUOTA_US..=MAX_PERIOD_US).contains(&p) => p,
            _ => {
                eprintln!(
                    "nodesim: warning: HETEROTRAIN_NODESIM_CPU_PERIOD_US={v:?} is not a whole number of µs in {MIN_QUOTA_US}..={MAX_PERIOD_US}; using {PERIOD_US}"
                );
                PERIOD_US
            }
        }
    })
}

/// Which cgroup hierarchy this machine has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
    /// No writable CPU controller: pods run unthrottled (a warning is logged).
    Unavailable,
}

/// Detect the writable CPU controller.
pub fn detect() -> Version {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() && writable(root) {
        Version::V2
    } else if root.join("cpu").join("cpu.cfs_quota_us").exists() && writable(&root.join("cpu")) {
        Version::V1
    } else {
        Version::Unavailable
    }
}

fn writable(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: access(2) on a valid C string.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// One pod's cgroup.
#[derive(Debug)]
pub struct Cgroup {
    dir: PathBuf,
    /// `cgroup.procs` as a C string, for joining from `pre_exec`.
    procs: CString,
    /// Cores granted.
    pub cores: f64,
}

impl Cgroup {
    /// Create `heterotrain/<group>/<name>` with a quota of `cores`.
    pub fn create(version: Version, group: &str, name: &str, cores: f64) -> Result<Option<Cgroup>> {
        let base = match version {
            Version::V1 => PathBuf::from("/sys/fs/cgroup/cpu/heterotrain"),
            Version::V2 => PathBuf::from("/sys/fs/cgroup/heterotrain"),
            Version::Unavailable => return Ok(None),
        };
        let parent = base.join(group);
        let dir = parent.join(name);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating cgroup {}", dir.display()))?;
        let (quota, period) = quota_period_us(cores, base_period_us());
        match version {
            Version::V1 => {
                std::fs::write(dir.join("cpu.cfs_period_us"), period.to_string())?;
                std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())
                    .with_context(|| format!("setting quota in {}", dir.display()))?;
            }
            Version::V2 => {
                // Delegate the cpu controller down the tree.
                for d in [
                    Path::new("/sys/fs/cgroup"),
                    base.as_path(),
                    parent.as_path(),
                ] {
                    let _ = std::fs::write(d.join("cgroup.subtree_control"), "+cpu");
                }
                std::fs::write(dir.join("cpu.max"), format!("{quota} {period}"))
                    .with_context(|| format!("setting cpu.max in {}", dir.display()))?;
            }
            Version::Unavailable => {}
        }
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_encoded_bytes())?;
        Ok(Some(Cgroup { dir, procs, cores }))
    }

    /// Path to `cgroup.procs` (used from `pre_exec` to join before exec).
    pub fn procs_cstr(&self) -> &CString {
        &self.procs
    }

    /// The cgroup directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Change the quota to `cores` while processes run in the cgroup.
    pub fn set_cores(&self, cores: f64) -> Result<()> {
        let (quota, period) = quota_period_us(cores, base_period_us());
        if self.dir.join("cpu.max").exists() {
            std::fs::write(self.dir.join("cpu.max"), format!("{quota} {period}"))
        } else {
            std::fs::write(self.dir.join("cpu.cfs_period_us"), period.to_string())
                .and_then(|()| std::fs::write(self.dir.join("cpu.cfs_quota_us"), quota.to_string()))
        }
        .with_context(|| format!("setting the quota of {}", self.dir.display()))
    }

    /// Remove the cgroup (after its processes exited).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// CFS quota and period (µs) that grant `cores` over `period` µs. Where
/// the quota would fall under the kernel's 1 ms the period grows instead,
/// so a very slow node still gets its share and not 1 ms per period
/// (0.05 cores over 10 ms: 1 ms per 20 ms, not 1 ms per 10 ms).
fn quota_period_us(cores: f64, period: u64) -> (u64, u64) {
    let quota = (cores * period as f64) as u64;
    if quota >= MIN_QUOTA_US {
        return (quota, period);
    }
    let longer = (MIN_QUOTA_US as f64 / cores.max(f64::MIN_POSITIVE)).ceil();
    (MIN_QUOTA_US, (longer as u64).clamp(period, MAX_PERIOD_US))
}

/// Join the cgroup whose `cgroup.procs` is `procs`; async-signal-safe, for `pre_exec`.
pub fn join_from_child(procs: &CString) -> std::io::Result<()> {
    // SAFETY: open/write/close with a valid C string and a stack buffer.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let buf = b"0\n";
        let n = libc::write(fd, buf.as_ptr().cast(), buf.len());
        libc::close(fd);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_over_the_period_grants_the_cores() {
        assert_eq!(quota_period_us(1.0, 10_000), (10_000, 10_000));
        assert_eq!(quota_period_us(0.35, 10_000), (3_500, 10_000));
        assert_eq!(quota_period_us(2.5, 10_000), (25_000, 10_000));
        // Under the kernel's 1 ms the period grows: 0.05 cores stay 0.05.
        assert_eq!(quota_period_us(0.05, 10_000), (1_000, 20_000));
        assert_eq!(quota_period_us(0.05, 5_000), (1_000, 20_000));
        let (q, p) = quota_period_us(0.003, 10_000);
        assert_eq!(q, 1_000);
        assert!((q as f64 / p as f64 - 0.003).abs() < 1e-6, "{q}/{p}");
        // The kernel's longest period bounds it.
        assert_eq!(quota_period_us(1e-9, 10_000), (1_000, MAX_PERIOD_US));
    }
}
