//! The small HTTP server: `/metrics` (OpenMetrics text of the operator's
//! registry), `/healthz` (alive: fails while leading when the leader Lease
//! has not been renewed for longer than the lease duration) and `/readyz`
//! (the CRD was found).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

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
        "/readyz" if ctx.ready.load(Ordering::SeqCst) => {
            respond(StatusCode::OK, "text/plain", "ok\n".into())
        }
        "/readyz" => respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            "waiting for the HeteroTrainingJob CRD\n".into(),
        ),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// Serve on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    ctx: Arc<Context>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => r?,
            _ = &mut shutdown => return Ok(()),
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let resp = route(req.uri().path(), &ctx);
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = http1::Builder::new()
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
