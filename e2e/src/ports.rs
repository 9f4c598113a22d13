//! Free loopback ports, so two clusters (or two test binaries) never collide.

use std::net::TcpListener;

/// Ask the kernel for `n` distinct free ports on 127.0.0.1. The listeners are
/// held until all ports are chosen so the same port is never returned twice.
pub fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
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
