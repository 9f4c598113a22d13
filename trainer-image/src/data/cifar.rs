//! CIFAR-10 binary batches: `data_batch_*.bin` for training and
//! `test_batch.bin` for evaluation (records of 1 label byte + 3072 pixels).

use std::path::Path;

use tch::Tensor;

use super::{normalize_u8, split_tail, DataShape, Dataset};
use crate::error::{Result, TrainerError};

const RECORD: usize = 1 + 3 * 32 * 32;
const MEAN: [f64; 3] = [0.4914, 0.4822, 0.4465];
const STD: [f64; 3] = [0.2470, 0.2435, 0.2616];

/// Parse concatenated CIFAR-10 binary records.
pub fn parse_records(bytes: &[u8], what: &str) -> Result<(Tensor, Tensor)> {
    if bytes.is_empty() || bytes.len() % RECORD != 0 {
        return Err(TrainerError::Data(format!(
            "{what}: {} bytes is not a whole number of {RECORD}-byte CIFAR-10 records",
            bytes.len()
        )));
    }
    let n = bytes.len() / RECORD;
    let mut labels = Vec::with_capacity(n);
    let mut pix = Vec::with_capacity(n * (RECORD - 1));
    for rec in bytes.chunks_exact(RECORD) {
        if rec[0] > 9 {
            return Err(TrainerError::Data(format!(
                "{what}: label {} out of range",
                rec[0]
            )));
        }
        labels.push(i64::from(rec[0]));
        pix.extend_from_slice(&rec[1..]);
    }
    let x = normalize_u8(
        &Tensor::from_slice(&pix).view([n as i64, 3, 32, 32]),
        &MEAN,
        &STD,
    );
    Ok((x, Tensor::from_slice(&labels)))
}

fn read_file(p: &Path) -> Result<(Tensor, Tensor)> {
    let b = std::fs::read(p).map_err(|e| TrainerError::io(p, e))?;
    parse_records(&b, &p.display().to_string())
}

/// Load CIFAR-10 from `dir`.
pub fn load(dir: &Path, eval_fraction: f64) -> Result<Dataset> {
    let mut train = Vec::new();
    for i in 1..=5 {
        let p = dir.join(format!("data_batch_{i}.bin"));
        if p.exists() {
            train.push(read_file(&p)?);
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
    let test = dir.join("test_batch.bin");
    let (train_x, train_y, eval_x, eval_y) = if test.exists() {
        let (ex, ey) = read_file(&test)?;
        (x, y, ex, ey)
    } else {
        split_tail(x, y, eval_fraction)
    };
    Ok(Dataset {
        shape: DataShape::Image {
            chw: [3, 32, 32],
            classes: 10,
        },
        train_x,
        train_y,
        eval_x,
        eval_y,
    })
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
            bytes.extend(std::iter::repeat_n(i * 10, RECORD - 1));
        }
        std::fs::write(dir.path().join("data_batch_1.bin"), &bytes).unwrap();
        std::fs::write(dir.path().join("test_batch.bin"), &bytes[..RECORD * 4]).unwrap();
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
}
