//! BatchNorm for heterogeneous data parallelism.
//!
//! `sync` (the default): in training, every layer normalises with the
//! statistics of the *global* batch. Each rank SUM-all-reduces its
//! per-channel sums (n·mean, centred sum of squares + n·mean²) and element
//! count through a differentiable
//! all-reduce (whose backward SUM-all-reduces the gradient), so autograd
//! produces the cross-rank backward terms (the global sums of dy and dy·x̂)
//! as well. Outputs, gradients and running statistics are those of one
//! process with batch B, whatever the split — a rank with one sample
//! included. `local`: PyTorch's per-rank BatchNorm (faster, split-dependent;
//! the trainer refuses local batches below 2 for it).
//!
//! Names match `tch::nn::batch_norm2d` (`weight`, `bias`, `running_mean`,
//! `running_var`), so checkpoints are interchangeable between modes.

use tch::nn::{self, ModuleT};
use tch::{Kind, Tensor};

use crate::c10d::GroupSlot;

/// A BatchNorm layer that synchronises its batch statistics through `slot`
/// when a group is bound and the mode is `sync`.
#[derive(Debug)]
pub struct HeteroBatchNorm {
    inner: nn::BatchNorm,
    eps: f64,
    momentum: f64,
    sync: Option<GroupSlot>,
}

/// A 2-d (N, C, H, W) BatchNorm; `sync` = None keeps statistics per rank.
pub fn batch_norm2d(p: nn::Path, channels: i64, sync: Option<GroupSlot>) -> HeteroBatchNorm {
    let cfg = nn::BatchNormConfig::default();
    let (eps, momentum) = (cfg.eps, cfg.momentum);
    HeteroBatchNorm {
        inner: nn::batch_norm2d(p, channels, cfg),
        eps,
        momentum,
        sync,
    }
}

impl HeteroBatchNorm {
    /// Training-mode forward over the global batch, or None when no group
    /// is bound (one process: the native kernel is the same maths).
    fn forward_global(&self, xs: &Tensor) -> Option<Tensor> {
        let slot = self.sync.as_ref()?;
        if !slot.is_bound() {
            return None;
        }
        let c = xs.size().get(1).copied().unwrap_or(1).max(1);
        let dims: Vec<i64> = (0..xs.dim() as i64).filter(|&d| d != 1).collect();
        let count = (xs.numel() as i64 / c) as f64;
        // Local mean and centred sum of squares in the input's precision
        // (one pass each, accurate), combined across ranks in double
        // (Chan et al.'s parallel variance): Σ n_r·m_r and
        // Σ (M2_r + n_r·m_r²), from which the global mean and variance.
        let (m, m2) = if count > 0.0 {
            let m = xs.mean_dim(dims.as_slice(), true, xs.kind());
            let m2 = (xs - &m)
                .square()
                .sum_dim_intlist(dims.as_slice(), false, xs.kind());
            (m.view([c]).to_kind(Kind::Double), m2.to_kind(Kind::Double))
        } else {
            let z = Tensor::zeros([c], (Kind::Double, xs.device()));
            (z.shallow_clone(), z)
        };
        let n = Tensor::from_slice(&[count]).to_device(xs.device());
        let packed = Tensor::cat(&[&m * count, m2 + m.square() * count, n], 0);
        let total = slot.all_reduce_sum_autograd(&packed)?;
        let n_all = total.double_value(&[2 * c]);
        let denom = n_all.max(1.0);
        let mean = total.narrow(0, 0, c) / denom;
        let var = (total.narrow(0, c, c) / denom - mean.square()).clamp_min(0.0);
        {
            let _guard = tch::no_grad_guard();
            let unbiased = if n_all > 1.0 {
                var.detach() * (n_all / (n_all - 1.0))
            } else {
                var.detach()
            };
            let m = self.momentum;
            let mut rm = self.inner.running_mean.shallow_clone();
            let mut rv = self.inner.running_var.shallow_clone();
            let _ = rm.g_mul_scalar_(1.0 - m);
            let _ = rm.g_add_(&(mean.detach() * m).to_kind(rm.kind()));
            let _ = rv.g_mul_scalar_(1.0 - m);
            let _ = rv.g_add_(&(unbiased * m).to_kind(rv.kind()));
        }
        let mut shape = vec![1i64; xs.dim()];
        if shape.len() > 1 {
            shape[1] = c;
        }
        let kind = xs.kind();
        let invstd = (var + self.eps).rsqrt();
        let scale = match &self.inner.ws {
            Some(w) => invstd * w.to_kind(Kind::Double),
            None => invstd,
        };
        let y = (xs - mean.to_kind(kind).view(shape.as_slice()))
            * scale.to_kind(kind).view(shape.as_slice());
        Some(match &self.inner.bs {
            Some(b) => y + b.view(shape.as_slice()),
            None => y,
        })
    }
}

impl ModuleT for HeteroBatchNorm {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        if train {
            if let Some(y) = self.forward_global(xs) {
                return y;
            }
        }
        self.inner.forward_t(xs, train)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::c10d::{ProcessGroup, RendezvousConfig};
    use tch::nn::VarStore;
    use tch::Device;

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b).abs().max().double_value(&[])
    }

    /// The all-reduced path over a group of one must be PyTorch's own
    /// BatchNorm: output, input and parameter gradients, running statistics.
    #[test]
    fn global_statistics_path_matches_pytorch_batch_norm() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("port");
        let pg = ProcessGroup::join(&RendezvousConfig {
            master_addr: "127.0.0.1".into(),
            master_port: port,
            rank: 0,
            world_size: 1,
            rendezvous_timeout: std::time::Duration::from_secs(20),
            collective_timeout: std::time::Duration::from_secs(20),
            bind_host: None,
            iface: None,
        })
        .expect("group of one");
        let slot = GroupSlot::default();
        let vs = VarStore::new(Device::Cpu);
        let bn = batch_norm2d(vs.root() / "bn", 3, Some(slot.clone()));
        let reference = VarStore::new(Device::Cpu);
        let plain = nn::batch_norm2d(reference.root() / "bn", 3, Default::default());
        tch::no_grad(|| {
            if let (Some(w), Some(pw)) = (&bn.inner.ws, &plain.ws) {
                pw.shallow_clone().copy_(&(w * 1.5 + 0.25));
                w.shallow_clone().copy_(&(w * 1.5 + 0.25));
            }
        });
        let _bound = slot.bind(&pg);
        assert!(slot.is_bound());
        let x =
            (Tensor::randn([5, 3, 4, 4], tch::kind::FLOAT_CPU) * 3.0 + 1.0).set_requires_grad(true);
        let x2 = x.detach().copy().set_requires_grad(true);
        let a = bn.forward_t(&x, true);
        let b = plain.forward_t(&x2, true);
        assert!(max_diff(&a, &b) < 1e-5, "outputs differ");
        let g = Tensor::randn([5, 3, 4, 4], tch::kind::FLOAT_CPU);
        (&a * &g).sum(tch::Kind::Float).backward();
        (&b * &g).sum(tch::Kind::Float).backward();
        assert!(
            max_diff(&x.grad(), &x2.grad()) < 1e-5,
            "input gradients differ"
        );
        let (w, pw) = (bn.inner.ws.as_ref().unwrap(), plain.ws.as_ref().unwrap());
        assert!(
            max_diff(&w.grad(), &pw.grad()) < 1e-4,
            "weight gradients differ"
        );
        assert!(max_diff(&bn.inner.running_var, &plain.running_var) < 1e-6);
        assert!(max_diff(&bn.inner.running_mean, &plain.running_mean) < 1e-6);
        assert!(
            max_diff(
                &bn.inner.running_var,
                &Tensor::ones([3], tch::kind::FLOAT_CPU)
            ) > 1e-3,
            "running statistics moved"
        );
        assert!(slot.take_error().is_none());
        // Evaluation uses the running statistics, like PyTorch's.
        let e = bn.forward_t(&x, false);
        assert!(max_diff(&e, &plain.forward_t(&x2, false)) < 1e-5);
    }
}
