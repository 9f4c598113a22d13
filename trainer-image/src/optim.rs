//! Optimizers (SGD with momentum / weight decay, AdamW) and learning-rate
//! schedules (linear warmup, then constant, cosine or step). Written over
//! tensors so their state is plain named tensors, easy to checkpoint.

use tch::Tensor;

use crate::cli::{OptimizerKind, ScheduleKind, TrainConfig};

/// Learning rate at (1-based) step `step` of `total`.
pub fn lr_at(cfg: &TrainConfig, step: u64, total: u64) -> f64 {
    let base = cfg.lr;
    if cfg.warmup_steps > 0 && step <= cfg.warmup_steps {
        return base * step as f64 / cfg.warmup_steps as f64;
    }
    let after = step.saturating_sub(cfg.warmup_steps);
    match cfg.schedule {
        ScheduleKind::Constant => base,
        ScheduleKind::Step => base * cfg.gamma.powi((after / cfg.step_size.max(1)) as i32),
        ScheduleKind::Cosine => {
            let span = total.saturating_sub(cfg.warmup_steps).max(1) as f64;
            let frac = (after as f64 / span).min(1.0);
            0.5 * base * (1.0 + (std::f64::consts::PI * frac).cos())
        }
    }
}

/// Optimizer over a fixed, ordered list of named trainable tensors.
pub struct Optimizer {
    kind: OptimizerKind,
    momentum: f64,
    weight_decay: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    /// Number of updates applied so far (AdamW bias correction).
    pub steps: u64,
    /// Per-parameter state: SGD momentum buffer, or AdamW (m, v).
    m: Vec<Tensor>,
    v: Vec<Tensor>,
}

impl Optimizer {
    pub fn new(cfg: &TrainConfig, params: &[(String, Tensor)]) -> Self {
        let zeros = || {
            params
                .iter()
                .map(|(_, p)| p.zeros_like())
                .collect::<Vec<_>>()
        };
        let adam = cfg.optimizer == OptimizerKind::Adamw;
        Optimizer {
            kind: cfg.optimizer,
            momentum: cfg.momentum,
            weight_decay: cfg.weight_decay,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            steps: 0,
            m: zeros(),
            v: if adam { zeros() } else { Vec::new() },
        }
    }

    /// One update with the parameters' current `.grad()`.
    pub fn step(&mut self, params: &[(String, Tensor)], lr: f64) {
        let _guard = tch::no_grad_guard();
        self.steps += 1;
        match self.kind {
            OptimizerKind::Sgd => {
                for ((_, p), buf) in params.iter().zip(self.m.iter_mut()) {
                    let mut g = p.grad();
                    if !g.defined() {
                        continue;
                    }
                    if self.weight_decay != 0.0 {
                        g += p * self.weight_decay;
                    }
                    let mut p = p.shallow_clone();
                    if self.momentum != 0.0 {
                        // buf starts at 0, so the first step gives buf = g (PyTorch's rule).
                        let _ = buf.g_mul_scalar_(self.momentum).g_add_(&g);
                        let _ = p.g_add_(&(&*buf * -lr));
                    } else {
                        let _ = p.g_add_(&(g * -lr));
                    }
                }
            }
            OptimizerKind::Adamw => {
                let t = self.steps as i32;
                let bc1 = 1.0 - self.beta1.powi(t);
                let bc2 = 1.0 - self.beta2.powi(t);
                for (((_, p), m), v) in params.iter().zip(self.m.iter_mut()).zip(self.v.iter_mut())
                {
                    let g = p.grad();
                    if !g.defined() {
                        continue;
                    }
                    let mut p = p.shallow_clone();
                    if self.weight_decay != 0.0 {
                        let _ = p.g_mul_scalar_(1.0 - lr * self.weight_decay);
                    }
                    let _ = m
                        .g_mul_scalar_(self.beta1)
                        .g_add_(&(&g * (1.0 - self.beta1)));
                    let _ = v
                        .g_mul_scalar_(self.beta2)
                        .g_add_(&(&g * &g * (1.0 - self.beta2)));
                    let denom = (&*v / bc2).sqrt() + self.eps;
                    let _ = p.g_add_(&(&*m / &denom * (-lr / bc1)));
                }
            }
        }
    }

    /// State as named tensors (`momentum.<param>` or `exp_avg.<param>`,
    /// `exp_avg_sq.<param>`), in parameter order.
    pub fn state(&self, params: &[(String, Tensor)]) -> Vec<(String, Tensor)> {
        let first = match self.kind {
            OptimizerKind::Sgd => "momentum",
            OptimizerKind::Adamw => "exp_avg",
        };
        let mut out: Vec<(String, Tensor)> = params
            .iter()
            .zip(&self.m)
            .map(|((n, _), t)| (format!("{first}.{n}"), t.shallow_clone()))
            .collect();
        out.extend(
            params
                .iter()
                .zip(&self.v)
                .map(|((n, _), t)| (format!("exp_avg_sq.{n}"), t.shallow_clone())),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use tch::Kind;

    fn cfg(args: &[&str]) -> TrainConfig {
        let mut v = vec!["x", "train"];
        v.extend_from_slice(args);
        match crate::cli::Cli::parse_from(v).command {
            crate::cli::Command::Train(c) | crate::cli::Command::Profile(c) => *c,
        }
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
        assert!((lr_at(&c, 5, 110) - 0.5).abs() < 1e-12);
        assert!((lr_at(&c, 10, 110) - 1.0).abs() < 1e-12);
        assert!((lr_at(&c, 60, 110) - 0.5).abs() < 1e-12);
        assert!(lr_at(&c, 110, 110).abs() < 1e-12);
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
        assert_eq!(lr_at(&s, 2, 100), 1.0);
        assert_eq!(lr_at(&s, 7, 100), 0.25);
    }

    #[test]
    fn sgd_momentum_matches_hand_computation() {
        let c = cfg(&["--momentum", "0.9", "--weight-decay", "0.1"]);
        let p = Tensor::from_slice(&[1.0f32, -2.0]).set_requires_grad(true);
        let params = vec![("w".to_string(), p.shallow_clone())];
        let mut o = Optimizer::new(&c, &params);
        for _ in 0..2 {
            let mut q = p.shallow_clone();
            q.zero_grad();
            (&p * &p).sum(Kind::Float).backward();
            o.step(&params, 0.1);
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
        assert_eq!(o.state(&params)[0].0, "momentum.w");
    }

    #[test]
    fn adamw_first_step_moves_by_lr() {
        let c = cfg(&["--optimizer", "adamw"]);
        let p = Tensor::from_slice(&[3.0f32]).set_requires_grad(true);
        let params = vec![("w".to_string(), p.shallow_clone())];
        let mut o = Optimizer::new(&c, &params);
        (&p * 5.0).sum(Kind::Float).backward();
        o.step(&params, 0.01);
        // bias-corrected m/sqrt(v) = 1 → step of exactly lr
        assert!((p.double_value(&[0]) - 2.99).abs() < 1e-6);
        assert_eq!(o.state(&params).len(), 2);
    }
}
