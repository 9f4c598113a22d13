//! [`Balancer::decide`]: the rules that turn the ranks' models into the
//! next plan, as a sequence of stages, each a function of typed values:
//!
//! 1. [`frame`](Balancer::frame): the per-decision bookkeeping, whether the
//!    current plan may be kept, the policy's models and the bounds
//!    ([`Frame`]);
//! 2. [`observe`](Balancer::observe): what the measured steps say — who is
//!    due back, verdicts of leave-out trials, who may be left out
//!    ([`Observed`]);
//! 3. [`choose`](Balancer::choose): the best split and membership
//!    ([`Chosen`], see [`crate::subset`]);
//! 4. judge: re-admission ([`readmission`](Balancer::readmission)), a
//!    measured leave-out trial ([`trial`](Balancer::trial)), or the
//!    hysteresis and damping ([`judge`](Balancer::judge)), each giving a
//!    [`Verdict`];
//! 5. [`conclude`](Balancer::conclude): the [`Decision`] with its reason
//!    and the bookkeeping that ends every decision.

mod choose;
mod frame;
mod judge;
mod trial;

#[cfg(test)]
mod tests;

use crate::bounds::Bounds;
use crate::measured::Review;
use crate::policy::PolicyModels;
use crate::{exchange, Balancer, BalancerConfig, BalancerError, Decision, StepModel};

/// What every later stage reads: the configuration, the current plan when
/// it is usable, the policy's models and the bounds.
pub(crate) struct Frame {
    pub cfg: BalancerConfig,
    /// Why the current plan cannot be kept (`None`: it can).
    pub problem: Option<String>,
    /// The current plan when it is usable.
    pub cur: Option<Vec<u32>>,
    pub stale: Vec<usize>,
    pub stragglers: Vec<usize>,
    pub bounds: Bounds,
    /// The policy's models and what they know.
    pub pm: PolicyModels,
    /// The models predictions use.
    pub predict: Vec<StepModel>,
    /// The models the split is chosen with.
    pub split: Vec<StepModel>,
    /// Predicted compute step of the current plan (0 when unusable).
    pub current_pred: f64,
    /// A measurement policy without a single measurement.
    pub no_data: bool,
    /// "; N rank(s) without data use the median model", or "".
    pub unknown_note: String,
    pub communication_seconds: f64,
}

/// What the measured steps say before the split is chosen.
pub(crate) struct Observed {
    /// Left-out ranks due back for measurement.
    pub readmit: Vec<usize>,
    /// The step measured over the interval that ran the current plan.
    pub measured: Option<f64>,
    /// The interval before it: its plan and measured step.
    pub previous_window: Option<(Vec<u32>, f64)>,
    pub review: Review,
    /// Ranks whose batch the CPU quota holds, with the share used.
    pub quota_held: Vec<(usize, f64)>,
    /// Ranks the split may leave out.
    pub eligible: Vec<usize>,
    /// Ranks the current plan leaves out.
    pub current_out: Vec<usize>,
}

/// The best split and membership.
pub(crate) struct Chosen {
    pub plan: Vec<u32>,
    /// The ranks the split leaves out.
    pub left_out: Vec<usize>,
    /// Its predicted compute step.
    pub predicted: f64,
    /// Why ranks are left out ("" when none are).
    pub leave_out_note: String,
    /// The exchange model, once live measurements calibrated it.
    pub exchange: Option<exchange::Model>,
}

impl Chosen {
    /// A plan's step with its exchange (compute alone without a model).
    pub fn step(&self, compute: f64, batches: &[u32]) -> f64 {
        compute + self.exchange.as_ref().map_or(0.0, |m| m.seconds(batches))
    }
}

/// What a decision concludes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Verdict {
    /// The new plan, `None` to keep the current one.
    pub plan: Option<Vec<u32>>,
    pub predicted: f64,
    pub gain: f64,
    pub reason: String,
}

impl Verdict {
    /// Keeps the current plan, for `reason`.
    pub fn keep(predicted: f64, gain: f64, reason: String) -> Self {
        Self {
            plan: None,
            predicted,
            gain,
            reason,
        }
    }
}

impl Balancer {
    /// Decides the next plan given the `current` one (pass `&[]` for the
    /// initial plan). A current plan of the wrong length or sum, or outside
    /// the bounds, is replaced unconditionally; otherwise a new plan is only
    /// returned when it beats the current one by `minGainPercent` (plus a
    /// noise margin). Measurement policies may leave slow ranks out (batch
    /// 0) and re-admit them for measurement after `readmitAfterDecisions`
    /// decisions, see [`crate::subset`].
    ///
    /// Errors: no ranks, or no feasible split (typed, with the numbers).
    pub fn decide(&mut self, current: &[u32]) -> Result<Decision, BalancerError> {
        if self.ranks.is_empty() {
            return Err(BalancerError::NoRanks);
        }
        let mut frame = self.frame(current);
        if frame.no_data && frame.cur.is_some() {
            let reason = format!(
                "{}: no measurements yet; keeping the current plan",
                frame.cfg.policy
            );
            let verdict = Verdict::keep(frame.current_pred, 0.0, reason);
            return Ok(self.conclude(&frame, None, verdict));
        }
        let observed = self.observe(&mut frame);
        let chosen = self.choose(&frame, &observed)?;
        let verdict = match frame.cur.as_deref() {
            None => initial(&frame, chosen),
            Some(cur) => match self.readmission(&frame, &observed, &chosen, cur) {
                Some(v) => v,
                None => match self.trial(&frame, &observed, &chosen, cur) {
                    Some(v) => v,
                    None => self.judge(&frame, &observed, chosen, cur),
                },
            },
        };
        Ok(self.conclude(&frame, observed.measured, verdict))
    }

    /// The [`Decision`] for `verdict`, with the notes and bookkeeping that
    /// end every decision ([`Balancer::finish`]).
    fn conclude(&mut self, frame: &Frame, measured: Option<f64>, v: Verdict) -> Decision {
        let out = Decision {
            plan: v.plan,
            predicted_step_seconds: v.predicted,
            current_predicted_step_seconds: frame.current_pred,
            gain_percent: v.gain,
            reason: v.reason,
            policy: frame.cfg.policy,
            stragglers: frame.stragglers.clone(),
            stale_ranks: frame.stale.clone(),
            communication_seconds: frame.communication_seconds,
            left_out: Vec::new(),
            measured_step_seconds: measured.unwrap_or(0.0),
        };
        self.finish(out, frame.cur.as_deref())
    }
}

/// The first plan (or one replacing an unusable plan): the chosen split,
/// whatever the hysteresis.
fn initial(frame: &Frame, chosen: Chosen) -> Verdict {
    let mut reason = format!(
        "{}: new plan because {}{}",
        frame.cfg.policy,
        frame.problem.clone().unwrap_or_default(),
        if frame.no_data {
            " (no measurements yet: equal split)"
        } else {
            ""
        }
    );
    if !frame.no_data {
        reason.push_str(&frame.unknown_note);
    }
    crate::text::push_note(&mut reason, &chosen.leave_out_note);
    Verdict {
        plan: Some(chosen.plan),
        predicted: chosen.predicted,
        gain: 0.0,
        reason,
    }
}
