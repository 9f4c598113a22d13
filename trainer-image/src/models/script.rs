//! Your own model: a TorchScript module (`torch.jit.save`) that maps a
//! batch of inputs to class logits. Its parameters are registered in the
//! VarStore under their module names (`fc1.weight`, `net.0.bias`), so the
//! flat buffer, the Reducer, the sharded optimizer and the checkpoints treat
//! them like a built-in model's.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};
use tch::nn;
use tch::{CModule, Device, Kind, Tensor};

use crate::error::{Result, TrainerError};

/// A loaded TorchScript module and the mode (train or eval) it is in.
pub struct Scripted {
    module: Mutex<(CModule, Option<bool>)>,
    path: PathBuf,
    /// First 16 hex digits of the SHA-256 of the file (the checkpoint
    /// fingerprint's record of which model this is).
    pub digest: String,
}

impl std::fmt::Debug for Scripted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scripted")
            .field("path", &self.path)
            .field("digest", &self.digest)
            .finish()
    }
}

/// An error about the module at `path`; libtorch's part shrunk to one line.
fn error(path: &Path, what: &str, e: impl std::fmt::Display) -> TrainerError {
    TrainerError::Config(format!(
        "--model-file {}: {what}: {}",
        path.display(),
        one_line(&e.to_string())
    ))
}

impl Scripted {
    /// Load the module at `path` onto `p`'s device and register each of its
    /// parameters in `p`'s VarStore under the parameter's own dotted name.
    pub fn load(p: &nn::Path, path: &Path) -> Result<Scripted> {
        let bytes = std::fs::read(path).map_err(|e| error(path, "cannot read it", e))?;
        let digest: String = Sha256::digest(&bytes)
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect();
        let module =
            CModule::load_data_on_device(&mut bytes.as_slice(), p.device()).map_err(|e| {
                error(
                    path,
                    "not a TorchScript module (save it with torch.jit.save)",
                    e,
                )
            })?;
        let named = module
            .named_parameters()
            .map_err(|e| error(path, "cannot list its parameters", e))?;
        if named.is_empty() {
            return Err(error(path, "the module", "has no parameters to train"));
        }
        for (name, t) in named {
            let parts: Vec<&str> = name.split('.').collect();
            let Some((leaf, prefix)) = parts.split_last() else {
                continue;
            };
            if parts.iter().any(|s| s.is_empty()) {
                return Err(error(
                    path,
                    "parameter name",
                    format!("{name:?} is not usable"),
                ));
            }
            let sub = prefix.iter().fold(p.clone(), |q, s| q.sub(*s));
            let trainable = t.requires_grad();
            let _ = sub.add(leaf, t, trainable);
        }
        Ok(Scripted {
            module: Mutex::new((module, None)),
            path: path.to_path_buf(),
            digest,
        })
    }

    /// The module's output for `x`, in training mode or not (dropout and
    /// the like follow the module's own `self.training`).
    pub fn forward(&self, x: &Tensor, train: bool) -> Result<Tensor> {
        let mut guard = self
            .module
            .lock()
            .map_err(|_| error(&self.path, "forward", "the module's lock is poisoned"))?;
        let (module, mode) = &mut *guard;
        if *mode != Some(train) {
            if train {
                module.f_set_train()
            } else {
                module.f_set_eval()
            }
            .map_err(|e| error(&self.path, "cannot switch mode", e))?;
            *mode = Some(train);
        }
        module
            .forward_ts(&[x])
            .map_err(|e| error(&self.path, "forward failed", e))
    }

    /// Check that the module maps a batch of two samples of `sample`'s
    /// shape to logits `[2, C]` with `C ≥ classes`.
    pub fn check_output(&self, sample: &[i64], classes: i64, device: Device) -> Result<()> {
        let _guard = tch::no_grad_guard();
        let mut dims = vec![2];
        dims.extend_from_slice(sample);
        let out = self.forward(
            &Tensor::zeros(dims.as_slice(), (Kind::Float, device)),
            false,
        )?;
        let size = out.size();
        if size.len() != 2 || size[0] != 2 || size[1] < classes {
            return Err(error(
                &self.path,
                "wrong output",
                format!(
                    "a batch of shape {dims:?} gives {size:?}; the model must return logits [batch, classes] with at least {classes} classes"
                ),
            ));
        }
        Ok(())
    }

    /// Write the module, with its current (trained) parameters, to `path`
    /// as TorchScript, on the CPU (written to a temporary file, then renamed).
    pub fn save(&self, path: &Path, kind: Kind) -> Result<()> {
        let mut guard = self
            .module
            .lock()
            .map_err(|_| error(&self.path, "save", "the module's lock is poisoned"))?;
        let (module, mode) = &mut *guard;
        module
            .f_set_eval()
            .map_err(|e| error(&self.path, "cannot switch mode", e))?;
        *mode = Some(false);
        module.to(Device::Cpu, kind, false);
        let tmp = path.with_extension("pt.tmp");
        module
            .save(&tmp)
            .map_err(|e| error(path, "cannot write the module", e))?;
        std::fs::rename(&tmp, path).map_err(|e| TrainerError::io(path, e))
    }
}

/// The gist of a libtorch error, on one line: the TorchScript
/// interpreter's closing `RuntimeError: ...` line when there is one (its
/// message starts with a traceback), else the first line (the rest is a
/// C++ backtrace).
fn one_line(s: &str) -> String {
    let s = s.trim_start_matches("Internal torch error: ");
    let lines = || s.lines().map(str::trim).filter(|l| !l.is_empty());
    lines()
        .rfind(|l| l.contains("Error: "))
        .or_else(|| lines().next())
        .unwrap_or(s)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn torch_errors_shrink_to_their_gist() {
        let interp = "Internal torch error: The following operation failed in the TorchScript interpreter.\nTraceback of TorchScript (most recent call last):\n  File \"code/x.py\", line 14\n    return torch.linear(input, weight, bias)\nRuntimeError: mat1 and mat2 shapes cannot be multiplied (24x6 and 5x4)\n";
        assert_eq!(
            one_line(interp),
            "RuntimeError: mat1 and mat2 shapes cannot be multiplied (24x6 and 5x4)"
        );
        let plain = "Internal torch error: PytorchStreamReader failed reading zip archive\nException raised from valid at x.cc:242\nframe #0: c10::Error::Error";
        assert_eq!(
            one_line(plain),
            "PytorchStreamReader failed reading zip archive"
        );
    }
}
