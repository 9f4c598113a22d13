//! The pure side of leader election: how long one renew call may take,
//! whether a leader whose renewals fail still holds its Lease, and whether
//! the replica is healthy (`/healthz`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest one acquire/renew call may take: the renew interval, and at
/// most half the lease duration, so a hanging API call is given up well
/// before another replica may take the Lease over.
pub fn renew_deadline(renew: Duration, duration: Duration) -> Duration {
    renew.min(duration / 2).max(Duration::from_millis(1))
}

/// What a leader makes of the time since its last successful renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Still ours: the next attempt comes before the Lease may expire.
    Held,
    /// Treat as lost: by the next attempt another replica may hold it.
    Lost,
}

/// Whether a leader last renewed `since` ago, trying every `renew` on a
/// Lease of `duration`, still holds it.
pub fn verdict(since: Duration, renew: Duration, duration: Duration) -> Verdict {
    if since.saturating_add(renew) >= duration {
        Verdict::Lost
    } else {
        Verdict::Held
    }
}

/// Healthy unless leading and the Lease was last renewed longer than
/// `duration` ago (`since` is `None` when not leading).
pub fn healthy(since: Option<Duration>, duration: Duration) -> bool {
    since.is_none_or(|s| s <= duration)
}

/// The replica's Lease as `/healthz` sees it.
#[derive(Debug)]
pub struct LeaseHealth {
    duration: Duration,
    /// When the Lease was last acquired or renewed, while leading.
    renewed: Mutex<Option<Instant>>,
}

impl LeaseHealth {
    /// Not leading yet, for a Lease of `duration`.
    pub fn new(duration: Duration) -> LeaseHealth {
        LeaseHealth {
            duration,
            renewed: Mutex::new(None),
        }
    }

    /// The Lease was acquired or renewed at `at`.
    pub fn renewed(&self, at: Instant) {
        if let Ok(mut r) = self.renewed.lock() {
            *r = Some(at);
        }
    }

    /// No longer leading.
    pub fn standing_by(&self) {
        if let Ok(mut r) = self.renewed.lock() {
            *r = None;
        }
    }

    /// Time since the last renewal at `now`, while leading.
    pub fn since_renewed(&self, now: Instant) -> Option<Duration> {
        self.renewed
            .lock()
            .ok()
            .and_then(|r| *r)
            .map(|t| now.saturating_duration_since(t))
    }

    /// Whether `/healthz` answers ok at `now`.
    pub fn healthy(&self, now: Instant) -> bool {
        healthy(self.since_renewed(now), self.duration)
    }
}
