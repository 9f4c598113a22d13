//! Leaving ranks out on the *measured* step.
//!
//! The step models see compute only. A rank can also cost every step time
//! that is not compute — its share of the gradient exchange or of the
//! optimizer update on a CPU throttled to a fraction of a core — which the
//! other ranks spend waiting inside the all-reduce. Its compute model then
//! looks cheap, the model-based choice ([`crate::subset::choose`]) keeps it
//! at one sample, and every measured step is far longer than predicted.
//!
//! So the live policies (dynamic, hybrid) also take the measured wall-clock
//! step of each decision interval ([`crate::Balancer::observe_step_time`];
//! the median over the ranks that train, counted only from ranks running
//! the plan decided last). When it is at least [`TRIAL_EXCESS_FACTOR`]× the
//! predicted compute step — or, when leaving the rank out would leave one
//! rank training alone (no exchange at all), merely longer than predicted —
//! a *leave-out trial* starts: the eligible rank
//! slowest per sample (never rank 0, a stale rank, one without data) is
//! left out for one interval, provided it is not waiting out a lost trial
//! and its absence could win at all. At the next decision the two
//! measurements are compared: when the step without it is at least
//! `leaveOutMarginPercent` shorter, the rank stays out ([`Presence`]) —
//! re-admitted for measurement after `readmitAfterDecisions` like any
//! left-out rank, and out again (its wait doubling) while the step measured
//! with it stays that much longer; otherwise it is back at once and not
//! tried again for `readmitAfterDecisions` × 1, 2, 4, 8 decisions (doubling
//! with each lost trial), and no rank is tried for `readmitAfterDecisions`
//! decisions. One trial runs at a time; measured verdicts change membership
//! without the compute hysteresis.

use std::fmt::Write as _;

use crate::bounds::{Bounds, QUOTA_SATURATED};
use crate::config::MAX_READMIT_FACTOR;
use crate::model::median;
use crate::rank::{Presence, RankState};
use crate::split::{max_step, optimal_split_bounded};
use crate::subset::trial_samples_needed;
use crate::text::push_note;
use crate::text::secs;
use crate::{BalancerConfig, StepModel};

/// While two or more ranks would still train without the candidate, a
/// leave-out trial starts only when the measured step is at least this
/// many times the predicted compute step: the exchange of a healthy job
/// stays well below it, a rank stalling every exchange far above (one rank
/// left alone: see [`excess_factor`]).
pub(crate) const TRIAL_EXCESS_FACTOR: f64 = 2.0;
/// How many times the predicted compute step the measured step must be for
/// a trial whose plan is `without` (the split without the candidate):
/// [`TRIAL_EXCESS_FACTOR`] while two or more ranks would still train (the
/// exchange stays, and a step longer than predicted may be its cost rather
/// than the candidate's), 1 when one rank would train alone — the exchange
/// goes with the candidate, so its absence wins whenever the compute step
/// without it is `leaveOutMarginPercent` shorter than the measured step.
fn excess_factor(without: &[u32]) -> f64 {
    if without.iter().filter(|&&b| b > 0).count() <= 1 {
        1.0
    } else {
        TRIAL_EXCESS_FACTOR
    }
}

/// Whether `rank` is a small part of `current` that is saturated on its CPU
/// quota, with at least two ranks training in `without` (the split
/// without it): it used [`QUOTA_SATURATED`] of its quota and trains at
/// most half an equal share. Such a rank cannot run faster whatever it
/// waits for, and its own part of each step — its share of the gradient
/// exchange, run on the same quota — does not shrink with its batch: on
/// four quota-bound ranks (0.6 / 0.42 / 0.24 / 0.15 core, simple_cnn,
/// B 128) the gang ran 1.23× (1.13–1.39) faster with the 0.15-core rank
/// at 0 samples than at 10, while in the bench no trial started on the
/// measured step's excess. So its trial needs no excess of the measured
/// step over the prediction; the measured verdict decides.
fn quota_bound(state: &RankState, rank: usize, current: &[u32], without: &[u32]) -> Option<f64> {
    let used = state.quota_use?;
    (used >= QUOTA_SATURATED
        && without.iter().filter(|&&x| x > 0).count() >= 2
        && small(current, rank))
    .then_some(used)
}

/// Decisions a leave-out trial waits for a step measured without its rank
/// before it is given up (and counted as lost).
pub(crate) const TRIAL_MAX_DECISIONS: u32 = 3;

/// Measured-step bookkeeping of one balancer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Measured {
    /// The plan decided last: step times count only from ranks running it.
    pub plan: Option<Vec<u32>>,
    /// The leave-out trial in progress.
    pub trial: Option<Trial>,
    /// Reason text for the decision being made (appended when it finishes).
    pub note: String,
    /// The plan and step measured over the interval before this decision's
    /// (a trial needs its excess in two intervals in a row, [`steady`]).
    pub last_window: Option<(Vec<u32>, f64)>,
    /// Decisions before any rank may be on a leave-out trial again: after a
    /// lost trial, `readmitAfterDecisions` (so that noise among equally
    /// slow ranks cannot run one trial after another).
    pub cooldown: u32,
}

/// A leave-out trial in progress.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Trial {
    /// The rank left out on trial.
    pub rank: usize,
    /// Step seconds measured with it, before the trial.
    pub with_seconds: f64,
    /// How much shorter the step without it must measure for it to stay
    /// out, a fraction ([`verdict_margin`] at the plan it left).
    pub margin: f64,
    /// Decisions since the trial started without a step measured.
    pub decisions: u32,
}

/// What the measurements decide before the split is chosen.
#[derive(Debug, Default)]
pub(crate) struct Review {
    /// Ranks kept out by measurement: bounds 0 in this decision.
    pub held_out: Vec<usize>,
    /// Ranks back after a lost trial: the plan takes them back at once.
    pub back: Vec<usize>,
    /// A verdict was reached (no new trial starts in this decision).
    pub settled: bool,
    /// Reason text ("" when nothing happened), without a leading "; ".
    pub note: String,
}

/// Whether `without` is at least `margin`% shorter than `with`.
fn shorter(without: f64, with: f64, margin: u32) -> bool {
    shorter_by(without, with, f64::from(margin.min(100)) / 100.0)
}

/// Whether `without` is shorter than `with` by at least the fraction `m`.
fn shorter_by(without: f64, with: f64, m: f64) -> bool {
    without < with * (1.0 - m)
}

/// How much shorter (a fraction) the step measured without `rank` must be
/// for it to stay out of `current`: `leaveOutMarginPercent`, or — when less
/// — the most its samples can save. With `b` of `total` samples, the
/// others take its `b` and their compute grows by at most `b / (total −
/// b)`, while the exchange loses a member, so leaving it out costs the step
/// at most that fraction; a wrong verdict on noise costs no more. The
/// margin guards against noise only where a wrong verdict could cost more:
/// on four quota-bound ranks (0.6 / 0.42 / 0.24 / 0.15 core, simple_cnn,
/// B 128) the 0.15-core rank at 2 samples made the step 9% longer than at
/// 0, under the 10% default margin, for a share worth 1.6%.
pub(crate) fn verdict_margin(current: &[u32], rank: usize, margin: u32) -> f64 {
    let m = f64::from(margin.min(100)) / 100.0;
    share_worth(current, rank).map_or(m, |w| m.min(w))
}

/// The most `rank`'s samples can save of the step under `current`, a
/// fraction: `b / (total − b)` (see [`verdict_margin`]); `None` when it
/// trains nothing or alone.
fn share_worth(current: &[u32], rank: usize) -> Option<f64> {
    let b = f64::from(current.get(rank).copied().unwrap_or(0));
    let total: f64 = current.iter().map(|&x| f64::from(x)).sum();
    (b > 0.0 && total > b).then(|| b / (total - b))
}

/// The margin a verdict needed, for its note: "leaveOutMarginPercent 10%",
/// or "1.6% (the most its samples can save, under leaveOutMarginPercent
/// 10%)".
fn margin_text(m: f64, margin: u32) -> String {
    if m < f64::from(margin.min(100)) / 100.0 {
        format!(
            "{:.1}% (the most its samples can save, under leaveOutMarginPercent {margin}%)",
            100.0 * m
        )
    } else {
        format!("leaveOutMarginPercent {margin}%")
    }
}

/// The step measured over the decision interval that ran `current`: the
/// median over its training ranks of each one's mean step time. `None`
/// unless `current` is the plan decided last and at least `needed` samples
/// came in.
pub(crate) fn window_step(
    ranks: &[RankState],
    decided: Option<&[u32]>,
    current: &[u32],
    needed: u32,
) -> Option<f64> {
    if decided != Some(current) {
        return None;
    }
    let training = ranks.iter().zip(current).filter(|(_, &b)| b > 0);
    let total: u64 = training
        .clone()
        .map(|(r, _)| u64::from(r.step_time.1))
        .sum();
    if total < u64::from(needed.max(1)) {
        return None;
    }
    let mut means: Vec<f64> = training
        .filter(|(r, _)| r.step_time.1 > 0)
        .map(|(r, _)| r.step_time.0 / f64::from(r.step_time.1))
        .filter(|t| t.is_finite() && *t > 0.0)
        .collect();
    median(&mut means)
}

/// Verdicts on the trial in progress and on ranks kept out by measurement,
/// given the step `measured` over the interval that ran `current`.
/// `readmit`: left-out ranks whose wait is over (they come back to be
/// measured, whatever kept them out).
pub(crate) fn review(
    ranks: &mut [RankState],
    m: &mut Measured,
    current: &[u32],
    measured: Option<f64>,
    readmit: &[usize],
    cfg: &BalancerConfig,
) -> Review {
    let margin = cfg.leave_out_margin_percent;
    let mut out = Review::default();
    for r in ranks.iter_mut() {
        r.trial_wait = r.trial_wait.saturating_sub(1);
    }
    m.cooldown = m.cooldown.saturating_sub(1);
    if let Some(t) = m.trial.take() {
        let out_now = current.get(t.rank) == Some(&0);
        if let (true, Some(rank)) = (out_now, ranks.get_mut(t.rank)) {
            out.settled = true;
            let r = t.rank;
            match measured {
                Some(w) if shorter_by(w, t.with_seconds, t.margin) => {
                    rank.presence = Some(Presence {
                        with_seconds: t.with_seconds,
                        without_seconds: w,
                    });
                    rank.trial_factor = 1;
                    out.held_out.push(r);
                    let _ = write!(
                        out.note,
                        "rank {r} stays left out after its leave-out trial: the step measured without it, {}, is {:.1}% shorter than the {} measured with it (it needed {}): its presence costs about {}/step that its compute does not show",
                        secs(w),
                        100.0 * (1.0 - w / t.with_seconds),
                        secs(t.with_seconds),
                        margin_text(t.margin, margin),
                        secs(t.with_seconds - w)
                    );
                }
                None if t.decisions + 1 < TRIAL_MAX_DECISIONS => {
                    out.settled = false;
                    out.held_out.push(r);
                    m.trial = Some(Trial {
                        decisions: t.decisions + 1,
                        ..t
                    });
                }
                w => {
                    let wait = cfg
                        .readmit_after_decisions
                        .max(1)
                        .saturating_mul(rank.trial_factor.clamp(1, MAX_READMIT_FACTOR));
                    rank.trial_wait = wait;
                    rank.trial_factor = (rank.trial_factor * 2).min(MAX_READMIT_FACTOR);
                    m.cooldown = cfg.readmit_after_decisions.max(1);
                    out.back.push(r);
                    let why = match w {
                        Some(w) => format!(
                            "the step measured without it, {}, is not shorter than the {} measured with it by {}",
                            secs(w),
                            secs(t.with_seconds),
                            margin_text(t.margin, margin)
                        ),
                        None => format!("no step was measured without it in {TRIAL_MAX_DECISIONS} decisions"),
                    };
                    let _ = write!(
                        out.note,
                        "rank {r} back after its leave-out trial: {why}; no new trial for it before {wait} decisions"
                    );
                }
            }
        }
    }
    let needed = trial_samples_needed(cfg);
    for (r, rank) in ranks.iter_mut().enumerate() {
        let Some(p) = rank.presence else { continue };
        if out.held_out.contains(&r) {
            continue;
        }
        match current.get(r).copied() {
            Some(0) if !readmit.contains(&r) => {
                if let Some(w) = measured {
                    rank.presence = Some(Presence {
                        without_seconds: w,
                        ..p
                    });
                }
                out.held_out.push(r);
            }
            Some(0) => {}
            Some(_) if rank.trial_samples.is_some_and(|n| n < needed) => {}
            _ => {
                rank.presence = None;
                if rank.trial_samples.is_none() {
                    continue;
                }
                out.settled = true;
                let sep = if out.note.is_empty() { "" } else { "; " };
                // The configured margin: at its probe batch the rank's samples
                // show only its fixed cost, not what it saves at its share.
                let m = f64::from(margin.min(100)) / 100.0;
                match measured {
                    Some(w) if shorter_by(p.without_seconds, w, m) => {
                        rank.presence = Some(Presence {
                            with_seconds: w,
                            ..p
                        });
                        out.held_out.push(r);
                        let _ = write!(
                            out.note,
                            "{sep}rank {r} left out again: the step measured without it, {}, is still shorter than the {} measured with it by {}",
                            secs(p.without_seconds),
                            secs(w),
                            margin_text(m, margin)
                        );
                    }
                    Some(w) => {
                        let _ = write!(
                            out.note,
                            "{sep}rank {r} stays in: the step measured without it, {}, is not shorter than the {} measured with it now by {}",
                            secs(p.without_seconds),
                            secs(w),
                            margin_text(m, margin)
                        );
                    }
                    None => {}
                }
            }
        }
    }
    out.held_out.sort_unstable();
    out
}

/// A training rank whose compute over the interval that ran `current`
/// ran more than `margin`% over what its model predicts at its batch: the
/// one that ran furthest over, with its measured mean and its prediction.
/// A slowdown (a throttle, a busy neighbour) shows there a decision or two
/// before the live model re-fits; until then the measured step runs over
/// the predicted compute step because of compute, not of time the models
/// cannot see, and a leave-out trial would test the wrong rank.
pub(crate) fn compute_outrun(
    ranks: &[RankState],
    predict: &[StepModel],
    current: &[u32],
    margin: u32,
) -> Option<(usize, f64, f64)> {
    let over = 1.0 + f64::from(margin.min(100)) / 100.0;
    ranks
        .iter()
        .zip(predict)
        .zip(current)
        .enumerate()
        .filter(|(_, ((r, _), &b))| b > 0 && r.compute_time.1 > 0)
        .filter_map(|(i, ((r, model), &b))| {
            let measured = r.compute_time.0 / f64::from(r.compute_time.1);
            let predicted = model.predict(b);
            (measured.is_finite() && predicted > 0.0 && measured > over * predicted)
                .then_some((i, measured, predicted))
        })
        .max_by(|p, q| (p.1 / p.2).total_cmp(&(q.1 / q.2)))
}

/// The note for a trial held back by [`compute_outrun`].
pub(crate) fn outrun_note((rank, measured, predicted): (usize, f64, f64), margin: u32) -> String {
    format!(
        "leave-out trials wait: rank {rank}'s compute over the interval, {}, is {:.2}× its model's {} (more than leaveOutMarginPercent {margin}% over), so the step ran long on compute the models have not caught up with yet",
        secs(measured),
        measured / predicted,
        secs(predicted)
    )
}

impl Measured {
    /// Append `note` to the decision's measured-step notes.
    pub fn add_note(&mut self, note: &str) {
        if self.note.is_empty() {
            self.note = note.to_string();
        } else {
            push_note(&mut self.note, note);
        }
    }
}

/// Whether the step `w` measured over the interval that ran `current` is
/// within `margin`% of the step measured over the interval before it, at
/// the same plan (`previous`). A slowdown that began within this interval
/// (a throttle, a busy neighbour) moves the step before the models catch
/// up; only an excess seen twice in a row is the steady cost a leave-out
/// trial tests. `Err` says why not: no previous interval at this plan
/// (`None`), or the step it measured.
pub(crate) fn steady(
    previous: Option<&(Vec<u32>, f64)>,
    current: &[u32],
    w: f64,
    margin: u32,
) -> Result<(), Option<f64>> {
    match previous {
        Some((plan, before)) if plan.as_slice() == current => {
            if (w - before).abs() <= f64::from(margin.min(100)) / 100.0 * before {
                Ok(())
            } else {
                Err(Some(*before))
            }
        }
        _ => Err(None),
    }
}

/// The note for a trial of `rank` held back by [`steady`].
pub(crate) fn unsteady_note(rank: usize, w: f64, why: Option<f64>, margin: u32) -> String {
    match why {
        None => format!(
            "leave-out trial of rank {rank} waits for a second interval at this plan (the step measured over this one, {}, is the first)",
            secs(w)
        ),
        Some(before) => format!(
            "leave-out trial of rank {rank} waits: the step measured over this interval, {}, moved more than leaveOutMarginPercent {margin}% from the {} of the interval before at the same plan",
            secs(w),
            secs(before)
        ),
    }
}

/// A leave-out trial to start: its rank, plan and predicted compute step.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TrialStart {
    pub rank: usize,
    pub plan: Vec<u32>,
    pub predicted_seconds: f64,
    /// The share of its CPU quota the rank used, when it starts on that
    /// ground ([`quota_bound`]) rather than on the measured step's excess.
    pub quota_use: Option<f64>,
    /// The most its samples can save (a fraction of the step), when it
    /// starts on that ground: worth less than the margin.
    pub cheap: Option<f64>,
    /// How much shorter the step without it must measure for it to stay
    /// out, a fraction ([`verdict_margin`]).
    pub margin: f64,
}

/// The split models, the models predictions use, and the global batch.
pub(crate) struct Models<'a> {
    pub split: &'a [StepModel],
    pub predict: &'a [StepModel],
    pub global: u32,
}

/// The trial to start when the step `measured` under `current` is at least
/// [`TRIAL_EXCESS_FACTOR`]× its predicted compute step `predicted` (1× when
/// the split without the candidate trains one rank: [`excess_factor`]): the
/// rank slowest per sample of all that train in `current` when it is
/// `eligible` (never rank 0), unless it is waiting out a lost trial, left out of the best split without it (the
/// ranks already out stay out: `lower`/`upper` hold them at 0) — provided
/// that split's predicted compute step is `margin`% below the measured step
/// (else its absence could not win). `Err` carries a note when the
/// candidate is a small rank (at most half an equal share) that the gates
/// hold back: which figures fell short of which threshold, so a decision
/// that keeps a small, slow rank says why it was not tried.
#[allow(clippy::too_many_arguments)]
pub(crate) fn trial_start(
    ranks: &[RankState],
    models: &Models<'_>,
    bounds: &Bounds,
    current: &[u32],
    eligible: &[usize],
    measured: f64,
    predicted: f64,
    margin: u32,
) -> Result<TrialStart, Option<String>> {
    if !(predicted > 0.0 && measured > 0.0) {
        return Err(None);
    }
    let per_sample = |r: usize| {
        let b = current.get(r).copied().unwrap_or(0);
        models
            .predict
            .get(r)
            .map_or(0.0, |m| m.predict(b) / f64::from(b.max(1)))
    };
    // The slowest per sample of all the ranks that train: when that is
    // rank 0 or another rank that may not leave, no trial (leaving out a
    // faster rank cannot shorten a step the slowest one sets).
    let rank = (0..current.len())
        .filter(|&r| current[r] > 0)
        .max_by(|&p, &q| per_sample(p).total_cmp(&per_sample(q)).then(p.cmp(&q)))
        .filter(|&r| r > 0 && eligible.contains(&r))
        .filter(|&r| ranks.get(r).is_some_and(|s| s.trial_wait == 0))
        .ok_or(None)?;
    let (lo, hi) = bounds.without(&[rank]);
    let split = optimal_split_bounded(models.split, models.global, &lo, &hi).map_err(|_| None)?;
    let predicted_seconds = max_step(models.predict, &split.batches);
    let quota_use = ranks
        .get(rank)
        .and_then(|s| quota_bound(s, rank, current, &split.batches));
    let factor = excess_factor(&split.batches);
    // A rank on a CPU quota whose samples can save less than the margin:
    // its own part of each exchange runs at its quota's pace, which its
    // compute model does not show, and its trial costs at most its share
    // of the step for one interval (the others absorb its samples); so it
    // needs only a measured step that its absence is predicted to shorten
    // by as much. (Without a quota, a step longer than its compute is the
    // exchange every rank shares: trying each small rank would cost every
    // job with many small ranks a trial per rank.)
    let worth = verdict_margin(current, rank, margin);
    let cheap = (ranks.get(rank).is_some_and(|s| s.quota_use.is_some())
        && share_worth(current, rank).is_some_and(|w| w < f64::from(margin.min(100)) / 100.0)
        && measured > predicted
        && shorter_by(predicted_seconds, measured, worth))
    .then_some(worth);
    if quota_use.is_none()
        && cheap.is_none()
        && (measured <= predicted
            || measured < factor * predicted
            || !shorter(predicted_seconds, measured, margin))
    {
        let held = Held {
            rank,
            quota_use: ranks.get(rank).and_then(|s| s.quota_use),
            factor,
            without_seconds: predicted_seconds,
            worth: share_worth(current, rank).unwrap_or(1.0),
        };
        return Err(small(current, rank).then(|| held.note(current, measured, predicted, margin)));
    }
    Ok(TrialStart {
        rank,
        plan: split.batches,
        predicted_seconds,
        quota_use,
        cheap: cheap.filter(|_| quota_use.is_none()),
        margin: worth,
    })
}

/// Whether `rank` trains at most half an equal share of `current`.
fn small(current: &[u32], rank: usize) -> bool {
    let training = current.iter().filter(|&&x| x > 0).count() as u64;
    let total: u64 = current.iter().map(|&x| u64::from(x)).sum();
    current
        .get(rank)
        .is_some_and(|&b| b > 0 && 2 * training * u64::from(b) <= total)
}

/// A trial candidate the gates of [`trial_start`] held back, and the
/// figures they read.
struct Held {
    rank: usize,
    /// The share of its CPU quota it used (`None`: no quota, or no reading).
    quota_use: Option<f64>,
    /// The excess of the measured step over the predicted compute step a
    /// trial on the step needs ([`excess_factor`]).
    factor: f64,
    /// The predicted compute step of the best split without it.
    without_seconds: f64,
    /// The most its samples can save, a fraction of the step
    /// ([`verdict_margin`]).
    worth: f64,
}

impl Held {
    /// e.g. "no trial leaving rank 3 out yet (batch 2 of 128): the step
    /// measured with it, 64.0 ms, is 1.31× the predicted compute step …".
    fn note(&self, current: &[u32], measured: f64, predicted: f64, margin: u32) -> String {
        let b = current.get(self.rank).copied().unwrap_or(0);
        let total: u32 = current.iter().sum();
        let mut why = vec![format!(
            "the step measured with it, {}, is {:.2}× the predicted compute step {} (a trial on the step needs {:.0}×)",
            secs(measured),
            measured / predicted,
            secs(predicted),
            self.factor
        )];
        if !shorter(self.without_seconds, measured, margin) {
            why.push(format!(
                "the compute step predicted without it, {}, is not leaveOutMarginPercent {margin}% shorter than that",
                secs(self.without_seconds)
            ));
        }
        let m = f64::from(margin.min(100)) / 100.0;
        why.push(if self.quota_use.is_some() && self.worth < m {
            format!(
                "its samples can save at most {:.1}% of the step, and the compute step predicted without it, {}, is not that much shorter than the step measured with it",
                100.0 * self.worth,
                secs(self.without_seconds)
            )
        } else {
            format!(
                "its samples can save up to {:.1}% of the step (a trial on that ground needs a CPU quota and under leaveOutMarginPercent {margin}%)",
                100.0 * self.worth
            )
        });
        why.push(match self.quota_use {
            Some(u) => format!(
                "it used {:.0}% of its CPU quota (a trial on that ground needs {:.0}% and two ranks training without it)",
                100.0 * u,
                100.0 * QUOTA_SATURATED
            ),
            None => "no reading of its CPU quota use (a rank without a quota is tried on the step alone)".to_string(),
        });
        format!(
            "no trial leaving rank {} out yet (batch {b} of {total}, the slowest per sample): {}",
            self.rank,
            why.join("; ")
        )
    }
}

/// Why a trial starts, e.g. "leave-out trial: rank 4 left out for one
/// decision interval …".
pub(crate) fn trial_reason(
    t: &TrialStart,
    current: &[u32],
    measured: f64,
    predicted: f64,
    margin: u32,
) -> String {
    let b = current.get(t.rank).copied().unwrap_or(0);
    if let Some(used) = t.quota_use {
        let total: u32 = current.iter().sum();
        return format!(
            "leave-out trial: rank {} (batch {b} of {total}, the slowest per sample) left out for one decision interval: it used {:.0}% of its CPU quota, so its own part of each step (such as its share of the gradient exchange) cannot go faster; the step measured with it is {}; it stays out only if the step measured without it is shorter by {} (predicted compute step without it {})",
            t.rank,
            100.0 * used,
            secs(measured),
            margin_text(t.margin, margin),
            secs(t.predicted_seconds)
        );
    }
    if let Some(worth) = t.cheap {
        let total: u32 = current.iter().sum();
        return format!(
            "leave-out trial: rank {} (batch {b} of {total}, the slowest per sample) left out for one decision interval: its samples can save at most {:.1}% of the step, and the compute step predicted without it, {}, is more than that shorter than the step measured with it, {} — time its compute model does not show, such as its share of the gradient exchange; it stays out only if the step measured without it is shorter by {}",
            t.rank,
            100.0 * worth,
            secs(t.predicted_seconds),
            secs(measured),
            margin_text(t.margin, margin)
        );
    }
    format!(
        "leave-out trial: rank {} (batch {b}, the slowest per sample) left out for one decision interval: the step measured with it, {}, is {:.1}× the predicted compute step {} — time its compute model does not show, such as its share of the gradient exchange; it stays out only if the step measured without it is shorter by {} (predicted compute step without it {})",
        t.rank,
        secs(measured),
        measured / predicted,
        secs(predicted),
        margin_text(t.margin, margin),
        secs(t.predicted_seconds)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank_with(times: &[f64]) -> RankState {
        let mut r = RankState::new(4);
        r.step_time = (times.iter().sum(), times.len() as u32);
        r
    }

    #[test]
    fn the_verdict_margin_is_the_smaller_of_the_margin_and_what_the_samples_save() {
        // 2 of 128: the other ranks take 2 more samples over their 126.
        let m = verdict_margin(&[64, 44, 18, 2], 3, 10);
        assert!((m - 2.0 / 126.0).abs() < 1e-12, "{m}");
        // 18 of 128 can save 18 / 110 > 10%.
        assert_eq!(verdict_margin(&[64, 44, 18, 2], 2, 10), 0.10);
        // Not training, or alone: the margin.
        assert_eq!(verdict_margin(&[64, 44, 20, 0], 3, 10), 0.10);
        assert_eq!(verdict_margin(&[128], 0, 10), 0.10);
        assert!(shorter_by(0.97, 1.0, 2.0 / 126.0));
        assert!(!shorter_by(0.99, 1.0, 2.0 / 126.0));
    }

    #[test]
    fn the_window_step_is_the_median_over_training_ranks_of_the_plan_decided_last() {
        let ranks = vec![rank_with(&[1.0, 1.0]), rank_with(&[1.2]), rank_with(&[9.0])];
        let plan = [4, 4, 4];
        assert_eq!(window_step(&ranks, Some(&plan), &plan, 3), Some(1.2));
        // Another plan ran, or too few samples: nothing measured.
        assert_eq!(window_step(&ranks, Some(&[4, 4, 5]), &plan, 3), None);
        assert_eq!(window_step(&ranks, None, &plan, 3), None);
        assert_eq!(window_step(&ranks, Some(&plan), &plan, 5), None);
        // A left-out rank's samples do not count.
        let out = [6, 6, 0];
        assert_eq!(window_step(&ranks, Some(&out), &out, 3), Some(1.1));
    }

    #[test]
    fn margins_are_strict() {
        assert!(shorter(0.89, 1.0, 10));
        assert!(!shorter(0.9, 1.0, 10));
        assert!(!shorter(1.0, 1.0, 0));
        assert!(!shorter(0.0, 1.0, 100));
    }
}
