//! Where a job's live metrics come from: one Prometheus query, or a scrape
//! of every rank pod of the current gang (the HTTP client is
//! [`crate::scrape::Scraper`]). [`request`] says what to read, from the
//! job and its pods; [`Request::run`] reads it, with nothing borrowed, so
//! it can run in its own task ([`super::collect`]).

use heterotrain_crds::MetricsSource;

use super::Deps;
use crate::config::MetricsSourceMode;
use crate::error::{Error, Result};
use crate::fetch::Observed;
use crate::scrape::{RankMetrics, Scraper};
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

/// What to read for one job.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    /// One instant query to the Prometheus at `url` (`None`: no URL known).
    Prometheus {
        url: Option<String>,
        namespace: String,
        job: String,
        world: usize,
    },
    /// Each rank's pod IP (`None` where the rank has none yet) and port.
    Pods {
        targets: Vec<Option<String>>,
        port: u16,
    },
}

/// What to read for `v`, whose pods are `obs`.
pub fn request(deps: &Deps<'_>, v: &ValidatedJob<'_>, obs: &Observed) -> Request {
    if use_prometheus(deps.config.metrics_source, v) {
        return Request::Prometheus {
            url: v
                .spec()
                .load_balancing
                .prometheus_url
                .clone()
                .or_else(|| deps.config.prometheus_url.clone()),
            namespace: v.namespace.clone(),
            job: v.name.clone(),
            world: v.ranks(),
        };
    }
    let gang = v.gang();
    let targets = (0..v.world_size)
        .map(|r| {
            obs.pods
                .iter()
                .find(|p| p.rank == Some(r) && p.restart == Some(gang) && !p.deleting)
                .and_then(|p| p.pod_ip.clone())
        })
        .collect();
    Request::Pods {
        targets,
        port: v.spec().metrics_port,
    }
}

impl Request {
    /// Each rank's metrics (or why they could not be read), in rank order.
    pub async fn run(self, scraper: &Scraper) -> Vec<Result<RankMetrics>> {
        match self {
            Request::Pods { targets, port } => scraper.scrape_pods(&targets, port).await,
            Request::Prometheus {
                url,
                namespace,
                job,
                world,
            } => {
                let Some(url) = url else {
                    return (0..world)
                        .map(|_| Err(Error::Invalid("no Prometheus URL".into())))
                        .collect();
                };
                match scraper
                    .query_prometheus(&url, &namespace, &job, world)
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
                }
            }
        }
    }
}
