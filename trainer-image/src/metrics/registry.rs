//! Building the registry: every series the trainer exports, registered
//! under its contract name with its help text.

use std::sync::Mutex;

use heterotrain_crds::bottleneck::Bottleneck;
use heterotrain_crds::metrics as m;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::{FloatCounter, FloatGauge, TrainerMetrics};
use crate::nvml::Gpu;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PhaseLabels {
    pub(super) phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabels {
    pub(super) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabels {
    pub(super) reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct BatchLabels {
    pub(super) batch_size: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PeerLabels {
    pub(super) peer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DeviceLabels {
    pub(super) kind: String,
    pub(super) name: String,
    pub(super) threads: String,
    pub(super) compute_capability: String,
    pub(super) driver_version: String,
}

/// GPU gauges, registered only when NVML answers for our device.
pub(super) struct GpuGauges {
    pub(super) gpu: Gpu,
    pub(super) utilization: FloatGauge,
    pub(super) memory_used: Gauge,
    pub(super) memory_total: Gauge,
    pub(super) temperature: FloatGauge,
    pub(super) power: FloatGauge,
    pub(super) sm_clock: FloatGauge,
    pub(super) pcie_gen: Gauge,
    pub(super) pcie_width: Gauge,
    pub(super) pcie_max_gen: Gauge,
    pub(super) pcie_max_width: Gauge,
}

/// Strip the `_total` suffix prometheus-client appends to counters itself.
pub(super) fn counter_name(full: &str) -> &str {
    full.strip_suffix("_total").unwrap_or(full)
}

impl TrainerMetrics {
    /// Build the registry. `gpu` is this rank's GPU (None on CPU ranks or
    /// without NVML): its gauges exist only then.
    pub fn new(gpu: Option<Gpu>) -> TrainerMetrics {
        let mut r = Registry::default();
        let phase_seconds = Family::<PhaseLabels, FloatCounter>::default();
        r.register(
            counter_name(m::PHASE_SECONDS_TOTAL),
            "Seconds spent per training phase (all-reduce = waiting for the other ranks)",
            phase_seconds.clone(),
        );
        for phase in m::PHASES {
            // Present from the start, so rates exist before the first step.
            let _ = phase_seconds.get_or_create(&PhaseLabels { phase });
        }
        let bottleneck = Family::<KindLabels, Gauge>::default();
        r.register(
            heterotrain_crds::bottleneck::METRIC,
            "1 for what bounds this rank's step (smoothed phase times): data, compute, communication or update; 0 for the others",
            bottleneck.clone(),
        );
        for b in Bottleneck::PHASES {
            let _ = bottleneck.get_or_create(&KindLabels { kind: b.as_str() });
        }
        let step_seconds = Histogram::new([
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
        ]);
        r.register(
            m::STEP_SECONDS,
            "Wall-clock seconds per training step",
            step_seconds.clone(),
        );
        let samples = Counter::default();
        r.register(
            counter_name(m::SAMPLES_TOTAL),
            "Samples this rank trained on",
            samples.clone(),
        );
        let steps = Counter::default();
        r.register(
            counter_name(m::STEPS_TOTAL),
            "Optimizer steps taken",
            steps.clone(),
        );
        let compute_seconds = FloatCounter::default();
        r.register(
            counter_name(m::COMPUTE_SECONDS_TOTAL),
            "Compute seconds (data, forward, backward, optimizer; no all-reduce wait)",
            compute_seconds.clone(),
        );
        let g = |r: &mut Registry, name: &str, help: &str| {
            let x = FloatGauge::default();
            r.register(name, help, x.clone());
            x
        };
        let gi = |r: &mut Registry, name: &str, help: &str| {
            let x = Gauge::default();
            r.register(name, help, x.clone());
            x
        };
        let compute_per_sample = g(
            &mut r,
            m::COMPUTE_SECONDS_PER_SAMPLE,
            "Smoothed compute seconds per sample on this rank",
        );
        let last_step_compute = g(
            &mut r,
            m::LAST_STEP_COMPUTE_SECONDS,
            "Compute seconds of the last step",
        );
        let compute_spread = g(
            &mut r,
            m::COMPUTE_SPREAD_SECONDS,
            "90th percentile minus median of the compute seconds of this rank's recent steps at its current local batch",
        );
        let local_batch = gi(&mut r, m::LOCAL_BATCH_SIZE, "Current local batch size");
        let plan_generation = gi(&mut r, m::PLAN_GENERATION, "Generation of the plan in use");
        let plan_rejected = Family::<ReasonLabels, Counter>::default();
        r.register(
            counter_name(m::PLAN_REJECTED_TOTAL),
            "Proposed plans refused as invalid, by reason",
            plan_rejected.clone(),
        );
        let step = gi(&mut r, m::STEP, "Current global step");
        let epoch = gi(&mut r, m::EPOCH, "Current epoch");
        let total_steps = gi(&mut r, m::TOTAL_STEPS, "Steps the run trains in all");
        let loss = g(
            &mut r,
            m::LOSS,
            "Training loss of the last step (this rank's slice)",
        );
        let eval_accuracy = g(
            &mut r,
            m::EVAL_ACCURACY_RATIO,
            "Held-out accuracy at the last evaluation",
        );
        let eval_loss = g(&mut r, m::EVAL_LOSS, "Held-out loss at the last evaluation");
        let finished = gi(&mut r, m::FINISHED, "1 when training finished on this rank");
        let profile_flops = g(
            &mut r,
            m::PROFILE_MATMUL_FLOPS,
            "Matmul throughput measured by the profile, FLOP/s",
        );
        let profile_bandwidth = g(
            &mut r,
            m::PROFILE_MEMORY_BANDWIDTH,
            "Memory copy bandwidth measured by the profile, bytes/s",
        );
        let profile_step = Family::<BatchLabels, FloatGauge>::default();
        r.register(
            m::PROFILE_STEP_SECONDS,
            "Forward+backward seconds at a probe batch size",
            profile_step.clone(),
        );
        let profile_fixed = g(
            &mut r,
            m::PROFILE_FIXED_SECONDS,
            "Fitted fixed cost a of t(b) = a + c*b, seconds",
        );
        let profile_per_sample = g(
            &mut r,
            m::PROFILE_PER_SAMPLE_SECONDS,
            "Fitted per-sample cost c of t(b) = a + c*b, seconds",
        );
        let profile_max_batch = gi(
            &mut r,
            m::PROFILE_MAX_BATCH_SIZE,
            "Largest local batch that fits in memory",
        );
        let profile_allreduce_latency = g(
            &mut r,
            m::PROFILE_ALLREDUCE_LATENCY_SECONDS,
            "Seconds of a 1 KiB all-reduce among all ranks at start-up (0: not measured)",
        );
        let profile_allreduce_bandwidth = g(
            &mut r,
            m::PROFILE_ALLREDUCE_BANDWIDTH,
            "Bus bandwidth of a 4 MiB all-reduce among all ranks at start-up, bytes/s (0: not measured)",
        );
        let profile_link = Family::<PeerLabels, FloatGauge>::default();
        r.register(
            m::PROFILE_LINK_BANDWIDTH,
            "Bytes/s of receiving 4 MiB from rank `peer` at start-up, every rank exchanging with its peer at the same ring shift",
            profile_link.clone(),
        );
        let gradient_bytes = gi(
            &mut r,
            m::GRADIENT_BYTES,
            "Bytes of gradient each step exchanges (the trainable parameters)",
        );
        let profile_data_read = g(
            &mut r,
            m::PROFILE_DATA_READ_BANDWIDTH,
            "Bytes of the dataset's files loaded (read and decoded) per second at start-up (0: synthetic data)",
        );
        let device_info = Family::<DeviceLabels, Gauge>::default();
        r.register(
            m::DEVICE_INFO,
            "The device this rank trains on (value 1)",
            device_info.clone(),
        );
        let cpu_quota = g(
            &mut r,
            m::CPU_QUOTA_CORES,
            "CPU cores this rank's cgroup quota allows (0: unlimited)",
        );
        let cpu_quota_used = g(
            &mut r,
            m::CPU_QUOTA_USED_RATIO,
            "CPU time used between the last two scrapes over what the quota allowed (0: no quota)",
        );
        let process_cpu = FloatCounter::default();
        r.register(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            process_cpu.clone(),
        );
        let process_rss = gi(
            &mut r,
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
        );
        let gpu = gpu.map(|gpu| GpuGauges {
            gpu,
            utilization: g(
                &mut r,
                m::GPU_UTILIZATION_RATIO,
                "GPU utilisation (NVML), 0..1",
            ),
            memory_used: gi(&mut r, m::GPU_MEMORY_USED_BYTES, "GPU memory used (NVML)"),
            memory_total: gi(&mut r, m::GPU_MEMORY_TOTAL_BYTES, "GPU memory total (NVML)"),
            temperature: g(&mut r, m::GPU_TEMPERATURE_CELSIUS, "GPU temperature (NVML)"),
            power: g(&mut r, m::GPU_POWER_WATTS, "GPU power draw (NVML)"),
            sm_clock: g(&mut r, m::GPU_SM_CLOCK_HERTZ, "GPU SM clock (NVML)"),
            pcie_gen: gi(
                &mut r,
                m::GPU_PCIE_LINK_GENERATION,
                "PCIe link generation now (NVML)",
            ),
            pcie_width: gi(&mut r, m::GPU_PCIE_LINK_WIDTH, "PCIe link lanes now (NVML)"),
            pcie_max_gen: gi(
                &mut r,
                m::GPU_PCIE_MAX_LINK_GENERATION,
                "Highest PCIe link generation of the GPU and its slot (NVML)",
            ),
            pcie_max_width: gi(
                &mut r,
                m::GPU_PCIE_MAX_LINK_WIDTH,
                "Most PCIe link lanes of the GPU and its slot (NVML)",
            ),
        });
        TrainerMetrics {
            registry: r,
            phase_seconds,
            bottleneck,
            phase_ema: Mutex::new(None),
            step_seconds,
            samples,
            steps,
            compute_seconds,
            compute_per_sample,
            last_step_compute,
            compute_spread,
            spread: Mutex::new(super::Spread::default()),
            local_batch,
            plan_generation,
            plan_rejected,
            step,
            total_steps,
            epoch,
            loss,
            eval_accuracy,
            eval_loss,
            finished,
            profile_flops,
            profile_bandwidth,
            profile_step,
            profile_fixed,
            profile_per_sample,
            profile_max_batch,
            profile_allreduce_latency,
            profile_allreduce_bandwidth,
            profile_link,
            gradient_bytes,
            profile_data_read,
            device_info,
            process_cpu,
            process_rss,
            cpu_seen: Mutex::new(0.0),
            cpu_quota,
            cpu_quota_used,
            quota_seen: Mutex::new(super::QuotaMeter::default()),
            gpu,
            ema: Mutex::new(None),
        }
    }
}
