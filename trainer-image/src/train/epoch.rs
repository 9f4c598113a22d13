//! After each step: evaluation at epoch ends, the local balancer's rounds,
//! status lines, checkpoints.

use std::time::{Duration, Instant};

use tch::Tensor;

use crate::c10d::ProcessGroup;
use crate::cli::{BatchNormMode, ModelArgs};
use crate::error::Result;
use crate::local_balance;
use crate::log::EvalRecord;
use crate::sampler::SamplerPosition;

use super::setup::broadcast_all;
use super::Trainer;

impl Trainer<'_> {
    /// The sampler's position after the current step.
    pub(super) fn next_position(&self) -> SamplerPosition {
        if self.pos.step_in_epoch + 1 >= self.p.steps_per_epoch {
            SamplerPosition {
                epoch: self.pos.epoch.saturating_add(1),
                step_in_epoch: 0,
            }
        } else {
            SamplerPosition {
                epoch: self.pos.epoch,
                step_in_epoch: self.pos.step_in_epoch + 1,
            }
        }
    }

    /// Everything between two steps; every rank calls it after every step.
    pub(super) fn end_of_step(&mut self) -> Result<()> {
        let (cfg, step) = (self.cfg, self.step);
        let next = self.next_position();
        let epoch_end = next.step_in_epoch == 0;
        if (epoch_end || step == self.p.total) && self.p.data.eval_len() > 0 {
            self.evaluate()?;
        }
        self.pos = next;
        self.balance_and_report()?;
        if cfg.output.checkpoint_every > 0
            && step % cfg.output.checkpoint_every == 0
            && step < self.p.total
        {
            agree_buffers(&cfg.model, self.pg, &self.p.all_vars, self.share())?;
            self.save()?;
        }
        if cfg.obs.step_sleep_ms > 0 {
            std::thread::sleep(Duration::from_millis(cfg.obs.step_sleep_ms));
        }
        Ok(())
    }

    /// Evaluate on the held-out split (each rank a contiguous shard in
    /// proportion to its local batch, so a slow rank does not hold the
    /// others up and a left-out rank evaluates nothing; results
    /// all-reduced), after the ranks' buffers agree.
    fn evaluate(&mut self) -> Result<()> {
        let (cfg, p) = (self.cfg, self.p);
        // A left-out rank's parameters are stale; it evaluates nothing, so
        // it catches up only at the end, where every rank ends with the
        // trained parameters.
        if !self.team.everyone() && self.step == p.total {
            self.catch_up()?;
        }
        agree_buffers(&cfg.model, self.pg, &p.all_vars, self.share())?;
        let (correct, count, loss) = {
            let _guard = tch::no_grad_guard();
            let mine: Vec<usize> =
                eval_shard(p.data.eval_len(), &self.plan.batch_sizes, cfg.dist.rank).collect();
            let (mut correct, mut count, mut loss) = (0.0, 0.0, 0.0);
            for chunk in mine.chunks(256) {
                let (x, y) = p.data.eval_batch(chunk, p.device);
                let logits = p.model.forward(&x, false)?;
                let (c, k, l) = p.model.score(&logits, &y);
                correct += c;
                count += k;
                loss += l;
            }
            (correct, count, loss)
        };
        let mut t = Tensor::from_slice(&[correct, count, loss]);
        if let Some(pg) = self.pg {
            pg.all_reduce_sum(&mut t)?;
        }
        let v = Vec::<f64>::try_from(&t).unwrap_or_default();
        let (k, n) = (v[1].max(1.0), v[1]);
        let (acc, eval_loss) = (v[0] / k, v[2] / k);
        self.last_acc = Some(acc);
        p.mx.set_eval(acc, eval_loss);
        self.log.write(&EvalRecord {
            event: "eval",
            rank: cfg.dist.rank,
            step: self.step,
            epoch: self.pos.epoch,
            eval_loss,
            eval_accuracy: acc,
            eval_samples: n as u64,
        });
        if cfg.dist.rank == 0 {
            eprintln!(
                "rank 0: epoch {} step {}: eval accuracy {:.4}, loss {:.4}",
                self.pos.epoch, self.step, acc, eval_loss
            );
        }
        Ok(())
    }

    /// The local balancer's round and the status line, each every so many
    /// steps (every rank takes part: same step on all).
    fn balance_and_report(&mut self) -> Result<()> {
        let (cfg, step) = (self.cfg, self.step);
        let balance_now = self.balancer_rounds() && step % cfg.plan.balance_every == 0;
        let status_now = cfg.obs.status_every > 0 && step % cfg.obs.status_every == 0;
        if !(balance_now || status_now) {
            return Ok(());
        }
        let mut mine = self.interval.report();
        mine.quota_used = self.quota.read();
        let reports = local_balance::gather(self.pg, mine)?;
        // A plan still in flight (a lagged control word) was decided from
        // earlier measurements: wait for it before deciding again.
        let settled = self
            .offer
            .as_ref()
            .is_none_or(|o| o.generation == self.plan.generation);
        if balance_now && settled {
            self.interval.reset();
            if let Some(lb) = self.balancer.as_mut() {
                self.pending = lb.round(&reports, &self.plan);
            }
        }
        if status_now && cfg.dist.rank == 0 {
            let (t, s0) = self.status_since;
            let b = f64::from(self.plan.global_batch_size);
            let sps = (step - s0) as f64 * b / t.elapsed().as_secs_f64().max(1e-9);
            let loss = self.global_loss;
            eprintln!(
                "{}",
                local_balance::status_line(step, self.p.total, loss, sps, &self.plan, &reports)
            );
            self.status_since = (Instant::now(), step);
        }
        Ok(())
    }

    /// Whether this run balances on its own (`--balancer local`).
    fn balancer_rounds(&self) -> bool {
        self.cfg.plan.balancer == crate::cli::BalancerMode::Local
    }
}

/// Make the ranks' buffers (BatchNorm running statistics) agree before
/// evaluation and checkpoints. Per-rank BatchNorm (`local`): the average
/// over ranks weighted by local batch (`weight` = b_r / B). Synchronised
/// BatchNorm keeps them equal by construction; rank 0's are broadcast as a
/// guard. Every rank must call it at the same step.
pub(super) fn agree_buffers(
    cfg: &ModelArgs,
    pg: Option<&ProcessGroup>,
    vars: &[(String, Tensor)],
    weight: f64,
) -> Result<()> {
    let Some(pg) = pg else { return Ok(()) };
    let buffers: Vec<(String, Tensor)> = vars
        .iter()
        .filter(|(_, t)| !t.requires_grad())
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    if buffers.is_empty() {
        return Ok(());
    }
    if cfg.batch_norm == BatchNormMode::Local && cfg.arch.has_batch_norm() {
        let _guard = tch::no_grad_guard();
        for (_, t) in &buffers {
            let mut w = (t * weight).contiguous();
            pg.all_reduce_sum(&mut w)?;
            t.shallow_clone().copy_(&w);
        }
        Ok(())
    } else {
        broadcast_all(Some(pg), &buffers)
    }
}

/// The held-out samples `rank` evaluates: a contiguous range of the `n`,
/// in proportion to the local batches (the same split as training, so a
/// rank's share of the evaluation takes it about as long as the others'),
/// none for a rank with no samples. The ranges tile `0..n`.
fn eval_shard(n: usize, batch_sizes: &[u32], rank: usize) -> std::ops::Range<usize> {
    let n64 = i64::try_from(n).unwrap_or(i64::MAX);
    let bounds = crate::shard::proportional_bounds(n64, batch_sizes);
    let (lo, hi) = bounds.get(rank).copied().unwrap_or((0, 0));
    let at = |v: i64| usize::try_from(v).unwrap_or(0).min(n);
    at(lo)..at(hi)
}

#[cfg(test)]
mod tests {
    use super::eval_shard;

    #[test]
    fn eval_shards_tile_the_split_in_proportion_to_the_batches() {
        let plan = [62, 43, 19, 4];
        let shards: Vec<_> = (0..4).map(|r| eval_shard(300, &plan, r)).collect();
        assert_eq!(shards, vec![0..145, 145..246, 246..290, 290..300]);
        // A left-out rank evaluates nothing; the others cover every sample.
        let out: Vec<_> = (0..3).map(|r| eval_shard(300, &[64, 0, 64], r)).collect();
        assert_eq!(out, vec![0..150, 150..150, 150..300]);
        // A rank the plan does not name evaluates nothing.
        assert_eq!(eval_shard(300, &[64, 64], 2), 0..0);
        assert_eq!(eval_shard(0, &[3, 1], 0), 0..0);
    }
}
