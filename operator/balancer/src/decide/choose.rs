//! The third stage: the best split and membership ([`Chosen`]), and the
//! first verdict that may follow it — ranks due back for measurement, or
//! measured verdicts that change the membership ([`Balancer::readmission`]).

use super::{Chosen, Frame, Observed, Verdict};
use crate::bounds::quota_note;
use crate::decision::gain_percent;
use crate::split::max_step;
use crate::text::{push_note, secs};
use crate::{subset, Balancer, BalancerError};

impl Balancer {
    /// The best split within the frame's bounds, and whom it leaves out.
    pub(super) fn choose(
        &mut self,
        frame: &Frame,
        observed: &Observed,
    ) -> Result<Chosen, BalancerError> {
        let margin = frame.cfg.leave_out_margin_percent;
        // Membership follows the exchange only once live measurements
        // calibrated how much of it the steps expose.
        let exchange = self.exchange().filter(|m| m.is_calibrated());
        let choice = subset::choose(
            &frame.split,
            &frame.bounds,
            &observed.eligible,
            &observed.current_out,
            margin,
            exchange.as_ref(),
        )?;
        let leave_out_note =
            choice.leave_out_note(&frame.split, &frame.bounds.lower, margin, exchange.as_ref());
        let predicted = max_step(&frame.predict, &choice.batches);
        let held_note = quota_note(
            &observed.quota_held,
            &choice.batches,
            &frame.bounds.upper,
            &frame.predict,
            predicted,
        );
        self.measured.add_note(&held_note);
        Ok(Chosen {
            plan: choice.batches,
            left_out: choice.left_out,
            predicted,
            leave_out_note,
            exchange,
        })
    }

    /// The chosen plan, whatever the hysteresis, when ranks are due back
    /// for measurement and the plan has room for them, or when measured
    /// verdicts change the membership (whatever the compute models
    /// predict: no hysteresis, no damping). `None` otherwise.
    pub(super) fn readmission(
        &mut self,
        frame: &Frame,
        observed: &Observed,
        chosen: &Chosen,
        cur: &[u32],
    ) -> Option<Verdict> {
        let plan = &chosen.plan;
        // Only those the plan has room for come back now; the others wait.
        let readmit: Vec<usize> = observed
            .readmit
            .iter()
            .copied()
            .filter(|&r| plan[r] > 0)
            .collect();
        let review = &observed.review;
        let forced =
            review.back.iter().any(|&r| plan[r] > 0) || review.held_out.iter().any(|&r| cur[r] > 0);
        if readmit.is_empty() && !forced {
            return None;
        }
        let mut reason = if readmit.is_empty() {
            format!(
                "{}: predicted step {}",
                frame.cfg.policy,
                secs(chosen.predicted)
            )
        } else {
            self.readmission_reason(&readmit, plan, chosen.predicted)
        };
        subset::start_trials(&mut self.ranks, &readmit, observed.measured);
        push_note(&mut reason, &chosen.leave_out_note);
        Some(Verdict {
            plan: Some(plan.clone()),
            predicted: chosen.predicted,
            gain: gain_percent(
                chosen.step(frame.current_pred, cur),
                chosen.step(chosen.predicted, plan),
            ),
            reason,
        })
    }
}
