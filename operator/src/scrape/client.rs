//! The HTTP client for pod scrapes (plain HTTP) and Prometheus queries
//! (http or https: the system's roots plus `--prometheus-ca-file`, and a
//! bearer token read from `--prometheus-bearer-token-file` at every query,
//! so a rotated token is picked up; the token goes to Prometheus only,
//! never to a pod, and is never logged). Every
//! request is bounded twice: by a timeout over the whole exchange (connect,
//! headers, body) and by a body-size limit enforced while the body streams
//! in, so a slow or huge endpoint costs one rank's metrics for one round and
//! never more than the limit in memory. Ranks are scraped concurrently, so
//! one rank's failure does not hold up the others.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::{Body, Bytes};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;

use super::{
    exposition::Lines, group_by_rank, parse_exposition, parse_prometheus_vector, percent_encode,
    RankMetrics,
};
use crate::error::{Error, Result};

/// Default limit on one response body: 4 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;
/// Default limit on the bodies read at once, over every job: 64 MiB.
pub const DEFAULT_MAX_TOTAL_BYTES: usize = 64 << 20;

/// A small HTTP client for scrapes and Prometheus queries.
#[derive(Clone)]
pub struct Scraper {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    timeout: Duration,
    max_body: usize,
    /// Scrapes in flight at once, each able to hold up to `max_body`
    /// bytes: the total budget over `max_body` (shared by the clones, so by
    /// every job).
    slots: Arc<Semaphore>,
    /// File holding the bearer token sent with Prometheus queries.
    prometheus_token_file: Option<PathBuf>,
}

/// How the operator reaches Prometheus over https.
#[derive(Clone, Debug, Default)]
pub struct PrometheusAuth {
    /// PEM file of CAs trusted besides the system's roots.
    pub ca_file: Option<PathBuf>,
    /// File whose (trimmed) content is sent as `Authorization: Bearer`.
    pub bearer_token_file: Option<PathBuf>,
}

/// rustls with the system's roots and the CAs in `ca_file`.
fn tls_config(ca_file: Option<&Path>) -> Result<rustls::ClientConfig> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let invalid = |m: String| Error::Invalid(m);
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates are skipped, as curl and Go do.
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = ca_file {
        let certs = CertificateDer::pem_file_iter(path)
            .map_err(|e| invalid(format!("--prometheus-ca-file {}: {e}", path.display())))?
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| invalid(format!("--prometheus-ca-file {}: {e}", path.display())))?;
        if certs.is_empty() {
            return Err(invalid(format!(
                "--prometheus-ca-file {}: no PEM certificate in it",
                path.display()
            )));
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|e| invalid(format!("--prometheus-ca-file {}: {e}", path.display())))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("TLS set-up: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// What takes a body's pieces as they arrive: an error stops the read.
type Sink<'a> = &'a mut (dyn FnMut(&[u8]) -> std::result::Result<(), String> + Send);

/// Read `body` to its end into `sink`, failing as soon as more than
/// `limit` bytes came.
async fn read_limited<B>(mut body: B, limit: usize, target: &str, sink: Sink<'_>) -> Result<()>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let too_large = || Error::ScrapeTooLarge {
        target: target.to_string(),
        limit,
    };
    let fail = |message: String| Error::Scrape {
        target: target.to_string(),
        message,
    };
    if body.size_hint().lower() > limit as u64 {
        return Err(too_large());
    }
    let mut read = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| fail(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            read = read.saturating_add(data.len());
            if read > limit {
                return Err(too_large());
            }
            sink(&data).map_err(fail)?;
        }
    }
    Ok(())
}

impl Scraper {
    /// A client whose every request gives up after `timeout` or once its
    /// body passes [`DEFAULT_MAX_BODY_BYTES`]; https with the system's roots.
    pub fn new(timeout: Duration) -> Result<Scraper> {
        Scraper::with_prometheus_auth(timeout, &PrometheusAuth::default())
    }

    /// [`Scraper::new`] that also trusts `auth.ca_file` and sends the token
    /// in `auth.bearer_token_file` with Prometheus queries. Fails when the CA
    /// file cannot be read or holds no certificate, or the token file cannot
    /// be read (checked now, so a wrong path stops the operator at start).
    pub fn with_prometheus_auth(timeout: Duration, auth: &PrometheusAuth) -> Result<Scraper> {
        if let Some(path) = &auth.bearer_token_file {
            read_token(path)?;
        }
        let tls = tls_config(auth.ca_file.as_deref())?;
        Ok(Scraper::build(timeout, tls, auth.bearer_token_file.clone()))
    }

    fn build(timeout: Duration, tls: rustls::ClientConfig, token: Option<PathBuf>) -> Scraper {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(timeout));
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Scraper {
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout,
            max_body: DEFAULT_MAX_BODY_BYTES,
            slots: Arc::new(Semaphore::new(
                DEFAULT_MAX_TOTAL_BYTES / DEFAULT_MAX_BODY_BYTES,
            )),
            prometheus_token_file: token,
        }
    }

    /// The same client with another body-size limit, in bytes.
    pub fn with_max_body(self, max_body: usize) -> Scraper {
        Scraper { max_body, ..self }
    }

    /// The same client with another limit on the bytes of all bodies read
    /// at once (at least one body's worth): scrapes beyond it wait their
    /// turn. Call after [`Scraper::with_max_body`].
    pub fn with_max_total(self, total: usize) -> Scraper {
        let n = (total / self.max_body.max(1)).max(1);
        Scraper {
            slots: Arc::new(Semaphore::new(n)),
            ..self
        }
    }

    /// GET `url` and return the body as text (2xx only); fails with
    /// [`Error::ScrapeTooLarge`] once the body passes the size limit.
    pub async fn get_text(&self, url: &str) -> Result<String> {
        self.get(url, None).await
    }

    /// GET `url` with `Authorization: Bearer <token>` when a token is
    /// given, the whole body as text.
    async fn get(&self, url: &str, token: Option<String>) -> Result<String> {
        let mut body = Vec::new();
        self.fetch(url, token, &mut |d: &[u8]| {
            body.extend_from_slice(d);
            Ok(())
        })
        .await?;
        String::from_utf8(body).map_err(|e| Error::Scrape {
            target: url.to_string(),
            message: e.to_string(),
        })
    }

    /// GET `url` (with a bearer token when given), handing the body's
    /// pieces to `sink` as they arrive.
    async fn fetch(&self, url: &str, token: Option<String>, sink: Sink<'_>) -> Result<()> {
        let fail = |message: String| Error::Scrape {
            target: url.to_string(),
            message,
        };
        let uri: hyper::Uri = url.parse().map_err(|e| fail(format!("bad URL: {e}")))?;
        let mut req = hyper::Request::get(uri);
        if let Some(t) = token {
            req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(Empty::new())
            .map_err(|e| fail(format!("request: {e}")))?;
        let fut = async {
            let resp = self.client.request(req).await.map_err(|e| {
                use std::error::Error as _;
                // The cause (a TLS verification failure, a refused
                // connection) is what a user needs; hyper's own text is
                // only "client error (Connect)".
                let mut msg = e.to_string();
                let mut src = e.source();
                while let Some(s) = src {
                    msg = format!("{msg}: {s}");
                    src = s.source();
                }
                fail(msg)
            })?;
            let status = resp.status();
            if !status.is_success() {
                return Err(fail(format!("HTTP {status}")));
            }
            read_limited(resp.into_body(), self.max_body, url, sink).await
        };
        tokio::time::timeout(self.timeout, fut)
            .await
            .map_err(|_| fail(format!("timed out after {:?}", self.timeout)))?
    }

    /// Scrape one pod's `/metrics`.
    pub async fn scrape_pod(&self, ip: &str, port: u16) -> Result<RankMetrics> {
        let host = if ip.contains(':') {
            format!("[{ip}]")
        } else {
            ip.to_string()
        };
        let url = format!("http://{host}:{port}/metrics");
        // A turn within the byte budget; the scrape's timeout starts after.
        let _turn = self.slots.acquire().await;
        // Only the lines the operator reads are kept as the body streams in.
        let mut lines = Lines::default();
        self.fetch(&url, None, &mut |d: &[u8]| lines.push(d))
            .await?;
        let text = lines.finish().map_err(|message| Error::Scrape {
            target: url.clone(),
            message,
        })?;
        let series = parse_exposition(&text).map_err(|e| Error::Scrape {
            target: url,
            message: e.to_string(),
        })?;
        Ok(RankMetrics::from_series(&series))
    }

    /// Scrape every rank concurrently; `targets[r]` is rank r's pod IP.
    pub async fn scrape_pods(
        &self,
        targets: &[Option<String>],
        port: u16,
    ) -> Vec<Result<RankMetrics>> {
        futures::future::join_all(targets.iter().enumerate().map(|(rank, ip)| async move {
            match ip {
                Some(ip) => self.scrape_pod(ip, port).await,
                None => Err(Error::Scrape {
                    target: format!("rank {rank}"),
                    message: "pod has no IP yet".into(),
                }),
            }
        }))
        .await
    }

    /// One instant query for every heterotrain series of the job's pods;
    /// results are grouped by the `pod` label into ranks.
    pub async fn query_prometheus(
        &self,
        base: &str,
        namespace: &str,
        job: &str,
        world_size: usize,
    ) -> Result<Vec<Result<RankMetrics>>> {
        let query = format!(
            "{{__name__=~\"heterotrain_.+\",namespace=\"{namespace}\",pod=~\"{job}-[0-9]+\"}}"
        );
        let url = format!(
            "{}/api/v1/query?query={}",
            base.trim_end_matches('/'),
            percent_encode(&query)
        );
        let token = match &self.prometheus_token_file {
            Some(path) => Some(read_token(path)?),
            None => None,
        };
        let text = self.get(&url, token).await?;
        let series = parse_prometheus_vector(&text).map_err(|message| Error::Scrape {
            target: url.clone(),
            message,
        })?;
        Ok(group_by_rank(&series, job, world_size))
    }
}

/// The bearer token in `path`, trimmed (a Secret's or a projected token's
/// file); its content is never put in an error.
fn read_token(path: &Path) -> Result<String> {
    let t = std::fs::read_to_string(path).map_err(|e| {
        Error::Invalid(format!(
            "--prometheus-bearer-token-file {}: {e}",
            path.display()
        ))
    })?;
    let t = t.trim().to_string();
    if t.is_empty() || t.contains(['\r', '\n']) {
        return Err(Error::Invalid(format!(
            "--prometheus-bearer-token-file {}: empty or more than one line",
            path.display()
        )));
    }
    Ok(t)
}
