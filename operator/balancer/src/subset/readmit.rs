//! Re-admitting left-out ranks for measurement: how long each waits, the
//! measurement trials that bring them back, and their verdicts.

use std::fmt::Write as _;

use crate::config::MAX_READMIT_FACTOR;
use crate::rank::{Probe, RankState};
use crate::text::secs;
use crate::BalancerConfig;

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
