//! Checkpoints: weights (safetensors, names = VarStore paths, loadable by
//! PyTorch), optimizer state (safetensors), and a JSON manifest with step,
//! sampler position, plan, the run's fingerprint and SHA-256 of both files.
//! Each file is written to a temp name, fsynced and renamed; the manifest
//! goes last, so a checkpoint without a complete manifest and matching
//! checksums is skipped.
//!
//! Resume takes only what belongs to this run: a checkpoint whose
//! fingerprint (model and its shape flags, global batch, dataset and its
//! size, optimizer, world size, job UID) differs from the run's is skipped
//! with a warning naming the differences, and one that fails to load falls
//! back to the next older one. Pruning only counts and removes this run's
//! checkpoints; other runs' are left alone.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use heterotrain_crds::BatchPlan;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tch::Tensor;

use crate::error::{Result, TrainerError};
use crate::sampler::SamplerPosition;

/// Checkpoints of a run kept on disk (older ones are removed).
pub const KEEP: usize = 3;

/// Manifest version written now (1: no fingerprint).
pub const VERSION: u32 = 2;

/// A file of a checkpoint and its checksum.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FileEntry {
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
}

mod fingerprint;

pub use fingerprint::{Belongs, Difference, Fingerprint, Manifest};

fn stem(step: u64) -> String {
    format!("ckpt-{step:010}")
}

fn sha256_file(path: &Path) -> Result<(u64, String)> {
    let mut f = File::open(path).map_err(|e| TrainerError::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = f.read(&mut buf).map_err(|e| TrainerError::io(path, e))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    let hex = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok((n, hex))
}

fn fsync(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| TrainerError::io(path, e))
}

/// Write tensors as safetensors atomically; returns the file's entry.
fn write_tensors(dir: &Path, name: &str, tensors: &[(String, Tensor)]) -> Result<FileEntry> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let cpu: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.to_device(tch::Device::Cpu).contiguous()))
        .collect();
    Tensor::write_safetensors(&cpu, &tmp)
        .map_err(|e| TrainerError::Checkpoint(format!("writing {}: {e}", tmp.display())))?;
    fsync(&tmp)?;
    let (bytes, sha256) = sha256_file(&tmp)?;
    let dst = dir.join(name);
    std::fs::rename(&tmp, &dst).map_err(|e| TrainerError::io(&dst, e))?;
    Ok(FileEntry {
        name: name.to_string(),
        bytes,
        sha256,
    })
}

/// What goes into a checkpoint.
pub struct Snapshot<'a> {
    pub step: u64,
    pub position: SamplerPosition,
    pub seed: u64,
    pub shuffle: bool,
    pub optimizer_steps: u64,
    pub plan: &'a BatchPlan,
    pub model: &'a str,
    pub fingerprint: &'a Fingerprint,
    pub weights: &'a [(String, Tensor)],
    pub optimizer: &'a [(String, Tensor)],
}

/// Write a checkpoint into `dir` and prune the run's old ones; returns the
/// manifest path.
pub fn save(dir: &Path, s: &Snapshot<'_>) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| TrainerError::io(dir, e))?;
    let st = stem(s.step);
    let weights = write_tensors(dir, &format!("{st}.model.safetensors"), s.weights)?;
    let optimizer = write_tensors(dir, &format!("{st}.optim.safetensors"), s.optimizer)?;
    let m = Manifest {
        version: VERSION,
        step: s.step,
        position: s.position,
        seed: s.seed,
        shuffle: s.shuffle,
        optimizer_steps: s.optimizer_steps,
        plan: s.plan.clone(),
        model: s.model.to_string(),
        fingerprint: Some(s.fingerprint.clone()),
        fingerprint_hash: Some(s.fingerprint.hash()),
        weights,
        optimizer,
    };
    let text =
        serde_json::to_string_pretty(&m).map_err(|e| TrainerError::Checkpoint(e.to_string()))?;
    let tmp = dir.join(format!(".{st}.json.tmp"));
    let dst = dir.join(format!("{st}.json"));
    {
        let mut f = File::create(&tmp).map_err(|e| TrainerError::io(&tmp, e))?;
        f.write_all(text.as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(|e| TrainerError::io(&tmp, e))?;
    }
    std::fs::rename(&tmp, &dst).map_err(|e| TrainerError::io(&dst, e))?;
    let _ = fsync(dir);
    prune(dir, KEEP, s.fingerprint);
    Ok(dst)
}

/// Manifests in `dir`, newest step first.
fn manifests(dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<(u64, PathBuf)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name
                .strip_prefix("ckpt-")?
                .strip_suffix(".json")?
                .parse()
                .ok()?;
            Some((step, e.path()))
        })
        .collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.0));
    v
}

fn read_manifest(path: &Path) -> Result<Manifest, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("bad manifest: {e}"))
}

/// Remove the run's checkpoints beyond the `keep` newest. Checkpoints of
/// other runs (another fingerprint) and unreadable manifests are left alone.
fn prune(dir: &Path, keep: usize, run: &Fingerprint) {
    let ours = manifests(dir).into_iter().filter(|(_, path)| {
        read_manifest(path).is_ok_and(|m| !matches!(m.belongs_to(run), Belongs::No(_)))
    });
    for (step, path) in ours.skip(keep) {
        let _ = std::fs::remove_file(&path);
        let st = stem(step);
        let _ = std::fs::remove_file(dir.join(format!("{st}.model.safetensors")));
        let _ = std::fs::remove_file(dir.join(format!("{st}.optim.safetensors")));
    }
}

/// A single path component other than `.` and `..`.
fn is_plain_file_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(n)), None) if n == std::ffi::OsStr::new(name)
    )
}

/// Both files of `m` match their sizes and checksums.
fn check_files(dir: &Path, m: &Manifest) -> Result<(), String> {
    for f in [&m.weights, &m.optimizer] {
        // A manifest names files beside it, never a path elsewhere.
        if !is_plain_file_name(&f.name) {
            return Err(format!(
                "file name {:?} is not a plain name in the checkpoint directory",
                f.name
            ));
        }
        let p = dir.join(&f.name);
        let (bytes, sha) = sha256_file(&p).map_err(|e| e.to_string())?;
        if bytes != f.bytes || sha != f.sha256 {
            return Err(format!(
                "{} has {bytes} bytes / sha256 {}…, manifest says {} bytes / {}…",
                f.name,
                &sha[..12],
                f.bytes,
                f.sha256.chars().take(12).collect::<String>()
            ));
        }
    }
    Ok(())
}

/// Resume from the newest checkpoint in `dir` that belongs to the run with
/// fingerprint `run`, whose files match their checksums and which `load`
/// accepts; returns its manifest. Each checkpoint passed over is named in a
/// warning on stderr with the reason: corrupt (manifest or checksums), from
/// a different run (the fields that differ), or failing to load (`load`'s
/// error; `load` must leave the model untouched when it fails). A version-1
/// manifest (no fingerprint) is accepted with a warning when its model,
/// batch size and world size match.
pub fn resume(
    dir: &Path,
    run: &Fingerprint,
    load: impl FnMut(&Manifest) -> Result<()>,
) -> Option<Manifest> {
    resume_matching(dir, run, false, load)
}

/// [`resume`] from an earlier run's directory: a checkpoint whose
/// fingerprint differs from `run`'s in the job UID alone belongs.
pub fn resume_earlier(
    dir: &Path,
    run: &Fingerprint,
    load: impl FnMut(&Manifest) -> Result<()>,
) -> Option<Manifest> {
    resume_matching(dir, run, true, load)
}

fn resume_matching(
    dir: &Path,
    run: &Fingerprint,
    any_uid: bool,
    mut load: impl FnMut(&Manifest) -> Result<()>,
) -> Option<Manifest> {
    for (step, path) in manifests(dir) {
        let m = match read_manifest(&path) {
            Ok(m) => m,
            Err(why) => {
                eprintln!(
                    "warning: skipping corrupt checkpoint {}: {why}",
                    path.display()
                );
                continue;
            }
        };
        let earlier;
        let run = match (&m.fingerprint, any_uid) {
            (Some(fp), true) => {
                earlier = Fingerprint {
                    job_uid: fp.job_uid.clone(),
                    ..run.clone()
                };
                &earlier
            }
            _ => run,
        };
        match m.belongs_to(run) {
            Belongs::Yes => {}
            Belongs::Unchecked => eprintln!(
                "warning: checkpoint at step {step} ({}) has no run fingerprint (manifest version {}): \
                 only its model, batch size and world size could be compared with this run's",
                path.display(),
                m.version
            ),
            Belongs::No(diff) => {
                let diff: Vec<String> = diff.iter().map(ToString::to_string).collect();
                eprintln!(
                    "warning: skipping checkpoint at step {step} ({}): it is from a different run: {} (checkpoint ≠ this run)",
                    path.display(),
                    diff.join(", ")
                );
                continue;
            }
        }
        if let Err(why) = check_files(dir, &m) {
            eprintln!(
                "warning: skipping corrupt checkpoint {}: {why}",
                path.display()
            );
            continue;
        }
        match load(&m) {
            Ok(()) => return Some(m),
            Err(e) => eprintln!(
                "warning: skipping checkpoint at step {step} ({}): loading it failed: {e}; trying an older one",
                path.display()
            ),
        }
    }
    None
}

/// Copy the tensors of each file into its targets by name (every name must
/// exist with the target's shape). Everything is read and checked before
/// the first copy, so on an error the targets are unchanged.
pub fn load_files(dir: &Path, files: &[(&FileEntry, &[(String, Tensor)])]) -> Result<()> {
    let mut staged = Vec::new();
    for (file, into) in files {
        let p = dir.join(&file.name);
        let loaded = Tensor::read_safetensors(&p)
            .map_err(|e| TrainerError::Checkpoint(format!("reading {}: {e}", p.display())))?;
        let mut map: std::collections::HashMap<String, Tensor> = loaded.into_iter().collect();
        for (name, t) in into.iter() {
            let src = map.remove(name).ok_or_else(|| {
                TrainerError::Checkpoint(format!("{} has no tensor {name}", p.display()))
            })?;
            if src.size() != t.size() {
                return Err(TrainerError::Checkpoint(format!(
                    "{name}: checkpoint shape {:?} differs from the model's {:?}",
                    src.size(),
                    t.size()
                )));
            }
            staged.push((name, t.shallow_clone(), src));
        }
    }
    let _guard = tch::no_grad_guard();
    for (name, mut dst, src) in staged {
        dst.f_copy_(&src)
            .map_err(|e| TrainerError::Checkpoint(format!("copying {name}: {e}")))?;
    }
    Ok(())
}

/// [`load_files`] for one file.
pub fn load_into(dir: &Path, file: &FileEntry, into: &[(String, Tensor)]) -> Result<()> {
    load_files(dir, &[(file, into)])
}

#[cfg(test)]
mod tests;
