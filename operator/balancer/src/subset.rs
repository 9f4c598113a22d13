//! Leaving slow ranks out ("never slower than the best subset").
//!
//! Including a rank costs the step at least its time at the smallest batch
//! it may get. When that is longer than the step the other ranks reach
//! without it — a large fixed cost, or a device far slower than the rest —
//! every step waits for it, and the job is faster with the rank given 0
//! samples. [`choose`] compares the best split over all ranks with splits
//! that leave out the slowest ranks; the rest of this module keeps the
//! per-rank bookkeeping that brings left-out ranks back for measurement.
//!
//! Rank 0 (it writes checkpoints) is never left out, nor is a stale rank
//! (it stays pinned) or one without data of its own.

use std::fmt::Write as _;

use crate::bounds::Bounds;
use crate::config::MAX_READMIT_FACTOR;
use crate::exchange;
use crate::rank::{Probe, RankState};
use crate::split::{optimal_split_bounded, round_to_sum};
use crate::text::{ranks_named, secs};
use crate::{BalancerConfig, BalancerError, StepModel};

/// A split chosen over the candidate memberships.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Choice {
    /// Local batch per rank (0: left out); sums to the global batch.
    pub batches: Vec<u32>,
    /// Its predicted step, seconds (ranks with 0 add nothing).
    pub step_seconds: f64,
    /// Predicted step of the best split in which every rank that may
    /// train does, seconds.
    pub all_ranks_step_seconds: f64,
    /// The eligible ranks this choice leaves out, in order.
    pub left_out: Vec<usize>,
    /// Left-out ranks that stay out because ranks pinned at their batch
    /// leave no samples for them.
    pub no_room: Vec<usize>,
}

/// The least rank `r` adds to a step when it trains: its step at the
/// smallest batch it may get.
fn smallest_step(model: &StepModel, lower: u32) -> f64 {
    model.predict(lower.max(1))
}

/// The best split over candidate memberships: every rank in, or the `k`
/// slowest of the `eligible` ranks left out (slowest by [`smallest_step`];
/// only ranks whose smallest step exceeds the all-ranks water level can
/// shorten the step by leaving, so only those are tried), or the
/// `current_out` ranks kept out.
///
/// A membership that leaves out no rank beyond `current_out` wins on the
/// predicted step alone (ties go to fewer ranks out, so a left-out rank
/// comes back as soon as including it pays); one that leaves out a further
/// rank must beat the best of those by `margin_percent` as well.
///
/// With an `exchange` model every membership's step also counts its
/// gradient exchange (leaving a rank out takes it out of the exchange),
/// every rank may shorten it by leaving (each one takes its share of the
/// exchange along), and ranks are ordered by their compute floor plus what
/// they add to the exchange.
///
/// `bounds` are those with every rank in; each membership's come from
/// [`Bounds::without`]. Errors only when the all-ranks split itself is
/// infeasible; an infeasible subset is skipped.
pub(crate) fn choose(
    models: &[StepModel],
    bounds: &Bounds,
    eligible: &[usize],
    current_out: &[usize],
    margin_percent: u32,
    exchange: Option<&exchange::Model>,
) -> Result<Choice, BalancerError> {
    let ex = |batches: &[u32]| exchange.map_or(0.0, |m| m.seconds(batches));
    let global = bounds.global;
    let lower = &bounds.lower;
    let zeroed = |set: &[usize]| bounds.without(set);
    // Ranks pinned at their batch (stale) may leave no room to bring the
    // left-out ranks back: then they stay out.
    let (lo, hi) = zeroed(&[]);
    let (all, no_room) = match optimal_split_bounded(models, global, &lo, &hi) {
        Ok(s) => (s, Vec::new()),
        Err(e) if !current_out.is_empty() => {
            let (lo, hi) = zeroed(current_out);
            let s = optimal_split_bounded(models, global, &lo, &hi).map_err(|_| e)?;
            (s, current_out.to_vec())
        }
        Err(e) => return Err(e),
    };
    let all_step = all.step_seconds + ex(&all.batches);
    let mut slow: Vec<(usize, f64)> = eligible
        .iter()
        .filter(|&&r| r != 0 && r < models.len() && !no_room.contains(&r))
        .map(|&r| (r, smallest_step(&models[r], lower[r])))
        .filter(|&(_, t)| t > all.water_level_seconds || exchange.is_some())
        .map(|(r, t)| (r, t + exchange.map_or(0.0, |m| m.marginal(&all.batches, r))))
        .collect();
    // Slowest first; among equals the higher rank leaves first.
    slow.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
    let everyone = Choice {
        all_ranks_step_seconds: all_step,
        step_seconds: all_step,
        batches: all.batches,
        left_out: Vec::new(),
        no_room: no_room.clone(),
    };
    if slow.is_empty() {
        return Ok(everyone);
    }

    let without = |set: &[usize]| -> Option<(Choice, f64)> {
        let mut out = set.to_vec();
        out.extend_from_slice(&no_room);
        // Leaving a further rank out must fit the others' soft bounds:
        // beyond its growth bound a rank's live model is a line through
        // one batch, and a membership that needs it would stake the whole
        // step on that guess (in the 4-node bench a 0.25-core rank timed
        // at 1 sample, at full speed between its quota's throttled
        // periods, was planned at 80 of 128 while two ranks left on their
        // links, and the step went from 45 to 130 ms). Ranks already out
        // may stay out whatever the bounds.
        let (lo, hi) = if set.iter().all(|r| current_out.contains(r)) {
            zeroed(&out)
        } else {
            let (lo, hi, _) = bounds.without_soft(&out);
            (lo, hi)
        };
        let s = optimal_split_bounded(models, global, &lo, &hi).ok()?;
        let mut left_out = set.to_vec();
        left_out.sort_unstable();
        let step_seconds = s.step_seconds + ex(&s.batches);
        Some((
            Choice {
                batches: s.batches,
                step_seconds,
                all_ranks_step_seconds: everyone.all_ranks_step_seconds,
                left_out,
                no_room: no_room.clone(),
            },
            s.water_level_seconds,
        ))
    };
    let mut tried: Vec<Choice> = Vec::new();
    let kept: Vec<usize> = slow
        .iter()
        .map(|&(r, _)| r)
        .filter(|r| current_out.contains(r))
        .collect();
    if !kept.is_empty() {
        tried.extend(without(&kept).map(|(c, _)| c));
    }
    let mut best = tried
        .iter()
        .map(|c| c.step_seconds)
        .fold(everyone.step_seconds, f64::min);
    for k in 1..=slow.len() {
        let set: Vec<usize> = slow[..k].iter().map(|&(r, _)| r).collect();
        // Less capacity with every rank removed: once infeasible, always.
        let Some((c, level)) = without(&set) else {
            break;
        };
        best = best.min(c.step_seconds);
        tried.push(c);
        // Removing ranks only raises the water level, a lower bound on
        // every larger subset's step.
        if level >= best {
            break;
        }
    }

    let only_current = |c: &Choice| c.left_out.iter().all(|r| current_out.contains(r));
    let better = |a: &Choice, b: &Choice| {
        a.step_seconds < b.step_seconds
            || (a.step_seconds == b.step_seconds && a.left_out.len() < b.left_out.len())
    };
    let mut base = everyone;
    for c in tried.iter().filter(|c| only_current(c)) {
        if better(c, &base) {
            base = c.clone();
        }
    }
    let threshold = base.step_seconds * (1.0 - f64::from(margin_percent.min(100)) / 100.0);
    let mut chosen: Option<Choice> = None;
    for c in tried
        .into_iter()
        .filter(|c| !only_current(c) && c.step_seconds < threshold)
    {
        if chosen.as_ref().is_none_or(|best| better(&c, best)) {
            chosen = Some(c);
        }
    }
    Ok(chosen.unwrap_or(base))
}

impl Choice {
    /// Why its ranks are left out, e.g. "rank 3 left out: its fixed cost
    /// 0.41 s/step exceeds the 0.12 s step the others reach without it;
    /// predicted step 0.12 s vs 0.45 s with it" (empty when none is).
    pub fn leave_out_note(
        &self,
        models: &[StepModel],
        lower: &[u32],
        margin_percent: u32,
        exchange: Option<&exchange::Model>,
    ) -> String {
        let mut s = String::new();
        if !self.no_room.is_empty() {
            let _ = write!(
                s,
                "{} stay left out: the ranks kept at their batch leave no samples to share; ",
                ranks_named(&self.no_room)
            );
        }
        for &r in &self.left_out {
            let (Some(m), Some(&lo)) = (models.get(r), lower.get(r)) else {
                continue;
            };
            let others = secs(self.step_seconds);
            let b = lo.max(1);
            let link = exchange.and_then(|x| x.bandwidth(r));
            if let (Some(bw), true) = (link, m.predict(b) <= self.step_seconds) {
                let _ = write!(
                    s,
                    "rank {r} left out: its link ({:.3} GB/s) slows the gradient exchange; ",
                    bw / 1e9
                );
            } else if m.fixed_seconds >= self.step_seconds {
                let _ = write!(
                    s,
                    "rank {r} left out: its fixed cost {}/step exceeds the {others} step the others reach without it; ",
                    secs(m.fixed_seconds)
                );
            } else {
                let _ = write!(
                    s,
                    "rank {r} left out: even at batch {b} its step takes {}, longer than the {others} step the others reach without it; ",
                    secs(m.predict(b))
                );
            }
        }
        if !self.left_out.is_empty() {
            let _ = write!(
                s,
                "predicted step {} vs {} with {} (leaveOutMarginPercent {margin_percent}%)",
                secs(self.step_seconds),
                secs(self.all_ranks_step_seconds),
                if self.left_out.len() == 1 {
                    "it"
                } else {
                    "them"
                }
            );
        }
        s.trim_end_matches("; ").to_string()
    }
}

/// Damped move from `current` towards `plan`, `alpha` of the way, as
/// integers summing to `global` within the bounds. A rank whose membership
/// changes (left out, or back in) takes its target at once — a left-out
/// rank never keeps a fraction of its old batch — and the ranks that train
/// in both plans share the rest in proportion to their damped targets.
/// `None` when the rounding cannot be made exact.
pub(crate) fn damp(
    current: &[u32],
    plan: &[u32],
    alpha: f64,
    global: u32,
    lower: &[u32],
    upper: &[u32],
) -> Option<Vec<u32>> {
    let same = |r: usize| (current[r] == 0) == (plan[r] == 0);
    let n = plan.len().min(current.len());
    let mut x: Vec<f64> = (0..n)
        .map(|r| {
            let (c, p) = (f64::from(current[r]), f64::from(plan[r]));
            if same(r) {
                c + alpha * (p - c)
            } else {
                p
            }
        })
        .collect();
    if (0..n).any(|r| !same(r)) {
        let fixed: f64 = (0..n).filter(|&r| !same(r)).map(|r| x[r]).sum();
        let damped: f64 = (0..n).filter(|&r| same(r)).map(|r| x[r]).sum();
        if damped <= 0.0 {
            return None;
        }
        let scale = (f64::from(global) - fixed) / damped;
        for r in (0..n).filter(|&r| same(r)) {
            x[r] *= scale;
        }
    }
    let out = |r: usize, v: u32| if plan[r] == 0 { 0 } else { v };
    let lo: Vec<u32> = (0..n).map(|r| out(r, lower[r])).collect();
    let hi: Vec<u32> = (0..n).map(|r| out(r, upper[r])).collect();
    round_to_sum(&x, global, &lo, &hi)
}

/// Live samples a re-admitted rank must report before fresh measurements
/// may leave it out again: enough for a fast re-fit when it changed.
pub(crate) fn trial_samples_needed(cfg: &BalancerConfig) -> u32 {
    cfg.straggler_patience.max(1)
}

/// The share of the training time re-admissions are spaced to cost. A
/// re-admission that measured the step `ρ` times longer with the rank
/// than without it, over `d` decisions, cost about `d × (ρ − 1)` decision
/// intervals of training (counted in steps: an interval of a fixed number
/// of steps at the slower step); the next one waits at least that over this
/// budget. On one H200 with an 8-thread CPU rank (resnet18, B 256) a
/// re-admission ran 25 steps at 0.16–0.35 s against 0.011 s without the
/// rank, and the base wait (20 decisions, doubling to 160) re-admitted it
/// so often that a job ran at 0.23–0.25 × the GPU alone.
pub const READMIT_COST_BUDGET: f64 = 0.05;

/// Decisions `rank` waits, left out, before its next re-admission: the
/// doubling back-off, or longer when its last re-admission's measured cost
/// needs it ([`READMIT_COST_BUDGET`]).
pub(crate) fn readmit_wait(rank: &RankState, cfg: &BalancerConfig) -> u32 {
    doubling_wait(rank, cfg).max(rank.probe_wait)
}

/// The doubling back-off alone: `readmitAfterDecisions` × 1, 2, 4, 8.
fn doubling_wait(rank: &RankState, cfg: &BalancerConfig) -> u32 {
    cfg.readmit_after_decisions
        .max(1)
        .saturating_mul(rank.readmit_factor.clamp(1, MAX_READMIT_FACTOR))
}

/// Counts the decision just measured into the cost of each re-admission in
/// progress whose rank trained in `current`: `measured` is the step over
/// the interval that ran it.
pub(crate) fn count_probes(ranks: &mut [RankState], current: &[u32], measured: Option<f64>) {
    for (rank, &b) in ranks.iter_mut().zip(current) {
        if let (Some(p), Some(_), true) = (rank.probe.as_mut(), rank.trial_samples, b > 0) {
            p.decisions = p.decisions.saturating_add(1);
            if let Some(w) = measured.filter(|w| w.is_finite() && *w > 0.0) {
                p.with_seconds.0 += w;
                p.with_seconds.1 += 1;
            }
        }
    }
}

/// The decisions the next re-admission must wait so that the one `probe`
/// measured costs about [`READMIT_COST_BUDGET`] of the training time, and
/// the measured ratio of the step with the rank to the step without it.
/// `None` without a step measured with the rank.
fn probe_cost(probe: &Probe) -> Option<(u32, f64)> {
    let (sum, n) = probe.with_seconds;
    if n == 0 || probe.without_seconds.is_nan() || probe.without_seconds <= 0.0 {
        return None;
    }
    let ratio = sum / f64::from(n) / probe.without_seconds;
    let lost = f64::from(probe.decisions) * (ratio - 1.0).max(0.0);
    let wait = (lost / READMIT_COST_BUDGET).ceil().min(f64::from(u32::MAX));
    Some((wait as u32, ratio))
}

/// Counts one more decision left out for each rank with 0 in `current`
/// (and restarts the count of the others).
pub(crate) fn count_left_out(ranks: &mut [RankState], current: &[u32]) {
    for (r, &b) in ranks.iter_mut().zip(current) {
        r.out_decisions = if b == 0 {
            r.out_decisions.saturating_add(1)
        } else {
            0
        };
    }
}

/// The left-out ranks of `current` whose wait is over (never a stale one:
/// it could not be measured).
pub(crate) fn due_for_readmission(
    ranks: &[RankState],
    current: &[u32],
    stale: &[usize],
    cfg: &BalancerConfig,
) -> Vec<usize> {
    (1..ranks.len().min(current.len()))
        .filter(|&r| current[r] == 0 && !stale.contains(&r))
        .filter(|&r| ranks[r].out_decisions >= readmit_wait(&ranks[r], cfg))
        .collect()
}

/// Whether `rank` is on a measurement trial that has not yet produced the
/// samples its verdict needs (it may not be left out until it has).
pub(crate) fn on_open_trial(rank: &RankState, cfg: &BalancerConfig) -> bool {
    rank.trial_samples
        .is_some_and(|n| n < trial_samples_needed(cfg))
}

/// Starts the measurement trials of `readmitted`; `measured`: the step
/// measured over the interval before, without them (their cost is counted
/// against it, [`count_probes`]).
pub(crate) fn start_trials(ranks: &mut [RankState], readmitted: &[usize], measured: Option<f64>) {
    for &r in readmitted {
        if let Some(rank) = ranks.get_mut(r) {
            rank.trial_samples = Some(0);
            rank.out_decisions = 0;
            rank.probe = measured
                .filter(|w| w.is_finite() && *w > 0.0)
                .map(|w| Probe {
                    without_seconds: w,
                    with_seconds: (0.0, 0),
                    decisions: 0,
                });
        }
    }
}

/// After a decision that runs `decided`: marks the left-out ranks (their
/// last times no longer describe the job); a trial with enough samples is over —
/// left out again, the rank's wait doubles (capped), kept in, it resets.
/// Returns notes for the reason (empty when nothing happened).
pub(crate) fn settle(ranks: &mut [RankState], decided: &[u32], cfg: &BalancerConfig) -> String {
    let mut notes = String::new();
    for (r, (rank, &b)) in ranks.iter_mut().zip(decided).enumerate() {
        rank.left_out = b == 0;
        if b == 0 {
            rank.climbing = false;
        }
        match rank.trial_samples {
            Some(n) if n >= trial_samples_needed(cfg) => {
                rank.trial_samples = None;
                let probe = rank.probe.take();
                if b == 0 {
                    rank.readmit_factor = (rank.readmit_factor * 2).min(MAX_READMIT_FACTOR);
                    let cost = probe.as_ref().and_then(probe_cost);
                    rank.probe_wait = cost.map_or(0, |(w, _)| w);
                    let _ = write!(
                        notes,
                        "; rank {r}'s fresh measurements leave it out again: next re-admission after {} decisions",
                        readmit_wait(rank, cfg)
                    );
                    if let (Some((w, ratio)), Some(p)) = (cost, probe) {
                        if w > doubling_wait(rank, cfg) {
                            let _ = write!(
                                notes,
                                " (its re-admission ran {} decision(s) at a measured step {ratio:.1}× the {} without it; re-admissions are spaced to cost about {:.0}% of the training time)",
                                p.decisions,
                                secs(p.without_seconds),
                                100.0 * READMIT_COST_BUDGET
                            );
                        }
                    }
                } else {
                    rank.readmit_factor = 1;
                    rank.probe_wait = 0;
                    rank.climbing = true;
                    let _ = write!(notes, "; rank {r} stays in after its measurement");
                }
            }
            _ => {
                if b > 0 && rank.trial_samples.is_none() {
                    rank.readmit_factor = 1;
                    rank.probe_wait = 0;
                }
            }
        }
    }
    notes
}

#[cfg(test)]
mod tests;
