//! Pod DNS names for processes on the simulated nodes: a managed block in
//! `/etc/hosts` per simulator instance, edited in place under a lock (the
//! file may be a bind mount, so it is never replaced), and removed on stop.

use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::entries::Entries;

/// The managed entries of one simulator instance.
pub struct HostsFile {
    path: PathBuf,
    marker: String,
    entries: Entries<(String, Vec<String>)>,
}

impl HostsFile {
    /// Manage a block tagged `instance` in `path` (normally `/etc/hosts`).
    pub fn new(path: &Path, instance: &str) -> HostsFile {
        HostsFile {
            path: path.to_path_buf(),
            marker: format!("heterotrain-nodesim {instance}"),
            entries: Entries::default(),
        }
    }

    /// Map `names` to `ip`, keyed by `key` (the pod's UID).
    pub fn add(&self, key: &str, ip: &str, names: Vec<String>) -> Result<()> {
        self.entries.insert(key, (ip.to_string(), names));
        self.sync()
    }

    /// Remove the entries under `key`.
    pub fn remove(&self, key: &str) -> Result<()> {
        if self.entries.remove(key) {
            self.sync()?;
        }
        Ok(())
    }

    /// Remove the whole block.
    pub fn clear(&self) -> Result<()> {
        self.entries.clear();
        self.sync()
    }

    fn begin(&self) -> String {
        format!("# BEGIN {}", self.marker)
    }

    fn end(&self) -> String {
        format!("# END {}", self.marker)
    }

    /// Rewrite our block under an exclusive `flock` on the file (other
    /// simulators' blocks) and the entries' lock (this one's other writers).
    fn sync(&self) -> Result<()> {
        self.entries
            .write_out(|entries| self.write_block(entries))
            .unwrap_or(Ok(()))
    }

    fn write_block(&self, entries: &[(String, Vec<String>)]) -> Result<()> {
        let block: Vec<String> = entries
            .iter()
            .map(|(ip, names)| format!("{ip} {}", names.join(" ")))
            .collect();
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .with_context(|| {
                format!(
                    "opening {} (pod DNS needs write access)",
                    self.path.display()
                )
            })?;
        use std::os::fd::AsRawFd;
        // SAFETY: flock on an open fd; released when `f` closes.
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        let mut text = String::new();
        f.read_to_string(&mut text)?;
        let (begin, end) = (self.begin(), self.end());
        let mut out = Vec::new();
        let mut inside = false;
        for line in text.lines() {
            if line == begin {
                inside = true;
                continue;
            }
            if line == end {
                inside = false;
                continue;
            }
            if !inside {
                out.push(line.to_string());
            }
        }
        if !block.is_empty() {
            out.push(begin);
            out.extend(block);
            out.push(end);
        }
        let mut new_text = out.join("\n");
        new_text.push('\n');
        f.rewind()?;
        f.set_len(0)?;
        f.write_all(new_text.as_bytes())?;
        f.sync_all()?;
        Ok(())
    }
}

impl Drop for HostsFile {
    fn drop(&mut self) {
        let _ = self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_and_removes_only_its_block() {
        let dir = std::env::temp_dir().join(format!("hosts-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hosts");
        std::fs::write(&path, "127.0.0.1 localhost\n").unwrap();
        let a = HostsFile::new(&path, "a");
        let b = HostsFile::new(&path, "b");
        a.add("u1", "127.1.0.2", vec!["j-0.j.ns.svc".into()])
            .unwrap();
        b.add("u2", "127.2.0.2", vec!["k-0.k.ns.svc".into()])
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("127.0.0.1 localhost\n"));
        assert!(text.contains("127.1.0.2 j-0.j.ns.svc") && text.contains("127.2.0.2 k-0.k.ns.svc"));
        a.remove("u1").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("j-0") && text.contains("k-0"));
        drop(b);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "127.0.0.1 localhost\n"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Pods start on several nodes at once, each adding its names: none
    /// may be lost to a writer that read the entries before it was added.
    #[test]
    fn concurrent_adds_all_land_in_the_file() {
        let dir = std::env::temp_dir().join(format!("hosts-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hosts");
        std::fs::write(&path, "127.0.0.1 localhost\n").unwrap();
        let hosts = HostsFile::new(&path, "race");
        let (threads, each) = (8, 30);
        // The lost write needs an unlucky interleaving: several rounds.
        for round in 0..6 {
            std::thread::scope(|s| {
                for t in 0..threads {
                    let hosts = &hosts;
                    s.spawn(move || {
                        for i in 0..each {
                            let name = format!("p{round}-{t}-{i}.j.ns.svc");
                            let (key, ip) =
                                (format!("u{round}-{t}-{i}"), format!("127.{round}.{t}.{i}"));
                            hosts.add(&key, &ip, vec![name]).unwrap();
                        }
                    });
                }
            });
            let text = std::fs::read_to_string(&path).unwrap();
            let missing: Vec<String> = (0..threads)
                .flat_map(|t| {
                    (0..each).map(move |i| format!("127.{round}.{t}.{i} p{round}-{t}-{i}.j.ns.svc"))
                })
                .filter(|line| !text.lines().any(|l| l == line))
                .collect();
            assert!(
                missing.is_empty(),
                "round {round}: lost entries: {missing:?}"
            );
        }
        drop(hosts);
        let _ = std::fs::remove_dir_all(dir);
    }
}
