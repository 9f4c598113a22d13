//! The small HTTP server: `/metrics` (OpenMetrics text of the operator's
//! registry), `/healthz` (alive: fails while leading when the leader Lease
//! has not been renewed for longer than the lease duration) and `/readyz`
//! (the CRD was found, the admission webhook serves when configured, and
//! no watch has been failing for longer than `--watch-unready-after`).
//!
//! A client gets [`HEADER_READ_TIMEOUT`] to send its request's headers
//! (a connection that sends nothing is closed, not held), and at most
//! [`MAX_CONNECTIONS`] connections are served at once; more wait to be
//! accepted.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// How long a client may take to send a request's headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The most connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

use crate::context::Context;
use crate::leader::health::healthy;

fn respond(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

/// Answer one request.
pub fn route(path: &str, ctx: &Context) -> Response<Full<Bytes>> {
    match path {
        "/metrics" => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            heterotrain_crds::metrics::openmetrics_to_text(&ctx.metrics.encode()),
        ),
        "/healthz" => match ctx.lease.since_renewed(Instant::now()) {
            Some(since) if !healthy(Some(since), ctx.config.lease_duration) => respond(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("leader Lease not renewed for {:.1}s\n", since.as_secs_f64()),
            ),
            _ => respond(StatusCode::OK, "text/plain", "ok\n".into()),
        },
        "/readyz" if ctx.webhook_pending.load(Ordering::SeqCst) => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "the admission webhook is not serving yet\n".into(),
        ),
        "/readyz" if ctx.ready.load(Ordering::SeqCst) => {
            match ctx
                .watch_health
                .stale(ctx.config.watch_unready_after, Instant::now())
            {
                Some((watch, d)) => respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!(
                        "the {watch} watch has been failing for {:.0}s: working from stale data\n",
                        d.as_secs_f64()
                    ),
                ),
                None => respond(StatusCode::OK, "text/plain", "ok\n".into()),
            }
        }
        "/readyz" => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "waiting for the HeteroTrainingJob CRD\n".into(),
        ),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// Answer `req`: [`route`], after the bearer token check for `/metrics`
/// when the operator has one ([`crate::metrics_auth`]).
pub async fn answer<B>(req: &Request<B>, ctx: &Context) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if let (Some(auth), "/metrics") = (&ctx.metrics_auth, path) {
        let header = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match auth.check(header).await {
            Ok(()) => {}
            Err(crate::metrics_auth::Refusal::Unauthenticated(why)) => {
                let mut r = respond(StatusCode::UNAUTHORIZED, "text/plain", format!("{why}\n"));
                r.headers_mut().insert(
                    hyper::header::WWW_AUTHENTICATE,
                    hyper::header::HeaderValue::from_static("Bearer"),
                );
                return r;
            }
            Err(crate::metrics_auth::Refusal::Forbidden(why)) => {
                return respond(StatusCode::FORBIDDEN, "text/plain", format!("{why}\n"))
            }
        }
    }
    route(path, ctx)
}

/// Serve on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, ctx, shutdown, HEADER_READ_TIMEOUT).await
}

/// [`serve`] with another header read timeout.
pub async fn serve_with(
    listener: TcpListener,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()>,
    header_timeout: Duration,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = async {
            let permit = slots.clone().acquire_owned().await;
            (permit, listener.accept().await)
        };
        let (permit, accepted) = tokio::select! {
            r = accepted => r,
            _ = &mut shutdown => return Ok(()),
        };
        let (stream, _) = accepted?;
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let ctx = ctx.clone();
                async move { Ok::<_, Infallible>(answer(&req, &ctx).await) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Bind `addr` (port 0 picks a free one) and return the listener and its address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr).await?;
    let a = l.local_addr()?;
    Ok((l, a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A context whose client points nowhere (the server never calls it).
    fn context() -> Arc<Context> {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        Context::new(client, Default::default(), crate::metrics::Metrics::new()).expect("context")
    }

    #[tokio::test]
    async fn a_client_that_sends_no_headers_is_cut_off_and_others_are_served() {
        let (listener, addr) = bind("127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_with(
            listener,
            context(),
            async {
                let _ = stopped.await;
            },
            Duration::from_millis(300),
        ));
        // A slow client: connects, sends half a request line, then nothing.
        let mut idle = tokio::net::TcpStream::connect(addr).await.expect("connect");
        idle.write_all(b"GET /metr").await.expect("write");
        // Meanwhile a whole request is answered.
        let mut ok = tokio::net::TcpStream::connect(addr).await.expect("connect");
        ok.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut answer = String::new();
        ok.read_to_string(&mut answer).await.expect("read");
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        // The slow one is closed by the server (EOF or an error response),
        // long before the test's own limit.
        let mut buf = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(30), idle.read_to_end(&mut buf)).await;
        assert!(
            closed.is_ok(),
            "a client that sent no headers was held open"
        );
        let _ = stop.send(());
        server.await.expect("join").expect("serve");
    }
}
