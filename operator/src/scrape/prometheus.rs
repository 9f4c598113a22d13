//! The Prometheus HTTP API: the instant-query answer into [`Series`], grouped
//! by pod into ranks, and the query-string encoding.

use std::collections::HashMap;

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

use super::{RankMetrics, Series};
use crate::error::{Error, Result};

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
