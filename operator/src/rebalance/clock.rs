//! When a job's plan is due to be reconsidered: enough steps since the last
//! decision, and at least the operator's minimum interval.

use std::time::{Duration, Instant};

/// Wall-clock slack on the minimum interval: decisions are only checked at
/// scrapes, so a floor that is a multiple of the scrape interval must not be
/// missed by a few milliseconds of timer jitter (and so cost a whole scrape).
const FLOOR_SLACK: f64 = 0.95;

/// Whether a job's plan is due to be reconsidered: the job has trained at
/// least `interval_steps` steps (at least 1) since the decision at
/// `last_step`, AND at least `min_interval` (the operator's
/// `--rebalance-interval`, less 5% slack) has passed since then (`elapsed`).
///
/// The operator asks at every metrics read (`--scrape-interval`), so the
/// effective decision period is about
/// max(`interval_steps` × step time, `min_interval`), rounded up to the next
/// scrape. A step count below `last_step` is never due (see
/// [`DecisionClock::due`], which re-bases then).
pub fn decision_due(
    last_step: u64,
    step: u64,
    elapsed: Duration,
    interval_steps: u32,
    min_interval: Duration,
) -> bool {
    let advanced = step.saturating_sub(last_step);
    advanced >= u64::from(interval_steps.max(1)) && elapsed >= min_interval.mul_f64(FLOOR_SLACK)
}

/// When (step and time) the plan of a job's gang was last considered; the
/// step is learnt from the first scrape that reports one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecisionClock {
    step: Option<u64>,
    at: Instant,
}

impl DecisionClock {
    /// A gang starting balancing at `now`: its first decision waits one
    /// interval from the first step read.
    pub fn new(now: Instant) -> DecisionClock {
        DecisionClock {
            step: None,
            at: now,
        }
    }

    /// Given the job's step read at this scrape (`None`: no rank reported
    /// one), the step to decide at now, or `None` to wait. The first step
    /// read is the baseline; a step below the last decision's (a trainer
    /// restarted from an older checkpoint without a gang change) becomes the
    /// new baseline rather than stalling decisions until the old step returns.
    pub fn due(
        &mut self,
        step: Option<u64>,
        now: Instant,
        interval_steps: u32,
        min_interval: Duration,
    ) -> Option<u64> {
        let step = step?;
        match self.step {
            Some(last) if step >= last => decision_due(
                last,
                step,
                now.saturating_duration_since(self.at),
                interval_steps,
                min_interval,
            )
            .then_some(step),
            _ => {
                self.step = Some(step);
                None
            }
        }
    }

    /// A decision was taken at `step`, `now`.
    pub fn mark(&mut self, step: u64, now: Instant) {
        *self = DecisionClock {
            step: Some(step),
            at: now,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// A clock started now, and now.
    fn started() -> (Instant, DecisionClock) {
        let t0 = Instant::now();
        (t0, DecisionClock::new(t0))
    }

    #[test]
    fn needs_both_the_steps_and_the_floor() {
        // 20 steps since step 100, and 30 s since then: due.
        assert!(decision_due(100, 120, 30 * S, 20, 30 * S));
        assert!(decision_due(100, 500, 31 * S, 20, 30 * S));
        // Enough time, too few steps (slow steps): wait for the steps.
        assert!(!decision_due(100, 119, 300 * S, 20, 30 * S));
        // Enough steps, too little time (fast steps): the floor holds.
        assert!(!decision_due(100, 10_000, 20 * S, 20, 30 * S));
        // No floor: the steps alone decide.
        assert!(decision_due(0, 5, Duration::ZERO, 5, Duration::ZERO));
        assert!(!decision_due(0, 4, Duration::ZERO, 5, Duration::ZERO));
    }

    #[test]
    fn floor_has_slack_for_scrape_jitter() {
        // A 2 s floor checked at 1 s scrapes that fire a little early.
        assert!(decision_due(0, 10, Duration::from_millis(1950), 10, 2 * S));
        assert!(!decision_due(0, 10, Duration::from_millis(1850), 10, 2 * S));
    }

    #[test]
    fn zero_steps_means_one_and_going_back_is_never_due() {
        assert!(!decision_due(7, 7, 60 * S, 0, S));
        assert!(decision_due(7, 8, 60 * S, 0, S));
        assert!(!decision_due(50, 10, 60 * S, 1, S));
    }

    #[test]
    fn clock_learns_its_baseline_then_counts_from_each_decision() {
        let (t0, mut c) = started();
        // No step read yet: never due, however late.
        assert_eq!(c.due(None, t0 + 100 * S, 10, S), None);
        // The first step read is the baseline, not a decision.
        assert_eq!(c.due(Some(40), t0 + 100 * S, 10, S), None);
        assert_eq!(c.due(Some(49), t0 + 101 * S, 10, S), None);
        assert_eq!(c.due(Some(50), t0 + 101 * S, 10, S), Some(50));
        c.mark(50, t0 + 101 * S);
        // The next one counts from the decision: steps and time again.
        assert_eq!(c.due(Some(59), t0 + 200 * S, 10, S), None);
        assert_eq!(c.due(Some(60), t0 + 101 * S, 10, S), None);
        assert_eq!(c.due(Some(60), t0 + 102 * S, 10, S), Some(60));
    }

    #[test]
    fn clock_rebases_when_the_step_goes_back() {
        let (t0, mut c) = started();
        c.mark(500, t0);
        // A trainer back at step 100: 100 is the new baseline...
        assert_eq!(c.due(Some(100), t0 + 60 * S, 10, S), None);
        // ...so ten steps later it is due, not 410 steps later.
        assert_eq!(c.due(Some(110), t0 + 61 * S, 10, S), Some(110));
    }

    #[test]
    fn unmarked_clock_stays_due_for_a_retry() {
        let (t0, mut c) = started();
        assert_eq!(c.due(Some(0), t0, 5, S), None);
        assert_eq!(c.due(Some(5), t0 + 2 * S, 5, S), Some(5));
        // The write failed and the mark was not moved: due at the next scrape.
        assert_eq!(c.due(Some(6), t0 + 3 * S, 5, S), Some(6));
    }
}
