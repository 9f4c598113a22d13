//! Whether the operator works from current data. A watch (jobs, pods,
//! ConfigMaps, per namespace) that fails is retried with back-off (at most
//! 30 s apart); it is failing from its first error until its next event,
//! or until it has gone [`QUIET`] without an error (a watch re-established
//! from its last resource version delivers nothing until something
//! changes). `/readyz` turns unready while one has been failing longer than
//! `--watch-unready-after` ([`WatchHealth::stale`]): an operator reconciling
//! from stale caches should not look healthy.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long without an error ends a watch's failure: longer than the
/// watchers' largest back-off between retries.
pub const QUIET: Duration = Duration::from_secs(45);

/// Failing watches, by name: when each started failing, and its last error.
#[derive(Debug, Default)]
pub struct WatchHealth {
    failing: Mutex<BTreeMap<String, (Instant, Instant)>>,
}

impl WatchHealth {
    /// Watch `name` delivered an event (`ok`) or an error, at `now`.
    pub fn observe(&self, name: &str, ok: bool, now: Instant) {
        let Ok(mut f) = self.failing.lock() else {
            return;
        };
        if ok {
            f.remove(name);
            return;
        }
        let e = f.entry(name.to_string()).or_insert((now, now));
        if now.saturating_duration_since(e.1) > QUIET {
            // The last failure ended quietly: a new one starts.
            e.0 = now;
        }
        e.1 = now;
    }

    /// The watch failing longest, when it has been failing for more than
    /// `after` at `now`: its name and for how long.
    pub fn stale(&self, after: Duration, now: Instant) -> Option<(String, Duration)> {
        let f = self.failing.lock().ok()?;
        f.iter()
            .filter(|(_, (_, last))| now.saturating_duration_since(*last) <= QUIET)
            .map(|(name, (since, _))| (name.clone(), now.saturating_duration_since(*since)))
            .filter(|(_, d)| *d > after)
            .max_by_key(|(_, d)| *d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_is_stale_from_its_first_error_until_its_next_event() {
        let h = WatchHealth::default();
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let after = Duration::from_secs(60);
        h.observe("pods/ml", true, t0);
        for t in (1..=61).step_by(20) {
            h.observe("pods/ml", false, s(t)); // retries keep the first error's time
        }
        assert_eq!(h.stale(after, s(60)), None);
        assert_eq!(
            h.stale(after, s(62)),
            Some(("pods/ml".into(), Duration::from_secs(61)))
        );
        // Another watch failing for less does not hide the longest.
        h.observe("jobs/ml", false, s(50));
        h.observe("jobs/ml", false, s(80));
        assert_eq!(
            h.stale(after, s(62)).map(|(n, _)| n),
            Some("pods/ml".into())
        );
        h.observe("pods/ml", true, s(63));
        assert_eq!(h.stale(after, s(100)), None, "jobs/ml: 50 s");
        assert_eq!(
            h.stale(after, s(111)).map(|(n, _)| n),
            Some("jobs/ml".into())
        );
    }

    #[test]
    fn a_watch_without_errors_for_a_while_is_no_longer_failing() {
        let h = WatchHealth::default();
        let t0 = Instant::now();
        let s = |secs: u64| t0 + Duration::from_secs(secs);
        let after = Duration::from_secs(10);
        h.observe("jobs/ml", false, s(0));
        h.observe("jobs/ml", false, s(20));
        assert!(h.stale(after, s(21)).is_some());
        // Re-established without an event: quiet for longer than QUIET.
        assert_eq!(h.stale(after, s(20) + QUIET + Duration::from_secs(1)), None);
        // A later error starts a new failure, not stale yet.
        let later = s(20) + QUIET + Duration::from_secs(5);
        h.observe("jobs/ml", false, later);
        assert_eq!(h.stale(after, later + Duration::from_secs(5)), None);
        assert!(h.stale(after, later + Duration::from_secs(11)).is_some());
    }
}
