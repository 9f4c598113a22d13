//! The CPU quota of this process's cgroup: how many cores it may use,
//! the smallest quota along its cgroup path (cgroup v2 `cpu.max`, v1
//! `cpu.cfs_quota_us` / `cpu.cfs_period_us`).

use std::path::{Path, PathBuf};
use std::time::Instant;

/// The share of its CPU quota this process used between readings (CPU time
/// over the quota's allowance; 1 = all of it).
#[derive(Debug, Default)]
pub struct QuotaMeter {
    seen: Option<(f64, Instant)>,
    last: f64,
}

impl QuotaMeter {
    /// The share used since the previous measurement, measured when at
    /// least half a second has passed (CPU time comes in 10 ms ticks);
    /// else the previous share (0 before the first, or without a quota).
    pub fn read(&mut self) -> f64 {
        self.read_at(
            super::serve::process_cpu_seconds(),
            cpu_quota_cores().unwrap_or(0.0),
            Instant::now(),
        )
    }

    /// [`QuotaMeter::read`] with the process's CPU seconds `cpu`, its quota
    /// in cores and the time given.
    pub fn read_at(&mut self, cpu: Option<f64>, quota: f64, now: Instant) -> f64 {
        let Some(cpu) = cpu else { return self.last };
        match self.seen {
            Some((cpu0, t0)) if now.duration_since(t0).as_secs_f64() >= 0.5 => {
                let allowed = now.duration_since(t0).as_secs_f64() * quota;
                self.last = if allowed > 0.0 {
                    ((cpu - cpu0) / allowed).max(0.0)
                } else {
                    0.0
                };
                self.seen = Some((cpu, now));
            }
            Some(_) => {}
            None => self.seen = Some((cpu, now)),
        }
        self.last
    }
}

/// Cores this process's cgroup quota allows; `None` when unlimited or
/// unreadable.
pub(super) fn cpu_quota_cores() -> Option<f64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    quota_in(Path::new("/sys/fs/cgroup"), &cgroup)
}

/// The quota for a `/proc/<pid>/cgroup` text with cgroups mounted at `root`.
fn quota_in(root: &Path, cgroup: &str) -> Option<f64> {
    let mut best: Option<f64> = None;
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let found = if controllers.is_empty() {
            walk(root, path, v2_quota)
        } else if controllers.split(',').any(|c| c == "cpu") {
            // The v1 hierarchy's mount is named after its controllers.
            [controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"]
                .iter()
                .map(|d| root.join(d))
                .find(|d| d.join("cpu.cfs_quota_us").exists())
                .and_then(|mount| walk(&mount, path, v1_quota))
        } else {
            None
        };
        if let Some(q) = found {
            best = Some(best.map_or(q, |b| b.min(q)));
        }
    }
    best
}

/// The smallest quota from `mount/path` up to `mount` itself.
fn walk(mount: &Path, path: &str, read: fn(&Path) -> Option<f64>) -> Option<f64> {
    let mut dir: PathBuf = mount.join(path.trim_start_matches('/'));
    let mut best: Option<f64> = None;
    loop {
        if let Some(q) = read(&dir) {
            best = Some(best.map_or(q, |b| b.min(q)));
        }
        if dir == mount || !dir.pop() || !dir.starts_with(mount) {
            break;
        }
    }
    best
}

/// `cpu.max`: "max 100000" (unlimited) or "15000 100000".
fn v2_quota(dir: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(dir.join("cpu.max")).ok()?;
    let mut f = text.split_whitespace();
    let quota: f64 = f.next()?.parse().ok()?;
    let period: f64 = f.next()?.parse().ok()?;
    (quota > 0.0 && period > 0.0).then_some(quota / period)
}

/// `cpu.cfs_quota_us` (-1: unlimited) over `cpu.cfs_period_us`.
fn v1_quota(dir: &Path) -> Option<f64> {
    let read = |name: &str| -> Option<f64> {
        std::fs::read_to_string(dir.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let quota = read("cpu.cfs_quota_us")?;
    let period = read("cpu.cfs_period_us")?;
    (quota > 0.0 && period > 0.0).then_some(quota / period)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_meter_measures_over_half_a_second_or_more() {
        use std::time::Duration;
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut m = QuotaMeter::default();
        // The first reading only starts the interval; unreadable CPU time
        // changes nothing.
        assert_eq!(m.read_at(Some(10.0), 0.5, at(0)), 0.0);
        assert_eq!(m.read_at(None, 0.5, at(600)), 0.0);
        // 0.3 s of CPU over 0.2 s: too soon, the previous share stands.
        assert_eq!(m.read_at(Some(10.3), 0.5, at(200)), 0.0);
        // 0.45 s of CPU over 1 s at 0.5 core: 90% used.
        assert!((m.read_at(Some(10.45), 0.5, at(1000)) - 0.9).abs() < 1e-9);
        // Without a quota: 0.
        assert_eq!(m.read_at(Some(11.0), 0.0, at(2000)), 0.0);
    }

    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn v2_takes_the_smallest_quota_along_the_path() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(r, "cpu.max", "max 100000\n");
        write(&r.join("kubepods"), "cpu.max", "150000 100000\n");
        write(&r.join("kubepods/pod1"), "cpu.max", "15000 100000\n");
        write(&r.join("kubepods/pod1/c"), "cpu.max", "max 100000\n");
        let q = quota_in(r, "0::/kubepods/pod1/c\n").unwrap();
        assert!((q - 0.15).abs() < 1e-12, "{q}");
        // Unlimited everywhere: none.
        assert_eq!(quota_in(r, "0::/\n"), None);
    }

    #[test]
    fn v1_reads_the_cpu_hierarchy_and_ignores_the_others() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let cpu = r.join("cpu,cpuacct");
        write(&cpu, "cpu.cfs_quota_us", "-1\n");
        write(&cpu, "cpu.cfs_period_us", "100000\n");
        write(&cpu.join("heterotrain/n/p"), "cpu.cfs_quota_us", "60000\n");
        write(
            &cpu.join("heterotrain/n/p"),
            "cpu.cfs_period_us",
            "100000\n",
        );
        write(&r.join("memory/heterotrain/n/p"), "cpu.cfs_quota_us", "1\n");
        let text =
            "12:memory:/heterotrain/n/p\n4:cpu,cpuacct:/heterotrain/n/p\n1:name=systemd:/x\n";
        let q = quota_in(r, text).unwrap();
        assert!((q - 0.6).abs() < 1e-12, "{q}");
        assert_eq!(quota_in(r, "4:cpu,cpuacct:/\n"), None);
        // Malformed lines and missing files give none, never a panic.
        assert_eq!(quota_in(r, "garbage\n::\n4:cpu:/nowhere\n"), None);
    }
}
