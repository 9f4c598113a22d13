//! Loopback address ranges handed out on this machine: the second octet
//! of a simulator's pod IPs and of a local control plane's Service range,
//! each claimed so that parallel test binaries never share one.

use std::sync::atomic::{AtomicU32, Ordering};

/// The second octets pod IPs are drawn from: 127.128.x.x to 127.254.x.x.
/// Below 128 is left to Service IPs ([`SERVICE_IP_OCTETS`]) and to tests
/// that bind loopback addresses of their own (the operator's tests serve
/// fake ranks on 127.77.x.x): a simulator's pod on such an address would
/// meet a test's listener — a trainer's metrics answered by a fake rank, a
/// pod's port already taken.
pub const POD_IP_OCTETS: std::ops::RangeInclusive<u8> = 128..=254;

/// The second octets of the local control planes' Service ranges
/// (`127.<octet>.0.0/16`, one per control plane running at once): their
/// ClusterIPs are loopback addresses the node simulator listens on
/// ([`services`]).
pub const SERVICE_IP_OCTETS: std::ops::RangeInclusive<u8> = 96..=127;

/// Second octet of an instance's pod IPs, distinct for every simulator on
/// this machine at once (test binaries run in parallel): see [`claim_octet`].
pub(super) fn claim_ip_prefix() -> (u8, Option<std::fs::File>) {
    claim_octet(POD_IP_OCTETS, "heterotrain-nodesim-ip-prefixes")
}

/// The first free octet of `octets`, distinct for every claimant on this
/// machine at once: claimed by an exclusive `flock` on a file of its own
/// under `dir` in the temporary directory, held by the returned file until
/// the claimant ends (the kernel drops it with the process). Where no lock
/// file can be made, an octet from the process id, most likely distinct.
pub fn claim_octet(octets: std::ops::RangeInclusive<u8>, dir: &str) -> (u8, Option<std::fs::File>) {
    use std::os::fd::AsRawFd;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let start = std::process::id().wrapping_mul(7).wrapping_add(n * 53);
    let (low, count) = (
        u32::from(*octets.start()),
        u32::from(*octets.end() - *octets.start()) + 1,
    );
    let octet = |i: u32| (low + start.wrapping_add(i) % count) as u8;
    let dir = std::env::temp_dir().join(dir);
    if std::fs::create_dir_all(&dir).is_ok() {
        for i in 0..count {
            let p = octet(i);
            let Ok(f) = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(dir.join(p.to_string()))
            else {
                break;
            };
            // SAFETY: flock(2) on a descriptor `f` owns for the call.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return (p, Some(f));
            }
        }
    }
    (octet(0), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulators claimed at once get distinct octets, all inside
    /// [`POD_IP_OCTETS`] and so never the operator tests' 127.77.x.x.
    #[test]
    fn claimed_octets_are_distinct_and_clear_of_the_tests_own_addresses() {
        let claims: Vec<_> = (0..16).map(|_| claim_ip_prefix()).collect();
        let octets: std::collections::BTreeSet<u8> = claims.iter().map(|(p, _)| *p).collect();
        assert_eq!(octets.len(), claims.len(), "{octets:?}");
        assert!(
            octets.iter().all(|p| POD_IP_OCTETS.contains(p)),
            "{octets:?}"
        );
        assert!(!POD_IP_OCTETS.contains(&77));
        assert!(!SERVICE_IP_OCTETS.contains(&77));
        assert!(POD_IP_OCTETS.start() > SERVICE_IP_OCTETS.end());
    }
}
