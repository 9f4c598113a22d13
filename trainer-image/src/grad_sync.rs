//! Gradient all-reduce in a few large flattened buckets. Each rank's loss
//! is already weighted by b_r / B (see `train`), so the SUM over ranks is
//! the gradient of the mean loss over the whole global batch.

use tch::{Device, Kind, Tensor};

use crate::c10d::ProcessGroup;
use crate::error::Result;

/// Parameter indices grouped into buckets of about `cap_bytes`.
#[derive(Debug, Clone)]
pub struct GradBuckets {
    buckets: Vec<Vec<usize>>,
}

impl GradBuckets {
    pub fn new(params: &[Tensor], cap_bytes: usize) -> Self {
        let mut buckets = vec![Vec::new()];
        let mut bytes = 0usize;
        for (i, p) in params.iter().enumerate() {
            let b = p.numel() * p.kind().elt_size_in_bytes();
            if bytes > 0 && bytes + b > cap_bytes {
                buckets.push(Vec::new());
                bytes = 0;
            }
            if let Some(last) = buckets.last_mut() {
                last.push(i);
            }
            bytes += b;
        }
        GradBuckets { buckets }
    }

    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// SUM-all-reduce every gradient (and `extra`, appended to the last
    /// bucket), write them back; returns the summed `extra`. `control` (a
    /// small int64 CPU tensor, see `control.rs`) is SUM-reduced in place
    /// beside the buckets, started first and waited with them.
    pub fn all_reduce(
        &self,
        pg: Option<&ProcessGroup>,
        params: &[Tensor],
        extra: &[f64],
        control: Option<&mut Tensor>,
    ) -> Result<Vec<f64>> {
        let _guard = tch::no_grad_guard();
        let Some(pg) = pg else {
            return Ok(extra.to_vec());
        };
        let mut flats = Vec::with_capacity(self.buckets.len());
        let mut pending = Vec::with_capacity(self.buckets.len());
        for (bi, idx) in self.buckets.iter().enumerate() {
            let mut parts: Vec<Tensor> = idx
                .iter()
                .map(|&i| {
                    let g = params[i].grad();
                    if g.defined() {
                        g.reshape([-1])
                    } else {
                        params[i].zeros_like().reshape([-1])
                    }
                })
                .collect();
            if bi + 1 == self.buckets.len() && !extra.is_empty() {
                let dev = parts.first().map(|t| t.device()).unwrap_or(Device::Cpu);
                let kind = parts.first().map(|t| t.kind()).unwrap_or(Kind::Float);
                parts.push(Tensor::from_slice(extra).to_kind(kind).to_device(dev));
            }
            let mut flat = Tensor::cat(&parts, 0);
            if pg.needs_staging(&flat) {
                flat = flat.to_device(Device::Cpu);
            }
            flats.push(flat);
        }
        // Start every bucket, then wait: Gloo works on its own threads.
        if let Some(word) = control {
            pending.push(pg.all_reduce_sum_async(word)?);
        }
        for flat in flats.iter_mut() {
            pending.push(pg.all_reduce_sum_async(flat)?);
        }
        for w in pending {
            w.wait()?;
        }
        let mut out = Vec::new();
        for (bi, (idx, flat)) in self.buckets.iter().zip(&flats).enumerate() {
            let mut off = 0i64;
            for &i in idx {
                let n = params[i].numel() as i64;
                let mut g = params[i].grad();
                let src = flat.narrow(0, off, n);
                if g.defined() {
                    g.copy_(&src.view_as(&g));
                }
                off += n;
            }
            if bi + 1 == self.buckets.len() && !extra.is_empty() {
                let tail = flat
                    .narrow(0, off, extra.len() as i64)
                    .to_kind(Kind::Double);
                out = Vec::<f64>::try_from(&tail).unwrap_or_default();
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_respect_the_cap() {
        let ps: Vec<Tensor> = [10, 10, 30, 5]
            .iter()
            .map(|&n| Tensor::zeros([n], tch::kind::FLOAT_CPU))
            .collect();
        let b = GradBuckets::new(&ps, 80);
        assert_eq!(b.buckets, vec![vec![0, 1], vec![2], vec![3]]);
        let one = GradBuckets::new(&ps, 1 << 20);
        assert_eq!(one.len(), 1);
    }
}
