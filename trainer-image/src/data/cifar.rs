//! CIFAR binary formats. CIFAR-10: `data_batch_*.bin` for training and
//! `test_batch.bin` for evaluation, records of 1 label byte + 3072 pixels.
//! CIFAR-100: `train.bin` and `test.bin`, records of 1 coarse label byte,
//! 1 fine label byte + 3072 pixels; we train on the 100 fine labels. Pixels
//! are the R, G and B planes of a 32×32 image, row-major.

use std::path::Path;

use tch::Tensor;

use super::{normalize_u8, with_eval, DataShape, Dataset};
use crate::error::{Result, TrainerError};

const PIXELS: usize = 3 * 32 * 32;

/// One of the two CIFAR binary layouts.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    name: &'static str,
    /// Label bytes before the pixels of each record.
    label_bytes: usize,
    /// Which of them is the label trained on.
    label_index: usize,
    classes: u8,
    mean: [f64; 3],
    std: [f64; 3],
}

/// (name, label bytes, label index, classes, channel mean, channel std).
type FormatRow = (&'static str, usize, usize, u8, [f64; 3], [f64; 3]);

const fn format((name, label_bytes, label_index, classes, mean, std): FormatRow) -> Format {
    Format {
        name,
        label_bytes,
        label_index,
        classes,
        mean,
        std,
    }
}

#[rustfmt::skip]
pub const CIFAR10: Format = format(("CIFAR-10", 1, 0, 10, [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]));
#[rustfmt::skip]
pub const CIFAR100: Format = format(("CIFAR-100", 2, 1, 100, [0.5071, 0.4865, 0.4409], [0.2673, 0.2564, 0.2762]));

impl Format {
    fn record(&self) -> usize {
        self.label_bytes + PIXELS
    }
}

/// Parse concatenated CIFAR-10 binary records.
pub fn parse_records(bytes: &[u8], what: &str) -> Result<(Tensor, Tensor)> {
    parse(CIFAR10, bytes, what)
}

/// Parse concatenated records of `format`.
pub fn parse(format: Format, bytes: &[u8], what: &str) -> Result<(Tensor, Tensor)> {
    let record = format.record();
    if bytes.is_empty() || bytes.len() % record != 0 {
        return Err(TrainerError::Data(format!(
            "{what}: {} bytes is not a whole number of {record}-byte {} records",
            bytes.len(),
            format.name
        )));
    }
    let n = bytes.len() / record;
    let mut labels = Vec::with_capacity(n);
    let mut pix = Vec::with_capacity(n * PIXELS);
    for (i, rec) in bytes.chunks_exact(record).enumerate() {
        let label = rec[format.label_index];
        if label >= format.classes {
            return Err(TrainerError::Data(format!(
                "{what}: record {i}: label {label} out of range for {} classes",
                format.classes
            )));
        }
        labels.push(i64::from(label));
        pix.extend_from_slice(&rec[format.label_bytes..]);
    }
    let x = normalize_u8(
        &Tensor::from_slice(&pix).view([n as i64, 3, 32, 32]),
        &format.mean,
        &format.std,
    );
    Ok((x, Tensor::from_slice(&labels)))
}

fn read_file(format: Format, p: &Path) -> Result<(Tensor, Tensor)> {
    let b = std::fs::read(p).map_err(|e| TrainerError::io(p, e))?;
    parse(format, &b, &p.display().to_string())
}

fn dataset(format: Format, train: (Tensor, Tensor), eval: (Tensor, Tensor)) -> Dataset {
    let shape = DataShape::Image {
        chw: [3, 32, 32],
        classes: i64::from(format.classes),
    };
    Dataset::new(shape, (train.0, train.1, eval.0, eval.1))
}

/// Load CIFAR-10 from `dir`.
pub fn load(dir: &Path, eval_fraction: f64) -> Result<Dataset> {
    let mut train = Vec::new();
    for i in 1..=5 {
        let p = dir.join(format!("data_batch_{i}.bin"));
        if p.exists() {
            train.push(read_file(CIFAR10, &p)?);
        }
    }
    if train.is_empty() {
        return Err(TrainerError::Data(format!(
            "{} has no data_batch_*.bin files",
            dir.display()
        )));
    }
    let x = Tensor::cat(&train.iter().map(|t| &t.0).collect::<Vec<_>>(), 0);
    let y = Tensor::cat(&train.iter().map(|t| &t.1).collect::<Vec<_>>(), 0);
    with_test_file(CIFAR10, (x, y), &dir.join("test_batch.bin"), eval_fraction)
}

/// Load CIFAR-100 (`train.bin`, and `test.bin` as the eval split when
/// present, else the tail `eval_fraction` of `train.bin`) from `dir`.
pub fn load_cifar100(dir: &Path, eval_fraction: f64) -> Result<Dataset> {
    let train = dir.join("train.bin");
    if !train.exists() {
        return Err(TrainerError::Data(format!(
            "{} has no train.bin (CIFAR-100 binary version)",
            dir.display()
        )));
    }
    let (x, y) = read_file(CIFAR100, &train)?;
    with_test_file(CIFAR100, (x, y), &dir.join("test.bin"), eval_fraction)
}

/// The dataset of the training images `train`, evaluated on the file
/// `test` when it exists, else on the tail `eval_fraction` of `train`.
fn with_test_file(
    format: Format,
    train: (Tensor, Tensor),
    test: &Path,
    eval_fraction: f64,
) -> Result<Dataset> {
    let eval = test.exists().then(|| read_file(format, test)).transpose()?;
    let (train_x, train_y, eval_x, eval_y) = with_eval(train.0, train.1, eval, eval_fraction);
    Ok(dataset(format, (train_x, train_y), (eval_x, eval_y)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_generated_batch() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = Vec::new();
        for i in 0..20u8 {
            bytes.push(i % 10);
            bytes.extend(std::iter::repeat_n(i * 10, PIXELS));
        }
        std::fs::write(dir.path().join("data_batch_1.bin"), &bytes).unwrap();
        let record = CIFAR10.record();
        std::fs::write(dir.path().join("test_batch.bin"), &bytes[..record * 4]).unwrap();
        let d = load(dir.path(), 0.1).unwrap();
        assert_eq!(d.train_len(), 20);
        assert_eq!(d.eval_len(), 4);
        assert_eq!(d.train_y.int64_value(&[13]), 3);
        // pixel 130/255 on channel 0, normalised
        let v = d.train_x.double_value(&[13, 0, 5, 5]);
        assert!((v - (130.0 / 255.0 - 0.4914) / 0.2470).abs() < 1e-5, "{v}");
        std::fs::write(dir.path().join("data_batch_2.bin"), [1u8; 10]).unwrap();
        let e = load(dir.path(), 0.1).err().unwrap().to_string();
        assert!(e.contains("CIFAR-10 records"), "{e}");
    }

    /// A CIFAR-100 record: coarse label, fine label, then R, G, B planes
    /// with pixel `v` everywhere in plane `c` set to `v + c`.
    fn record100(coarse: u8, fine: u8, v: u8) -> Vec<u8> {
        let mut r = vec![coarse, fine];
        for c in 0..3u8 {
            r.extend(std::iter::repeat_n(v.wrapping_add(c), 1024));
        }
        r
    }

    #[test]
    fn reads_cifar100_fine_labels() {
        let dir = tempfile::tempdir().unwrap();
        let train: Vec<u8> = (0..30u8)
            .flat_map(|i| record100(i % 20, (i * 3) % 100, i * 8))
            .collect();
        let test: Vec<u8> = (0..5u8).flat_map(|i| record100(1, 99 - i, 200)).collect();
        std::fs::write(dir.path().join("train.bin"), &train).unwrap();
        std::fs::write(dir.path().join("test.bin"), &test).unwrap();
        let d = load_cifar100(dir.path(), 0.1).unwrap();
        assert_eq!(
            d.shape,
            DataShape::Image {
                chw: [3, 32, 32],
                classes: 100
            }
        );
        assert_eq!((d.train_len(), d.eval_len()), (30, 5));
        assert_eq!(d.train_x.size(), vec![30, 3, 32, 32]);
        // The fine label (second byte), not the coarse one.
        assert_eq!(d.train_y.int64_value(&[7]), 21);
        assert_eq!(d.eval_y.int64_value(&[4]), 95);
        // Record 7's planes hold 56, 57, 58: the green plane, normalised.
        let g = d.train_x.double_value(&[7, 1, 31, 0]);
        assert!((g - (57.0 / 255.0 - 0.4865) / 0.2564).abs() < 1e-5, "{g}");

        // Without test.bin: the tail of train.bin is held out.
        std::fs::remove_file(dir.path().join("test.bin")).unwrap();
        let d = load_cifar100(dir.path(), 0.2).unwrap();
        assert_eq!((d.train_len(), d.eval_len()), (24, 6));
        // Record 24 has fine label 24 · 3 = 72.
        assert_eq!(d.eval_y.int64_value(&[0]), 72);
    }

    #[test]
    fn refuses_broken_cifar100() {
        let dir = tempfile::tempdir().unwrap();
        let e = load_cifar100(dir.path(), 0.1)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("no train.bin"), "{e}");
        // A CIFAR-10-sized record is one byte short of a CIFAR-100 one.
        std::fs::write(dir.path().join("train.bin"), vec![0u8; 3073 * 2]).unwrap();
        let e = load_cifar100(dir.path(), 0.1)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("3074-byte CIFAR-100 records"), "{e}");
        let mut bad = record100(0, 5, 0);
        bad.extend(record100(0, 100, 0));
        std::fs::write(dir.path().join("train.bin"), &bad).unwrap();
        let e = load_cifar100(dir.path(), 0.1)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("record 1: label 100 out of range"), "{e}");
    }
}
