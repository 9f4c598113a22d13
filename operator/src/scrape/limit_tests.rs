//! The scrape client against a local HTTP server: bodies over the limit
//! (endless, 10 MiB without a length, 10 MiB announced) fail fast with
//! `ScrapeTooLarge`; a hanging rank times out without holding up the others.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::Scraper;
use crate::error::Error;

#[derive(Clone, Copy)]
enum Answer {
    /// A chunked body that never ends.
    Endless,
    /// 10 MiB, the end marked by closing the connection.
    BigUnannounced,
    /// 10 MiB with a Content-Length header.
    BigAnnounced,
    /// Read the request, never answer.
    Hang,
    /// A small valid exposition.
    Small,
}

const TEN_MIB: usize = 10 << 20;

async fn answer(mut s: TcpStream, a: Answer) -> std::io::Result<()> {
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        got.extend_from_slice(&buf[..n]);
    }
    let chunk = vec![b'#'; 64 << 10];
    match a {
        Answer::Endless => {
            s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                .await?;
            let head = format!("{:x}\r\n", chunk.len());
            loop {
                s.write_all(head.as_bytes()).await?;
                s.write_all(&chunk).await?;
                s.write_all(b"\r\n").await?;
            }
        }
        Answer::BigUnannounced | Answer::BigAnnounced => {
            let head = match a {
                Answer::BigAnnounced => {
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {TEN_MIB}\r\n\r\n")
                }
                _ => "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".to_string(),
            };
            s.write_all(head.as_bytes()).await?;
            for _ in 0..TEN_MIB / chunk.len() {
                s.write_all(&chunk).await?;
            }
            s.shutdown().await
        }
        Answer::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(())
        }
        Answer::Small => {
            let body = "heterotrain_local_batch_size 16\nheterotrain_step 3\n";
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
            s.write_all(head.as_bytes()).await?;
            s.write_all(body.as_bytes()).await
        }
    }
}

/// Serve `a` on `ip:port` (port 0: a free one); the port.
async fn serve_on(ip: &str, port: u16, a: Answer) -> u16 {
    let l = TcpListener::bind((ip, port)).await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(answer(s, a));
        }
    });
    port
}

async fn serve(a: Answer) -> u16 {
    serve_on("127.0.0.1", 0, a).await
}

async fn too_large(a: Answer) {
    let port = serve(a).await;
    // A long timeout: the limit, not the timeout, must end the scrape.
    let scraper = Scraper::new(Duration::from_secs(60))
        .expect("client")
        .with_max_body(4 << 20);
    let start = Instant::now();
    let r = scraper.scrape_pod("127.0.0.1", port).await;
    match r {
        Err(Error::ScrapeTooLarge { limit, .. }) => assert_eq!(limit, 4 << 20),
        other => panic!("expected ScrapeTooLarge, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn endless_body_is_cut_off() {
    too_large(Answer::Endless).await;
}

#[tokio::test]
async fn big_body_without_length_is_cut_off() {
    too_large(Answer::BigUnannounced).await;
}

#[tokio::test]
async fn big_announced_body_is_refused() {
    too_large(Answer::BigAnnounced).await;
}

#[tokio::test]
async fn one_bad_rank_does_not_hold_up_the_others() {
    // Three ranks on one port, told apart by loopback address.
    let port = serve_on("127.0.0.1", 0, Answer::Small).await;
    serve_on("127.0.0.2", port, Answer::Endless).await;
    serve_on("127.0.0.3", port, Answer::Hang).await;
    // Time enough for the good rank's answer on a loaded machine; the
    // hanging rank ends the round at this timeout, well within the bound.
    let scraper = Scraper::new(Duration::from_secs(10))
        .expect("client")
        .with_max_body(1 << 20);
    let targets: Vec<Option<String>> = vec![
        Some("127.0.0.1".into()),
        Some("127.0.0.2".into()),
        Some("127.0.0.3".into()),
        None,
    ];
    let start = Instant::now();
    let r = scraper.scrape_pods(&targets, port).await;
    // A generous bound: the round ends with the hanging rank's timeout.
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(r[0].as_ref().expect("good rank").local_batch, Some(16));
    assert!(
        matches!(r[1], Err(Error::ScrapeTooLarge { .. })),
        "{:?}",
        r[1]
    );
    assert!(
        matches!(&r[2], Err(Error::Scrape { message, .. }) if message.contains("timed out")),
        "{:?}",
        r[2]
    );
    assert!(matches!(&r[3], Err(Error::Scrape { message, .. }) if message.contains("no IP")));
}

/// 64 ranks answering bodies just under the 1 MiB limit, with a 4 MiB
/// budget: every rank is read, and never more than 4 bodies at once (the
/// ranks count the requests they are answering at the same time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bodies_read_at_once_stay_within_the_budget() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut body = "# padding to just under the limit\n".repeat((900 << 10) / 34);
    body.push_str("heterotrain_local_batch_size 16\n");
    let body = Arc::new(body);
    let mut port = 0;
    for i in 1..=64u8 {
        let l = TcpListener::bind((format!("127.0.9.{i}").as_str(), port))
            .await
            .expect("bind");
        port = l.local_addr().expect("addr").port();
        let (now, most, body) = (now.clone(), most.clone(), body.clone());
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let (now, most, body) = (now.clone(), most.clone(), body.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len());
                    let _ = s.write_all(head.as_bytes()).await;
                    let _ = s.write_all(body.as_bytes()).await;
                    now.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
    }
    let scraper = Scraper::new(Duration::from_secs(60))
        .expect("client")
        .with_max_body(1 << 20)
        .with_max_total(4 << 20);
    let targets: Vec<Option<String>> = (1..=64).map(|i| Some(format!("127.0.9.{i}"))).collect();
    let r = scraper.scrape_pods(&targets, port).await;
    for (rank, m) in r.iter().enumerate() {
        assert_eq!(
            m.as_ref().map(|m| m.local_batch).ok().flatten(),
            Some(16),
            "rank {rank}: {m:?}"
        );
    }
    let most = most.load(Ordering::SeqCst);
    assert!((1..=4).contains(&most), "{most} bodies at once");
}
