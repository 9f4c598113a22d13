//! Prometheus file-SD output: the `metrics` port of every pod this
//! simulator runs, with the labels the chart's PodMonitor gives trainer
//! targets, rewritten to a file on each change once enabled (see
//! [`crate::prometheus`]).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use heterotrain_crds::labels as L;
use k8s_openapi::api::core::v1::Pod;

use super::entries::Entries;

/// The target list of one simulator, by pod UID.
#[derive(Default)]
pub struct Targets {
    /// Where the list goes, when enabled.
    file: Mutex<Option<PathBuf>>,
    entries: Entries<serde_json::Value>,
}

impl Targets {
    /// Keep the list at `path` from now on (written at once).
    pub fn export_to(&self, path: &Path) {
        if let Ok(mut p) = self.file.lock() {
            *p = Some(path.to_path_buf());
        }
        self.write();
    }

    /// Record the metrics target of a started pod (its container port named
    /// `metrics`), with the labels the chart's PodMonitor gives trainer targets.
    pub fn add(&self, pod: &Pod, ip: &str) {
        let port = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.ports.as_ref())
            .and_then(|ps| ps.iter().find(|p| p.name.as_deref() == Some("metrics")))
            .map(|p| p.container_port);
        let Some(port) = port else { return };
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let l = |k: &str| labels.get(k).cloned().unwrap_or_default();
        let target = serde_json::json!({
            "targets": [format!("{ip}:{port}")],
            "labels": {
                "namespace": pod.metadata.namespace.clone().unwrap_or_default(),
                "pod": pod.metadata.name.clone().unwrap_or_default(),
                "node": pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
                "job_name": l(L::JOB),
                "rank": l(L::RANK),
                "group": l(L::GROUP),
            }
        });
        self.entries
            .insert(pod.metadata.uid.as_deref().unwrap_or_default(), target);
        self.write();
    }

    /// Forget a pod's metrics target.
    pub fn remove(&self, uid: &str) {
        if self.entries.remove(uid) {
            self.write();
        }
    }

    fn write(&self) {
        let Some(path) = self.file.lock().ok().and_then(|p| p.clone()) else {
            return;
        };
        // One writer at a time, with the entries as they are now: the
        // writers share the temporary file.
        self.entries.write_out(|all| {
            let tmp = path.with_extension("tmp");
            if std::fs::write(&tmp, serde_json::to_vec_pretty(all).unwrap_or_default()).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, name: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "c", "ports": [{"name": "metrics", "containerPort": 9400}]}]}
        }))
        .expect("a valid pod")
    }

    /// Pods start on several nodes at once: every target lands in the file.
    #[test]
    fn concurrent_adds_all_land_in_the_file() {
        let dir = std::env::temp_dir().join(format!("targets-race-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("targets.json");
        let targets = Targets::default();
        targets.export_to(&path);
        let (threads, each) = (8, 30);
        std::thread::scope(|s| {
            for t in 0..threads {
                let targets = &targets;
                s.spawn(move || {
                    for i in 0..each {
                        targets.add(
                            &pod(&format!("u{t}-{i}"), &format!("p{t}-{i}")),
                            &format!("127.9.{t}.{i}"),
                        );
                    }
                });
            }
        });
        let list: Vec<serde_json::Value> =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(list.len(), threads * each);
        targets.remove("u0-0");
        let list: Vec<serde_json::Value> =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(list.len(), threads * each - 1);
        assert!(list.iter().all(|t| t["labels"]["pod"] != "p0-0"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
