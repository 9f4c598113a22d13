//! Metrics ingestion: read each rank's trainer metrics, either by scraping
//! `http://<podIP>:<metricsPort>/metrics` concurrently with a timeout, or by
//! one instant query to a Prometheus server's HTTP API. Both end in
//! [`RankMetrics`], built from the metric names in `heterotrain_crds::metrics`.

use std::collections::HashMap;
use std::time::Duration;

use heterotrain_crds::metrics as m;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use crate::error::{Error, Result};

/// One series: name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub labels: HashMap<String, String>,
    pub value: f64,
}

/// A rank's start-up profile as exported.
#[derive(Clone, Debug, PartialEq)]
pub struct RankProfile {
    /// `(batch size, seconds)` at each probe batch size.
    pub points: Vec<(u32, f64)>,
    /// Largest local batch that fits.
    pub max_batch: u32,
    /// Fitted fixed and per-sample seconds, when exported.
    pub fixed_seconds: Option<f64>,
    pub per_sample_seconds: Option<f64>,
}

/// What the operator reads from one rank.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankMetrics {
    pub steps_total: Option<f64>,
    pub compute_seconds_total: Option<f64>,
    /// Seconds of exposed communication so far (the `allreduce` phase).
    pub communication_seconds_total: Option<f64>,
    pub samples_total: Option<f64>,
    pub local_batch: Option<u32>,
    pub last_step_compute_seconds: Option<f64>,
    pub step: Option<u64>,
    pub epoch: Option<u32>,
    /// The step the run ends at.
    pub total_steps: Option<u64>,
    pub plan_generation: Option<u64>,
    pub finished: bool,
    pub profile: Option<RankProfile>,
}

fn count(v: f64) -> Option<u64> {
    (v.is_finite() && v >= 0.0 && v <= u64::MAX as f64).then_some(v as u64)
}

impl RankMetrics {
    /// Pick the operator's metrics out of a rank's series.
    pub fn from_series(series: &[Series]) -> RankMetrics {
        let get = |name: &str| {
            series
                .iter()
                .find(|s| s.name == name && s.value.is_finite())
                .map(|s| s.value)
        };
        let mut points: Vec<(u32, f64)> = series
            .iter()
            .filter(|s| s.name == m::PROFILE_STEP_SECONDS && s.value.is_finite() && s.value > 0.0)
            .filter_map(|s| {
                let b = s.labels.get("batch_size")?.parse::<u32>().ok()?;
                Some((b, s.value))
            })
            .collect();
        points.sort_by_key(|p| p.0);
        let max_batch = get(m::PROFILE_MAX_BATCH_SIZE)
            .and_then(count)
            .map(|v| v.min(u64::from(u32::MAX)) as u32);
        let profile = match (points.is_empty(), max_batch) {
            (false, Some(max_batch)) if max_batch > 0 => Some(RankProfile {
                points,
                max_batch,
                fixed_seconds: get(m::PROFILE_FIXED_SECONDS),
                per_sample_seconds: get(m::PROFILE_PER_SAMPLE_SECONDS),
            }),
            _ => None,
        };
        RankMetrics {
            steps_total: get(m::STEPS_TOTAL),
            compute_seconds_total: get(m::COMPUTE_SECONDS_TOTAL),
            communication_seconds_total: series
                .iter()
                .find(|s| {
                    s.name == m::PHASE_SECONDS_TOTAL
                        && s.labels.get("phase").map(String::as_str) == Some("allreduce")
                        && s.value.is_finite()
                })
                .map(|s| s.value),
            samples_total: get(m::SAMPLES_TOTAL),
            local_batch: get(m::LOCAL_BATCH_SIZE)
                .and_then(count)
                .map(|v| v.min(u64::from(u32::MAX)) as u32),
            last_step_compute_seconds: get(m::LAST_STEP_COMPUTE_SECONDS),
            step: get(m::STEP).and_then(count),
            total_steps: get(m::TOTAL_STEPS).and_then(count).filter(|&t| t > 0),
            epoch: get(m::EPOCH)
                .and_then(count)
                .map(|v| v.min(u64::from(u32::MAX)) as u32),
            plan_generation: get(m::PLAN_GENERATION).and_then(count),
            finished: get(m::FINISHED).is_some_and(|v| v >= 1.0),
            profile,
        }
    }
}

/// Parse Prometheus/OpenMetrics text exposition into series.
pub fn parse_exposition(text: &str) -> Result<Vec<Series>, std::io::Error> {
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))?;
    Ok(scrape
        .samples
        .into_iter()
        .filter_map(|s| {
            let value = match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => return None,
            };
            let labels = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            Some(Series {
                name: s.metric,
                labels,
                value,
            })
        })
        .collect())
}

/// A small plain-HTTP client for scrapes and Prometheus queries.
#[derive(Clone)]
pub struct Scraper {
    client: Client<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
}

impl Scraper {
    /// A client whose every request gives up after `timeout`.
    pub fn new(timeout: Duration) -> Scraper {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        Scraper {
            client: Client::builder(TokioExecutor::new()).build(connector),
            timeout,
        }
    }

    /// GET `url` and return the body as text (2xx only).
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
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| fail(e.to_string()))?
                .to_bytes();
            if !status.is_success() {
                return Err(fail(format!("HTTP {status}")));
            }
            String::from_utf8(body.to_vec()).map_err(|e| fail(e.to_string()))
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

/// Group series by their `pod` label (`<job>-<rank>`) into per-rank metrics.
pub fn group_by_rank(series: &[Series], job: &str, world_size: usize) -> Vec<Result<RankMetrics>> {
    let mut per: Vec<Vec<Series>> = vec![Vec::new(); world_size];
    for s in series {
        let rank = s
            .labels
            .get("pod")
            .and_then(|p| p.strip_prefix(job))
            .and_then(|p| p.strip_prefix('-'))
            .and_then(|r| r.parse::<usize>().ok());
        if let Some(r) = rank.filter(|r| *r < world_size) {
            per[r].push(s.clone());
        }
    }
    per.into_iter()
        .enumerate()
        .map(|(r, s)| {
            if s.is_empty() {
                Err(Error::Scrape {
                    target: format!("prometheus, rank {r}"),
                    message: "no series".into(),
                })
            } else {
                Ok(RankMetrics::from_series(&s))
            }
        })
        .collect()
}

/// Parse a Prometheus `/api/v1/query` vector answer into series.
pub fn parse_prometheus_vector(text: &str) -> Result<Vec<Series>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if v.get("status").and_then(|s| s.as_str()) != Some("success") {
        return Err(format!(
            "query failed: {}",
            v.get("error")
                .and_then(|e| e.as_str())
                .unwrap_or("no error text")
        ));
    }
    let result = v
        .pointer("/data/result")
        .and_then(|r| r.as_array())
        .ok_or("answer has no data.result array")?;
    Ok(result
        .iter()
        .filter_map(|item| {
            let metric = item.get("metric")?.as_object()?;
            let value = item
                .get("value")?
                .as_array()?
                .get(1)?
                .as_str()?
                .parse::<f64>()
                .ok()?;
            let labels: HashMap<String, String> = metric
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect();
            Some(Series {
                name: labels.get("__name__")?.clone(),
                labels,
                value,
            })
        })
        .collect())
}

/// RFC 3986's unreserved characters: what a query parameter value keeps as is.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encode a query parameter value (RFC 3986 unreserved kept).
pub fn percent_encode(s: &str) -> String {
    utf8_percent_encode(s, UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP heterotrain_steps Optimizer steps taken.
# TYPE heterotrain_steps counter
heterotrain_steps_total 12
# TYPE heterotrain_compute_seconds counter
heterotrain_compute_seconds_total 3.5
# TYPE heterotrain_local_batch_size gauge
heterotrain_local_batch_size 16
heterotrain_step 12
heterotrain_epoch 1
heterotrain_plan_generation 2
heterotrain_profile_step_seconds{batch_size="16"} 0.2
heterotrain_profile_step_seconds{batch_size="8"} 0.1
heterotrain_profile_max_batch_size 512
heterotrain_step_seconds_bucket{le="0.1"} 3
heterotrain_finished 0
# EOF
"#;

    #[test]
    fn parses_trainer_exposition() {
        let s = parse_exposition(TEXT).expect("parse");
        let r = RankMetrics::from_series(&s);
        assert_eq!(r.steps_total, Some(12.0));
        assert_eq!(r.compute_seconds_total, Some(3.5));
        assert_eq!(r.local_batch, Some(16));
        assert_eq!(r.step, Some(12));
        assert_eq!(r.epoch, Some(1));
        assert_eq!(r.plan_generation, Some(2));
        assert!(!r.finished);
        let p = r.profile.expect("profile");
        assert_eq!(p.points, vec![(8, 0.1), (16, 0.2)]);
        assert_eq!(p.max_batch, 512);
    }

    #[test]
    fn garbage_gives_empty_metrics() {
        let s = parse_exposition("this is not metrics\n{{{").unwrap_or_default();
        assert_eq!(RankMetrics::from_series(&s), RankMetrics::default());
    }

    #[test]
    fn prometheus_answers_group_by_pod() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
          {"metric":{"__name__":"heterotrain_local_batch_size","pod":"j-1","namespace":"n"},"value":[1,"24"]},
          {"metric":{"__name__":"heterotrain_local_batch_size","pod":"j-0","namespace":"n"},"value":[1,"8"]},
          {"metric":{"__name__":"heterotrain_local_batch_size","pod":"other-0"},"value":[1,"99"]}]}}"#;
        let s = parse_prometheus_vector(body).expect("parse");
        let ranks = group_by_rank(&s, "j", 3);
        assert_eq!(ranks[0].as_ref().ok().and_then(|r| r.local_batch), Some(8));
        assert_eq!(ranks[1].as_ref().ok().and_then(|r| r.local_batch), Some(24));
        assert!(ranks[2].is_err());
        assert!(parse_prometheus_vector(r#"{"status":"error","error":"bad"}"#).is_err());
        assert_eq!(percent_encode("a b{=\"}"), "a%20b%7B%3D%22%7D");
    }
}
