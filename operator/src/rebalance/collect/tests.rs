//! The collector against a local HTTP server that answers only when the
//! test lets it: a read never blocks the caller, a second read of the same
//! job waits for the first, the job is woken when the reading is there,
//! a reading of another gang is never taken, a forgotten job never woken.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::*;

const BODY: &str = "heterotrain_step 42\nheterotrain_samples_total 640\n";

/// A server answering one request with [`BODY`] once `release` fires.
async fn held_server() -> (u16, oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (tx, rx) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        let mut buf = vec![0u8; 4096];
        let mut got = Vec::new();
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let _ = rx.await;
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
            BODY.len()
        );
        let _ = s.write_all(head.as_bytes()).await;
        let _ = s.write_all(BODY.as_bytes()).await;
    });
    (port, tx)
}

fn setup() -> (
    Collector,
    mpsc::UnboundedReceiver<ObjectRef<DynamicObject>>,
    Scraper,
) {
    let c = Collector::new();
    let (tx, rx) = mpsc::unbounded();
    c.register(Some("ns".into()), crate::guard::api_resource(), tx);
    let scraper = Scraper::new(Duration::from_secs(30)).expect("scraper");
    (c, rx, scraper)
}

fn pods(port: u16) -> Request {
    Request::Pods {
        targets: vec![Some("127.0.0.1".into())],
        port,
    }
}

#[tokio::test]
async fn a_read_runs_off_the_callers_path_and_wakes_the_job() {
    let (port, release) = held_server().await;
    let (c, mut woken, scraper) = setup();
    let key = JobKey::new("ns", "j");
    let task = c
        .start(&key, "uid/0", pods(port), &scraper)
        .expect("first read starts");
    // The server has not answered: nothing to take, and a second read of
    // the same job does not start beside the first.
    assert!(c.take(&key, "uid/0").is_none());
    assert!(c.start(&key, "uid/0", pods(port), &scraper).is_none());
    release.send(()).expect("release");
    task.await.expect("read task");
    let r = woken.try_recv().expect("woken");
    assert_eq!(r.name, "j");
    assert_eq!(r.namespace.as_deref(), Some("ns"));
    assert!(c.take(&key, "uid/1").is_none(), "another gang's reading");
    let reading = c.take(&key, "uid/0").expect("the reading");
    assert_eq!(reading.ranks.len(), 1);
    let m = reading.ranks[0].as_ref().expect("rank 0 read");
    assert_eq!(m.step, Some(42));
    assert_eq!(m.samples_total, Some(640.0));
    assert!(c.take(&key, "uid/0").is_none(), "taken once");
}

#[tokio::test]
async fn a_forgotten_job_is_neither_kept_nor_woken() {
    let (port, release) = held_server().await;
    let (c, mut woken, scraper) = setup();
    let key = JobKey::new("ns", "gone");
    let task = c
        .start(&key, "uid/0", pods(port), &scraper)
        .expect("read starts");
    c.forget(&key);
    release.send(()).expect("release");
    task.await.expect("read task");
    assert!(c.take(&key, "uid/0").is_none());
    assert!(woken.try_recv().is_err(), "nothing woken");
    // A job of another namespace than any registered scope is not woken
    // either (no controller watches it).
    let elsewhere = JobKey::new("other", "j");
    let none = Request::Pods {
        targets: vec![None],
        port,
    };
    let t = c.start(&elsewhere, "u/0", none, &scraper).expect("starts");
    t.await.expect("read task");
    assert!(woken.try_recv().is_err());
    let r = c.take(&elsewhere, "u/0").expect("kept");
    assert!(r.ranks[0].is_err(), "a rank without an IP is an error");
}

#[tokio::test]
async fn a_read_cut_short_lets_the_next_one_start() {
    let (port, _held) = held_server().await;
    let (c, _woken, scraper) = setup();
    let key = JobKey::new("ns", "j");
    let task = c
        .start(&key, "uid/0", pods(port), &scraper)
        .expect("read starts");
    assert!(c.start(&key, "uid/0", pods(port), &scraper).is_none());
    // The task ends without an answer (as on a panic): not left in flight.
    task.abort();
    let _ = task.await;
    assert!(c.start(&key, "uid/0", pods(port), &scraper).is_some());
}
