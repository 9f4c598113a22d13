//! Prometheus/OpenMetrics text exposition (a rank's `/metrics` body) into
//! [`Series`]; histograms and summaries are skipped.

use super::Series;

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
