//! Choosing the membership: the best split over every rank, or over all
//! but the slowest ones ([`choose`]), and the note that says why ranks
//! are left out.

use std::fmt::Write as _;

use crate::bounds::Bounds;
use crate::exchange;
use crate::split::{optimal_split_bounded, Split};
use crate::text::{ranks_named, secs};
use crate::{BalancerError, StepModel};

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
    let (all, no_room) = all_ranks_split(models, bounds, current_out)?;
    let all_step = all.step_seconds + exchange_seconds(exchange, &all.batches);
    let slow = slowest_first(models, &bounds.lower, eligible, &no_room, &all, exchange);
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
    let memberships = Memberships {
        models,
        bounds,
        current_out,
        no_room: &no_room,
        exchange,
        all_ranks_step_seconds: all_step,
    };
    let tried = memberships.try_leaving_out(&slow, everyone.step_seconds);
    Ok(pick(everyone, tried, current_out, margin_percent))
}

/// The exchange's seconds under `batches` (0 without an exchange model).
fn exchange_seconds(exchange: Option<&exchange::Model>, batches: &[u32]) -> f64 {
    exchange.map_or(0.0, |m| m.seconds(batches))
}

/// The best split with every rank in, and the ranks that stay out because
/// there is no room for them. Ranks pinned at their batch (stale) may
/// leave no room to bring the left-out ranks back: then they stay out.
fn all_ranks_split(
    models: &[StepModel],
    bounds: &Bounds,
    current_out: &[usize],
) -> Result<(Split, Vec<usize>), BalancerError> {
    let global = bounds.global;
    let (lo, hi) = bounds.without(&[]);
    match optimal_split_bounded(models, global, &lo, &hi) {
        Ok(s) => Ok((s, Vec::new())),
        Err(e) if !current_out.is_empty() => {
            let (lo, hi) = bounds.without(current_out);
            let s = optimal_split_bounded(models, global, &lo, &hi).map_err(|_| e)?;
            Ok((s, current_out.to_vec()))
        }
        Err(e) => Err(e),
    }
}

/// The `eligible` ranks (never rank 0, nor one in `no_room`) that could
/// shorten the step by leaving, with their smallest step plus what they
/// add to the exchange under `all`: slowest first; among equals the
/// higher rank leaves first.
fn slowest_first(
    models: &[StepModel],
    lower: &[u32],
    eligible: &[usize],
    no_room: &[usize],
    all: &Split,
    exchange: Option<&exchange::Model>,
) -> Vec<(usize, f64)> {
    let mut slow: Vec<(usize, f64)> = eligible
        .iter()
        .filter(|&&r| r != 0 && r < models.len() && !no_room.contains(&r))
        .map(|&r| (r, smallest_step(&models[r], lower[r])))
        .filter(|&(_, t)| t > all.water_level_seconds || exchange.is_some())
        .map(|(r, t)| (r, t + exchange.map_or(0.0, |m| m.marginal(&all.batches, r))))
        .collect();
    slow.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.0.cmp(&a.0)));
    slow
}

/// What every candidate membership is split from.
struct Memberships<'a> {
    models: &'a [StepModel],
    /// The bounds with every rank in.
    bounds: &'a Bounds,
    /// The ranks out of the current plan.
    current_out: &'a [usize],
    /// Ranks that stay out for lack of room ([`all_ranks_split`]).
    no_room: &'a [usize],
    exchange: Option<&'a exchange::Model>,
    /// The predicted step of the all-ranks split.
    all_ranks_step_seconds: f64,
}

impl Memberships<'_> {
    /// The best split with the ranks in `set` (and those without room)
    /// left out, and its water level; `None` when infeasible.
    fn without(&self, set: &[usize]) -> Option<(Choice, f64)> {
        let mut out = set.to_vec();
        out.extend_from_slice(self.no_room);
        // Leaving a further rank out must fit the others' soft bounds:
        // beyond its growth bound a rank's live model is a line through
        // one batch, and a membership that needs it would stake the whole
        // step on that guess (in the 4-node bench a 0.25-core rank timed
        // at 1 sample, at full speed between its quota's throttled
        // periods, was planned at 80 of 128 while two ranks left on their
        // links, and the step went from 45 to 130 ms). Ranks already out
        // may stay out whatever the bounds.
        let (lo, hi) = if set.iter().all(|r| self.current_out.contains(r)) {
            self.bounds.without(&out)
        } else {
            let (lo, hi, _) = self.bounds.without_soft(&out);
            (lo, hi)
        };
        let s = optimal_split_bounded(self.models, self.bounds.global, &lo, &hi).ok()?;
        let mut left_out = set.to_vec();
        left_out.sort_unstable();
        let step_seconds = s.step_seconds + exchange_seconds(self.exchange, &s.batches);
        Some((
            Choice {
                batches: s.batches,
                step_seconds,
                all_ranks_step_seconds: self.all_ranks_step_seconds,
                left_out,
                no_room: self.no_room.to_vec(),
            },
            s.water_level_seconds,
        ))
    }

    /// The memberships worth comparing: the `slow` ranks already out kept
    /// out, then the 1, 2, … slowest left out, until a membership is
    /// infeasible or its water level shows no larger one can beat the
    /// best step so far (`everyone`: the all-ranks step).
    fn try_leaving_out(&self, slow: &[(usize, f64)], everyone: f64) -> Vec<Choice> {
        let mut tried: Vec<Choice> = Vec::new();
        let kept: Vec<usize> = slow
            .iter()
            .map(|&(r, _)| r)
            .filter(|r| self.current_out.contains(r))
            .collect();
        if !kept.is_empty() {
            tried.extend(self.without(&kept).map(|(c, _)| c));
        }
        let mut best = tried
            .iter()
            .map(|c| c.step_seconds)
            .fold(everyone, f64::min);
        for k in 1..=slow.len() {
            let set: Vec<usize> = slow[..k].iter().map(|&(r, _)| r).collect();
            // Less capacity with every rank removed: once infeasible, always.
            let Some((c, level)) = self.without(&set) else {
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
        tried
    }
}

/// The choice among `everyone` and the `tried` memberships: the best of
/// those that leave out no rank beyond `current_out` (ties to fewer ranks
/// out), unless one that leaves out a further rank beats it by
/// `margin_percent`.
fn pick(
    everyone: Choice,
    tried: Vec<Choice>,
    current_out: &[usize],
    margin_percent: u32,
) -> Choice {
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
    chosen.unwrap_or(base)
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
