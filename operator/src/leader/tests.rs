//! The pure parts of leader election.

use std::time::{Duration, Instant};

use super::health::{healthy, renew_deadline, verdict, LeaseHealth, Verdict};

const S: fn(u64) -> Duration = Duration::from_secs;

#[test]
fn renew_calls_end_well_before_the_lease_expires() {
    assert_eq!(renew_deadline(S(5), S(15)), S(5));
    assert_eq!(renew_deadline(S(10), S(15)), Duration::from_millis(7500));
    assert!(renew_deadline(Duration::ZERO, Duration::ZERO) > Duration::ZERO);
}

#[test]
fn lost_once_the_next_attempt_could_come_too_late() {
    assert_eq!(verdict(S(0), S(5), S(15)), Verdict::Held);
    assert_eq!(verdict(S(9), S(5), S(15)), Verdict::Held);
    assert_eq!(verdict(S(10), S(5), S(15)), Verdict::Lost);
    assert_eq!(verdict(S(60), S(5), S(15)), Verdict::Lost);
    assert_eq!(verdict(Duration::MAX, S(5), S(15)), Verdict::Lost);
}

#[test]
fn unhealthy_only_when_leading_and_not_renewed_for_a_lease_duration() {
    assert!(healthy(None, S(15)));
    assert!(healthy(Some(S(15)), S(15)));
    assert!(!healthy(Some(S(16)), S(15)));
}

#[test]
fn lease_health_follows_renewals() {
    let h = LeaseHealth::new(S(15));
    let t0 = Instant::now();
    assert!(h.healthy(t0 + S(100)), "standing by is healthy");
    h.renewed(t0);
    assert!(h.healthy(t0 + S(10)));
    assert!(!h.healthy(t0 + S(20)));
    h.renewed(t0 + S(18));
    assert!(h.healthy(t0 + S(20)));
    h.standing_by();
    assert!(h.healthy(t0 + S(100)));
}
