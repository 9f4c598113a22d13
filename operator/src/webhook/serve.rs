//! The webhook's HTTPS server: `POST /validate` answers an
//! `AdmissionReview`; anything else is 404/405. The certificate can be
//! swapped while serving ([`Certs::set`]).

use std::convert::Infallible;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{anyhow, Context as _, Result};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::context::Context;

/// Where the API server sends reviews of HeteroTrainingJobs.
pub const PATH: &str = "/validate";
/// The largest review read (the API server's own request limit is 3 MiB).
const MAX_BODY: usize = 4 << 20;
/// Time for a client to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Time for a TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most connections served at once.
const MAX_CONNECTIONS: usize = 64;

/// The serving certificate, replaceable while the server runs.
#[derive(Debug, Default)]
pub struct Certs {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl Certs {
    /// Serve `cert_pem` (the chain) with `key_pem` from now on.
    pub fn set(&self, cert_pem: &str, key_pem: &str) -> Result<()> {
        let chain = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow!("the webhook certificate: {e}"))?;
        if chain.is_empty() {
            return Err(anyhow!("the webhook certificate file holds no certificate"));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| anyhow!("the webhook key: {e}"))?;
        let signer = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| anyhow!("the webhook key: {e}"))?;
        let ck = Arc::new(CertifiedKey::new(chain, signer));
        if let Ok(mut c) = self.current.write() {
            *c = Some(ck);
        }
        Ok(())
    }
}

impl ResolvesServerCert for Certs {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok()?.clone()
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

async fn answer(req: Request<Incoming>, ctx: &Context) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::POST, PATH) => {}
        (_, PATH) => {
            return respond(
                StatusCode::METHOD_NOT_ALLOWED,
                "text/plain",
                b"POST only\n".to_vec(),
            )
        }
        _ => return respond(StatusCode::NOT_FOUND, "text/plain", b"not found\n".to_vec()),
    }
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return respond(
                StatusCode::PAYLOAD_TOO_LARGE,
                "text/plain",
                format!("request body: {e}\n").into_bytes(),
            )
        }
    };
    let review = super::review::review(&body, ctx.config.admission(), &ctx.config.watch_namespaces);
    match serde_json::to_vec(&review) {
        Ok(json) => respond(StatusCode::OK, "application/json", json),
        Err(e) => respond(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("{e}\n").into_bytes(),
        ),
    }
}

/// Serve reviews on `listener` with `certs` for ever.
pub async fn serve(listener: TcpListener, certs: Arc<Certs>, ctx: Arc<Context>) -> Result<()> {
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS versions")?
    .with_no_client_auth()
    .with_cert_resolver(certs);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
            return Ok(());
        };
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "webhook: accepting a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let ctx = Arc::clone(&ctx);
        tokio::spawn(async move {
            let _permit = permit;
            let stream =
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "webhook: TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                };
            let svc = service_fn(move |req| {
                let ctx = Arc::clone(&ctx);
                async move { Ok::<_, Infallible>(answer(req, &ctx).await) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
