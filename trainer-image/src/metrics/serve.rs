//! The `/metrics` endpoint (hyper, on its own thread), and the process
//! gauges read at each scrape.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use super::TrainerMetrics;

/// User+system CPU seconds of this process (`/proc/self/stat`).
pub(super) fn process_cpu_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime, stime are 14, 15.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then(|| (utime + stime) / ticks as f64)
}

/// Resident set size of this process (`/proc/self/statm`).
pub fn process_rss_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * page.max(4096) as u64)
}

/// Serve `/metrics` (and `/healthz`) on `addr:port` with hyper, on a
/// background thread with its own single-threaded runtime (training never
/// waits for a scrape). Returns the bound address; a bind failure is
/// returned (the caller warns and trains on without an endpoint).
pub fn serve(
    metrics: Arc<TrainerMetrics>,
    addr: &str,
    port: u16,
) -> std::io::Result<std::net::SocketAddr> {
    let host = if addr.contains(':') && !addr.starts_with('[') {
        format!("[{addr}]")
    } else {
        addr.to_string()
    };
    let listener = std::net::TcpListener::bind(format!("{host}:{port}"))?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || runtime.block_on(accept(listener, metrics)))?;
    Ok(local)
}

/// Accept connections for ever, each served on its own task.
async fn accept(listener: std::net::TcpListener, metrics: Arc<TrainerMetrics>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        eprintln!("warning: the metrics endpoint could not start");
        return;
    };
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let metrics = Arc::clone(&metrics);
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<Incoming>| {
                let metrics = Arc::clone(&metrics);
                async move { Ok::<_, Infallible>(respond(&req, &metrics)) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// The answer to one request: `GET /metrics`, `GET /healthz`, else 404/405.
fn respond(req: &Request<Incoming>, metrics: &TrainerMetrics) -> Response<Full<Bytes>> {
    let (status, ctype, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.encode(),
        ),
        (&Method::GET, "/healthz") => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        (&Method::GET, _) => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".to_string(),
        ),
        _ => (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".to_string(),
        ),
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}
