//! Tensors in safetensors files, for any classification task:
//! `train.safetensors` and, when present, `eval.safetensors` (else the
//! tail `--eval-fraction` of the train file), each holding `x` (floating
//! point, `[N, ...]`) and `y` (int64 class ids, `[N]`). The classes are
//! `0..=max(y)` over both files.

use std::path::Path;

use tch::{Kind, Tensor};

use super::{with_eval, DataShape, Dataset};
use crate::error::{Result, TrainerError};

/// The train file's name.
pub const TRAIN: &str = "train.safetensors";
/// The optional held-out file's name.
pub const EVAL: &str = "eval.safetensors";

/// `x` as float32 and `y` from the safetensors file at `path`.
fn read(path: &Path) -> Result<(Tensor, Tensor)> {
    let bad = |m: String| TrainerError::Data(format!("{}: {m}", path.display()));
    let named = Tensor::read_safetensors(path)
        .map_err(|e| bad(format!("not a readable safetensors file: {e}")))?;
    let take = |key: &str| {
        named
            .iter()
            .find(|(n, _)| n == key)
            .map(|(_, t)| t.shallow_clone())
            .ok_or_else(|| {
                let keys: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
                bad(format!(
                    "no tensor {key:?} (it holds {keys:?}; expected \"x\" and \"y\")"
                ))
            })
    };
    let (x, y) = (take("x")?, take("y")?);
    if !matches!(
        x.kind(),
        Kind::Float | Kind::Double | Kind::Half | Kind::BFloat16
    ) {
        return Err(bad(format!(
            "x has dtype {:?}; it must be floating point (float32 is used)",
            x.kind()
        )));
    }
    if y.kind() != Kind::Int64 {
        return Err(bad(format!(
            "y has dtype {:?}; it must be int64 class ids",
            y.kind()
        )));
    }
    let (xs, ys) = (x.size(), y.size());
    if xs.is_empty() || ys.len() != 1 {
        return Err(bad(format!(
            "x must be [N, ...] and y [N], found x {xs:?} and y {ys:?}"
        )));
    }
    if xs.len() < 2 || xs[1..].contains(&0) {
        return Err(bad(format!(
            "x must be [N, ...] with samples of at least one dimension, none of size 0; found x {xs:?}"
        )));
    }
    if xs[0] != ys[0] {
        return Err(bad(format!(
            "x has {} samples but y has {} labels",
            xs[0], ys[0]
        )));
    }
    if ys[0] > 0 && y.min().int64_value(&[]) < 0 {
        return Err(bad("y holds a negative class id".into()));
    }
    Ok((x.to_kind(Kind::Float).contiguous(), y.contiguous()))
}

/// Most classes a dataset may have (the output layer has one unit each):
/// a stray huge class id would otherwise ask for a layer that cannot be
/// allocated.
pub const MAX_CLASSES: i64 = 1 << 20;

/// Load `train.safetensors` and optional `eval.safetensors` from `dir`.
pub fn load(dir: &Path, eval_fraction: f64) -> Result<Dataset> {
    let train = dir.join(TRAIN);
    if !train.is_file() {
        return Err(TrainerError::Data(format!(
            "{} has no {TRAIN} (with tensors x and y)",
            dir.display()
        )));
    }
    let (x, y) = read(&train)?;
    if x.size()[0] == 0 {
        return Err(TrainerError::Data(format!(
            "{} holds no samples",
            train.display()
        )));
    }
    let sample = x.size()[1..].to_vec();
    let eval_path = dir.join(EVAL);
    let eval = if eval_path.is_file() {
        let (ex, ey) = read(&eval_path)?;
        if ex.size()[1..] != sample[..] {
            return Err(TrainerError::Data(format!(
                "{} holds samples of shape {:?}, {} of shape {sample:?}",
                eval_path.display(),
                &ex.size()[1..],
                train.display()
            )));
        }
        Some((ex, ey))
    } else {
        None
    };
    let max_label = |t: &Tensor| {
        if t.numel() == 0 {
            -1
        } else {
            t.max().int64_value(&[])
        }
    };
    let classes = max_label(&y)
        .max(eval.as_ref().map_or(-1, |(_, ey)| max_label(ey)))
        .saturating_add(1);
    if classes < 2 {
        return Err(TrainerError::Data(format!(
            "{}: y has a single class; classification needs at least 2",
            train.display()
        )));
    }
    if classes > MAX_CLASSES {
        return Err(TrainerError::Data(format!(
            "{}: the largest class id in y is {}; at most {MAX_CLASSES} classes are supported (class ids must run from 0)",
            train.display(),
            classes - 1
        )));
    }
    let shape = DataShape::Tensors { sample, classes };
    Ok(Dataset::new(shape, with_eval(x, y, eval, eval_fraction)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(dir: &Path) -> String {
        match load(dir, 0.1) {
            Ok(_) => panic!("loaded"),
            Err(e) => e.to_string(),
        }
    }

    fn write(dir: &Path, name: &str, tensors: &[(&str, Tensor)]) {
        Tensor::write_safetensors(tensors, dir.join(name)).unwrap();
    }

    #[test]
    fn reads_x_and_y_with_and_without_an_eval_file() {
        let dir = tempfile::tempdir().unwrap();
        let x = Tensor::arange(40, (Kind::Float, tch::Device::Cpu)).view([10, 2, 2]);
        let y = Tensor::from_slice(&[0i64, 1, 2, 0, 1, 2, 0, 1, 2, 0]);
        write(dir.path(), TRAIN, &[("x", x.shallow_clone()), ("y", y)]);
        let d = load(dir.path(), 0.2).unwrap();
        assert_eq!(
            d.shape,
            DataShape::Tensors {
                sample: vec![2, 2],
                classes: 3
            }
        );
        assert_eq!((d.train_len(), d.eval_len()), (8, 2));
        let ex = x.narrow(0, 0, 3).to_kind(Kind::Double);
        write(
            dir.path(),
            EVAL,
            &[("x", ex), ("y", Tensor::from_slice(&[4i64, 0, 1]))],
        );
        let d = load(dir.path(), 0.2).unwrap();
        assert_eq!((d.train_len(), d.eval_len()), (10, 3));
        assert_eq!(d.eval_x.kind(), Kind::Float);
        assert_eq!(
            d.shape,
            DataShape::Tensors {
                sample: vec![2, 2],
                classes: 5
            }
        );
    }

    #[test]
    fn refuses_what_it_cannot_use() {
        let dir = tempfile::tempdir().unwrap();
        let e = refusal(dir.path());
        assert!(e.contains("has no train.safetensors"), "{e}");
        let x = Tensor::zeros([4, 3], (Kind::Float, tch::Device::Cpu));
        let y = Tensor::from_slice(&[0i64, 1, 0, 1]);
        let cases: Vec<(Vec<(&str, Tensor)>, &str)> = vec![
            (vec![("x", x.shallow_clone())], "no tensor \"y\""),
            (
                vec![("x", x.shallow_clone()), ("y", y.to_kind(Kind::Int))],
                "must be int64",
            ),
            (
                vec![("x", y.shallow_clone()), ("y", y.shallow_clone())],
                "must be floating point",
            ),
            (
                vec![("x", x.narrow(0, 0, 3)), ("y", y.shallow_clone())],
                "x has 3 samples but y has 4 labels",
            ),
            (
                vec![("x", x.shallow_clone()), ("y", y.view([2, 2]))],
                "x must be [N, ...] and y [N]",
            ),
            (
                vec![("x", x.shallow_clone()), ("y", &y - 1)],
                "negative class id",
            ),
            (
                vec![("x", x.select(1, 0).contiguous()), ("y", y.shallow_clone())],
                "samples of at least one dimension",
            ),
            (
                vec![("x", x.narrow(1, 0, 0)), ("y", y.shallow_clone())],
                "none of size 0",
            ),
            (
                vec![("x", x.shallow_clone()), ("y", &y * MAX_CLASSES)],
                "at most 1048576 classes",
            ),
        ];
        for (tensors, phrase) in cases {
            write(dir.path(), TRAIN, &tensors);
            let e = refusal(dir.path());
            assert!(e.contains(phrase), "expected {phrase:?} in {e}");
        }
        write(dir.path(), TRAIN, &[("x", x.shallow_clone()), ("y", y)]);
        write(
            dir.path(),
            EVAL,
            &[
                ("x", x.view([4, 3, 1])),
                ("y", Tensor::from_slice(&[0i64; 4])),
            ],
        );
        let e = refusal(dir.path());
        assert!(e.contains("of shape [3, 1]"), "{e}");
    }
}
