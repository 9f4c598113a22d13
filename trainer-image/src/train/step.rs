//! One training step: the step-boundary agreement, then data, forward,
//! backward (the Reducer exchanging gradient buckets while it runs), the
//! sharded update and the step's record.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tch::Tensor;

use crate::c10d::{self, PendingWork, UpdateDone, UpdateInBackward};
use crate::control;
use crate::error::{Result, TrainerError};
use crate::log::{StepRecord, StepTimings};
use crate::optim;
use crate::shard::Layout;

use super::setup::{broadcast_all, sync_device};

/// How long a step waits for its batch under `--prefetch-wait`: far beyond
/// any gather, so that only a helper that died misses it.
const PREFETCH_WAIT: std::time::Duration = std::time::Duration::from_secs(120);
use super::Trainer;

/// What forward and backward leave for the rest of the step.
struct Pass<'a> {
    local_loss: f64,
    /// The control word with this rank's weighted loss, being all-reduced
    /// (none at a step without a word).
    word: Option<Tensor>,
    word_work: Option<PendingWork<'a>>,
    /// (buckets launched before backward ended, buckets).
    overlap: Option<(usize, usize)>,
    /// The update ran inside backward: what it did.
    updated: Option<UpdateDone>,
}

impl<'a> Trainer<'a> {
    /// The step boundary: every rank applies the same agreement (plan and
    /// stop). Returns false when the run stops here.
    pub(super) fn boundary(&mut self, stop_requested: bool) -> Result<bool> {
        let rank = self.cfg.dist.rank;
        let agreed = match self.carried.take() {
            Some(a) => a,
            // No control word was due at the end of the last step.
            None if self.begun => return Ok(true),
            None => {
                self.begun = true;
                let proposed = self.propose();
                control::agree(self.pg, rank, &proposed, stop_requested)?
            }
        };
        self.lag = agreed.lag;
        self.word_every = agreed.every;
        if agreed.stop {
            self.stopped = true;
            return Ok(false);
        }
        // Generation 0 from a ConfigMap may replace the built-in equal split
        // of the same generation: compare the batches too.
        let plan = &self.plan;
        if agreed.plan.generation != plan.generation || agreed.plan.batch_sizes != plan.batch_sizes
        {
            agreed
                .plan
                .validate_for(self.cfg.dist.world_size, self.cfg.optim.batch_size)
                .map_err(|e| TrainerError::Config(format!("agreed plan is invalid: {e}")))?;
            if rank == 0 {
                // Why, when rank 0 proposed this plan (its balancer's or
                // the operator's reason).
                let why = self
                    .offer
                    .as_ref()
                    .filter(|o| {
                        o.generation == agreed.plan.generation
                            && o.batch_sizes == agreed.plan.batch_sizes
                    })
                    .map(|o| o.reason.trim())
                    .filter(|r| !r.is_empty())
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default();
                eprintln!(
                    "rank 0: step {}: switching to plan generation {} {:?}{why}",
                    self.step + 1,
                    agreed.plan.generation,
                    agreed.plan.batch_sizes
                );
            }
            self.plan = agreed.plan;
            self.p.mx.set_plan(self.plan.generation, self.local_batch());
            self.warm = true;
        }
        // Ranks coming back into the exchange catch up first: parameters
        // and buffers from rank 0, and (replicated) the optimizer state.
        let members = self.plan.members();
        let joining = members.iter().any(|r| !self.team.members().contains(r));
        if joining {
            broadcast_all(self.pg, &self.p.all_vars)?;
        }
        // The optimizer ranges follow the plan (the state moves with them).
        let len = self.p.flat.len();
        let wanted = Layout::for_plan(
            len,
            &self.plan.batch_sizes,
            self.cfg.optim.optimizer_sharding,
        );
        if wanted != self.layout || joining {
            let whole = self.opt.gather(self.pg, rank, &self.layout, len)?;
            if joining && matches!(self.layout, Layout::Replicated { .. }) {
                let named: Vec<(String, Tensor)> = whole
                    .iter()
                    .map(|t| (String::new(), t.shallow_clone()))
                    .collect();
                broadcast_all(self.pg, &named)?;
            }
            self.opt.adopt(&whole, wanted.own(rank));
            self.layout = wanted;
            self.shard_reduction()?;
        }
        if members != self.team.members() {
            if rank == 0 {
                let out = self.plan.left_out();
                eprintln!(
                    "rank 0: step {}: {} rank(s) train{}",
                    self.step + 1,
                    members.len(),
                    if out.is_empty() {
                        String::new()
                    } else {
                        format!("; left out (no samples): ranks {out:?}")
                    }
                );
            }
            self.regroup(members)?;
        }
        Ok(true)
    }

    /// One step from data to update, logged; `started` is when its
    /// boundary began.
    pub(super) fn step(&mut self, started: Instant, stop: &AtomicBool) -> Result<()> {
        let (rank, device) = (self.cfg.dist.rank, self.p.device);
        let mut tm = StepTimings::default();
        let t0 = Instant::now();
        // Rank 0's next proposal and every stop request ride in the control
        // word with the loss: one small all-reduce, started once forward has
        // the loss, overlapped with backward and waited at the end of the
        // step it is due (`lag` steps later); it takes effect at the next
        // step boundary.
        let proposed = self.propose();
        self.prefetched = false;
        // A word every `word_every` steps, at the same steps on every rank.
        let word_now = self.step >= self.next_word;
        self.word_now = word_now;
        if word_now {
            self.next_word = self.step + u64::from(self.word_every.max(1));
        }
        if self.local_batch() == 0 {
            if word_now {
                let stop_now = stop.load(Ordering::SeqCst);
                let mut word =
                    control::encode(rank, self.cfg.dist.world_size, &proposed, stop_now, 0.0);
                let word_work = self.start_sum(&mut word)?;
                self.push_word(word, word_work, proposed);
            }
            return self.sit_out(started);
        }

        let idx = self.sampler.rank_indices(self.pos, &self.plan, rank);
        // Ready or not at all: never wait on the helper (see Prefetcher),
        // unless asked to (`--prefetch-wait`, for tests of this path).
        let patience = if self.cfg.data.prefetch_wait {
            PREFETCH_WAIT
        } else {
            std::time::Duration::ZERO
        };
        let ahead = self.prefetch.as_mut().and_then(|f| f.take(&idx, patience));
        self.prefetched = ahead.is_some();
        let (x, y) = match ahead {
            Some((x, y)) => (x.to_device(device), y.to_device(device)),
            None => self.p.data.train_batch(&idx, device),
        };
        // The next step's rows under this plan (a plan change, or the run's
        // end, leaves them unused).
        if self.prefetch.is_some() && self.step + 1 < self.p.total {
            let next = self.next_position();
            let next_idx = self.sampler.rank_indices(next, &self.plan, rank);
            if let Some(f) = self.prefetch.as_mut() {
                f.request(next_idx);
            }
        }
        sync_device(device);
        let t1 = Instant::now();
        tm.data_seconds = (t1 - t0).as_secs_f64();

        let lr = optim::lr_at(&self.cfg.optim, self.step + 1, self.p.total);
        let mut pass =
            self.forward_backward(&x, &y, &mut tm, word_now.then_some(&proposed), stop, lr)?;
        // While words lag or skip steps, the global loss comes late: a rank
        // whose own loss is not finite stops now, before a checkpoint can
        // keep its update.
        if (self.lag > 0 || self.word_every > 1) && !pass.local_loss.is_finite() {
            return Err(TrainerError::Data(format!(
                "loss became {} at step {}; lower --lr",
                pass.local_loss,
                self.step + 1
            )));
        }
        if let Some(word) = pass.word.take() {
            let word_work = pass.word_work.take();
            self.push_word(word, word_work, proposed);
        }
        // Summed over the members (alone: its own loss, weighted by 1).
        let fresh = self.take_words()?;
        let global_loss = if self.pg.is_some() {
            fresh
        } else {
            Some(pass.local_loss)
        };
        sync_device(device);
        // Exposed communication: everything in forward and backward that
        // was not local compute, plus the final waits.
        tm.allreduce_seconds =
            (t1.elapsed().as_secs_f64() - tm.forward_seconds - tm.backward_seconds).max(0.0);
        self.update(&mut tm, lr, pass.updated)?;
        self.step += 1;
        let done = (pass.overlap, pass.updated);
        let global_loss = self.known_loss(global_loss)?;
        self.record(started, tm, pass.local_loss, global_loss, lr, done)
    }

    /// Queue this step's control word, due `lag` steps on.
    fn push_word(
        &mut self,
        word: Tensor,
        work: Option<PendingWork<'a>>,
        proposed: control::Proposal,
    ) {
        self.words
            .push(self.step + 1, self.lag, word, work, proposed);
    }

    /// Wait for the control words due at the end of this step; they are
    /// applied at the next boundary. Returns the newest global loss among
    /// them (none was due: None).
    fn take_words(&mut self) -> Result<Option<f64>> {
        self.carried = self.words.take_due(self.step + 1, self.cfg.dist.rank)?;
        Ok(self.carried.as_ref().map(|a| a.loss))
    }

    /// A new global loss must be finite (every rank sees the same one and
    /// stops with the same error); none new: the last known.
    fn known_loss(&self, fresh: Option<f64>) -> Result<f64> {
        match fresh {
            Some(l) if !l.is_finite() => Err(TrainerError::Data(format!(
                "loss became {l} by step {}; lower --lr",
                self.step
            ))),
            Some(l) => Ok(l),
            None => Ok(self.global_loss),
        }
    }

    /// A step of a rank the plan leaves out: no data, no compute, no part
    /// in the loss, the gradient exchange or the update's broadcasts; it
    /// takes part only in the control word (which brings it back) and
    /// keeps the optimizer's step count.
    fn sit_out(&mut self, started: Instant) -> Result<()> {
        let t0 = Instant::now();
        // The members' loss (this rank adds none).
        let fresh = self.take_words()?;
        self.opt.skip();
        let tm = StepTimings {
            allreduce_seconds: t0.elapsed().as_secs_f64(),
            ..StepTimings::default()
        };
        let lr = optim::lr_at(&self.cfg.optim, self.step + 1, self.p.total);
        self.step += 1;
        let global_loss = self.known_loss(fresh)?;
        self.record(started, tm, global_loss, global_loss, lr, (None, None))
    }

    /// Start an asynchronous SUM of the control word `t` over every rank,
    /// through rank 0 (a star sum: two messages on the other ranks; none
    /// without a group).
    fn start_sum(&self, t: &mut Tensor) -> Result<Option<PendingWork<'a>>> {
        self.pg.map(|g| g.star_sum_async(t)).transpose()
    }

    /// Forward and backward of this rank's batch, starting the control word
    /// (`proposed`, the stop request, the weighted loss) between them at a
    /// step that has one (`proposed` given).
    /// Forward and backward times exclude waiting inside collectives
    /// (synchronised BatchNorm).
    fn forward_backward(
        &self,
        x: &Tensor,
        y: &Tensor,
        tm: &mut StepTimings,
        proposed: Option<&control::Proposal>,
        stop: &AtomicBool,
        lr: f64,
    ) -> Result<Pass<'a>> {
        let device = self.p.device;
        let waited0 = c10d::autograd_collective_seconds();
        let t1 = Instant::now();
        if let Some(r) = &self.reducer {
            r.prepare_forward()?;
        }
        let logits = self.p.model.forward(x, true)?;
        if let Some(msg) = self.p.group_slot.take_error() {
            return Err(TrainerError::Collective {
                op: "batch_norm",
                msg,
            });
        }
        let loss = self.p.model.loss(&logits, y);
        let local_loss = loss.double_value(&[]);
        sync_device(device);
        let t2 = Instant::now();
        let waited1 = c10d::autograd_collective_seconds();
        tm.forward_seconds = ((t2 - t1).as_secs_f64() - (waited1 - waited0).max(0.0)).max(0.0);
        let scale = self.share();
        // On the whole group: a left-out rank adds no loss (and no plan
        // unless it is rank 0, which always trains).
        let (word, word_work) = match proposed {
            Some(proposed) => {
                let mut word = control::encode(
                    self.cfg.dist.rank,
                    self.cfg.dist.world_size,
                    proposed,
                    stop.load(Ordering::SeqCst),
                    local_loss * scale,
                );
                let work = self.start_sum(&mut word)?;
                (Some(word), work)
            }
            None => (None, None),
        };

        crate::c10d::clear_grads(&self.p.params);
        // The b_r / B weight goes into the loss, so the SUM of the ranks'
        // gradients is the gradient of the mean loss over the global batch,
        // and cross-rank terms (synchronised BatchNorm) are weighted right.
        // With a group, PyTorch's Reducer SUM-all-reduces gradient buckets
        // while backward still runs; they are reduced when it returns.
        let scaled = &loss * scale;
        let in_backward = self.reducer.is_some()
            && self.update_in_backward
            && matches!(self.layout, Layout::Sharded { .. });
        if let Some(r) = &self.reducer {
            r.set_update(in_backward.then(|| {
                let (adamw, m, v, own) = self.opt.state_for_backward();
                UpdateInBackward {
                    adamw,
                    m,
                    v,
                    own,
                    coefficients: self.opt.coefficients(lr),
                }
            }))?;
            r.prepare_backward(&scaled)?;
        }
        scaled.f_backward().map_err(|e| TrainerError::Collective {
            op: "backward",
            msg: e.to_string().lines().next().unwrap_or_default().to_string(),
        })?;
        sync_device(device);
        let backward_wait = (c10d::autograd_collective_seconds() - waited1).max(0.0);
        let trace = self.reducer.as_ref().map(|r| r.trace());
        let local_backward = match &trace {
            Some(t) if t.backward_seconds > 0.0 => t.backward_seconds,
            _ => t2.elapsed().as_secs_f64(),
        };
        tm.backward_seconds = (local_backward - backward_wait).max(0.0);
        Ok(Pass {
            local_loss,
            word,
            word_work,
            overlap: trace.map(|t| (t.overlapped_launches(), t.ready_at_launch.len())),
            updated: self
                .reducer
                .as_ref()
                .filter(|_| in_backward)
                .map(|r| r.updated()),
        })
    }

    /// This rank's share of the update, then the owners' broadcasts (their
    /// wait counts as communication); or, where backward ran the update
    /// (`updated`), only the check that it covered every element.
    fn update(&mut self, tm: &mut StepTimings, lr: f64, updated: Option<UpdateDone>) -> Result<()> {
        if let Some(done) = updated {
            let (lo, hi) = self.opt.range();
            let total = self.p.flat.len();
            if done.updated != hi - lo || done.updated + done.received != total {
                return Err(TrainerError::Collective {
                    op: "update",
                    msg: format!(
                        "the update in backward covered {} own and {} received of {} elements \
                         (own range {lo}..{hi}); rerun with --update-after-backward",
                        done.updated, done.received, total
                    ),
                });
            }
            self.opt.skip();
            tm.optimizer_seconds = done.seconds;
            return Ok(());
        }
        let device = self.p.device;
        let t4 = Instant::now();
        self.opt.step(&self.p.flat, lr);
        sync_device(device);
        let t5 = Instant::now();
        tm.optimizer_seconds = (t5 - t4).as_secs_f64();
        let flat = &self.p.flat;
        let team = (self.team.group(), self.team.members());
        self.layout
            .share_among(team.0, team.1, &flat.range((0, flat.len())))?;
        sync_device(device);
        tm.allreduce_seconds += t5.elapsed().as_secs_f64();
        Ok(())
    }

    /// The step's log line, metrics and balancer sample.
    fn record(
        &mut self,
        started: Instant,
        tm: StepTimings,
        local_loss: f64,
        global_loss: f64,
        lr: f64,
        (overlap, updated): (Option<(usize, usize)>, Option<UpdateDone>),
    ) -> Result<()> {
        let (b_local, b_global) = (self.local_batch(), self.plan.global_batch_size);
        // Includes the step-boundary agreement.
        let step_s = started.elapsed().as_secs_f64();
        // What this rank updated (nothing while left out).
        let (lo, hi) = if b_local == 0 {
            (0, 0)
        } else {
            self.opt.range()
        };
        self.log.write(&StepRecord {
            event: "step",
            rank: self.cfg.dist.rank,
            step: self.step,
            epoch: self.pos.epoch,
            generation: self.plan.generation,
            batch_size: b_local,
            global_batch_size: b_global,
            loss: local_loss,
            global_loss,
            lr,
            timings: tm,
            compute_seconds: tm.compute_seconds(),
            step_seconds: step_s,
            samples_per_second: f64::from(b_global) / step_s.max(1e-12),
            invalid_plans: self.gate.invalid_plans,
            buckets: overlap.map(|o| o.1),
            overlapped_buckets: overlap.map(|o| o.0),
            updated_in_backward: updated.map(|u| u.early),
            optimizer_elements: hi - lo,
            control_word: self.word_now,
            prefetched: self.prefetched,
            unix_seconds: crate::log::unix_seconds(),
        });
        self.p
            .mx
            .observe_step(self.step, self.pos.epoch, b_local, &tm, step_s, local_loss);
        self.interval
            .record(b_local, tm.compute_seconds(), step_s, !self.warm);
        self.warm = false;
        self.global_loss = global_loss;
        let now = Instant::now();
        if let Some(last) = self.last_end.replace(now) {
            let wall = (now - last).as_secs_f64();
            self.step_ema = if self.step_ema > 0.0 {
                0.8 * self.step_ema + 0.2 * wall
            } else {
                wall
            };
        }
        Ok(())
    }

    /// Rank 0: the plan to propose for the next step (the local balancer's
    /// pending plan, then the plan source's, each through the gate). Other
    /// ranks propose nothing (their control word carries only a stop request).
    fn propose(&mut self) -> control::Proposal {
        if self.cfg.dist.rank != 0 {
            return control::Proposal {
                plan: self.plan.clone(),
                lag: 0,
                every: 1,
            };
        }
        let mut proposed = self.offer.take().unwrap_or_else(|| self.plan.clone());
        let world = self.plan.batch_sizes.len();
        for p in [self.pending.take().map(Ok), self.source.poll()]
            .into_iter()
            .flatten()
        {
            match self.gate.consider(p, &proposed, world) {
                Some(p) => proposed = p,
                None => {
                    if let Some(r) = self.gate.last_reason.take() {
                        self.p.mx.plan_rejected(r);
                    }
                }
            }
        }
        self.offer = Some(proposed.clone());
        // While a rank sits out, its control word may come late.
        let lag = if proposed.left_out().is_empty() {
            0
        } else {
            self.cfg.dist.control_lag_steps
        };
        control::Proposal {
            plan: proposed,
            lag,
            every: control::word_interval(self.cfg.dist.control_interval_ms, self.step_ema),
        }
    }
}
