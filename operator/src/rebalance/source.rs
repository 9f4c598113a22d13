//! Where a job's live metrics come from: one Prometheus query, or a scrape
//! of every rank pod of the current gang (the HTTP client is
//! [`crate::scrape::Scraper`]).

use heterotrain_crds::MetricsSource;

use super::Deps;
use crate::config::MetricsSourceMode;
use crate::error::{Error, Result};
use crate::fetch::Observed;
use crate::scrape::RankMetrics;
use crate::validate::ValidatedJob;

/// Whether the job's metrics are read from Prometheus.
fn use_prometheus(mode: MetricsSourceMode, v: &ValidatedJob) -> bool {
    match mode {
        MetricsSourceMode::Job => {
            v.spec().load_balancing.metrics_source == MetricsSource::Prometheus
        }
        MetricsSourceMode::Pods => false,
        MetricsSourceMode::Prometheus => true,
    }
}

/// Each rank's metrics (or why they could not be read), in rank order.
pub async fn read_metrics(
    deps: &Deps<'_>,
    v: &ValidatedJob<'_>,
    obs: &Observed,
) -> Vec<Result<RankMetrics>> {
    let world = v.ranks();
    if use_prometheus(deps.config.metrics_source, v) {
        let url = v
            .spec()
            .load_balancing
            .prometheus_url
            .clone()
            .or_else(|| deps.config.prometheus_url.clone());
        let Some(url) = url else {
            return (0..world)
                .map(|_| Err(Error::Invalid("no Prometheus URL".into())))
                .collect();
        };
        return match deps
            .scraper
            .query_prometheus(&url, &v.namespace, &v.name, world)
            .await
        {
            Ok(m) => m,
            Err(e) => {
                let msg = e.to_string();
                (0..world)
                    .map(|_| {
                        Err(Error::Scrape {
                            target: url.clone(),
                            message: msg.clone(),
                        })
                    })
                    .collect()
            }
        };
    }
    let gang = v.gang();
    let targets: Vec<Option<String>> = (0..v.world_size)
        .map(|r| {
            obs.pods
                .iter()
                .find(|p| p.rank == Some(r) && p.restart == Some(gang) && !p.deleting)
                .and_then(|p| p.pod_ip.clone())
        })
        .collect();
    deps.scraper
        .scrape_pods(&targets, v.spec().metrics_port)
        .await
}
