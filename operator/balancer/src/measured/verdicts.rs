//! Verdicts on the leave-out trial in progress and on the ranks kept out
//! by measurement ([`review`]).

use std::fmt::Write as _;

use super::margins::{margin_text, shorter_by};
use super::state::{Measured, Review, Trial, TRIAL_MAX_DECISIONS};
use crate::config::MAX_READMIT_FACTOR;
use crate::rank::{Presence, RankState};
use crate::subset::trial_samples_needed;
use crate::text::secs;
use crate::BalancerConfig;

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
    let seen = Seen {
        current,
        measured,
        readmit,
        cfg,
    };
    let mut out = Review::default();
    for r in ranks.iter_mut() {
        r.trial_wait = r.trial_wait.saturating_sub(1);
    }
    m.cooldown = m.cooldown.saturating_sub(1);
    if let Some(t) = m.trial.take() {
        review_trial(ranks, m, t, &seen, &mut out);
    }
    let needed = trial_samples_needed(cfg);
    for (r, rank) in ranks.iter_mut().enumerate() {
        let Some(p) = rank.presence else { continue };
        if out.held_out.contains(&r) {
            continue;
        }
        review_presence(rank, r, p, &seen, needed, &mut out);
    }
    out.held_out.sort_unstable();
    out
}

/// What a review reads: the plan that ran over the interval, the step
/// measured over it, the left-out ranks whose wait is over, the settings.
struct Seen<'a> {
    current: &'a [u32],
    measured: Option<f64>,
    readmit: &'a [usize],
    cfg: &'a BalancerConfig,
}

/// The verdict on the trial `t` in progress (taken out of `m`): its rank
/// stays out when the step measured without it is shorter by its margin,
/// the trial goes on when no step was measured yet (up to
/// [`TRIAL_MAX_DECISIONS`]), else the rank is back. Nothing when the rank
/// trains again in `current` (the trial is over without a verdict).
fn review_trial(
    ranks: &mut [RankState],
    m: &mut Measured,
    t: Trial,
    seen: &Seen<'_>,
    out: &mut Review,
) {
    let out_now = seen.current.get(t.rank) == Some(&0);
    let (true, Some(rank)) = (out_now, ranks.get_mut(t.rank)) else {
        return;
    };
    out.settled = true;
    match seen.measured {
        Some(w) if shorter_by(w, t.with_seconds, t.margin) => {
            trial_won(rank, &t, w, seen.cfg.leave_out_margin_percent, out);
        }
        None if t.decisions + 1 < TRIAL_MAX_DECISIONS => {
            out.settled = false;
            out.held_out.push(t.rank);
            m.trial = Some(Trial {
                decisions: t.decisions + 1,
                ..t
            });
        }
        w => trial_lost(rank, m, &t, w, seen.cfg, out),
    }
}

/// The trial's rank stays out: the step `w` measured without it is
/// shorter than the one measured with it by the trial's margin.
fn trial_won(rank: &mut RankState, t: &Trial, w: f64, margin: u32, out: &mut Review) {
    let r = t.rank;
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

/// The trial's rank is back: the step `w` measured without it was not
/// shorter by the trial's margin, or none was measured in time. Its next
/// trial waits `readmitAfterDecisions` × its doubling factor, and every
/// rank's waits `readmitAfterDecisions`.
fn trial_lost(
    rank: &mut RankState,
    m: &mut Measured,
    t: &Trial,
    w: Option<f64>,
    cfg: &BalancerConfig,
    out: &mut Review,
) {
    let (r, margin) = (t.rank, cfg.leave_out_margin_percent);
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

/// A rank `r` kept out by measurement (`p`): still out, it stays held out
/// (the step measured without it updated); re-admitted and measured with
/// enough samples (`needed`), [`presence_verdict`] decides.
fn review_presence(
    rank: &mut RankState,
    r: usize,
    p: Presence,
    seen: &Seen<'_>,
    needed: u32,
    out: &mut Review,
) {
    match seen.current.get(r).copied() {
        Some(0) if !seen.readmit.contains(&r) => {
            if let Some(w) = seen.measured {
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
                return;
            }
            out.settled = true;
            presence_verdict(rank, r, p, seen, out);
        }
    }
}

/// The verdict on a rank kept out by measurement (`p`) after its
/// re-admission: out again while the step measured with it stays longer
/// than the one measured without it by `leaveOutMarginPercent`, else in.
fn presence_verdict(
    rank: &mut RankState,
    r: usize,
    p: Presence,
    seen: &Seen<'_>,
    out: &mut Review,
) {
    let margin = seen.cfg.leave_out_margin_percent;
    let sep = if out.note.is_empty() { "" } else { "; " };
    // The configured margin: at its probe batch the rank's samples
    // show only its fixed cost, not what it saves at its share.
    let m = f64::from(margin.min(100)) / 100.0;
    match seen.measured {
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
