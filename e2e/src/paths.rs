//! Where cached binaries and cluster state live (`$HETEROTRAIN_CACHE`,
//! default `~/.cache/heterotrain`).

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
