//! Free loopback ports, so two clusters (or two test binaries) never collide.
//!
//! Ports come from below the kernel's ephemeral range
//! (`net.ipv4.ip_local_port_range`), so the source port of an outgoing
//! connection can never take one between its choice and its server's bind
//! (with test binaries in parallel, thousands of connections come and go on
//! loopback). Each is claimed for the life of this process by an exclusive
//! `flock` on a file of its own in the temporary directory, so two
//! processes never pick the same one, and checked free by a bind.

use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

/// The lowest port handed out.
const LOWEST: u16 = 10_000;

/// Claims held until the process exits.
static CLAIMS: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());

/// `n` distinct free ports on 127.0.0.1, none of them another process's
/// claim, none in the ephemeral range (where that range leaves room; else
/// the kernel's choice, as before).
pub fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let Some(highest) = below_ephemeral() else {
        return kernel_ports(n);
    };
    let dir = std::env::temp_dir().join("heterotrain-ports");
    if std::fs::create_dir_all(&dir).is_err() {
        return kernel_ports(n);
    }
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let span = u32::from(highest - LOWEST) + 1;
    let seed = std::process::id()
        .wrapping_mul(2_654_435_761)
        .wrapping_add(NEXT.fetch_add(1, Ordering::SeqCst).wrapping_mul(7_919))
        .wrapping_add(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0),
        );
    let mut out = Vec::with_capacity(n);
    let mut claims = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
    for i in 0..span {
        if out.len() == n {
            break;
        }
        let port = LOWEST + ((seed.wrapping_add(i)) % span) as u16;
        let Ok(file) = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
        else {
            continue;
        };
        // SAFETY: flock(2) on a descriptor `file` owns for the call.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        claims.push(file);
        out.push(port);
    }
    if out.len() == n {
        Ok(out)
    } else {
        kernel_ports(n)
    }
}

/// The highest port below the ephemeral range, when at least 1,000 ports
/// lie between [`LOWEST`] and it.
fn below_ephemeral() -> Option<u16> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let low: u16 = text.split_whitespace().next()?.parse().ok()?;
    (low > LOWEST + 1_000).then(|| low - 1)
}

/// Ask the kernel for `n` distinct free ports on 127.0.0.1. The listeners are
/// held until all ports are chosen so the same port is never returned twice.
fn kernel_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

/// Fail with a clear message when something already listens on `port`.
pub fn ensure_free(port: u16) -> Result<(), String> {
    match TcpListener::bind(("127.0.0.1", port)) {
        Ok(_) => Ok(()),
        Err(e) => Err(format!("port 127.0.0.1:{port} is taken ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_free_and_below_the_ephemeral_range() {
        let a = free_ports(5).unwrap();
        let b = free_ports(5).unwrap();
        let mut all: Vec<u16> = a.iter().chain(&b).copied().collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 10, "{a:?} {b:?}");
        for p in &all {
            assert!(TcpListener::bind(("127.0.0.1", *p)).is_ok(), "{p} taken");
            if let Some(highest) = below_ephemeral() {
                assert!((LOWEST..=highest).contains(p), "{p}");
            }
        }
    }
}
