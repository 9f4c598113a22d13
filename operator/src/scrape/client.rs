//! The plain-HTTP client for pod scrapes and Prometheus queries. Every
//! request is bounded twice: by a timeout over the whole exchange (connect,
//! headers, body) and by a body-size limit enforced while the body streams
//! in, so a slow or huge endpoint costs one rank's metrics for one round and
//! never more than the limit in memory. Ranks are scraped concurrently, so
//! one rank's failure does not hold up the others.

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::{Body, Bytes};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{
    group_by_rank, parse_exposition, parse_prometheus_vector, percent_encode, RankMetrics,
};
use crate::error::{Error, Result};

/// Default limit on one response body: 4 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// A small plain-HTTP client for scrapes and Prometheus queries.
#[derive(Clone)]
pub struct Scraper {
    client: Client<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
    max_body: usize,
}

/// Read `body` to its end, failing as soon as more than `limit` bytes came.
async fn read_limited<B>(mut body: B, limit: usize, target: &str) -> Result<Vec<u8>>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let too_large = || Error::ScrapeTooLarge {
        target: target.to_string(),
        limit,
    };
    if body.size_hint().lower() > limit as u64 {
        return Err(too_large());
    }
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Error::Scrape {
            target: target.to_string(),
            message: e.to_string(),
        })?;
        if let Ok(data) = frame.into_data() {
            if out.len().saturating_add(data.len()) > limit {
                return Err(too_large());
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

impl Scraper {
    /// A client whose every request gives up after `timeout` or once its
    /// body passes [`DEFAULT_MAX_BODY_BYTES`].
    pub fn new(timeout: Duration) -> Scraper {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        Scraper {
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout,
            max_body: DEFAULT_MAX_BODY_BYTES,
        }
    }

    /// The same client with another body-size limit, in bytes.
    pub fn with_max_body(self, max_body: usize) -> Scraper {
        Scraper { max_body, ..self }
    }

    /// GET `url` and return the body as text (2xx only); fails with
    /// [`Error::ScrapeTooLarge`] once the body passes the size limit.
    pub async fn get_text(&self, url: &str) -> Result<String> {
        let fail = |message: String| Error::Scrape {
            target: url.to_string(),
            message,
        };
        let uri: hyper::Uri = url.parse().map_err(|e| fail(format!("bad URL: {e}")))?;
        let fut = async {
            let resp = self
                .client
                .get(uri)
                .await
                .map_err(|e| fail(e.to_string()))?;
            let status = resp.status();
            if !status.is_success() {
                return Err(fail(format!("HTTP {status}")));
            }
            let body = read_limited(resp.into_body(), self.max_body, url).await?;
            String::from_utf8(body).map_err(|e| fail(e.to_string()))
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
        let text = self.get_text(&url).await?;
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
        let text = self.get_text(&url).await?;
        let series = parse_prometheus_vector(&text).map_err(|message| Error::Scrape {
            target: url.clone(),
            message,
        })?;
        Ok(group_by_rank(&series, job, world_size))
    }
}
