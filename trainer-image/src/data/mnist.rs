//! MNIST-format IDX files: `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`
//! and, when present, `t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte` as the
//! eval split (else the tail `--eval-fraction` of the train files).

use std::path::Path;

use tch::Tensor;

use super::{normalize_u8, split_tail, DataShape, Dataset};
use crate::error::{Result, TrainerError};

/// Parse an IDX file of unsigned bytes: returns (dims, data).
pub fn parse_idx(bytes: &[u8], what: &str) -> Result<(Vec<usize>, Vec<u8>)> {
    let bad = |m: String| TrainerError::Data(format!("{what}: {m}"));
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad("not an IDX file (bad magic)".into()));
    }
    if bytes[2] != 0x08 {
        return Err(bad(format!(
            "element type 0x{:02x} is not unsigned byte",
            bytes[2]
        )));
    }
    let ndim = bytes[3] as usize;
    let header = 4 + 4 * ndim;
    if bytes.len() < header {
        return Err(bad("truncated header".into()));
    }
    let dims: Vec<usize> = (0..ndim)
        .map(|i| {
            let b = &bytes[4 + 4 * i..8 + 4 * i];
            u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
        })
        .collect();
    let count = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| bad(format!("dims {dims:?} overflow a byte count")))?;
    if Some(bytes.len()) != header.checked_add(count) {
        return Err(bad(format!(
            "expected {} data bytes for dims {:?}, found {}",
            count,
            dims,
            bytes.len() - header
        )));
    }
    Ok((dims, bytes[header..].to_vec()))
}

fn read(dir: &Path, name: &str) -> Result<Option<Vec<u8>>> {
    let p = dir.join(name);
    match std::fs::read(&p) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TrainerError::io(&p, e)),
    }
}

fn pair(dir: &Path, prefix: &str) -> Result<Option<(Tensor, Tensor, [i64; 2])>> {
    let img_name = format!("{prefix}-images-idx3-ubyte");
    let lbl_name = format!("{prefix}-labels-idx1-ubyte");
    let (Some(img), Some(lbl)) = (read(dir, &img_name)?, read(dir, &lbl_name)?) else {
        return Ok(None);
    };
    let (idims, ipix) = parse_idx(&img, &img_name)?;
    let (ldims, labels) = parse_idx(&lbl, &lbl_name)?;
    if idims.len() != 3 || ldims.len() != 1 || idims[0] != ldims[0] {
        return Err(TrainerError::Data(format!(
            "{img_name} dims {idims:?} do not match {lbl_name} dims {ldims:?}"
        )));
    }
    if let Some(&l) = labels.iter().find(|&&l| l > 9) {
        return Err(TrainerError::Data(format!(
            "{lbl_name}: label {l} is not a digit"
        )));
    }
    let (n, h, w) = (idims[0] as i64, idims[1] as i64, idims[2] as i64);
    let x = normalize_u8(
        &Tensor::from_slice(&ipix).view([n, 1, h, w]),
        &[0.1307],
        &[0.3081],
    );
    let y: Vec<i64> = labels.iter().map(|&l| i64::from(l)).collect();
    Ok(Some((x, Tensor::from_slice(&y), [h, w])))
}

/// Load MNIST IDX files from `dir`.
pub fn load(dir: &Path, eval_fraction: f64) -> Result<Dataset> {
    let (x, y, hw) = pair(dir, "train")?.ok_or_else(|| {
        TrainerError::Data(format!(
            "{} has no train-images-idx3-ubyte / train-labels-idx1-ubyte",
            dir.display()
        ))
    })?;
    let split = match pair(dir, "t10k")? {
        Some((ex, ey, ehw)) if ehw == hw => (x, y, ex, ey),
        Some(_) => {
            return Err(TrainerError::Data(
                "t10k images differ in size from the train images".into(),
            ))
        }
        None => split_tail(x, y, eval_fraction),
    };
    let shape = DataShape::Image {
        chw: [1, hw[0], hw[1]],
        classes: 10,
    };
    Ok(Dataset::new(shape, split))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_broken_idx() {
        assert!(parse_idx(b"garbage", "x").is_err());
        let mut ok = vec![0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3];
        assert_eq!(parse_idx(&ok, "x").unwrap(), (vec![3], vec![1, 2, 3]));
        ok.pop();
        let e = parse_idx(&ok, "x").unwrap_err().to_string();
        assert!(e.contains("expected 3 data bytes"), "{e}");
        // Dimensions whose product overflows: an error, not a panic.
        let mut huge = vec![0, 0, 8, 3];
        huge.extend([0xff_u8; 12]);
        let e = parse_idx(&huge, "x").unwrap_err().to_string();
        assert!(e.contains("overflow"), "{e}");
    }
}
