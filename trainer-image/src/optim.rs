//! Optimizers (SGD with momentum / weight decay, AdamW) and learning-rate
//! schedules (linear warmup, then constant, cosine or step). Written over
//! the flat parameter buffer ([`crate::shard`]) so a rank can update just
//! its range; the state is plain tensors, named per parameter for
//! checkpoints.

use tch::Tensor;

use crate::c10d::ProcessGroup;
use crate::cli::{OptimArgs, OptimizerKind, Schedule};
use crate::error::Result;
use crate::shard::{FlatParams, Layout};

/// `n` as a `powi` exponent: beyond `i32::MAX` the powers of the factors
/// used here (momentum-like, in (0, 1]) no longer change, so it saturates
/// there instead of wrapping (a step count from a checkpoint manifest).
fn exponent(n: u64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Learning rate at (1-based) step `step` of `total`.
pub fn lr_at(cfg: &OptimArgs, step: u64, total: u64) -> f64 {
    let base = cfg.lr;
    if cfg.warmup_steps > 0 && step <= cfg.warmup_steps {
        return base * step as f64 / cfg.warmup_steps as f64;
    }
    let after = step.saturating_sub(cfg.warmup_steps);
    match cfg.schedule {
        Schedule::Constant => base,
        Schedule::Step => base * cfg.gamma.powi(exponent(after / cfg.step_size.max(1))),
        Schedule::Cosine => {
            let span = total.saturating_sub(cfg.warmup_steps).max(1) as f64;
            let frac = (after as f64 / span).min(1.0);
            0.5 * base * (1.0 + (std::f64::consts::PI * frac).cos())
        }
    }
}

/// Optimizer over the range `[lo, hi)` of the flat parameters this rank
/// updates (all of them in one process or with sharding off). Its state
/// covers exactly that range.
pub struct Optimizer {
    kind: OptimizerKind,
    momentum: f64,
    weight_decay: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    /// Number of updates applied so far (AdamW bias correction).
    pub steps: u64,
    range: (i64, i64),
    /// SGD momentum buffer, or AdamW's m; AdamW's v. Flat, over `range`.
    m: Tensor,
    v: Option<Tensor>,
}

impl Optimizer {
    pub fn new(cfg: &OptimArgs, flat: &FlatParams, range: (i64, i64)) -> Self {
        let adam = cfg.optimizer == OptimizerKind::Adamw;
        let zeros = || Tensor::zeros([range.1 - range.0], (flat.kind(), flat.device()));
        Optimizer {
            kind: cfg.optimizer,
            momentum: cfg.momentum,
            weight_decay: cfg.weight_decay,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            steps: 0,
            range,
            m: zeros(),
            v: adam.then(zeros),
        }
    }

    /// The range of the flat parameters this optimizer updates.
    pub fn range(&self) -> (i64, i64) {
        self.range
    }

    /// A step this rank takes no part in (left out of the plan): only the
    /// count moves, so AdamW's bias correction stays in step with the
    /// others when the rank comes back.
    pub fn skip(&mut self) {
        self.steps += 1;
    }

    /// One update of the owned range with the parameters' current `.grad()`.
    /// Element-wise, so a range updates exactly as in the whole update.
    pub fn step(&mut self, flat: &FlatParams, lr: f64) {
        let _guard = tch::no_grad_guard();
        let c = self.coefficients(lr);
        self.steps += 1;
        for piece in flat.pieces(self.range) {
            let full = flat.param(piece.param).grad();
            if !full.defined() {
                continue;
            }
            let g = full.reshape([-1]).narrow(0, piece.in_param, piece.len);
            let p = flat.range((
                self.range.0 + piece.in_range,
                self.range.0 + piece.in_range + piece.len,
            ));
            let m = self.m.narrow(0, piece.in_range, piece.len);
            let v = self
                .v
                .as_ref()
                .map(|v| v.narrow(0, piece.in_range, piece.len));
            self.update(p, g, m, v, &c);
        }
    }

    /// One range's update: SGD on float32 CPU tensors in one pass
    /// ([`crate::c10d::fused_sgd`], the same bits), else the tensor ops of
    /// [`Optimizer::update_ops`] (AdamW: ATen's vectorized float sqrt is
    /// not the IEEE one on every CPU, and a one-pass AdamW would differ
    /// from the one-process run by an ulp).
    fn update(&self, p: Tensor, g: Tensor, m: Tensor, v: Option<Tensor>, c: &[f64]) {
        if self.kind == OptimizerKind::Sgd
            && matches!(crate::c10d::fused_sgd(&p, &g, &m, c), Ok(true))
        {
            return;
        }
        self.update_ops(p, g, m, v, c);
    }

    /// The scalars of the next update (step `steps + 1`) at learning rate
    /// `lr`, in the order [`Optimizer::update`] uses them. The update run
    /// inside backward (the C++ shim) applies the same ops with the same
    /// scalars, so both give the same result bit for bit. SGD: weight
    /// decay, momentum, −lr. AdamW: 1 − lr·wd, β1, 1 − β1, β2, 1 − β2,
    /// 1 − β2ᵗ, ε, −lr / (1 − β1ᵗ).
    pub fn coefficients(&self, lr: f64) -> Vec<f64> {
        let t = exponent(self.steps.saturating_add(1));
        match self.kind {
            OptimizerKind::Adamw => {
                let bc1 = 1.0 - self.beta1.powi(t);
                let bc2 = 1.0 - self.beta2.powi(t);
                vec![
                    1.0 - lr * self.weight_decay,
                    self.beta1,
                    1.0 - self.beta1,
                    self.beta2,
                    1.0 - self.beta2,
                    bc2,
                    self.eps,
                    -lr / bc1,
                ]
            }
            OptimizerKind::Sgd => vec![self.weight_decay, self.momentum, -lr],
        }
    }

    /// What an update inside backward needs: whether it is AdamW, the
    /// state tensors and the range they cover.
    pub fn state_for_backward(&self) -> (bool, &Tensor, Option<&Tensor>, (i64, i64)) {
        (
            self.kind == OptimizerKind::Adamw,
            &self.m,
            self.v.as_ref(),
            self.range,
        )
    }

    /// The update as whole-tensor ops (any device and kind).
    fn update_ops(
        &self,
        mut p: Tensor,
        mut g: Tensor,
        mut m: Tensor,
        v: Option<Tensor>,
        c: &[f64],
    ) {
        match (self.kind, v) {
            (OptimizerKind::Adamw, Some(mut v)) => {
                if self.weight_decay != 0.0 {
                    let _ = p.g_mul_scalar_(c[0]);
                }
                let _ = m.g_mul_scalar_(c[1]).g_add_(&(&g * c[2]));
                let _ = v.g_mul_scalar_(c[3]).g_add_(&(&g * &g * c[4]));
                let denom = (&v / c[5]).sqrt() + c[6];
                let _ = p.g_add_(&(&m / &denom * c[7]));
            }
            _ => {
                if c[0] != 0.0 {
                    g = &g + &p * c[0];
                }
                if c[1] != 0.0 {
                    // m starts at 0, so the first step gives m = g (PyTorch's rule).
                    let _ = m.g_mul_scalar_(c[1]).g_add_(&g);
                    let _ = p.g_add_(&(&m * c[2]));
                } else {
                    let _ = p.g_add_(&(g * c[2]));
                }
            }
        }
    }

    /// This rank's state tensors, flat over its range.
    fn local_state(&self) -> Vec<&Tensor> {
        std::iter::once(&self.m).chain(self.v.as_ref()).collect()
    }

    /// Names of the state tensors (`momentum`, or `exp_avg` and `exp_avg_sq`).
    fn state_names(&self) -> &'static [&'static str] {
        match self.kind {
            OptimizerKind::Sgd => &["momentum"],
            OptimizerKind::Adamw => &["exp_avg", "exp_avg_sq"],
        }
    }

    /// The whole optimizer state (every owner's range), flat, one tensor
    /// per state name. Collective under a sharded layout: every rank calls
    /// it at the same step.
    pub fn gather(
        &self,
        pg: Option<&ProcessGroup>,
        rank: usize,
        layout: &Layout,
        len: i64,
    ) -> Result<Vec<Tensor>> {
        self.local_state()
            .into_iter()
            .map(|t| layout.gather(pg, rank, t, len))
            .collect()
    }

    /// The whole state as named tensors shaped like the parameters
    /// (`momentum.<param>`, or `exp_avg.<param>` and `exp_avg_sq.<param>`).
    pub fn named(
        &self,
        full: &[Tensor],
        flat: &FlatParams,
        names: &[String],
    ) -> Vec<(String, Tensor)> {
        full.iter()
            .zip(self.state_names())
            .flat_map(|(t, prefix)| flat.unflatten(t, names, prefix))
            .collect()
    }

    /// Zeroed whole-state tensors, to load a checkpoint into.
    pub fn empty_full(&self, flat: &FlatParams) -> Vec<Tensor> {
        self.state_names()
            .iter()
            .map(|_| Tensor::zeros([flat.len()], (flat.kind(), flat.device())))
            .collect()
    }

    /// Take this rank's range `range` of the whole state `full`.
    pub fn adopt(&mut self, full: &[Tensor], range: (i64, i64)) {
        let take = |t: &Tensor| t.narrow(0, range.0, range.1 - range.0).copy();
        self.range = range;
        self.m = take(&full[0]);
        self.v = full.get(1).filter(|_| self.v.is_some()).map(take);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    use crate::cli::train_args as cfg;

    #[test]
    fn step_counts_past_i32_give_the_limit_not_a_wrapped_exponent() {
        assert_eq!(exponent(7), 7);
        assert_eq!(exponent(1 << 32), i32::MAX);
        let c = cfg(&["--optimizer", "adamw", "--lr", "0.1"]);
        let p = Tensor::from_slice(&[1.0f32]);
        let flat = FlatParams::new(&[p]).unwrap();
        let mut o = Optimizer::new(&c.optim, &flat, (0, 1));
        for steps in [1u64 << 31, 1 << 32, u64::MAX] {
            o.steps = steps;
            let k = o.coefficients(0.1);
            assert!(k.iter().all(|x| x.is_finite()), "{steps}: {k:?}");
            // Bias corrections are 1 by then: the last scalar is −lr.
            assert!((k[k.len() - 1] + 0.1).abs() < 1e-12, "{steps}: {k:?}");
        }
        let s = cfg(&[
            "--lr",
            "1.0",
            "--schedule",
            "step",
            "--step-size",
            "1",
            "--gamma",
            "0.5",
        ]);
        assert_eq!(lr_at(&s.optim, 1 << 33, 1 << 34), 0.0);
    }

    #[test]
    fn schedules() {
        let c = cfg(&[
            "--lr",
            "1.0",
            "--warmup-steps",
            "10",
            "--schedule",
            "cosine",
        ]);
        assert!((lr_at(&c.optim, 5, 110) - 0.5).abs() < 1e-12);
        assert!((lr_at(&c.optim, 10, 110) - 1.0).abs() < 1e-12);
        assert!((lr_at(&c.optim, 60, 110) - 0.5).abs() < 1e-12);
        assert!(lr_at(&c.optim, 110, 110).abs() < 1e-12);
        let s = cfg(&[
            "--lr",
            "1.0",
            "--schedule",
            "step",
            "--step-size",
            "3",
            "--gamma",
            "0.5",
        ]);
        assert_eq!(lr_at(&s.optim, 2, 100), 1.0);
        assert_eq!(lr_at(&s.optim, 7, 100), 0.25);
    }

    #[test]
    fn sgd_momentum_matches_hand_computation() {
        let c = cfg(&["--momentum", "0.9", "--weight-decay", "0.1"]);
        let p = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        let flat = FlatParams::new(&[p.shallow_clone()]).unwrap();
        let mut o = Optimizer::new(&c.optim, &flat, (0, flat.len()));
        for _ in 0..2 {
            let mut q = p.shallow_clone();
            q.zero_grad();
            (&p * &p).sum(Kind::Float).backward();
            o.step(&flat, 0.1);
        }
        // g1 = 2w + 0.1w = 2.1w; buf1 = g1; w1 = w - 0.1 g1 = 0.79 w
        // g2 = 2.1 w1; buf2 = 0.9 buf1 + g2; w2 = w1 - 0.1 buf2
        let w0 = 1.0f64;
        let g1 = 2.1 * w0;
        let w1 = w0 - 0.1 * g1;
        let buf2 = 0.9 * g1 + 2.1 * w1;
        let w2 = w1 - 0.1 * buf2;
        assert!(
            (p.double_value(&[0]) - w2).abs() < 1e-6,
            "{}",
            p.double_value(&[0])
        );
        let full = o
            .gather(None, 0, &Layout::Replicated { len: 2 }, 2)
            .unwrap();
        assert_eq!(o.named(&full, &flat, &["w".into()])[0].0, "momentum.w");
    }

    #[test]
    fn adamw_first_step_moves_by_lr() {
        let c = cfg(&["--optimizer", "adamw"]);
        let p = Tensor::from_slice(&[3.0f32]).set_requires_grad(true);
        let flat = FlatParams::new(&[p.shallow_clone()]).unwrap();
        let mut o = Optimizer::new(&c.optim, &flat, (0, 1));
        (&p * 5.0).sum(Kind::Float).backward();
        o.step(&flat, 0.01);
        // bias-corrected m/sqrt(v) = 1 → step of exactly lr
        assert!((p.double_value(&[0]) - 2.99).abs() < 1e-6);
        let full = o
            .gather(None, 0, &Layout::Replicated { len: 1 }, 1)
            .unwrap();
        assert_eq!(o.named(&full, &flat, &["w".into()]).len(), 2);
    }

    /// The one-pass SGD update (csrc/update_kernel.cpp) gives the tensor
    /// ops' result bit for bit, with and without momentum and weight
    /// decay, over several steps (so the momentum is not zero), on a length
    /// with a vector tail and above ATen's grain size (split across
    /// threads); other kinds are left to the tensor ops.
    #[test]
    fn one_pass_update_matches_the_tensor_ops_bit_for_bit() {
        tch::manual_seed(7);
        let n = 100_003i64;
        let cpu = (Kind::Float, tch::Device::Cpu);
        let cases: [&[&str]; 3] = [
            &["--momentum", "0.9", "--weight-decay", "0.01"],
            &["--momentum", "0.9", "--weight-decay", "0"],
            &["--momentum", "0", "--weight-decay", "0.05"],
        ];
        for args in cases {
            let c = cfg(args);
            let w = Tensor::randn([n], cpu).set_requires_grad(true);
            let flat = FlatParams::new(&[w.shallow_clone()]).unwrap();
            let mut o = Optimizer::new(&c.optim, &flat, (0, n));
            let _guard = tch::no_grad_guard();
            let (p1, p2) = (w.detach().copy(), w.detach().copy());
            let (m1, m2) = (o.m.copy(), o.m.copy());
            for step in 0..4 {
                let g = Tensor::randn([n], cpu) * 10f64.powi(-3 * step);
                let coef = o.coefficients(0.01);
                o.update_ops(
                    p1.shallow_clone(),
                    g.copy(),
                    m1.shallow_clone(),
                    None,
                    &coef,
                );
                let g2 = g.copy();
                assert!(
                    crate::c10d::fused_sgd(&p2, &g2, &m2, &coef).unwrap(),
                    "{args:?}: float32 CPU tensors take the one-pass update"
                );
                assert!(g2.equal(&g), "{args:?}: the gradient is left as it was");
                o.steps += 1;
                assert!(p1.equal(&p2), "{args:?} step {step}: parameters differ");
                assert!(m1.equal(&m2), "{args:?} step {step}: momentum differs");
                assert!(!p1.equal(&w.detach()), "{args:?}: the update moved nothing");
            }
        }
        // Float64, or the wrong coefficients: left to the tensor ops,
        // nothing touched.
        let one = |k| Tensor::ones([4], (k, tch::Device::Cpu));
        let d = one(Kind::Double);
        assert!(!crate::c10d::fused_sgd(&d, &d, &d, &[0.0, 0.9, -0.1]).unwrap());
        assert!(d.equal(&one(Kind::Double)));
        let f = one(Kind::Float);
        assert!(!crate::c10d::fused_sgd(&f, &f, &f, &[0.9, -0.1]).unwrap());
        assert!(f.equal(&one(Kind::Float)));
    }

    /// Two optimizers over complementary ranges (cut inside a parameter)
    /// end with exactly the parameters and state of one whole update.
    #[test]
    fn ranges_update_exactly_like_the_whole() {
        for kind in ["sgd", "adamw"] {
            let c = cfg(&[
                "--optimizer",
                kind,
                "--momentum",
                "0.9",
                "--weight-decay",
                "0.01",
            ]);
            let make = || {
                // Fixed values (the global RNG is shared with parallel tests).
                let opts = (Kind::Float, tch::Device::Cpu);
                let a = (Tensor::arange(15, opts).view([3, 5]) * 0.37 - 2.1).sin();
                let b = (Tensor::arange(7, opts) * 0.91 + 0.3).cos();
                let (a, b) = (a.set_requires_grad(true), b.set_requires_grad(true));
                (a, b)
            };
            let run = |cuts: &[(i64, i64)]| {
                let (a, b) = make();
                let flat = FlatParams::new(&[a.shallow_clone(), b.shallow_clone()]).unwrap();
                let mut opts: Vec<Optimizer> = cuts
                    .iter()
                    .map(|&r| Optimizer::new(&c.optim, &flat, r))
                    .collect();
                for _ in 0..3 {
                    for t in [&a, &b] {
                        t.shallow_clone().zero_grad();
                    }
                    ((&a * &a).sum(Kind::Float) + (&b * &b * &b).sum(Kind::Float)).backward();
                    for o in &mut opts {
                        o.step(&flat, 0.05);
                    }
                }
                let state: Vec<Tensor> = opts.iter().map(|o| o.m.shallow_clone()).collect();
                (flat.range((0, 22)).copy(), Tensor::cat(&state, 0))
            };
            let (whole_p, whole_m) = run(&[(0, 22)]);
            let (cut_p, cut_m) = run(&[(0, 9), (9, 22)]);
            assert!(whole_p.equal(&cut_p), "{kind}: parameters differ");
            assert!(whole_m.equal(&cut_m), "{kind}: state differs");
            let (moved, _) = {
                let (a, b) = make();
                (Tensor::cat(&[a.view(-1), b], 0), ())
            };
            assert!(!moved.equal(&whole_p), "{kind}: nothing was updated");
        }
    }
}
