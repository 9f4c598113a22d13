//! The measured-step bookkeeping a balancer keeps between decisions, and
//! what a review of it decides.

use crate::text::push_note;

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
    /// (a trial needs its excess in two intervals in a row,
    /// [`steady`](super::gates::steady)).
    pub last_window: Option<(Vec<u32>, f64)>,
    /// Decisions before any rank may be on a leave-out trial again: after a
    /// lost trial, `readmitAfterDecisions` (so that noise among equally
    /// slow ranks cannot run one trial after another).
    pub cooldown: u32,
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

/// A leave-out trial in progress.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Trial {
    /// The rank left out on trial.
    pub rank: usize,
    /// Step seconds measured with it, before the trial.
    pub with_seconds: f64,
    /// How much shorter the step without it must measure for it to stay
    /// out, a fraction ([`verdict_margin`](super::margins::verdict_margin)
    /// at the plan it left).
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
