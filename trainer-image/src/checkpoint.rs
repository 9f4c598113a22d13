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

use std::fmt;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use heterotrain_crds::BatchPlan;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tch::Tensor;

use crate::cli::{ModelKind, TrainConfig};
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

/// What a run's meaning depends on: a checkpoint is resumed only by a run
/// with the same fingerprint. Shape flags a model does not use are `None`,
/// so changing them does not orphan its checkpoints.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Fingerprint {
    /// `--model` (snake_case name).
    pub model: String,
    /// `--hidden` (mlp, simple_cnn, gpt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden: Option<i64>,
    /// `--resnet-width` (resnet18, resnet50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resnet_width: Option<i64>,
    /// `--layers` (gpt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<i64>,
    /// `--heads` (gpt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<i64>,
    /// `--context` (gpt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<i64>,
    /// `--vocab` (gpt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab: Option<i64>,
    /// Global batch B (`--batch-size`).
    pub batch_size: u32,
    /// `--dataset` (snake_case name).
    pub dataset: String,
    /// Samples in the train split.
    pub train_samples: u64,
    /// `--optimizer` (snake_case name).
    pub optimizer: String,
    /// `WORLD_SIZE`.
    pub world_size: u64,
    /// The HeteroTrainingJob's UID (`--job-uid`, set by the operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_uid: Option<String>,
}

/// A clap/serde enum's snake_case name.
fn enum_name<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

impl Fingerprint {
    /// The fingerprint of a run configured by `cfg` whose train split has
    /// `train_samples` samples.
    pub fn of(cfg: &TrainConfig, train_samples: usize) -> Fingerprint {
        let (hidden, gpt) = match cfg.model {
            ModelKind::Mlp | ModelKind::SimpleCnn => (true, false),
            ModelKind::Resnet18 | ModelKind::Resnet50 => (false, false),
            ModelKind::Gpt => (true, true),
        };
        let gpt_flag = |v: i64| gpt.then_some(v);
        Fingerprint {
            model: enum_name(&cfg.model),
            hidden: hidden.then_some(cfg.hidden),
            resnet_width: cfg.model.has_batch_norm().then_some(cfg.resnet_width),
            layers: gpt_flag(cfg.layers),
            heads: gpt_flag(cfg.heads),
            context: gpt_flag(cfg.context),
            vocab: gpt_flag(cfg.vocab),
            batch_size: cfg.batch_size,
            dataset: enum_name(&cfg.dataset),
            train_samples: train_samples as u64,
            optimizer: enum_name(&cfg.optimizer),
            world_size: cfg.world_size as u64,
            job_uid: cfg.job_uid.clone().filter(|u| !u.is_empty()),
        }
    }

    /// First 16 hex digits of the SHA-256 of the fingerprint's JSON (for
    /// logs and a quick look; comparisons use the fields).
    pub fn hash(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_default();
        Sha256::digest(json.as_bytes())
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// Fields of a checkpoint's fingerprint (`self`) that differ from the
    /// run's, in a fixed order; empty when they match.
    pub fn differences(&self, run: &Fingerprint) -> Vec<Difference> {
        fn opt<T: ToString>(v: &Option<T>) -> String {
            v.as_ref().map_or_else(|| "none".into(), T::to_string)
        }
        let mut out = Vec::new();
        let mut cmp = |field: &'static str, ckpt: String, now: String| {
            if ckpt != now {
                out.push(Difference {
                    field,
                    checkpoint: ckpt,
                    run: now,
                });
            }
        };
        cmp("model", self.model.clone(), run.model.clone());
        cmp("hidden width", opt(&self.hidden), opt(&run.hidden));
        cmp(
            "resnet width",
            opt(&self.resnet_width),
            opt(&run.resnet_width),
        );
        cmp("layers", opt(&self.layers), opt(&run.layers));
        cmp("heads", opt(&self.heads), opt(&run.heads));
        cmp("context", opt(&self.context), opt(&run.context));
        cmp("vocab", opt(&self.vocab), opt(&run.vocab));
        cmp(
            "batch size",
            self.batch_size.to_string(),
            run.batch_size.to_string(),
        );
        cmp("dataset", self.dataset.clone(), run.dataset.clone());
        cmp(
            "train samples",
            self.train_samples.to_string(),
            run.train_samples.to_string(),
        );
        cmp("optimizer", self.optimizer.clone(), run.optimizer.clone());
        cmp(
            "world size",
            self.world_size.to_string(),
            run.world_size.to_string(),
        );
        cmp("job UID", opt(&self.job_uid), opt(&run.job_uid));
        out
    }
}

/// One field in which a checkpoint differs from the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    pub field: &'static str,
    /// The checkpoint's value.
    pub checkpoint: String,
    /// This run's value.
    pub run: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ≠ {}", self.field, self.checkpoint, self.run)
    }
}

/// Whether a checkpoint belongs to the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Belongs {
    /// Same fingerprint.
    Yes,
    /// A version-1 manifest without a fingerprint whose model, batch size
    /// and world size (from its plan) match: accepted, the other fields
    /// cannot be checked (weights still have to load into the model).
    Unchecked,
    /// Differs in these fields.
    No(Vec<Difference>),
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
    /// The run this checkpoint belongs to (absent in version 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<Fingerprint>,
    /// [`Fingerprint::hash`] of `fingerprint`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint_hash: Option<String>,
    pub weights: FileEntry,
    pub optimizer: FileEntry,
}

impl Manifest {
    /// Whether this checkpoint belongs to a run with fingerprint `run`.
    pub fn belongs_to(&self, run: &Fingerprint) -> Belongs {
        if let Some(fp) = &self.fingerprint {
            let d = fp.differences(run);
            return if d.is_empty() {
                Belongs::Yes
            } else {
                Belongs::No(d)
            };
        }
        // Version 1: what the manifest does record.
        let legacy = Fingerprint {
            model: self.model.clone(),
            batch_size: self.plan.global_batch_size,
            world_size: self.plan.batch_sizes.len() as u64,
            ..run.clone()
        };
        let d = legacy.differences(run);
        if d.is_empty() {
            Belongs::Unchecked
        } else {
            Belongs::No(d)
        }
    }
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

/// Both files of `m` match their sizes and checksums.
fn check_files(dir: &Path, m: &Manifest) -> Result<(), String> {
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
mod tests {
    use super::*;
    use clap::Parser;

    fn cfg(args: &[&str]) -> TrainConfig {
        let mut v = vec!["x", "train"];
        v.extend_from_slice(args);
        match crate::cli::Cli::parse_from(v).command {
            crate::cli::Command::Train(c) | crate::cli::Command::Profile(c) => *c,
        }
    }

    fn fp(args: &[&str]) -> Fingerprint {
        Fingerprint::of(&cfg(args), 1000)
    }

    fn weights(v: f32) -> Vec<(String, Tensor)> {
        vec![("fc.weight".to_string(), Tensor::from_slice(&[v, 2.0]))]
    }

    fn momentum() -> Vec<(String, Tensor)> {
        vec![(
            "momentum.fc.weight".to_string(),
            Tensor::from_slice(&[0.5f32, 0.5]),
        )]
    }

    /// Save a checkpoint at `step` whose first weight is `step` (plan B = 8, 2 ranks).
    fn save_at(dir: &Path, step: u64, fingerprint: &Fingerprint) {
        let plan = BatchPlan::equal(0, 8, 2);
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
            fingerprint,
            weights: &weights(step as f32),
            optimizer: &momentum(),
        };
        save(dir, &s).unwrap();
    }

    fn target() -> Vec<(String, Tensor)> {
        vec![(
            "fc.weight".to_string(),
            Tensor::zeros([2], tch::kind::FLOAT_CPU),
        )]
    }

    /// Resume with `run`, loading into `t`; the resumed step.
    fn resume_step(dir: &Path, run: &Fingerprint, t: &[(String, Tensor)]) -> Option<u64> {
        resume(dir, run, |m| load_into(dir, &m.weights, t)).map(|m| m.step)
    }

    fn steps_on_disk(dir: &Path) -> Vec<u64> {
        manifests(dir).into_iter().map(|(s, _)| s).collect()
    }

    #[test]
    fn fingerprint_records_the_runs_meaning() {
        let f = fp(&[
            "--model",
            "gpt",
            "--dataset",
            "synthetic_text",
            "--hidden",
            "64",
            "--layers",
            "3",
            "--heads",
            "8",
            "--context",
            "32",
            "--vocab",
            "100",
            "--batch-size",
            "48",
            "--optimizer",
            "adamw",
            "--world-size",
            "4",
            "--job-uid",
            "6f1c2a9e",
        ]);
        let want = Fingerprint {
            model: "gpt".into(),
            hidden: Some(64),
            resnet_width: None,
            layers: Some(3),
            heads: Some(8),
            context: Some(32),
            vocab: Some(100),
            batch_size: 48,
            dataset: "synthetic_text".into(),
            train_samples: 1000,
            optimizer: "adamw".into(),
            world_size: 4,
            job_uid: Some("6f1c2a9e".into()),
        };
        assert_eq!(f, want);
        // Readable JSON with camelCase names; round trip.
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(v["batchSize"], 48);
        assert_eq!(v["jobUid"], "6f1c2a9e");
        assert_eq!(serde_json::from_value::<Fingerprint>(v).unwrap(), f);
        assert_eq!(f.hash().len(), 16);
        assert_ne!(f.hash(), fp(&[]).hash());
    }

    #[test]
    fn flags_a_model_does_not_use_are_not_part_of_it() {
        let a = fp(&["--model", "mlp", "--hidden", "32", "--layers", "2"]);
        let b = fp(&["--model", "mlp", "--hidden", "32", "--layers", "7"]);
        assert_eq!(a, b);
        assert_eq!(a.layers, None);
        let r1 = fp(&["--model", "resnet18", "--hidden", "32"]);
        let r2 = fp(&["--model", "resnet18", "--hidden", "64"]);
        assert!(r1.differences(&r2).is_empty());
        assert_eq!(r1.hidden, None);
        // An empty UID (unset env in a template) is no UID.
        assert_eq!(fp(&["--job-uid", ""]).job_uid, None);
    }

    #[test]
    fn differences_name_each_changed_field() {
        let base = fp(&["--batch-size", "32"]);
        assert!(base.differences(&base.clone()).is_empty());

        let d = base.differences(&fp(&["--batch-size", "64"]));
        assert_eq!(
            d,
            [Difference {
                field: "batch size",
                checkpoint: "32".into(),
                run: "64".into()
            }]
        );
        assert_eq!(d[0].to_string(), "batch size 32 ≠ 64");

        let other = fp(&[
            "--batch-size",
            "32",
            "--hidden",
            "48",
            "--optimizer",
            "adamw",
            "--world-size",
            "2",
            "--job-uid",
            "abc",
        ]);
        let fields: Vec<&str> = base.differences(&other).iter().map(|d| d.field).collect();
        assert_eq!(
            fields,
            ["hidden width", "optimizer", "world size", "job UID"]
        );
        let uid = base.differences(&other).pop().unwrap();
        assert_eq!(uid.to_string(), "job UID none ≠ abc");

        let mut data = base.clone();
        data.train_samples = 999;
        data.dataset = "mnist".into();
        let fields: Vec<&str> = data.differences(&base).iter().map(|d| d.field).collect();
        assert_eq!(fields, ["dataset", "train samples"]);

        let gpt = fp(&[
            "--model",
            "gpt",
            "--dataset",
            "synthetic_text",
            "--batch-size",
            "32",
        ]);
        let fields: Vec<&str> = base.differences(&gpt).iter().map(|d| d.field).collect();
        assert_eq!(
            fields,
            ["model", "layers", "heads", "context", "vocab", "dataset"]
        );
    }

    #[test]
    fn version_1_manifests_are_checked_by_what_they_record() {
        let v1 = serde_json::json!({
            "version": 1,
            "step": 40,
            "position": {"epoch": 0, "step_in_epoch": 40},
            "seed": 0,
            "shuffle": true,
            "optimizerSteps": 40,
            "plan": BatchPlan::equal(3, 64, 2),
            "model": "mlp",
            "weights": {"name": "w", "bytes": 1, "sha256": "00"},
            "optimizer": {"name": "o", "bytes": 1, "sha256": "00"},
        });
        let m: Manifest = serde_json::from_value(v1).unwrap();
        assert_eq!(m.fingerprint, None);
        let run = fp(&["--batch-size", "64", "--world-size", "2"]);
        assert_eq!(m.belongs_to(&run), Belongs::Unchecked);
        let Belongs::No(d) = m.belongs_to(&fp(&["--batch-size", "32", "--world-size", "2"])) else {
            panic!("batch size differs")
        };
        assert_eq!(d[0].to_string(), "batch size 64 ≠ 32");
        let Belongs::No(d) = m.belongs_to(&fp(&[
            "--model",
            "simple_cnn",
            "--batch-size",
            "64",
            "--world-size",
            "3",
        ])) else {
            panic!("model and world size differ")
        };
        let fields: Vec<&str> = d.iter().map(|d| d.field).collect();
        assert_eq!(fields, ["model", "world size"]);
    }

    #[test]
    fn resume_skips_a_truncated_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let run = fp(&[]);
        for step in [5, 10, 15, 20] {
            save_at(dir.path(), step, &run);
        }
        assert_eq!(steps_on_disk(dir.path()), [20, 15, 10], "old ones pruned");
        let newest = dir.path().join("ckpt-0000000020.model.safetensors");
        let len = std::fs::metadata(&newest).unwrap().len();
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&newest)
            .unwrap();
        f.set_len(len / 2).unwrap();
        let t = target();
        assert_eq!(resume_step(dir.path(), &run, &t), Some(15));
        assert_eq!(t[0].1.double_value(&[0]), 15.0);
        assert_eq!(t[0].1.double_value(&[1]), 2.0);
    }

    #[test]
    fn resume_skips_other_runs_and_pruning_leaves_them_alone() {
        let dir = tempfile::tempdir().unwrap();
        let old = fp(&["--batch-size", "32"]);
        let run = fp(&["--batch-size", "64"]);
        for step in [30, 35, 40] {
            save_at(dir.path(), step, &old);
        }
        let t = target();
        assert_eq!(resume_step(dir.path(), &run, &t), None);
        assert_eq!(t[0].1.double_value(&[0]), 0.0, "nothing loaded");
        // The new run's checkpoints (lower steps) are kept and counted on
        // their own; the other run's stay.
        for step in [5, 10, 15, 20] {
            save_at(dir.path(), step, &run);
        }
        assert_eq!(steps_on_disk(dir.path()), [40, 35, 30, 20, 15, 10]);
        assert_eq!(resume_step(dir.path(), &run, &t), Some(20));
        assert_eq!(resume_step(dir.path(), &old, &t), Some(40));
        assert_eq!(t[0].1.double_value(&[0]), 40.0);
    }

    #[test]
    fn resume_falls_back_when_loading_fails() {
        let dir = tempfile::tempdir().unwrap();
        let run = fp(&[]);
        for step in [10, 15, 20] {
            save_at(dir.path(), step, &run);
        }
        // Step 20: the weights have another shape (checksums fixed up, so
        // only loading can notice).
        let st = stem(20);
        let wrong = vec![(
            "fc.weight".to_string(),
            Tensor::from_slice(&[9.0f32, 9.0, 9.0]),
        )];
        let entry = write_tensors(dir.path(), &format!("{st}.model.safetensors"), &wrong).unwrap();
        let mpath = dir.path().join(format!("{st}.json"));
        let mut m = read_manifest(&mpath).unwrap();
        m.weights = entry;
        std::fs::write(&mpath, serde_json::to_string(&m).unwrap()).unwrap();
        // Step 15: not safetensors at all (checksums fixed up too).
        let st = stem(15);
        let garbage = dir.path().join(format!("{st}.model.safetensors"));
        std::fs::write(&garbage, b"not a safetensors file").unwrap();
        let (bytes, sha256) = sha256_file(&garbage).unwrap();
        let mpath = dir.path().join(format!("{st}.json"));
        let mut m = read_manifest(&mpath).unwrap();
        m.weights.bytes = bytes;
        m.weights.sha256 = sha256;
        std::fs::write(&mpath, serde_json::to_string(&m).unwrap()).unwrap();

        let t = target();
        let mut tried = Vec::new();
        let got = resume(dir.path(), &run, |m| {
            tried.push(m.step);
            load_into(dir.path(), &m.weights, &t)
        });
        assert_eq!(got.map(|m| m.step), Some(10));
        assert_eq!(tried, [20, 15, 10]);
        assert_eq!(t[0].1.double_value(&[0]), 10.0);
    }

    #[test]
    fn a_failed_load_leaves_the_targets_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let run = fp(&[]);
        save_at(dir.path(), 5, &run);
        let m = read_manifest(&dir.path().join("ckpt-0000000005.json")).unwrap();
        let w = target();
        // The optimizer file lacks this tensor: the weights (first file)
        // must not be copied either.
        let o = vec![(
            "exp_avg.fc.weight".to_string(),
            Tensor::zeros([2], tch::kind::FLOAT_CPU),
        )];
        let err = load_files(dir.path(), &[(&m.weights, &w), (&m.optimizer, &o)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no tensor exp_avg.fc.weight"), "{err}");
        assert_eq!(w[0].1.double_value(&[0]), 0.0);
        let o = vec![(
            "momentum.fc.weight".to_string(),
            Tensor::zeros([2], tch::kind::FLOAT_CPU),
        )];
        load_files(dir.path(), &[(&m.weights, &w), (&m.optimizer, &o)]).unwrap();
        assert_eq!(w[0].1.double_value(&[0]), 5.0);
        assert_eq!(o[0].1.double_value(&[0]), 0.5);
    }
}
