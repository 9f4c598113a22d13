//! Token files in nanoGPT's layout: `train.bin` and, optionally, `val.bin`,
//! each a flat array of little-endian `u16` token ids.
//!
//! Samples are non-overlapping windows: sample `i` is tokens
//! `[i·context, i·context + context]` (`context + 1` tokens), its input the
//! first `context` and its targets the last `context`, so consecutive
//! samples share one boundary token and every token after the first is a
//! target exactly once. A file of `n` tokens gives `⌊(n − 1) / context⌋`
//! samples (a short tail is dropped); the sampler's indices are these window
//! numbers. Without `val.bin` the tail `--eval-fraction` of the windows of
//! `train.bin` is held out.
//!
//! The vocabulary is `--vocab` (default 256, bytes); every token must be
//! below it.

use std::path::Path;

use tch::{Kind, Tensor};

use super::{with_eval, DataShape, Dataset};
use crate::error::{Result, TrainerError};

/// Parse a flat little-endian `u16` token file, checking every token is
/// below `vocab`.
pub fn parse(bytes: &[u8], vocab: i64, what: &str) -> Result<Vec<i64>> {
    if bytes.len() % 2 != 0 {
        return Err(TrainerError::Data(format!(
            "{what}: {} bytes is an odd size; a token file holds little-endian uint16 tokens (2 bytes each)",
            bytes.len()
        )));
    }
    let tokens: Vec<i64> = bytes
        .chunks_exact(2)
        .map(|b| i64::from(u16::from_le_bytes([b[0], b[1]])))
        .collect();
    if let Some(i) = tokens.iter().position(|&t| t >= vocab) {
        let max = tokens.iter().copied().max().unwrap_or(0);
        return Err(TrainerError::Data(format!(
            "{what}: token {} at position {i} is outside the vocabulary of {vocab}; the largest token is {max}, so set --vocab to at least {}",
            tokens[i],
            max + 1
        )));
    }
    Ok(tokens)
}

/// Inputs and targets `[N, context]` of the non-overlapping windows of `tokens`.
pub fn windows(tokens: &[i64], context: i64, what: &str) -> Result<(Tensor, Tensor)> {
    let need = context as usize + 1;
    if context < 1 || tokens.len() < need {
        return Err(TrainerError::Data(format!(
            "{what}: {} tokens is too short for one sample of --context {context} (needs {need})",
            tokens.len()
        )));
    }
    let n = (tokens.len() - 1) / context as usize;
    let used = n * context as usize + 1;
    let all = Tensor::from_slice(&tokens[..used]).to_kind(Kind::Int64);
    // [n, context + 1] windows with stride `context`.
    let w = all.unfold(0, context + 1, context);
    let x = w.narrow(1, 0, context).contiguous();
    let y = w.narrow(1, 1, context).contiguous();
    Ok((x, y))
}

fn read(dir: &Path, name: &str, context: i64, vocab: i64) -> Result<Option<(Tensor, Tensor)>> {
    let p = dir.join(name);
    let bytes = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(TrainerError::io(&p, e)),
    };
    let what = p.display().to_string();
    let tokens = parse(&bytes, vocab, &what)?;
    windows(&tokens, context, &what).map(Some)
}

/// Load `train.bin` (and `val.bin` when present) from `dir`.
pub fn load(dir: &Path, context: i64, vocab: i64, eval_fraction: f64) -> Result<Dataset> {
    let (x, y) = read(dir, "train.bin", context, vocab)?.ok_or_else(|| {
        TrainerError::Data(format!(
            "{} has no train.bin (flat little-endian uint16 tokens)",
            dir.display()
        ))
    })?;
    let split = with_eval(x, y, read(dir, "val.bin", context, vocab)?, eval_fraction);
    Ok(Dataset::new(DataShape::Text { context, vocab }, split))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_tokens(path: &Path, tokens: &[u16]) {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        std::fs::write(path, bytes).unwrap();
    }

    #[test]
    fn windows_are_non_overlapping_and_targets_shifted() {
        let dir = tempfile::tempdir().unwrap();
        // 0..=40: 41 tokens → 10 windows of context 4 (tokens 0..=40 all used).
        let train: Vec<u16> = (0..=40).collect();
        write_tokens(&dir.path().join("train.bin"), &train);
        // 300 and above need a vocabulary past 256.
        write_tokens(&dir.path().join("val.bin"), &[300, 301, 302, 303, 304, 305]);
        let d = load(dir.path(), 4, 512, 0.1).unwrap();
        assert_eq!(
            d.shape,
            DataShape::Text {
                context: 4,
                vocab: 512
            }
        );
        assert_eq!((d.train_len(), d.eval_len()), (10, 1));
        assert_eq!(d.train_x.size(), vec![10, 4]);
        assert_eq!(d.train_x.kind(), Kind::Int64);
        let row = |t: &Tensor, i: i64| Vec::<i64>::try_from(t.get(i)).unwrap();
        assert_eq!(row(&d.train_x, 0), vec![0, 1, 2, 3]);
        assert_eq!(row(&d.train_y, 0), vec![1, 2, 3, 4]);
        assert_eq!(row(&d.train_x, 9), vec![36, 37, 38, 39]);
        assert_eq!(row(&d.train_y, 9), vec![37, 38, 39, 40]);
        // val.bin: 6 tokens, one window; token 305 is a dropped tail.
        assert_eq!(row(&d.eval_x, 0), vec![300, 301, 302, 303]);
        assert_eq!(row(&d.eval_y, 0), vec![301, 302, 303, 304]);
        // A batch of chosen windows, as the sampler asks for them.
        let (x, _) = d.train_batch(&[3, 1], tch::Device::Cpu);
        assert_eq!(row(&x, 0), vec![12, 13, 14, 15]);
        assert_eq!(row(&x, 1), vec![4, 5, 6, 7]);
    }

    #[test]
    fn without_val_bin_the_tail_is_held_out() {
        let dir = tempfile::tempdir().unwrap();
        let train: Vec<u16> = (0..=80).map(|i| i % 256).collect();
        write_tokens(&dir.path().join("train.bin"), &train);
        let d = load(dir.path(), 8, 256, 0.2).unwrap();
        assert_eq!((d.train_len(), d.eval_len()), (8, 2));
        assert_eq!(d.eval_x.int64_value(&[0, 0]), 64);
    }

    #[test]
    fn refuses_missing_short_odd_and_out_of_vocab_files() {
        let dir = tempfile::tempdir().unwrap();
        let err = |context: i64, vocab: i64| {
            load(dir.path(), context, vocab, 0.1)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        assert!(err(4, 256).contains("has no train.bin"), "{}", err(4, 256));
        std::fs::write(dir.path().join("train.bin"), [1u8, 0, 2]).unwrap();
        assert!(
            err(4, 256).contains("3 bytes is an odd size"),
            "{}",
            err(4, 256)
        );
        write_tokens(&dir.path().join("train.bin"), &[1, 2, 3, 4]);
        let e = err(4, 256);
        assert!(
            e.contains("4 tokens is too short") && e.contains("needs 5"),
            "{e}"
        );
        write_tokens(&dir.path().join("train.bin"), &[1, 2, 3, 700, 5, 900]);
        let e = err(4, 256);
        assert!(
            e.contains("token 700 at position 3") && e.contains("--vocab to at least 901"),
            "{e}"
        );
        assert!(load(dir.path(), 4, 901, 0.1).is_ok());
        write_tokens(&dir.path().join("train.bin"), &[1, 2, 3, 4, 5]);
        assert!(load(dir.path(), 4, 256, 0.1).is_ok());
        write_tokens(&dir.path().join("val.bin"), &[1, 2]);
        let e = err(4, 256);
        assert!(e.contains("val.bin") && e.contains("too short"), "{e}");
    }
}
