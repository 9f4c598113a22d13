//! Synthetic datasets, deterministic by seed: class-prototype images
//! (3×32×32, 10 classes) and token sequences from a noisy affine recurrence.

use tch::Tensor;

use super::{split_tail, DataShape, Dataset};
use crate::sampler::SplitMix64;

/// `n` images of 10 classes: a per-class prototype plus Gaussian noise.
pub fn images(n: usize, seed: u64, eval_fraction: f64) -> Dataset {
    let (c, h, w, classes) = (3usize, 32usize, 32usize, 10usize);
    let d = c * h * w;
    let mut rng = SplitMix64::new(seed ^ 0x1A6E);
    let protos: Vec<f32> = (0..classes * d).map(|_| rng.normal() as f32).collect();
    let mut xs = vec![0f32; n * d];
    let mut ys = vec![0i64; n];
    for i in 0..n {
        let label = rng.below(classes as u64) as usize;
        ys[i] = label as i64;
        let p = &protos[label * d..(label + 1) * d];
        for (k, v) in xs[i * d..(i + 1) * d].iter_mut().enumerate() {
            *v = 0.05 * p[k] + rng.normal() as f32;
        }
    }
    let x = Tensor::from_slice(&xs).view([n as i64, c as i64, h as i64, w as i64]);
    let y = Tensor::from_slice(&ys);
    let shape = DataShape::Image {
        chw: [c as i64, h as i64, w as i64],
        classes: classes as i64,
    };
    Dataset::new(shape, split_tail(x, y, eval_fraction))
}

/// `n` sequences of `context + 1` tokens: t' = (5t + 3 + noise) mod vocab,
/// noise ∈ {0, 1} with probability 1/8 — learnable but not trivial.
pub fn text(n: usize, context: i64, vocab: i64, seed: u64, eval_fraction: f64) -> Dataset {
    let len = context as usize + 1;
    let v = vocab as u64;
    let mut rng = SplitMix64::new(seed ^ 0x7E47);
    let mut toks = vec![0i64; n * len];
    for i in 0..n {
        let mut t = rng.below(v);
        for j in 0..len {
            toks[i * len + j] = t as i64;
            let noise = u64::from(rng.below(8) == 0);
            t = (5 * t + 3 + noise) % v;
        }
    }
    let all = Tensor::from_slice(&toks).view([n as i64, len as i64]);
    let x = all.narrow(1, 0, context).contiguous();
    let y = all.narrow(1, 1, context).contiguous();
    Dataset::new(
        DataShape::Text { context, vocab },
        split_tail(x, y, eval_fraction),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_deterministic_by_seed() {
        let a = images(64, 1, 0.25);
        let b = images(64, 1, 0.25);
        let c = images(64, 2, 0.25);
        assert_eq!(a.train_len(), 48);
        assert_eq!(a.eval_len(), 16);
        assert_eq!(a.train_x.size(), vec![48, 3, 32, 32]);
        assert!(a.train_x.equal(&b.train_x));
        assert!(!a.train_x.equal(&c.train_x));
    }

    #[test]
    fn text_targets_are_inputs_shifted() {
        let d = text(10, 16, 50, 3, 0.0);
        assert_eq!(d.train_x.size(), vec![10, 16]);
        let shifted = d.train_x.narrow(1, 1, 15);
        assert!(shifted.equal(&d.train_y.narrow(1, 0, 15)));
        assert!(d.train_x.max().int64_value(&[]) < 50);
    }
}
