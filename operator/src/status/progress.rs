//! Progress of a run: how far rank 0 is, when it will end, and whether it
//! still moves (the `Progressing` condition).

use heterotrain_crds::ProgressStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::conditions::{self, Desired};

/// Progress from the run's total steps (kept from `old` when not read this
/// round), rank 0's `step` and the throughput; `done` once the job
/// Succeeded. None until the total is known.
pub fn progress(
    old: Option<ProgressStatus>,
    total_steps: Option<u64>,
    step: u64,
    old_step: u64,
    steps_per_second: Option<f64>,
    done: bool,
    now: &Time,
) -> Option<ProgressStatus> {
    let total = total_steps
        .or(old.as_ref().map(|o| o.total_steps))
        .filter(|&t| t > 0)?;
    let step = if done { total } else { step.min(total) };
    let percent = if done {
        100
    } else {
        ((step as f64 / total as f64) * 100.0).floor().min(99.0) as u32
    };
    let remaining = if done {
        Some(0)
    } else {
        steps_per_second
            .map(|r| ((total - step) as f64 / r).ceil() as u64)
            .or(old.as_ref().and_then(|o| o.estimated_remaining_seconds))
    };
    let moved = step != old_step || done != (old.as_ref().map(|o| o.percent) == Some(100));
    Some(ProgressStatus {
        total_steps: total,
        percent,
        percent_text: format!("{percent}%"),
        estimated_remaining_seconds: remaining,
        eta: remaining.map(duration_text),
        last_update_time: if moved || old.is_none() {
            Some(now.clone())
        } else {
            old.and_then(|o| o.last_update_time)
        },
    })
}

/// Seconds without a step before a running job counts as stalled: ten
/// measured steps, and never under a minute (evaluations and checkpoints
/// take a while).
pub fn stall_after_seconds(step_seconds: Option<f64>) -> f64 {
    step_seconds
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(STALL_FLOOR_SECONDS, |s| (10.0 * s).max(STALL_FLOOR_SECONDS))
}

const STALL_FLOOR_SECONDS: f64 = 60.0;

/// The `Progressing` condition of a running job: True while rank 0's step
/// moves, False (`Stalled`) once it has not for [`stall_after_seconds`].
/// None until progress is known.
pub fn progressing(
    p: Option<&ProgressStatus>,
    step: u64,
    step_seconds: Option<f64>,
    now: &Time,
) -> Option<Desired> {
    let since = p?.last_update_time.as_ref()?;
    let idle = (now.0.as_millisecond() - since.0.as_millisecond()) as f64 / 1000.0;
    let limit = stall_after_seconds(step_seconds);
    Some(if idle > limit {
        Desired::no(
            conditions::types::PROGRESSING,
            conditions::reasons::STALLED,
            format!(
                "no step for {idle:.0} s (at step {step}, over the {limit:.0} s allowed); a hung or stopped rank fails the gang after runPolicy.collectiveTimeoutSeconds"
            ),
        )
    } else {
        Desired::yes(
            conditions::types::PROGRESSING,
            conditions::reasons::STEP_ADVANCING,
            format!("at step {step}"),
        )
    })
}

/// "1h2m", "4m10s", "12s", as `kubectl` prints ages.
pub fn duration_text(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Time {
        Time(s.parse().expect("time"))
    }

    #[test]
    fn progress_percent_eta_and_finish() {
        let t0 = at("2026-01-01T00:00:00Z");
        let t1 = at("2026-01-01T00:01:00Z");
        // Nothing before the total is known.
        assert_eq!(progress(None, None, 10, 0, Some(2.0), false, &t0), None);
        // 250 of 1000 steps at 2 steps/s: 25%, 375 s left.
        let p = progress(None, Some(1000), 250, 0, Some(2.0), false, &t0).unwrap();
        assert_eq!((p.percent, p.percent_text.as_str()), (25, "25%"));
        assert_eq!(p.estimated_remaining_seconds, Some(375));
        assert_eq!(p.eta.as_deref(), Some("6m15s"));
        assert_eq!(p.last_update_time, Some(t0.clone()));
        // No new throughput or total: both kept; the step did not move, so
        // neither did the update time.
        let q = progress(Some(p.clone()), None, 250, 250, None, false, &t1).unwrap();
        assert_eq!(q.total_steps, 1000);
        assert_eq!(q.estimated_remaining_seconds, Some(375));
        assert_eq!(q.last_update_time, Some(t0.clone()));
        // 999 of 1000 is not done; a Succeeded job is, whatever was read.
        let r = progress(Some(q), None, 999, 250, Some(2.0), false, &t1).unwrap();
        assert_eq!(
            (r.percent, r.last_update_time.clone()),
            (99, Some(t1.clone()))
        );
        let done = progress(Some(r), None, 998, 999, None, true, &t1).unwrap();
        assert_eq!(done.percent, 100);
        assert_eq!(done.estimated_remaining_seconds, Some(0));
        assert_eq!(done.eta.as_deref(), Some("0s"));
    }

    #[test]
    fn a_step_that_stops_moving_turns_progressing_false() {
        let t0 = at("2026-01-01T00:00:00Z");
        let p = progress(None, Some(1000), 40, 0, Some(10.0), false, &t0).unwrap();
        let c = |now: &str, step_s: Option<f64>| {
            progressing(Some(&p), 40, step_s, &at(now)).expect("condition")
        };
        assert!(c("2026-01-01T00:00:30Z", Some(0.1)).status);
        let stalled = c("2026-01-01T00:01:01Z", Some(0.1));
        assert!(!stalled.status);
        assert_eq!(stalled.reason, conditions::reasons::STALLED);
        assert!(
            stalled.message.contains("no step for 61 s"),
            "{}",
            stalled.message
        );
        // Slow steps (20 s each) get ten of them.
        assert!(c("2026-01-01T00:03:00Z", Some(20.0)).status);
        assert!(!c("2026-01-01T00:03:21Z", Some(20.0)).status);
        assert_eq!(progressing(None, 40, None, &t0), None);
    }

    #[test]
    fn durations_read_like_kubectl() {
        assert_eq!(duration_text(0), "0s");
        assert_eq!(duration_text(59), "59s");
        assert_eq!(duration_text(61), "1m1s");
        assert_eq!(duration_text(3725), "1h2m");
    }
}
