//! The trainer's Prometheus metrics (names from `heterotrain_crds::metrics`,
//! the contract with the operator's scraper and the dashboards) and a small
//! `/metrics` HTTP server on its own thread. Process CPU/memory and, on GPUs
//! with an NVML library, GPU gauges are refreshed at each scrape; without a
//! GPU or NVML those series are absent and nothing fails.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use heterotrain_crds::bottleneck::{Bottleneck, PhaseTimes};
use heterotrain_crds::HardwareProfile;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::log::StepTimings;

mod quota;
mod registry;
use registry::{BatchLabels, DeviceLabels, GpuGauges, KindLabels, PhaseLabels, ReasonLabels};

type FloatCounter = Counter<f64, AtomicU64>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric a trainer rank exports.
pub struct TrainerMetrics {
    registry: Registry,
    phase_seconds: Family<PhaseLabels, FloatCounter>,
    /// One-hot: what bounds the step (`heterotrain_bottleneck{kind}`).
    bottleneck: Family<KindLabels, Gauge>,
    /// Smoothed per-step phase times behind `bottleneck`.
    phase_ema: Mutex<Option<PhaseTimes>>,
    step_seconds: Histogram,
    samples: Counter,
    steps: Counter,
    compute_seconds: FloatCounter,
    compute_per_sample: FloatGauge,
    last_step_compute: FloatGauge,
    compute_spread: FloatGauge,
    /// Recent compute seconds behind `compute_spread`.
    spread: Mutex<Spread>,
    local_batch: Gauge,
    plan_generation: Gauge,
    plan_rejected: Family<ReasonLabels, Counter>,
    step: Gauge,
    epoch: Gauge,
    total_steps: Gauge,
    loss: FloatGauge,
    eval_accuracy: FloatGauge,
    eval_loss: FloatGauge,
    finished: Gauge,
    profile_flops: FloatGauge,
    profile_bandwidth: FloatGauge,
    profile_step: Family<BatchLabels, FloatGauge>,
    profile_fixed: FloatGauge,
    profile_per_sample: FloatGauge,
    profile_max_batch: Gauge,
    profile_allreduce_latency: FloatGauge,
    profile_allreduce_bandwidth: FloatGauge,
    profile_link: Family<registry::PeerLabels, FloatGauge>,
    gradient_bytes: Gauge,
    profile_data_read: FloatGauge,
    device_info: Family<DeviceLabels, Gauge>,
    process_cpu: FloatCounter,
    process_rss: Gauge,
    /// Last process CPU seconds read (the counter is advanced by deltas).
    cpu_seen: Mutex<f64>,
    cpu_quota: FloatGauge,
    cpu_quota_used: FloatGauge,
    /// The share of the CPU quota used between refreshes.
    quota_seen: Mutex<QuotaMeter>,
    gpu: Option<GpuGauges>,
    /// Smoothing state of compute seconds per sample.
    ema: Mutex<Option<f64>>,
}

/// The compute seconds of a rank's last steps at one local batch, and how
/// far its slow ones run over its typical one
/// ([`heterotrain_crds::metrics::COMPUTE_SPREAD_SECONDS`]).
#[derive(Clone, Debug, Default)]
pub(crate) struct Spread {
    batch: u32,
    recent: std::collections::VecDeque<f64>,
}

impl Spread {
    /// One step's compute at `batch`: the 90th percentile minus the median
    /// of the window, once it holds enough steps at this batch (a new
    /// batch starts it afresh; a step without samples or a time that is
    /// not finite is left out). The newest steps count once a later one
    /// confirms their level; a new level starts the window afresh (see
    /// [`heterotrain_crds::metrics::COMPUTE_SPREAD_SECONDS`]).
    pub(crate) fn push(&mut self, batch: u32, seconds: f64) -> Option<f64> {
        use heterotrain_crds::metrics::{
            SPREAD_LEVEL_SHIFT, SPREAD_LEVEL_STEPS, SPREAD_MIN_STEPS, SPREAD_WINDOW,
        };
        if batch != self.batch {
            self.batch = batch;
            self.recent.clear();
        }
        if batch == 0 || !seconds.is_finite() || seconds < 0.0 {
            return None;
        }
        // The window, and the newest steps still waiting for confirmation.
        let pending = SPREAD_LEVEL_STEPS - 1;
        if self.recent.len() == SPREAD_WINDOW + pending {
            self.recent.pop_front();
        }
        self.recent.push_back(seconds);
        let n = self.recent.len();
        if n >= 2 * SPREAD_LEVEL_STEPS {
            let split = n - SPREAD_LEVEL_STEPS;
            let older = median(self.recent.range(..split).copied().collect());
            let newest = median(self.recent.range(split..).copied().collect());
            if newest > SPREAD_LEVEL_SHIFT * older || newest * SPREAD_LEVEL_SHIFT < older {
                self.recent.drain(..split);
                return None;
            }
        }
        let confirmed = n.checked_sub(pending)?;
        if confirmed < SPREAD_MIN_STEPS {
            return None;
        }
        let mut v: Vec<f64> = self.recent.range(..confirmed).copied().collect();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Some((at(0.9) - at(0.5)).max(0.0))
    }
}

/// The median of `v` (0 when it is empty).
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

impl TrainerMetrics {
    /// One finished step.
    #[allow(clippy::too_many_arguments)]
    pub fn observe_step(
        &self,
        step: u64,
        epoch: u64,
        local_batch: u32,
        tm: &StepTimings,
        step_seconds: f64,
        loss: f64,
    ) {
        for (phase, s) in [
            ("data", tm.data_seconds),
            ("forward", tm.forward_seconds),
            ("backward", tm.backward_seconds),
            ("allreduce", tm.allreduce_seconds),
            ("optimizer", tm.optimizer_seconds),
        ] {
            if s.is_finite() && s >= 0.0 {
                self.phase_seconds
                    .get_or_create(&PhaseLabels { phase })
                    .inc_by(s);
            }
        }
        self.observe_bottleneck(tm);
        self.step_seconds.observe(step_seconds);
        self.samples.inc_by(u64::from(local_batch));
        self.steps.inc();
        let compute = tm.compute_seconds();
        self.compute_seconds.inc_by(compute.max(0.0));
        self.last_step_compute.set(compute);
        // After a plan change the last figure stands until the new batch
        // has enough steps of its own.
        if let Some(v) = self
            .spread
            .lock()
            .ok()
            .and_then(|mut s| s.push(local_batch, compute))
        {
            self.compute_spread.set(v);
        }
        if local_batch > 0 {
            let per = compute / f64::from(local_batch);
            if let Ok(mut ema) = self.ema.lock() {
                let v = ema.map_or(per, |e| 0.8 * e + 0.2 * per);
                *ema = Some(v);
                self.compute_per_sample.set(v);
            }
        }
        self.local_batch.set(i64::from(local_batch));
        self.step.set(step as i64);
        self.epoch.set(epoch as i64);
        if loss.is_finite() {
            self.loss.set(loss);
        }
    }

    /// Smooth this step's phase times into the running figure and mark
    /// the phase that dominates it (nothing while the rank is left out:
    /// no compute).
    fn observe_bottleneck(&self, tm: &StepTimings) {
        let now = PhaseTimes {
            data: tm.data_seconds,
            compute: tm.forward_seconds + tm.backward_seconds,
            communication: tm.allreduce_seconds,
            update: tm.optimizer_seconds,
        };
        let Ok(mut ema) = self.phase_ema.lock() else {
            return;
        };
        let mix = |e: f64, x: f64| 0.8 * e + 0.2 * x;
        let smoothed = match *ema {
            Some(e) => PhaseTimes {
                data: mix(e.data, now.data),
                compute: mix(e.compute, now.compute),
                communication: mix(e.communication, now.communication),
                update: mix(e.update, now.update),
            },
            None => now,
        };
        if smoothed.dominant().is_none() {
            return;
        }
        *ema = Some(smoothed);
        let top = (smoothed.compute > 0.0)
            .then(|| smoothed.dominant())
            .flatten();
        for b in Bottleneck::PHASES {
            self.bottleneck
                .get_or_create(&KindLabels { kind: b.as_str() })
                .set(i64::from(top == Some(b)));
        }
    }

    /// The plan in use.
    pub fn set_plan(&self, generation: u64, local_batch: u32) {
        self.plan_generation.set(generation as i64);
        self.local_batch.set(i64::from(local_batch));
    }

    /// Where training stands before the first step (after a resume), and
    /// the step it ends at.
    pub fn set_position(&self, step: u64, epoch: u64, total_steps: u64) {
        self.step.set(step as i64);
        self.epoch.set(epoch as i64);
        self.total_steps.set(total_steps as i64);
    }

    /// A refused plan, with a short stable reason.
    pub fn plan_rejected(&self, reason: &str) {
        self.plan_rejected
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn set_eval(&self, accuracy: f64, loss: f64) {
        self.eval_accuracy.set(accuracy);
        self.eval_loss.set(loss);
    }

    pub fn set_finished(&self) {
        self.finished.set(1);
    }

    /// Device info (value 1); called once.
    pub fn set_device(&self, d: &heterotrain_crds::DeviceInfo) {
        self.device_info
            .get_or_create(&DeviceLabels {
                kind: d.kind.to_string(),
                name: d.name.clone(),
                threads: d.threads.to_string(),
                compute_capability: d.compute_capability.clone().unwrap_or_default(),
                driver_version: d.driver_version.clone().unwrap_or_default(),
            })
            .set(1);
    }

    /// Export a finished profile.
    pub fn set_profile(&self, p: &HardwareProfile) {
        self.set_device(&p.device);
        self.profile_flops.set(p.matmul_flops);
        self.profile_bandwidth
            .set(p.memory_bandwidth_bytes_per_second);
        for pt in &p.points {
            self.profile_step
                .get_or_create(&BatchLabels {
                    batch_size: pt.batch_size.to_string(),
                })
                .set(pt.seconds);
        }
        self.profile_fixed.set(p.fixed_seconds);
        self.profile_per_sample.set(p.per_sample_seconds);
        self.profile_max_batch.set(i64::from(p.max_batch_size));
    }

    /// Export the group's all-reduce figures (start-up).
    pub fn set_collective(&self, c: &crate::profile::CommProfile) {
        self.profile_allreduce_latency.set(c.latency_seconds);
        self.profile_allreduce_bandwidth
            .set(c.bus_bandwidth_bytes_per_second);
        for &(peer, bytes_per_second) in &c.links {
            self.profile_link
                .get_or_create(&registry::PeerLabels {
                    peer: peer.to_string(),
                })
                .set(bytes_per_second);
        }
    }

    /// Export the bytes of gradient each step exchanges.
    pub fn set_gradient_bytes(&self, bytes: u64) {
        self.gradient_bytes.set(bytes.min(i64::MAX as u64) as i64);
    }

    /// Export the dataset's load throughput, bytes/s (start-up).
    pub fn set_data_read(&self, bytes_per_second: f64) {
        self.profile_data_read.set(bytes_per_second);
    }

    /// Refresh the process and GPU series (called at each scrape).
    pub fn refresh(&self) {
        let cpu_now = process_cpu_seconds();
        let quota = quota::cpu_quota_cores().unwrap_or(0.0);
        self.cpu_quota.set(quota);
        if let Ok(mut meter) = self.quota_seen.lock() {
            let used = meter.read_at(cpu_now, quota, std::time::Instant::now());
            self.cpu_quota_used.set(used);
        }
        if let Some(cpu) = cpu_now {
            if let Ok(mut seen) = self.cpu_seen.lock() {
                if cpu > *seen {
                    self.process_cpu.inc_by(cpu - *seen);
                    *seen = cpu;
                }
            }
        }
        if let Some(rss) = process_rss_bytes() {
            self.process_rss.set(rss as i64);
        }
        if let Some(g) = &self.gpu {
            let s = g.gpu.sample();
            if let Some(v) = s.utilization_ratio {
                g.utilization.set(v);
            }
            if let Some((used, total)) = s.memory_used_total {
                g.memory_used.set(used as i64);
                g.memory_total.set(total as i64);
            }
            if let Some(v) = s.temperature_celsius {
                g.temperature.set(v);
            }
            if let Some(v) = s.power_watts {
                g.power.set(v);
            }
            if let Some((gen, width)) = s.pcie_link {
                g.pcie_gen.set(i64::from(gen));
                g.pcie_width.set(i64::from(width));
            }
            if let Some((gen, width)) = s.pcie_max_link {
                g.pcie_max_gen.set(i64::from(gen));
                g.pcie_max_width.set(i64::from(width));
            }
            if let Some(v) = s.sm_clock_hertz {
                g.sm_clock.set(v);
            }
        }
    }

    /// The exposition in the Prometheus text format 0.0.4 (what
    /// `promtool check metrics` lints), after a refresh.
    pub fn encode(&self) -> String {
        self.refresh();
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        openmetrics_to_text(&out)
    }
}

pub use heterotrain_crds::metrics::openmetrics_to_text;

pub(crate) mod serve;

pub use quota::QuotaMeter;
use serve::process_cpu_seconds;
pub use serve::{process_rss_bytes, serve};

#[cfg(test)]
mod tests;
