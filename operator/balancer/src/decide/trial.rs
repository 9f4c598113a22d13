//! A measured leave-out trial ([`crate::measured`]): started only once the
//! split has settled and the measured step shows an excess over two
//! intervals in a row.

use super::{Chosen, Frame, Observed, Verdict};
use crate::decision::{gain_percent, noise_margin_percent};
use crate::measured::{self, Trial, TrialStart};
use crate::{subset, Balancer};

impl Balancer {
    /// The trial plan (a rank left out to be measured without it), when
    /// one may start now; `None` otherwise (with a note saying why not,
    /// where that is news).
    pub(super) fn trial(
        &mut self,
        frame: &Frame,
        observed: &Observed,
        chosen: &Chosen,
        cur: &[u32],
    ) -> Option<Verdict> {
        let w = observed.measured?;
        if !self.trial_may_start(frame, observed, chosen, cur) {
            return None;
        }
        let t = self.trial_start(frame, observed, cur, w)?;
        let margin = frame.cfg.leave_out_margin_percent;
        let why = measured::trial_reason(&t, cur, w, frame.current_pred, margin);
        self.measured.trial = Some(Trial {
            rank: t.rank,
            with_seconds: w,
            margin: t.margin,
            decisions: 0,
        });
        Some(Verdict {
            gain: gain_percent(frame.current_pred, t.predicted_seconds),
            predicted: t.predicted_seconds,
            plan: Some(t.plan),
            reason: format!("{}: {why}", frame.cfg.policy),
        })
    }

    /// Compute comes first: a trial only once the split has settled — the
    /// best split's predicted gain is below the hysteresis that a re-split
    /// must clear (minGainPercent plus the noise margin, as in
    /// [`Balancer::judge`]): a split that will not move is as settled as it
    /// gets — no verdict was just reached, no trial is open or cooling
    /// down, the split leaves no new rank out, and no re-admitted rank's
    /// measurement is open (a stale one's may never close: it does not
    /// block). Nor while a rank's compute runs ahead of its model (a
    /// slowdown not yet re-fitted): the step's excess is then compute.
    fn trial_may_start(
        &mut self,
        frame: &Frame,
        observed: &Observed,
        chosen: &Chosen,
        cur: &[u32],
    ) -> bool {
        let cfg = &frame.cfg;
        let n = cur.len();
        let settled_split = gain_percent(
            chosen.step(frame.current_pred, cur),
            chosen.step(chosen.predicted, &chosen.plan),
        ) < f64::from(cfg.min_gain_percent)
            + noise_margin_percent(frame.pm.relative_error, n);
        let quiet = settled_split
            && !observed.review.settled
            && self.measured.trial.is_none()
            && self.measured.cooldown == 0;
        let no_new_out = chosen
            .left_out
            .iter()
            .all(|r| observed.current_out.contains(r));
        let no_open =
            (0..n).all(|r| !subset::on_open_trial(&self.ranks[r], cfg) || frame.stale.contains(&r));
        if !(quiet && no_new_out && no_open) {
            return false;
        }
        let margin = cfg.leave_out_margin_percent;
        match measured::compute_outrun(&self.ranks, &frame.predict, cur, margin) {
            Some(o) => {
                self.measured.add_note(&measured::outrun_note(o, margin));
                false
            }
            None => true,
        }
    }

    /// The trial the measured step `w` calls for, if any, and only on an
    /// excess seen over two intervals in a row — for a rank on a quota
    /// whose samples save less than the margin (on either ground), two
    /// intervals at this plan, whatever the first measured: a trial on a
    /// passing excess costs it no more than its share, and on CPU quotas
    /// the step moves 10% between intervals at one plan.
    fn trial_start(
        &mut self,
        frame: &Frame,
        observed: &Observed,
        cur: &[u32],
        w: f64,
    ) -> Option<TrialStart> {
        let mut kept_out = frame.bounds.clone();
        for &r in &observed.current_out {
            kept_out.hold_out(r);
        }
        let models = measured::Models {
            split: &frame.split,
            predict: &frame.predict,
            global: frame.cfg.global_batch_size,
        };
        let (pred, m) = (frame.current_pred, frame.cfg.leave_out_margin_percent);
        let eligible = &observed.eligible;
        let t =
            match measured::trial_start(&self.ranks, &models, &kept_out, cur, eligible, w, pred, m)
            {
                Ok(t) => t,
                Err(note) => {
                    if let Some(note) = note {
                        self.measured.add_note(&note);
                    }
                    return None;
                }
            };
        let small_share = f64::from(m.min(100)) / 100.0;
        let cheap = t.cheap.is_some() || (t.quota_use.is_some() && t.margin < small_share);
        match measured::steady(observed.previous_window.as_ref(), cur, w, m) {
            Err(Some(_)) if cheap => Some(t),
            Err(why) => {
                self.measured
                    .add_note(&measured::unsteady_note(t.rank, w, why, m));
                None
            }
            Ok(()) => Some(t),
        }
    }
}
