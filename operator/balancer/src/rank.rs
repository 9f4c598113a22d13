//! What the balancer knows about one rank: its profile model and memory cap,
//! its live measurement window, seed-formula inputs, and whether it still
//! reports.

use crate::exchange::Link;
use crate::model::LiveModel;
use crate::StepModel;

/// Per-rank state. Reset when the rank's pod moves to another device.
#[derive(Debug, Clone)]
pub(crate) struct RankState {
    /// Model fitted from the start-up profile.
    pub profile: Option<StepModel>,
    /// Largest local batch that fits in memory (from the profile).
    pub cap: Option<u32>,
    /// Live measurement window.
    pub live: LiveModel,
    /// Seed formula: hardware compute score (e.g. matmul FLOP/s).
    pub compute_score: Option<f64>,
    /// Seed formula: (GPU utilisation, memory use), fractions in [0, 1].
    pub utilisation: Option<(f64, f64)>,
    /// A sample arrived since the previous decision.
    pub reported_since_decision: bool,
    /// Decisions in a row without a sample.
    pub missed_decisions: u32,
    /// The caller said this rank stopped reporting.
    pub marked_missing: bool,
    /// Batch of the last accepted sample.
    pub last_batch: Option<u32>,
    /// Compute seconds of the last accepted sample.
    pub last_seconds: Option<f64>,
    /// Hybrid: whether the profile still describes this rank (false after a
    /// straggler re-fit showed the device changed).
    pub profile_trusted: bool,
    /// Fast re-fits since the previous decision.
    pub refits_since_decision: u32,
    /// Exposed communication per step (seconds, exponentially smoothed):
    /// the step time this rank spent not computing.
    pub communication: Option<f64>,
    /// How far its slow steps' compute runs over its typical one (seconds,
    /// exponentially smoothed; see [`crate::Balancer::observe_compute_spread`]).
    pub spread: Option<f64>,
    /// Start-up communication figures (see [`crate::exchange`]).
    pub link: Option<Link>,
    /// Decisions in a row this rank has been left out (batch 0 in the
    /// current plan).
    pub out_decisions: u32,
    /// Multiple of `readmitAfterDecisions` this rank waits while left out:
    /// 1, doubled each time fresh measurements leave it out again (capped),
    /// back to 1 once it stays in.
    pub readmit_factor: u32,
    /// On a measurement trial after a re-admission: the live samples it
    /// reported since (`None`: not on trial).
    pub trial_samples: Option<u32>,
    /// The measured cost of the re-admission in progress (`None`: none, or
    /// no measured step to compare with).
    pub probe: Option<Probe>,
    /// Decisions the next re-admission waits at least, from the measured
    /// cost of the last one (see [`crate::subset::READMIT_COST_BUDGET`]).
    pub probe_wait: u32,
    /// Left out of the last decided plan (until it reports a step again):
    /// its last compute and communication times describe an old plan.
    pub left_out: bool,
    /// Measured wall-clock step seconds since the previous decision: their
    /// sum and count (see [`crate::Balancer::observe_step_time`]).
    pub step_time: (f64, u32),
    /// Compute seconds reported since the previous decision, at the batch
    /// of the plan decided last: their sum and count (what the interval's
    /// compute was, beside what the models predict).
    pub compute_time: (f64, u32),
    /// Share of its CPU quota used (smoothed; see
    /// [`crate::Balancer::observe_quota_use`]); `None` without a quota.
    pub quota_use: Option<f64>,
    /// Left out because the measured step without it was shorter (a
    /// leave-out trial, [`crate::measured`]): the steps measured with it
    /// and, most recently, without it.
    pub presence: Option<Presence>,
    /// Decisions before this rank may be on a leave-out trial again.
    pub trial_wait: u32,
    /// Multiple of `readmitAfterDecisions` the next lost leave-out trial
    /// makes it wait: 1, doubled by each lost trial (capped).
    pub trial_factor: u32,
    /// Kept in by its re-admission's verdict, and growing from its probe
    /// share: while the growth bound (2·b + 2 per decision) is what holds
    /// it back, each step toward its share is taken without the
    /// hysteresis, as the verdict itself was (see `Balancer::decide`).
    pub climbing: bool,
}

/// What a re-admission costs: the step measured before it (the rank out)
/// and the steps measured while the rank trains again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Probe {
    /// Step seconds measured over the interval before the re-admission.
    pub without_seconds: f64,
    /// Sum and count of the step seconds measured over the intervals the
    /// re-admitted rank trained in.
    pub with_seconds: (f64, u32),
    /// Decisions the rank trained in since its re-admission.
    pub decisions: u32,
}

/// The measured steps that keep a rank out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Presence {
    /// Step seconds measured with the rank in.
    pub with_seconds: f64,
    /// Step seconds measured without it (the latest decision interval).
    pub without_seconds: f64,
}

impl RankState {
    /// A rank nothing is known about yet.
    pub fn new(window: usize) -> Self {
        RankState {
            profile: None,
            cap: None,
            live: LiveModel::new(window),
            compute_score: None,
            utilisation: None,
            reported_since_decision: false,
            missed_decisions: 0,
            marked_missing: false,
            last_batch: None,
            last_seconds: None,
            profile_trusted: true,
            refits_since_decision: 0,
            communication: None,
            spread: None,
            link: None,
            out_decisions: 0,
            readmit_factor: 1,
            trial_samples: None,
            probe: None,
            probe_wait: 0,
            left_out: false,
            step_time: (0.0, 0),
            compute_time: (0.0, 0),
            quota_use: None,
            presence: None,
            trial_wait: 0,
            trial_factor: 1,
            climbing: false,
        }
    }

    /// Has ever delivered a live sample.
    pub fn ever_reported(&self) -> bool {
        self.last_batch.is_some()
    }

    /// Stopped reporting: marked missing, or silent for `stale_after` decisions.
    pub fn is_stale(&self, stale_after: u32) -> bool {
        self.marked_missing || (self.ever_reported() && self.missed_decisions >= stale_after.max(1))
    }
}
