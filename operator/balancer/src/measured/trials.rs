//! Starting a leave-out trial: the candidate, the gates it must pass, and
//! the notes that say why a trial starts or is held back.

use super::margins::{margin_text, share_worth, shorter, shorter_by, small, verdict_margin};
use crate::bounds::{Bounds, QUOTA_SATURATED};
use crate::rank::RankState;
use crate::split::{max_step, optimal_split_bounded};
use crate::text::secs;
use crate::StepModel;

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
