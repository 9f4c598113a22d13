//! Checkpoints: weights (safetensors, names = VarStore paths, loadable by
//! PyTorch), optimizer state (safetensors), and a JSON manifest with step,
//! sampler position, plan and SHA-256 of both files. Each file is written
//! to a temp name, fsynced and renamed; the manifest goes last, so a
//! checkpoint without a complete manifest and matching checksums is skipped.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use heterotrain_crds::BatchPlan;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tch::Tensor;

use crate::error::{Result, TrainerError};
use crate::sampler::SamplerPosition;

/// Checkpoints kept on disk (older ones are removed).
pub const KEEP: usize = 3;

/// A file of a checkpoint and its checksum.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FileEntry {
    pub name: String,
    pub bytes: u64,
    pub sha256: String,
}

/// The manifest `ckpt-<step>.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub version: u32,
    /// Global steps completed.
    pub step: u64,
    /// Where the sampler continues (its RNG is a pure function of seed and epoch).
    pub position: SamplerPosition,
    pub seed: u64,
    pub shuffle: bool,
    pub optimizer_steps: u64,
    pub plan: BatchPlan,
    pub model: String,
    pub weights: FileEntry,
    pub optimizer: FileEntry,
}

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
    pub weights: &'a [(String, Tensor)],
    pub optimizer: &'a [(String, Tensor)],
}

/// Write a checkpoint into `dir` and prune old ones; returns the manifest path.
pub fn save(dir: &Path, s: &Snapshot<'_>) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| TrainerError::io(dir, e))?;
    let st = stem(s.step);
    let weights = write_tensors(dir, &format!("{st}.model.safetensors"), s.weights)?;
    let optimizer = write_tensors(dir, &format!("{st}.optim.safetensors"), s.optimizer)?;
    let m = Manifest {
        version: 1,
        step: s.step,
        position: s.position,
        seed: s.seed,
        shuffle: s.shuffle,
        optimizer_steps: s.optimizer_steps,
        plan: s.plan.clone(),
        model: s.model.to_string(),
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
    prune(dir, KEEP);
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

fn prune(dir: &Path, keep: usize) {
    for (step, path) in manifests(dir).into_iter().skip(keep) {
        let _ = std::fs::remove_file(&path);
        let st = stem(step);
        let _ = std::fs::remove_file(dir.join(format!("{st}.model.safetensors")));
        let _ = std::fs::remove_file(dir.join(format!("{st}.optim.safetensors")));
    }
}

fn check(dir: &Path, path: &Path) -> Result<Manifest, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let m: Manifest = serde_json::from_str(&text).map_err(|e| format!("bad manifest: {e}"))?;
    for f in [&m.weights, &m.optimizer] {
        let p = dir.join(&f.name);
        let (bytes, sha) = sha256_file(&p).map_err(|e| e.to_string())?;
        if bytes != f.bytes || sha != f.sha256 {
            return Err(format!(
                "{} has {bytes} bytes / sha256 {}…, manifest says {} bytes / {}…",
                f.name,
                &sha[..12],
                f.bytes,
                &f.sha256[..f.sha256.len().min(12)]
            ));
        }
    }
    Ok(m)
}

/// The newest checkpoint whose files match their checksums; corrupt ones
/// are skipped with a warning.
pub fn newest_valid(dir: &Path) -> Option<Manifest> {
    for (_, path) in manifests(dir) {
        match check(dir, &path) {
            Ok(m) => return Some(m),
            Err(why) => eprintln!(
                "warning: skipping corrupt checkpoint {}: {why}",
                path.display()
            ),
        }
    }
    None
}

/// Copy the tensors of `file` into `into` by name (every name must exist).
pub fn load_into(dir: &Path, file: &FileEntry, into: &[(String, Tensor)]) -> Result<()> {
    let p = dir.join(&file.name);
    let loaded = Tensor::read_safetensors(&p)
        .map_err(|e| TrainerError::Checkpoint(format!("reading {}: {e}", p.display())))?;
    let map: std::collections::HashMap<String, Tensor> = loaded.into_iter().collect();
    let _guard = tch::no_grad_guard();
    for (name, t) in into {
        let src = map.get(name).ok_or_else(|| {
            TrainerError::Checkpoint(format!("{} has no tensor {name}", p.display()))
        })?;
        if src.size() != t.size() {
            return Err(TrainerError::Checkpoint(format!(
                "{name}: checkpoint shape {:?} differs from the model's {:?}",
                src.size(),
                t.size()
            )));
        }
        let mut dst = t.shallow_clone();
        dst.copy_(src);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_valid_skips_a_truncated_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let plan = BatchPlan::equal(0, 8, 2);
        let w = vec![("fc.weight".to_string(), Tensor::from_slice(&[1.0f32, 2.0]))];
        let o = vec![(
            "momentum.fc.weight".to_string(),
            Tensor::from_slice(&[0.5f32, 0.5]),
        )];
        for step in [5, 10, 15, 20] {
            let s = Snapshot {
                step,
                position: SamplerPosition {
                    epoch: 0,
                    step_in_epoch: step,
                },
                seed: 1,
                shuffle: true,
                optimizer_steps: step,
                plan: &plan,
                model: "mlp",
                weights: &w,
                optimizer: &o,
            };
            save(dir.path(), &s).unwrap();
        }
        assert_eq!(manifests(dir.path()).len(), KEEP, "old checkpoints pruned");
        assert_eq!(newest_valid(dir.path()).unwrap().step, 20);
        let newest = dir.path().join("ckpt-0000000020.model.safetensors");
        let len = std::fs::metadata(&newest).unwrap().len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&newest)
            .unwrap();
        f.set_len(len / 2).unwrap();
        let m = newest_valid(dir.path()).unwrap();
        assert_eq!(m.step, 15);
        let target = vec![(
            "fc.weight".to_string(),
            Tensor::zeros([2], tch::kind::FLOAT_CPU),
        )];
        load_into(dir.path(), &m.weights, &target).unwrap();
        assert_eq!(target[0].1.double_value(&[1]), 2.0);
    }
}
