//! A TCP proxy a test can cut: it forwards connections on a loopback port
//! to a target port until [`CutProxy::cut`], which closes every open
//! connection and refuses new ones until [`CutProxy::restore`]. Put in
//! front of the API server for one client, it takes that client's access
//! away (a partitioned node) while everything else keeps it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running proxy; stopped when dropped.
pub struct CutProxy {
    port: u16,
    cut: watch::Sender<bool>,
    /// Connections being forwarded.
    live: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

/// Counts a forwarded connection while it lives.
struct Live(Arc<AtomicUsize>);

impl Live {
    fn new(n: &Arc<AtomicUsize>) -> Live {
        n.fetch_add(1, Ordering::SeqCst);
        Live(n.clone())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl CutProxy {
    /// Forward 127.0.0.1:<new port> to 127.0.0.1:`target`.
    pub async fn start(target: u16) -> Result<CutProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the proxy")?;
        let port = listener.local_addr()?.port();
        let (cut, cut_rx) = watch::channel(false);
        let live = Arc::new(AtomicUsize::new(0));
        let counter = live.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if *cut_rx.borrow() {
                    drop(inbound);
                    continue;
                }
                let mut rx = cut_rx.clone();
                let alive = Live::new(&counter);
                tokio::spawn(async move {
                    let _alive = alive;
                    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let mut inbound = inbound;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = rx.wait_for(|c| *c) => {}
                    }
                });
            }
        });
        Ok(CutProxy {
            port,
            cut,
            live,
            task,
        })
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Close every connection and refuse new ones; returns once every
    /// open connection is closed (at most a few seconds).
    pub async fn cut(&self) {
        let _ = self.cut.send(true);
        for _ in 0..500 {
            if self.live.load(Ordering::SeqCst) == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Forward again.
    pub fn restore(&self) {
        let _ = self.cut.send(false);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        let _ = self.cut.send(true);
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An echo server: what comes in goes back.
    async fn echo() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = l.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        port
    }

    async fn round_trip(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
        s.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await?;
        Ok(buf.to_vec())
    }

    #[tokio::test]
    async fn a_cut_closes_open_connections_and_refuses_new_ones_until_restored() {
        let proxy = CutProxy::start(echo().await).await.expect("proxy");
        let mut open = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .expect("connect");
        assert_eq!(round_trip(&mut open).await.expect("forwarded"), b"ping");
        proxy.cut().await;
        assert!(
            round_trip(&mut open).await.is_err(),
            "the open connection is closed"
        );
        let mut during = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .expect("accepted, then closed");
        assert!(round_trip(&mut during).await.is_err());
        proxy.restore();
        let mut after = TcpStream::connect(("127.0.0.1", proxy.port()))
            .await
            .expect("connect");
        assert_eq!(round_trip(&mut after).await.expect("forwarded"), b"ping");
    }
}
