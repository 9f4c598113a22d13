//! Datasets held in memory as tensors: synthetic images and text
//! (deterministic by seed), CIFAR-10 and CIFAR-100 binary files, MNIST IDX
//! files, flat uint16 token files (nanoGPT's `train.bin`/`val.bin`), and
//! tensors `x`/`y` in safetensors files.

pub mod cifar;
pub mod mnist;
pub mod prefetch;
pub mod synthetic;
pub mod tensors;
pub mod tokens;

use tch::{Device, Kind, Tensor};

use crate::cli::{DataArgs, DatasetName, TrainerArgs};
use crate::error::{Result, TrainerError};

/// What the model sees and predicts.
#[derive(Clone, Debug, PartialEq)]
pub enum DataShape {
    /// Images `[C, H, W]` with `classes` labels.
    Image { chw: [i64; 3], classes: i64 },
    /// Token sequences of `context` tokens over `vocab`; targets are the
    /// inputs shifted by one.
    Text { context: i64, vocab: i64 },
    /// Samples of any shape `sample` (a float tensor each) with `classes`
    /// labels.
    Tensors { sample: Vec<i64>, classes: i64 },
}

impl DataShape {
    /// One sample's shape and the number of classes (none for text).
    pub fn sample_and_classes(&self) -> Option<(Vec<i64>, i64)> {
        match self {
            DataShape::Image { chw, classes } => Some((chw.to_vec(), *classes)),
            DataShape::Tensors { sample, classes } => Some((sample.clone(), *classes)),
            DataShape::Text { .. } => None,
        }
    }

    /// `[C, H, W]` and the number of classes, for images and for tensor
    /// samples of three dimensions.
    pub fn as_image(&self) -> Option<([i64; 3], i64)> {
        match self.sample_and_classes()? {
            (s, classes) if s.len() == 3 => Some(([s[0], s[1], s[2]], classes)),
            _ => None,
        }
    }
}

/// A train split and a held-out eval split.
pub struct Dataset {
    pub shape: DataShape,
    pub train_x: Tensor,
    pub train_y: Tensor,
    pub eval_x: Tensor,
    pub eval_y: Tensor,
}

/// Training inputs and labels, then held-out inputs and labels.
pub type Split = (Tensor, Tensor, Tensor, Tensor);

impl Dataset {
    /// A dataset of `shape` from its training and held-out parts.
    pub fn new(shape: DataShape, (train_x, train_y, eval_x, eval_y): Split) -> Dataset {
        Dataset {
            shape,
            train_x,
            train_y,
            eval_x,
            eval_y,
        }
    }

    pub fn train_len(&self) -> usize {
        self.train_x.size()[0] as usize
    }

    pub fn eval_len(&self) -> usize {
        self.eval_x.size()[0] as usize
    }

    /// Rows `idx` of the train split, on `device`.
    pub fn train_batch(&self, idx: &[usize], device: Device) -> (Tensor, Tensor) {
        gather(&self.train_x, &self.train_y, idx, device)
    }

    /// Rows `idx` of the eval split, on `device`.
    pub fn eval_batch(&self, idx: &[usize], device: Device) -> (Tensor, Tensor) {
        gather(&self.eval_x, &self.eval_y, idx, device)
    }
}

fn gather(x: &Tensor, y: &Tensor, idx: &[usize], device: Device) -> (Tensor, Tensor) {
    let i: Vec<i64> = idx.iter().map(|&v| v as i64).collect();
    let i = Tensor::from_slice(&i);
    (
        x.index_select(0, &i).to_device(device),
        y.index_select(0, &i).to_device(device),
    )
}

/// The dataset's own held-out split when it has one, else the last
/// `fraction` of the train rows (see [`split_tail`]).
pub fn with_eval(x: Tensor, y: Tensor, eval: Option<(Tensor, Tensor)>, fraction: f64) -> Split {
    match eval {
        Some((ex, ey)) => (x, y, ex, ey),
        None => split_tail(x, y, fraction),
    }
}

/// Split the last `fraction` of rows off as the eval split.
pub fn split_tail(x: Tensor, y: Tensor, fraction: f64) -> Split {
    let n = x.size()[0];
    let n_eval = ((n as f64) * fraction).round() as i64;
    let n_train = n - n_eval;
    (
        x.narrow(0, 0, n_train),
        y.narrow(0, 0, n_train),
        x.narrow(0, n_train, n_eval),
        y.narrow(0, n_train, n_eval),
    )
}

/// Normalise u8 images `[N, C, H, W]` per channel to float.
pub fn normalize_u8(images: &Tensor, mean: &[f64], std: &[f64]) -> Tensor {
    let c = mean.len() as i64;
    let m = Tensor::from_slice(mean)
        .to_kind(Kind::Float)
        .view([1, c, 1, 1]);
    let s = Tensor::from_slice(std)
        .to_kind(Kind::Float)
        .view([1, c, 1, 1]);
    (images.to_kind(Kind::Float) / 255.0 - m) / s
}

/// What the token and synthetic readers need beyond the data group: the
/// model's text shape and the run's seed.
#[derive(Clone, Copy, Debug)]
pub struct Needs {
    /// Tokens per sample (`--context`).
    pub context: i64,
    /// Vocabulary size (`--vocab`).
    pub vocab: i64,
    /// Seed of the synthetic generators.
    pub seed: u64,
    /// The global batch B: the train split must hold at least one.
    pub global_batch: u32,
}

impl Needs {
    /// The needs of the run `cfg` describes.
    pub fn of(cfg: &TrainerArgs) -> Needs {
        Needs {
            context: cfg.model.context,
            vocab: cfg.model.vocab,
            seed: cfg.optim.seed,
            global_batch: cfg.optim.batch_size,
        }
    }
}

/// Why a generated dataset is too large to hold in memory, if it is.
fn synthetic_over_limit(data: &DataArgs, needs: &Needs) -> Option<String> {
    let context = u64::try_from(needs.context.max(0)).unwrap_or(0);
    let n = data.synthetic_samples as u64;
    let limit = heterotrain_crds::MAX_SYNTHETIC_BYTES;
    match data.dataset.synthetic_bytes(n, context) {
        None if !data.dataset.from_files() => Some(format!(
            "--synthetic-samples {n}: the {} dataset's size overflows; use fewer samples",
            data.dataset.as_str()
        )),
        Some(b) if b > limit => Some(format!(
            "--synthetic-samples {n}: the {} dataset would take {:.1} GiB of memory, over the {} GiB limit; use fewer samples",
            data.dataset.as_str(),
            b as f64 / f64::from(1u32 << 30),
            limit >> 30
        )),
        _ => None,
    }
}

/// Load the dataset the data group names.
pub fn load(data: &DataArgs, needs: Needs) -> Result<Dataset> {
    let dir = || {
        data.data_dir
            .clone()
            .ok_or_else(|| TrainerError::Config("--data-dir is required".into()))
    };
    if let Some(limit) = synthetic_over_limit(data, &needs) {
        return Err(TrainerError::Config(limit));
    }
    let ds = match data.dataset {
        DatasetName::SyntheticImage => {
            synthetic::images(data.synthetic_samples, needs.seed, data.eval_fraction)
        }
        DatasetName::SyntheticText => synthetic::text(
            data.synthetic_samples,
            needs.context,
            needs.vocab,
            needs.seed,
            data.eval_fraction,
        ),
        DatasetName::Cifar10 => cifar::load(&dir()?, data.eval_fraction)?,
        DatasetName::Mnist => mnist::load(&dir()?, data.eval_fraction)?,
        DatasetName::Cifar100 => cifar::load_cifar100(&dir()?, data.eval_fraction)?,
        DatasetName::Tokens => {
            tokens::load(&dir()?, needs.context, needs.vocab, data.eval_fraction)?
        }
        DatasetName::Tensors => tensors::load(&dir()?, data.eval_fraction)?,
    };
    if ds.train_len() < needs.global_batch as usize {
        return Err(TrainerError::Data(format!(
            "the train split has {} samples, fewer than one global batch of {}",
            ds.train_len(),
            needs.global_batch
        )));
    }
    Ok(ds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::train_args as cfg;

    #[test]
    fn a_generated_dataset_too_large_for_memory_is_an_error_before_allocating() {
        let over = |args: &[&str]| {
            let c = cfg(args);
            synthetic_over_limit(&c.data, &Needs::of(&c))
        };
        assert_eq!(over(&["--dataset", "synthetic_image"]), None);
        // 1e8 images of 3×32×32 floats: about 1.1 TiB.
        let e = load(
            &cfg(&[
                "--dataset",
                "synthetic_image",
                "--synthetic-samples",
                "100000000",
            ])
            .data,
            Needs::of(&cfg(&[])),
        )
        .err()
        .expect("an error, not an allocation");
        assert!(e.to_string().contains("over the 8 GiB limit"), "{e}");
        // Text: samples × (context + 1) × 8 bytes, just under and just over.
        let n = (MAX_SYNTHETIC_LIMIT_SAMPLES_TEXT).to_string();
        assert_eq!(
            over(&[
                "--dataset",
                "synthetic_text",
                "--context",
                "1023",
                "--synthetic-samples",
                &n
            ]),
            None
        );
        let n1 = (MAX_SYNTHETIC_LIMIT_SAMPLES_TEXT + 1).to_string();
        assert!(over(&[
            "--dataset",
            "synthetic_text",
            "--context",
            "1023",
            "--synthetic-samples",
            &n1
        ])
        .is_some());
        // File datasets are not generated: no limit here.
        assert_eq!(
            over(&[
                "--dataset",
                "cifar10",
                "--synthetic-samples",
                "100000000000"
            ]),
            None
        );
    }

    /// Sequences of 1,024 int64 tokens that fit in the limit.
    const MAX_SYNTHETIC_LIMIT_SAMPLES_TEXT: u64 =
        heterotrain_crds::MAX_SYNTHETIC_BYTES / (1024 * 8);
}
