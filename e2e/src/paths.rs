//! Where cached binaries and cluster state live (`$HETEROTRAIN_CACHE`,
//! default `~/.cache/heterotrain`), and the repository's example jobs.

use std::path::{Path, PathBuf};

/// The cache root shared by `make setup`, tests and the demo.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HETEROTRAIN_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache").join("heterotrain")
}

/// Find an executable: `$HETEROTRAIN_CACHE/bin/<name>`, then `$PATH`.
pub fn find_binary(name: &str) -> Option<PathBuf> {
    let cached = cache_dir().join("bin").join(name);
    if is_executable(&cached) {
        return Some(cached);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The repository's `examples/` folder.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

/// Every HeteroTrainingJob in a `.yaml` file under `examples/`
/// (subdirectories too: `own-model/job.yaml`), as (file, job), files in
/// sorted order; other kinds of document are skipped.
pub fn example_jobs() -> std::io::Result<Vec<(PathBuf, serde_yaml::Value)>> {
    use serde::Deserialize;
    let mut dirs = vec![examples_dir()];
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().and_then(|e| e.to_str()) == Some("yaml") {
                files.push(path);
            }
        }
    }
    files.sort();
    let mut jobs = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path)?;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(doc).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            })?;
            if value.get("kind").and_then(|k| k.as_str()) == Some("HeteroTrainingJob") {
                jobs.push((path.clone(), value));
            }
        }
    }
    Ok(jobs)
}
