//! Names of the trainer's Prometheus metrics (docs/design.md "Contracts"): the
//! contract between the trainer that exports them, the operator that reads
//! them and the Grafana dashboards. All in base units; counters end in `_total`.

/// Trainer metrics port.
pub const DEFAULT_METRICS_PORT: u16 = 9400;

/// Counter, label `phase` ∈ [`PHASES`]: seconds spent per training phase.
pub const PHASE_SECONDS_TOTAL: &str = "heterotrain_phase_seconds_total";
/// The phases of one step.
pub const PHASES: [&str; 5] = ["data", "forward", "backward", "allreduce", "optimizer"];
/// Histogram: wall-clock seconds per training step.
pub const STEP_SECONDS: &str = "heterotrain_step_seconds";
/// Counter: samples this rank trained on.
pub const SAMPLES_TOTAL: &str = "heterotrain_samples_total";
/// Counter: optimizer steps taken.
pub const STEPS_TOTAL: &str = "heterotrain_steps_total";
/// Counter: compute seconds (data+forward+backward+optimizer, no all-reduce wait).
pub const COMPUTE_SECONDS_TOTAL: &str = "heterotrain_compute_seconds_total";
/// Gauge: smoothed compute seconds per sample on this rank.
pub const COMPUTE_SECONDS_PER_SAMPLE: &str = "heterotrain_compute_seconds_per_sample";
/// Gauge: compute seconds of the last step.
pub const LAST_STEP_COMPUTE_SECONDS: &str = "heterotrain_last_step_compute_seconds";
/// Gauge: how far this rank's slow steps run over its typical one: the
/// 90th percentile minus the median of the compute seconds of its last
/// [`SPREAD_WINDOW`] steps at its current local batch (0 until its first
/// [`SPREAD_MIN_STEPS`] steps at one batch; after a plan change the last
/// figure stands until the new batch has as many). A synchronous step waits for the
/// slowest rank *that step*, so a rank whose compute jumps (a CPU quota's
/// next period, a shared device) holds the others up more often than its
/// mean shows; the live policies plan with it.
///
/// The figure is jitter around one level, not a change of level: the
/// newest [`SPREAD_LEVEL_STEPS`] − 1 steps enter it only once the step
/// after them confirms they are not a new level, and when the median of
/// the newest [`SPREAD_LEVEL_STEPS`] steps is more than
/// [`SPREAD_LEVEL_SHIFT`]× away from the median of the older ones (the
/// device was throttled, or freed), the older steps are dropped and the
/// last figure stands until the new level has [`SPREAD_MIN_STEPS`] steps.
/// Without this a slowdown's first steps read as a tail as long as the
/// slowdown itself.
pub const COMPUTE_SPREAD_SECONDS: &str = "heterotrain_compute_spread_seconds";
/// Steps behind [`COMPUTE_SPREAD_SECONDS`].
pub const SPREAD_WINDOW: usize = 32;
/// Steps at one batch (and one level) before [`COMPUTE_SPREAD_SECONDS`] is reported.
pub const SPREAD_MIN_STEPS: usize = 8;
/// Newest steps whose median is compared with the older ones' to find a
/// new level of compute (see [`COMPUTE_SPREAD_SECONDS`]).
pub const SPREAD_LEVEL_STEPS: usize = 4;
/// How far (a factor, either way) the newest steps' median must be from
/// the older ones' to count as a new level. Above a CPU quota's jitter
/// as a median of four steps sees it: on the 4-node bench's quotas a
/// 0.15-core rank's compute ranged 3.4× (15 to 52 ms) from its 10th to its
/// 90th percentile, but the median of four steps moves far less than the
/// steps themselves.
pub const SPREAD_LEVEL_SHIFT: f64 = 2.0;
/// Gauge: current local batch size.
pub const LOCAL_BATCH_SIZE: &str = "heterotrain_local_batch_size";
/// Gauge: generation of the plan in use.
pub const PLAN_GENERATION: &str = "heterotrain_plan_generation";
/// Counter, label `reason`: plans refused as invalid.
pub const PLAN_REJECTED_TOTAL: &str = "heterotrain_plan_rejected_total";
/// Gauge: current step (global, same on every rank).
pub const STEP: &str = "heterotrain_step";
/// Gauge: current epoch.
pub const EPOCH: &str = "heterotrain_epoch";
/// Gauge: steps the run trains in all (its last step).
pub const TOTAL_STEPS: &str = "heterotrain_total_steps";
/// Gauge: training loss of the last step (this rank's slice).
pub const LOSS: &str = "heterotrain_loss";
/// Gauge: held-out accuracy at the last evaluation (0..1).
pub const EVAL_ACCURACY_RATIO: &str = "heterotrain_eval_accuracy_ratio";
/// Gauge: held-out loss at the last evaluation.
pub const EVAL_LOSS: &str = "heterotrain_eval_loss";
/// Gauge: 1 when training finished on this rank.
pub const FINISHED: &str = "heterotrain_finished";

/// Gauge: matmul throughput measured by the profile, FLOP/s.
pub const PROFILE_MATMUL_FLOPS: &str = "heterotrain_profile_matmul_flops";
/// Gauge: memory bandwidth measured by the profile, bytes/s.
pub const PROFILE_MEMORY_BANDWIDTH: &str = "heterotrain_profile_memory_bandwidth_bytes_per_second";
/// Gauge, label `batch_size`: forward+backward seconds at a probe batch size.
pub const PROFILE_STEP_SECONDS: &str = "heterotrain_profile_step_seconds";
/// Gauge: fitted fixed cost a of t(b) = a + c·b.
pub const PROFILE_FIXED_SECONDS: &str = "heterotrain_profile_fixed_seconds";
/// Gauge: fitted per-sample cost c of t(b) = a + c·b.
pub const PROFILE_PER_SAMPLE_SECONDS: &str = "heterotrain_profile_per_sample_seconds";
/// Gauge: largest local batch that fits in memory.
pub const PROFILE_MAX_BATCH_SIZE: &str = "heterotrain_profile_max_batch_size";
/// Gauge: seconds of one small (1 KiB) all-reduce among all ranks, measured
/// at start-up (absent for a single rank).
pub const PROFILE_ALLREDUCE_LATENCY_SECONDS: &str = "heterotrain_profile_allreduce_latency_seconds";
/// Gauge: bus bandwidth of a 4 MiB all-reduce among all ranks at start-up,
/// bytes/s (the algorithm bandwidth × 2(n−1)/n, as NCCL's tests report it).
pub const PROFILE_ALLREDUCE_BANDWIDTH: &str =
    "heterotrain_profile_allreduce_bus_bandwidth_bytes_per_second";
/// Gauge, label `peer`: bytes/s of receiving 4 MiB from rank `peer` while
/// every rank exchanges with its peer at the same ring shift, at start-up
/// (every pair up to 8 ranks, ring neighbours above; absent alone).
pub const PROFILE_LINK_BANDWIDTH: &str = "heterotrain_profile_link_bandwidth_bytes_per_second";
/// Gauge: bytes of gradient each step exchanges (the trainable parameters).
pub const GRADIENT_BYTES: &str = "heterotrain_gradient_bytes";
/// Gauge: bytes of the dataset's files per second of loading them (read and
/// decode) at start-up; absent for synthetic data.
pub const PROFILE_DATA_READ_BANDWIDTH: &str = "heterotrain_profile_data_read_bytes_per_second";
/// Gauge: the CPU cores this rank's cgroup quota allows (cgroup v2
/// `cpu.max`, v1 `cpu.cfs_quota_us` over `cpu.cfs_period_us`; the smallest
/// along its cgroup path); 0 when unlimited or unreadable.
pub const CPU_QUOTA_CORES: &str = "heterotrain_cpu_quota_cores";
/// Gauge: the CPU time the rank's process used between its last two
/// scrapes over what its quota allowed in that time (1: the whole quota
/// spent, so the rank cannot run faster whatever it waits for); 0 without
/// a quota or before the second scrape.
pub const CPU_QUOTA_USED_RATIO: &str = "heterotrain_cpu_quota_used_ratio";
/// Gauges from NVML: the GPU's PCIe link now and at most (generation, lanes).
pub const GPU_PCIE_LINK_GENERATION: &str = "heterotrain_gpu_pcie_link_generation";
pub const GPU_PCIE_LINK_WIDTH: &str = "heterotrain_gpu_pcie_link_width";
pub const GPU_PCIE_MAX_LINK_GENERATION: &str = "heterotrain_gpu_pcie_max_link_generation";
pub const GPU_PCIE_MAX_LINK_WIDTH: &str = "heterotrain_gpu_pcie_max_link_width";
/// Info gauge (value 1), labels `kind`, `name`: the device.
pub const DEVICE_INFO: &str = "heterotrain_device_info";

/// GPU gauges from NVML (absent without a GPU).
pub const GPU_UTILIZATION_RATIO: &str = "heterotrain_gpu_utilization_ratio";
pub const GPU_MEMORY_USED_BYTES: &str = "heterotrain_gpu_memory_used_bytes";
pub const GPU_MEMORY_TOTAL_BYTES: &str = "heterotrain_gpu_memory_total_bytes";
pub const GPU_TEMPERATURE_CELSIUS: &str = "heterotrain_gpu_temperature_celsius";
pub const GPU_POWER_WATTS: &str = "heterotrain_gpu_power_watts";
pub const GPU_SM_CLOCK_HERTZ: &str = "heterotrain_gpu_sm_clock_hertz";

/// Turn prometheus-client's OpenMetrics text into the classic text format:
/// counters' HELP/TYPE name gets its `_total` (as the samples have), and
/// the OpenMetrics-only `# UNIT` / `# EOF` lines go.
pub fn openmetrics_to_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(&l),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::openmetrics_to_text;

    #[test]
    fn counters_get_total_in_help_and_type_and_eof_goes() {
        let om = "# HELP x_seconds Time.\n# TYPE x_seconds counter\n# UNIT x_seconds seconds\nx_seconds_total 1.5\n# TYPE g gauge\ng 2\n# EOF\n";
        let text = openmetrics_to_text(om);
        assert_eq!(
            text,
            "# HELP x_seconds_total Time.\n# TYPE x_seconds_total counter\nx_seconds_total 1.5\n# TYPE g gauge\ng 2\n"
        );
    }
}
