//! Metrics ingestion: read each rank's trainer metrics, either by scraping
//! `http://<podIP>:<metricsPort>/metrics` concurrently, each request bounded
//! in time and in body size ([`client`]), or by one instant query to a
//! Prometheus server's HTTP API ([`prometheus`]). Both end in
//! [`RankMetrics`], built from the metric names in `heterotrain_crds::metrics`;
//! [`exposition`] turns `/metrics` text into [`Series`].

mod client;
mod exposition;
mod prometheus;

pub use client::{PrometheusAuth, Scraper, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_TOTAL_BYTES};
pub use exposition::parse_exposition;
pub use prometheus::{group_by_rank, parse_prometheus_vector, percent_encode};

use std::collections::HashMap;

use heterotrain_crds::bottleneck::PhaseTimes;
use heterotrain_crds::metrics as m;

/// One series: name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub name: String,
    pub labels: HashMap<String, String>,
    pub value: f64,
}

/// The most distinct probe batch sizes a rank's profile may carry: the
/// spec allows 16 (`profiling.probeBatchSizes`); a rank that exports more
/// is broken or hostile, and its profile is dropped rather than fitted
/// (the fit compares every pair of points).
pub const MAX_PROFILE_POINTS: usize = 64;

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

/// A rank's start-up communication figures as exported: what the
/// balancer's exchange model needs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RankLink {
    /// Seconds of a 1 KiB all-reduce among all ranks.
    pub latency_seconds: f64,
    /// Bytes/s of its slowest rank-to-rank link, else the group's
    /// all-reduce bus bandwidth.
    pub bandwidth_bytes_per_second: f64,
    /// Bytes of gradient each step exchanges, when exported.
    pub gradient_bytes: Option<u64>,
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
    /// How far the rank's slow steps' compute runs over its typical one
    /// (`heterotrain_compute_spread_seconds`).
    pub compute_spread_seconds: Option<f64>,
    pub step: Option<u64>,
    pub epoch: Option<u32>,
    /// The step the run ends at.
    pub total_steps: Option<u64>,
    pub plan_generation: Option<u64>,
    pub finished: bool,
    pub profile: Option<RankProfile>,
    /// Seconds so far by phase (`heterotrain_phase_seconds_total`), when
    /// every phase is exported.
    pub phase_seconds_total: Option<PhaseTimes>,
    /// Start-up communication figures (absent alone or before measured).
    pub link: Option<RankLink>,
    /// The share of its CPU quota the rank used between its last two
    /// scrapes (`heterotrain_cpu_quota_used_ratio`); `None` without a quota.
    pub cpu_quota_used: Option<f64>,
    /// Distinct profile points exported when there were more than
    /// [`MAX_PROFILE_POINTS`] (the profile is then `None`).
    pub profile_points_dropped: Option<usize>,
}

fn count(v: f64) -> Option<u64> {
    (v.is_finite() && v >= 0.0 && v <= u64::MAX as f64).then_some(v as u64)
}

/// The trainer's per-phase seconds as [`PhaseTimes`] (forward and backward
/// as compute); `None` unless every phase is there.
fn phase_totals(series: &[Series]) -> Option<PhaseTimes> {
    let phase = |name: &str| {
        series
            .iter()
            .find(|s| {
                s.name == m::PHASE_SECONDS_TOTAL
                    && s.labels.get("phase").map(String::as_str) == Some(name)
                    && s.value.is_finite()
            })
            .map(|s| s.value)
    };
    Some(PhaseTimes {
        data: phase("data")?,
        compute: phase("forward")? + phase("backward")?,
        communication: phase("allreduce")?,
        update: phase("optimizer")?,
    })
}

/// The rank's [`RankLink`]: needs a measured latency and a bandwidth
/// (gauges at 0 are not measured yet).
fn link(series: &[Series]) -> Option<RankLink> {
    let positive = |name: &str| {
        series
            .iter()
            .filter(|s| s.name == name && s.value.is_finite() && s.value > 0.0)
            .map(|s| s.value)
            .reduce(f64::min)
    };
    let bandwidth =
        positive(m::PROFILE_LINK_BANDWIDTH).or_else(|| positive(m::PROFILE_ALLREDUCE_BANDWIDTH))?;
    Some(RankLink {
        latency_seconds: positive(m::PROFILE_ALLREDUCE_LATENCY_SECONDS)?,
        bandwidth_bytes_per_second: bandwidth,
        gradient_bytes: positive(m::GRADIENT_BYTES).and_then(count),
    })
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
        points.dedup_by_key(|p| p.0);
        let profile_points_dropped = (points.len() > MAX_PROFILE_POINTS).then_some(points.len());
        if profile_points_dropped.is_some() {
            points.clear();
        }
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
            compute_spread_seconds: get(m::COMPUTE_SPREAD_SECONDS).filter(|s| *s >= 0.0),
            step: get(m::STEP).and_then(count),
            total_steps: get(m::TOTAL_STEPS).and_then(count).filter(|&t| t > 0),
            epoch: get(m::EPOCH)
                .and_then(count)
                .map(|v| v.min(u64::from(u32::MAX)) as u32),
            plan_generation: get(m::PLAN_GENERATION).and_then(count),
            finished: get(m::FINISHED).is_some_and(|v| v >= 1.0),
            profile,
            phase_seconds_total: phase_totals(series),
            link: link(series),
            cpu_quota_used: get(m::CPU_QUOTA_CORES)
                .filter(|q| *q > 0.0)
                .and(get(m::CPU_QUOTA_USED_RATIO))
                .filter(|u| *u > 0.0),
            profile_points_dropped,
        }
    }
}

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod limit_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tls_tests;
