//! Step-boundary agreement. A small control word
//! `[stop, generation, B, lag, every, b_0..b_{n-1}, loss]` — rank 0's
//! proposed plan, control lag and word interval, every rank's stop request
//! and its weighted loss (b_r/B · mean loss) — is summed over the ranks so
//! that all ranks switch plans, and stop, at the same step, and learn the
//! global batch's loss. Before the first step it is a blocking all-reduce
//! of its own ([`agree`]); during training it is the only collective
//! besides the gradient buckets, a star sum through rank 0 (one message
//! out and one back on every other rank, `ProcessGroup::star_sum_async`):
//! started asynchronously once forward has the loss, overlapped with
//! backward, and waited `lag` steps later ([`Pipeline`]): at the end of the
//! same step while every rank trains (lag 0), several steps later while the
//! plan leaves a rank out, so that a left-out rank on a sliver of a core (a
//! CPU quota that stalls it for a whole period) never holds up the ranks
//! that train. A word is started every `every` steps only
//! ([`word_interval`]: about `--control-interval-ms` apart): each word
//! costs every rank messages, and a rank on a CPU quota a wake-up it may
//! have to wait a whole period for. Lag and interval are rank 0's choice,
//! carried in the word, so every rank starts and waits each word at the
//! same step. The word is f64: plan numbers are integers far below 2^53,
//! so they stay exact.

use std::collections::VecDeque;

use heterotrain_crds::BatchPlan;
use tch::Tensor;

use crate::c10d::{PendingWork, ProcessGroup};
use crate::error::{Result, TrainerError};

/// What the ranks agreed on for the coming step.
#[derive(Debug, Clone, PartialEq)]
pub struct Agreement {
    pub plan: BatchPlan,
    /// Some rank asked to stop (SIGTERM).
    pub stop: bool,
    /// Σ_r b_r/B · loss_r: the global batch's mean loss (0 before training).
    pub loss: f64,
    /// Steps between starting a control word and waiting for it, for the
    /// words started under this agreement (rank 0's choice).
    pub lag: u32,
    /// Steps from one control word to the next, for the words started
    /// under this agreement (rank 0's choice, at least 1).
    pub every: u32,
}

/// Fixed slots before the batches: stop, generation, B, lag, every.
const HEAD: usize = 5;

/// The most steps between two control words (a stop or a plan change
/// waits at most this many steps, plus the lag).
pub const MAX_EVERY: u32 = 64;

/// Steps between control words so that they are about `target_ms` apart
/// at `step_seconds` a step: at least 1 (also for 0 or an unknown step
/// time), at most [`MAX_EVERY`].
pub fn word_interval(target_ms: u32, step_seconds: f64) -> u32 {
    if target_ms == 0 || step_seconds.is_nan() || step_seconds <= 0.0 {
        return 1;
    }
    let k = (f64::from(target_ms) / 1000.0 / step_seconds).floor();
    if k.is_finite() {
        (k as u32).clamp(1, MAX_EVERY)
    } else {
        1
    }
}

/// This rank's control word: its stop request, its weighted loss and, on
/// rank 0, the plan.
pub fn encode(rank: usize, world: usize, proposed: &Proposal, stop: bool, loss: f64) -> Tensor {
    let mut v = vec![0f64; HEAD + 1 + world];
    v[0] = f64::from(u8::from(stop));
    if rank == 0 {
        let plan = &proposed.plan;
        v[1] = plan.generation as f64;
        v[2] = f64::from(plan.global_batch_size);
        v[3] = f64::from(proposed.lag);
        v[4] = f64::from(proposed.every);
        for (r, b) in plan.batch_sizes.iter().enumerate().take(world) {
            v[HEAD + r] = f64::from(*b);
        }
    }
    v[HEAD + world] = loss;
    Tensor::from_slice(&v)
}

/// What a rank puts forward at a step: on rank 0 the plan, and the lag
/// and interval for the words started under it; elsewhere the current
/// plan (kept for its text), no lag and an interval of 1.
#[derive(Debug, Clone, PartialEq)]
pub struct Proposal {
    pub plan: BatchPlan,
    pub lag: u32,
    pub every: u32,
}

/// The agreement in a SUM-reduced control word; `proposed` is this rank's
/// own proposal (rank 0 keeps its plan's policy and reason).
pub fn decode(word: &Tensor, rank: usize, proposed: &Proposal) -> Agreement {
    let out = Vec::<f64>::try_from(word).unwrap_or_default();
    if out.len() <= HEAD {
        return Agreement {
            plan: proposed.plan.clone(),
            stop: false,
            loss: f64::NAN,
            lag: proposed.lag,
            every: proposed.every.max(1),
        };
    }
    let (batches, loss) = (&out[HEAD..out.len() - 1], out[out.len() - 1]);
    let generation = out[1] as u64;
    let mut plan = proposed.plan.clone();
    if rank != 0 || plan.generation != generation {
        plan.generation = generation;
        plan.global_batch_size = out[2] as u32;
        plan.batch_sizes = batches.iter().map(|&b| b as u32).collect();
        plan.policy = "agreed".into();
        plan.reason = "from rank 0".into();
    }
    Agreement {
        plan,
        stop: out[0] > 0.0,
        loss,
        lag: out[3] as u32,
        every: (out[4] as u32).clamp(1, MAX_EVERY),
    }
}

/// Agree on the plan (rank 0's `proposed`) and on stopping, now (one
/// blocking collective).
pub fn agree(
    pg: Option<&ProcessGroup>,
    rank: usize,
    proposed: &Proposal,
    stop: bool,
) -> Result<Agreement> {
    let Some(pg) = pg else {
        return Ok(Agreement {
            plan: proposed.plan.clone(),
            stop,
            loss: 0.0,
            lag: proposed.lag,
            every: proposed.every.max(1),
        });
    };
    let mut t = encode(rank, pg.world_size(), proposed, stop, 0.0);
    pg.all_reduce_sum(&mut t)?;
    Ok(decode(&t, rank, proposed))
}

/// A control word being summed, and the step at whose end it is due.
struct InFlight<'a> {
    word: Tensor,
    work: Option<PendingWork<'a>>,
    due: u64,
    proposed: Proposal,
}

/// The control words in flight, oldest first. A word started at step s
/// under lag L is due at the end of step max(s + L, the previous word's
/// due step): every rank computes the same due steps from the same
/// agreements, and words are applied in the order they were started.
#[derive(Default)]
pub struct Pipeline<'a> {
    queue: VecDeque<InFlight<'a>>,
    last_due: u64,
}

impl<'a> Pipeline<'a> {
    /// Keep `word` (its sum's `work` started at `step`) until its due step.
    pub fn push(
        &mut self,
        step: u64,
        lag: u32,
        word: Tensor,
        work: Option<PendingWork<'a>>,
        proposed: Proposal,
    ) {
        let due = due_step(step, lag, self.last_due);
        self.last_due = due;
        self.queue.push_back(InFlight {
            word,
            work,
            due,
            proposed,
        });
    }

    /// Wait for the words due by the end of `step`, oldest first, and merge
    /// their agreements: the newest plan, lag and loss, and a stop if any
    /// asked for one. None: nothing was due.
    pub fn take_due(&mut self, step: u64, rank: usize) -> Result<Option<Agreement>> {
        let mut merged: Option<Agreement> = None;
        while let Some(w) = self.queue.pop_front() {
            if w.due > step {
                self.queue.push_front(w);
                break;
            }
            if let Some(work) = w.work {
                work.wait()?;
            }
            let a = decode(&w.word, rank, &w.proposed);
            let stop = a.stop || merged.as_ref().is_some_and(|m| m.stop);
            // A non-finite loss in an older word is not hidden by a newer one.
            let loss = match &merged {
                Some(m) if !m.loss.is_finite() => m.loss,
                _ => a.loss,
            };
            merged = Some(Agreement { stop, loss, ..a });
        }
        Ok(merged)
    }

    /// Wait for every word still in flight (at the end of the run: every
    /// rank started the same words, so they all complete). A non-finite
    /// loss among them fails the run as it would have at its due step.
    pub fn drain(&mut self, rank: usize) -> Result<()> {
        let mut bad = None;
        for w in self.queue.drain(..) {
            if let Some(work) = w.work {
                work.wait()?;
            }
            let loss = decode(&w.word, rank, &w.proposed).loss;
            if !loss.is_finite() && bad.is_none() {
                bad = Some(loss);
            }
        }
        match bad {
            Some(l) => Err(TrainerError::Data(format!(
                "loss became {l} in the last steps; lower --lr"
            ))),
            None => Ok(()),
        }
    }
}

/// The step at whose end a word started at `step` under `lag` is due, after
/// the previous word's `last_due` (never before it: words apply in order).
pub fn due_step(step: u64, lag: u32, last_due: u64) -> u64 {
    step.saturating_add(u64::from(lag)).max(last_due)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(plan: &BatchPlan, lag: u32) -> Proposal {
        Proposal {
            plan: plan.clone(),
            lag,
            every: 1,
        }
    }

    #[test]
    fn the_word_carries_rank_zero_interval() {
        let p = BatchPlan::equal(1, 8, 2);
        let with = |every| Proposal {
            every,
            ..offer(&p, 0)
        };
        // Rank 1 proposes 9: only rank 0's value counts.
        let sum = encode(0, 2, &with(6), false, 0.0) + encode(1, 2, &with(9), false, 0.0);
        assert_eq!(decode(&sum, 1, &with(9)).every, 6);
        // Never 0 (a word every step at least), never above MAX_EVERY.
        let zero = encode(0, 2, &with(0), false, 0.0);
        assert_eq!(decode(&zero, 1, &with(3)).every, 1);
        let huge = encode(0, 2, &with(10_000), false, 0.0);
        assert_eq!(decode(&huge, 1, &with(3)).every, MAX_EVERY);
        assert_eq!(agree(None, 0, &with(5), false).unwrap().every, 5);
    }

    #[test]
    fn words_are_spaced_by_the_target_time() {
        // 200 ms apart at 50 ms a step: every 4th step.
        assert_eq!(word_interval(200, 0.050), 4);
        assert_eq!(word_interval(200, 0.045), 4, "rounded down");
        // Steps slower than the target: every step.
        assert_eq!(word_interval(200, 0.5), 1);
        assert_eq!(word_interval(200, 1e-6), MAX_EVERY);
        // Off, or no step time measured yet: every step.
        assert_eq!(word_interval(0, 0.001), 1);
        assert_eq!(word_interval(200, 0.0), 1);
        assert_eq!(word_interval(200, f64::NAN), 1);
    }

    #[test]
    fn sum_of_words_carries_rank_zero_plan_lag_and_any_stop() {
        let mut p0 = BatchPlan::equal(3, 32, 3);
        p0.batch_sizes = vec![20, 9, 3];
        let p1 = BatchPlan::equal(2, 32, 3);
        let sum = encode(0, 3, &offer(&p0, 4), false, 0.25)
            + encode(1, 3, &offer(&p1, 9), true, 0.5)
            + encode(2, 3, &offer(&p1, 9), false, 0.125);
        let a = decode(&sum, 1, &offer(&p1, 9));
        assert!(a.stop);
        assert_eq!(a.plan.generation, 3);
        assert_eq!(a.plan.batch_sizes, vec![20, 9, 3]);
        assert_eq!(a.lag, 4, "rank 0's lag, the others' ignored");
        assert_eq!(a.loss, 0.875, "the weighted losses add up");
        let a0 = decode(&sum, 0, &offer(&p0, 4));
        assert_eq!(a0.plan, p0, "rank 0 keeps its own plan's text");
        let calm =
            encode(0, 3, &offer(&p0, 0), false, 0.0) + encode(1, 3, &offer(&p1, 0), false, 0.0);
        assert!(!decode(&calm, 2, &offer(&p1, 0)).stop);
    }

    #[test]
    fn large_generations_and_batches_survive_the_float_word() {
        let mut p = BatchPlan::equal(1 << 40, 1 << 20, 2);
        p.batch_sizes = vec![(1 << 20) - 1, 1];
        let a = decode(
            &encode(0, 2, &offer(&p, 0), false, 0.0),
            1,
            &offer(&BatchPlan::equal(0, 2, 2), 0),
        );
        assert_eq!(a.plan.generation, 1 << 40);
        assert_eq!(a.plan.global_batch_size, 1 << 20);
        assert_eq!(a.plan.batch_sizes, p.batch_sizes);
    }

    #[test]
    fn due_steps_follow_the_lag_and_never_reorder() {
        // Lag 0: due at the end of its own step.
        assert_eq!(due_step(5, 0, 4), 5);
        // Lag 3 from step 5: due at 8.
        assert_eq!(due_step(5, 3, 4), 8);
        // The lag dropped to 0 while the word of step 5 (due 8) is in
        // flight: the word of step 6 waits for it (due 8, not 6).
        assert_eq!(due_step(6, 0, 8), 8);
        assert_eq!(due_step(u64::MAX, 7, 0), u64::MAX);
    }

    #[test]
    fn pipeline_applies_words_at_their_due_step_merging_stops() {
        // Without a group (no work to wait for) the words are their own sums.
        let mut plan = BatchPlan::equal(1, 8, 2);
        let mut pipe = Pipeline::default();
        let rank1 = offer(&BatchPlan::equal(0, 8, 2), 0);
        pipe.push(
            1,
            2,
            encode(0, 2, &offer(&plan, 2), true, 0.5),
            None,
            rank1.clone(),
        );
        plan.generation = 2;
        plan.batch_sizes = vec![7, 1];
        pipe.push(
            2,
            0,
            encode(0, 2, &offer(&plan, 0), false, 0.25),
            None,
            rank1.clone(),
        );
        assert!(
            pipe.take_due(1, 1).unwrap().is_none(),
            "step 1's word is due at 3"
        );
        assert!(
            pipe.take_due(2, 1).unwrap().is_none(),
            "step 2's word waits behind it"
        );
        let a = pipe.take_due(3, 1).unwrap().expect("both due at 3");
        assert_eq!(a.plan.batch_sizes, vec![7, 1], "the newest plan");
        assert_eq!((a.lag, a.loss), (0, 0.25), "the newest lag and loss");
        assert!(a.stop, "a stop in an older word is kept");
        assert!(pipe.take_due(9, 1).unwrap().is_none());
        pipe.push(4, 0, encode(1, 2, &rank1, false, 0.0), None, rank1.clone());
        pipe.drain(1).unwrap();
        assert!(pipe.take_due(9, 1).unwrap().is_none(), "drained");
        // A non-finite loss is kept over a newer finite one, and fails a drain.
        pipe.push(
            5,
            1,
            encode(0, 2, &offer(&plan, 1), false, f64::NAN),
            None,
            rank1.clone(),
        );
        pipe.push(
            6,
            0,
            encode(0, 2, &offer(&plan, 0), false, 0.5),
            None,
            rank1.clone(),
        );
        assert!(pipe.take_due(6, 1).unwrap().unwrap().loss.is_nan());
        pipe.push(
            7,
            4,
            encode(0, 2, &offer(&plan, 4), false, f64::INFINITY),
            None,
            rank1,
        );
        let e = pipe.drain(1).unwrap_err().to_string();
        assert!(e.contains("loss became inf"), "{e}");
    }
}
