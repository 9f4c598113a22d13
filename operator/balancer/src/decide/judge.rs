//! The last judgement of a decision: whether the chosen split is worth a
//! move — hysteresis (minGainPercent plus the noise margin), ranks that
//! climb from a re-admission's probe share, damping on young measurements —
//! and the reason text of a move.

use std::fmt::Write as _;

use super::{Chosen, Frame, Observed, Verdict};
use crate::decision::{gain_percent, noise_margin_percent};
use crate::split::max_step;
use crate::text::{push_note, ranks_named, secs};
use crate::{subset, Balancer, BalancerConfig, Policy};

/// What the hysteresis concludes for a candidate's predicted `gain`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hysteresis {
    /// Below the threshold with no rank climbing (or no gain at all).
    Keep,
    /// At or above `minGainPercent` plus the noise margin.
    Clears,
    /// Below it, but a rank climbs from its probe share (no hysteresis).
    Climbs,
}

/// The hysteresis on a candidate's predicted `gain` against `threshold`
/// (minGainPercent plus the noise margin), with `climbing` ranks.
pub(super) fn hysteresis(gain: f64, threshold: f64, climbing: bool) -> Hysteresis {
    if gain <= 0.0 || (gain < threshold && !climbing) {
        Hysteresis::Keep
    } else if gain >= threshold {
        Hysteresis::Clears
    } else {
        Hysteresis::Climbs
    }
}

/// How far a move goes when models are young: the least share of half a
/// window measured among `young` ranks (`(rank, samples)`), at least
/// `minDamping`; 1 when none is young.
pub(super) fn damping(young: &[(usize, u64)], cfg: &BalancerConfig) -> f64 {
    young
        .iter()
        .map(|&(_, n)| n as f64 / (cfg.window / 2).max(1) as f64)
        .fold(1.0, f64::min)
        .max(cfg.min_damping)
}

impl Balancer {
    /// The verdict on the chosen split: kept when it is the current plan,
    /// or (live policies) its predicted gain does not clear the hysteresis;
    /// else a move, damped on young measurements.
    pub(super) fn judge(
        &mut self,
        frame: &Frame,
        observed: &Observed,
        chosen: Chosen,
        cur: &[u32],
    ) -> Verdict {
        let policy = frame.cfg.policy;
        if chosen.plan == cur {
            let reason = format!("{policy}: the current plan is already optimal");
            return Verdict::keep(chosen.predicted, 0.0, reason);
        }
        let (step_now, step_new) = (
            chosen.step(frame.current_pred, cur),
            chosen.step(chosen.predicted, &chosen.plan),
        );
        let gain = gain_percent(step_now, step_new);
        let (plan, predicted, reason) = match policy {
            Policy::Static => (
                chosen.plan.clone(),
                chosen.predicted,
                "static: back to the equal split".to_string(),
            ),
            Policy::SeedFormula => {
                let reason = format!("seed-formula: re-scored (predicted gain {gain:.1}%)");
                (chosen.plan.clone(), chosen.predicted, reason)
            }
            _ => match self.live_move(frame, observed, &chosen, cur, (step_now, step_new)) {
                Ok(m) => m,
                Err(reason) => return Verdict::keep(chosen.predicted, gain, reason),
            },
        };
        let mut reason = reason;
        reason.push_str(&frame.unknown_note);
        push_note(&mut reason, &chosen.leave_out_note);
        for r in observed
            .current_out
            .iter()
            .copied()
            .filter(|&r| plan[r] > 0)
        {
            let _ = write!(
                reason,
                "; rank {r} re-admitted: its model predicts {} at batch {}, within the {} step of the new plan, so including it pays",
                secs(frame.predict[r].predict(plan[r])),
                plan[r],
                secs(predicted)
            );
        }
        Verdict {
            gain: gain_percent(
                chosen.step(frame.current_pred, cur),
                chosen.step(predicted, &plan),
            ),
            plan: Some(plan),
            predicted,
            reason,
        }
    }

    /// A live policy's move: `(plan, predicted, reason)` when the gain
    /// clears the hysteresis (or a rank climbs), damped on young
    /// measurements; `Err(reason)` to keep the current plan.
    fn live_move(
        &mut self,
        frame: &Frame,
        observed: &Observed,
        chosen: &Chosen,
        cur: &[u32],
        (step_now, step_new): (f64, f64),
    ) -> Result<(Vec<u32>, f64, String), String> {
        let cfg = &frame.cfg;
        let gain = gain_percent(step_now, step_new);
        let margin = noise_margin_percent(frame.pm.relative_error, cur.len());
        let threshold = f64::from(cfg.min_gain_percent) + margin;
        self.end_climbs(observed, cur);
        let climbing = self.climbers(frame, &chosen.plan, cur);
        let (policy, min_gain) = (cfg.policy, cfg.min_gain_percent);
        let mut reason = match hysteresis(gain, threshold, !climbing.is_empty()) {
            Hysteresis::Keep => {
                return Err(format!(
                    "{policy}: predicted gain {gain:.1}% is below minGainPercent {min_gain}% + {margin:.1}% noise margin; keeping the current plan"
                ))
            }
            Hysteresis::Clears => format!(
                "{policy}: predicted step {step_new:.4}s vs {step_now:.4}s now (gain {gain:.1}% ≥ minGainPercent {min_gain}% + {margin:.1}% noise margin)"
            ),
            Hysteresis::Climbs => format!(
                "{policy}: predicted step {step_new:.4}s vs {step_now:.4}s now (gain {gain:.1}%); {} grows from its probe share within the growth bound, kept in by its re-admission's verdict (no hysteresis)",
                ranks_named(&climbing)
            ),
        };
        let alpha = damping(&frame.pm.young, cfg);
        let (lower, upper) = (&frame.bounds.lower, &frame.bounds.upper);
        let damped = (alpha < 1.0)
            .then(|| {
                subset::damp(
                    cur,
                    &chosen.plan,
                    alpha,
                    cfg.global_batch_size,
                    lower,
                    upper,
                )
            })
            .flatten();
        let Some(damped) = damped else {
            return Ok((chosen.plan.clone(), chosen.predicted, reason));
        };
        if damped == cur {
            return Err(format!(
                "{policy}: damped move ({:.0}% of the way, young measurements) rounds to the current plan",
                alpha * 100.0
            ));
        }
        let _ = write!(
            reason,
            "; damped to {:.0}% of the way (young measurements on {} rank(s))",
            alpha * 100.0,
            frame.pm.young.len()
        );
        let predicted = max_step(&frame.predict, &damped);
        Ok((damped, predicted, reason))
    }

    /// Ends the climbs whose last step measured a longer step than the
    /// interval before it: a climbing rank's compute model, fitted on a few
    /// samples at a small batch (on a CPU quota, timed between throttled
    /// periods), promised a gain the step does not show. On four
    /// quota-bound ranks a re-admitted 0.15-core rank climbed 1 → 2 → 4 →
    /// 7 → 16 while the measured step went 27.6 → 28.3 → 28.1 → 33.5 →
    /// 42.1 ms.
    fn end_climbs(&mut self, observed: &Observed, cur: &[u32]) {
        let (Some((before_plan, before)), Some(w)) = (&observed.previous_window, observed.measured)
        else {
            return;
        };
        if before_plan.as_slice() == cur || w <= *before {
            return;
        }
        let ended: Vec<usize> = (0..cur.len())
            .filter(|&r| self.ranks[r].climbing)
            .filter(|&r| before_plan.get(r).is_some_and(|&b| b < cur[r]))
            .collect();
        for &r in &ended {
            self.ranks[r].climbing = false;
        }
        if !ended.is_empty() {
            self.measured.add_note(&format!(
                "{} no longer climbs: the step measured at its last climb, {}, is longer than the {} before it",
                ranks_named(&ended),
                secs(w),
                secs(*before)
            ));
        }
    }

    /// The ranks that climb in `plan`: kept in by a re-admission's verdict
    /// (or climbing already), growing, and held back by the growth bound.
    /// Each step of a small rank gains little by itself, and under the
    /// hysteresis a rank back at 1 of 120 samples beside three equal ranks
    /// stayed at 1; while the bound is what holds it back, its steps skip
    /// the hysteresis, after, it is a rank like any other.
    fn climbers(&mut self, frame: &Frame, plan: &[u32], cur: &[u32]) -> Vec<usize> {
        let needed = subset::trial_samples_needed(&frame.cfg);
        let climbing: Vec<usize> = (0..cur.len())
            .filter(|&r| {
                let rank = &self.ranks[r];
                rank.climbing || rank.trial_samples.is_some_and(|k| k >= needed)
            })
            .filter(|&r| plan[r] > cur[r] && plan[r] >= frame.bounds.upper[r])
            .collect();
        for (r, rank) in self.ranks.iter_mut().enumerate() {
            rank.climbing = climbing.contains(&r);
        }
        climbing
    }
}
