//! The hardware profile (see docs/design.md): device facts, matmul FLOP/s,
//! memory bandwidth, forward+backward seconds of the configured model at the
//! probe batch sizes with the fitted t(b) = a + c·b, and the largest local
//! batch that fits. Printed by `heterotrain-trainer profile`, exported as
//! gauges at `train` start.

use std::time::Instant;

use heterotrain_crds::{DeviceInfo, DeviceKind, HardwareProfile, ProfilePoint};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::cli::{ModelArgs, TrainerArgs};
use crate::data::Dataset;
use crate::error::Result;
use crate::models;
use crate::nvml::Gpu;

/// Headroom kept free when sizing the largest batch (fraction of memory).
const MEMORY_USE: f64 = 0.8;
/// Largest batch ever reported.
const MAX_BATCH_CAP: u64 = 1 << 20;

fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// Repeat `f` (after one warm-up call) until `budget` seconds pass, at
/// least `min_reps` times; returns (repetitions, seconds).
fn timed(device: Device, budget: f64, min_reps: u32, mut f: impl FnMut()) -> (u32, f64) {
    f();
    sync(device);
    let start = Instant::now();
    let mut reps = 0u32;
    loop {
        f();
        reps += 1;
        sync(device);
        let el = start.elapsed().as_secs_f64();
        if reps >= min_reps && el >= budget {
            return (reps, el);
        }
        if reps >= 10_000 {
            return (reps, el);
        }
    }
}

/// Dense float32 matmul throughput, FLOP/s.
pub fn matmul_flops(device: Device, budget: f64) -> f64 {
    let n: i64 = if device.is_cuda() { 4096 } else { 256 };
    let _g = tch::no_grad_guard();
    let a = Tensor::randn([n, n], (Kind::Float, device));
    let b = Tensor::randn([n, n], (Kind::Float, device));
    let (reps, secs) = timed(device, budget, 3, || {
        let _ = a.matmul(&b);
    });
    2.0 * (n as f64).powi(3) * f64::from(reps) / secs.max(1e-9)
}

/// Memory copy bandwidth (read + write), bytes/s.
pub fn memory_bandwidth(device: Device, budget: f64) -> f64 {
    let elems: i64 = if device.is_cuda() { 64 << 20 } else { 8 << 20 };
    let _g = tch::no_grad_guard();
    let src = Tensor::ones([elems], (Kind::Float, device));
    let mut dst = Tensor::zeros([elems], (Kind::Float, device));
    let (reps, secs) = timed(device, budget, 3, || {
        dst.copy_(&src);
    });
    2.0 * 4.0 * elems as f64 * f64::from(reps) / secs.max(1e-9)
}

/// Bytes allocated on the C heap right now (glibc: libtorch's CPU
/// allocator sits on malloc), falling back to the resident set size.
fn heap_in_use() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let mi = unsafe { libc::mallinfo2() };
        let used = (mi.uordblks as u64).saturating_add(mi.hblkhd as u64);
        if used > 0 {
            return used;
        }
    }
    crate::metrics::serve::process_rss_bytes().unwrap_or(0)
}

/// `MemAvailable` from /proc/meminfo, bounded by a cgroup memory limit.
fn available_ram() -> u64 {
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(4 << 30, |kib| kib * 1024);
    let limit = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .filter_map(|t| t.trim().parse::<u64>().ok())
    .min()
    .unwrap_or(u64::MAX);
    let used = crate::metrics::serve::process_rss_bytes().unwrap_or(0);
    mem.min(limit.saturating_sub(used))
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Static facts about `device` (`gpu`: its NVML handle, if any).
pub fn device_info(device: Device, gpu: Option<&Gpu>) -> DeviceInfo {
    match device {
        Device::Cuda(i) => {
            let info = gpu.map(Gpu::info).unwrap_or_default();
            DeviceInfo {
                kind: DeviceKind::Cuda,
                name: info.name.unwrap_or_else(|| format!("cuda:{i}")),
                threads: tch::get_num_threads().max(1) as u32,
                memory_bytes: info.memory_total.unwrap_or(0),
                compute_capability: info.compute_capability,
                driver_version: info.driver_version,
            }
        }
        _ => DeviceInfo {
            kind: DeviceKind::Cpu,
            name: cpu_model(),
            threads: tch::get_num_threads().max(1) as u32,
            memory_bytes: available_ram(),
            compute_capability: None,
            driver_version: None,
        },
    }
}

/// A label for the model and its size knobs (a TorchScript model: its file).
pub fn model_label(cfg: &ModelArgs) -> String {
    let name = serde_json::to_value(cfg.arch)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    if let Some(f) = &cfg.model_file {
        return format!("{name}(file={})", f.display());
    }
    format!(
        "{name}(hidden={},layers={},heads={},context={},vocab={})",
        cfg.hidden, cfg.layers, cfg.heads, cfg.context, cfg.vocab
    )
}

/// Fit t(b) = a + c·b by least squares (the balancer's fit), falling back
/// to a pure per-sample cost when the fit is degenerate.
fn fit(points: &[(u32, f64)]) -> (f64, f64) {
    if let Some(m) = heterotrain_balancer::fit_profile(points) {
        if m.per_sample_seconds > 0.0 {
            return (m.fixed_seconds, m.per_sample_seconds);
        }
    }
    let c = points
        .iter()
        .map(|(b, t)| t / f64::from((*b).max(1)))
        .fold(0.0, f64::max);
    (0.0, c.max(1e-9))
}

/// The batch sizes to probe: `requested`, sorted and deduplicated, without
/// those above `limit` (a training run's global batch: no rank trains more
/// samples a step); `limit` itself when none is left.
pub fn probe_sizes(requested: &[u32], limit: Option<u32>) -> Vec<u32> {
    let mut sizes: Vec<u32> = requested.to_vec();
    sizes.sort_unstable();
    sizes.dedup();
    if let Some(limit) = limit.filter(|&l| l > 0) {
        sizes.retain(|&b| b <= limit);
        if sizes.is_empty() {
            sizes.push(limit);
        }
    }
    sizes
}

/// Measure the profile of `cfg`'s model on `device` with data like `data`,
/// at the probe sizes up to `limit` ([`probe_sizes`]).
pub fn measure(
    cfg: &TrainerArgs,
    device: Device,
    data: &Dataset,
    gpu: Option<&Gpu>,
    limit: Option<u32>,
) -> Result<HardwareProfile> {
    let budget = cfg.obs.profile_seconds;
    let sizes = probe_sizes(&cfg.obs.profile_batch_sizes, limit);
    let info = device_info(device, gpu);
    let matmul = matmul_flops(device, budget * 0.1);
    let bandwidth = memory_bandwidth(device, budget * 0.1);

    // A private copy of the model: the run's weights stay untouched.
    let vs = VarStore::new(device);
    let model = models::build(
        &vs.root(),
        &cfg.model,
        &data.shape,
        &crate::c10d::GroupSlot::default(),
    )?;
    let params: Vec<Tensor> = vs.trainable_variables();
    let param_bytes: u64 = params
        .iter()
        .map(|p| p.numel() as u64 * p.kind().elt_size_in_bytes() as u64)
        .sum();
    let n = data.train_len().max(1);
    let per_probe = budget * 0.8 / sizes.len().max(1) as f64;
    let mut points = Vec::with_capacity(sizes.len());
    // Memory in use right after the forward pass (activations held for the
    // backward): RSS on CPU, NVML's device memory on GPUs.
    let mut mem_at: Vec<(u32, u64)> = Vec::new();
    for &b in &sizes {
        let idx: Vec<usize> = (0..b as usize).map(|i| i % n).collect();
        let (x, y) = data.train_batch(&idx, device);
        let mut peak = 0u64;
        let mut failed = None;
        let (reps, secs) = timed(device, per_probe, 2, || {
            if failed.is_some() {
                return;
            }
            for p in &params {
                let mut p = p.shallow_clone();
                p.zero_grad();
            }
            let logits = match model.forward(&x, true) {
                Ok(l) => l,
                Err(e) => {
                    failed = Some(e);
                    return;
                }
            };
            let loss = model.loss(&logits, &y);
            let now = match (device, gpu) {
                (Device::Cuda(_), Some(g)) => g.memory_used().unwrap_or(0),
                (Device::Cuda(_), None) => 0,
                _ => heap_in_use(),
            };
            peak = peak.max(now);
            loss.backward();
        });
        if let Some(e) = failed {
            return Err(e);
        }
        points.push((b, secs / f64::from(reps.max(1))));
        mem_at.push((b, peak));
    }
    let (a, c) = fit(&points);
    let max_batch = max_batch(device, &info, &mem_at, param_bytes, &sizes);
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Ok(HardwareProfile {
        rank: cfg.dist.rank as u32,
        hostname,
        device: info,
        matmul_flops: matmul,
        memory_bandwidth_bytes_per_second: bandwidth,
        model: model_label(&cfg.model),
        points: points
            .iter()
            .map(|&(batch_size, seconds)| ProfilePoint {
                batch_size,
                seconds,
            })
            .collect(),
        fixed_seconds: a,
        per_sample_seconds: c,
        max_batch_size: max_batch,
        ..Default::default()
    })
}

/// Small all-reduces timed for the latency.
const LATENCY_REPS: u32 = 20;
/// Large all-reduces timed for the bandwidth.
const BANDWIDTH_REPS: u32 = 5;
/// Elements of the small (1 KiB) and large (4 MiB) all-reduce.
const SMALL: i64 = 256;
const LARGE: i64 = 1 << 20;

/// How fast the ranks exchange gradients, measured once at start-up on the
/// whole group (every rank runs the same fixed sequence, so it is safe for
/// collectives): the mean seconds of a 1 KiB all-reduce (latency) and the
/// bus bandwidth of a 4 MiB one (algorithm bandwidth × 2(n−1)/n, bytes/s).
///
/// Rank to rank, where cheap (at most [`ALL_PAIRS_UP_TO`] ranks: every
/// pair; above, each rank and its ring neighbours only): in round `s` every
/// rank sends 4 MiB to rank `r + s` while it receives 4 MiB from `r − s`
/// (mod n); `links` holds, per peer a rank received from, the bytes/s of
/// that round as this rank saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct CommProfile {
    pub latency_seconds: f64,
    pub bus_bandwidth_bytes_per_second: f64,
    /// `(peer, bytes/s)`, by peer.
    pub links: Vec<(usize, f64)>,
}

impl CommProfile {
    /// The slowest rank-to-rank link this rank measured, bytes/s.
    pub fn slowest_link(&self) -> Option<f64> {
        self.links.iter().map(|&(_, b)| b).reduce(f64::min)
    }
}

/// Groups up to this size measure every pair of ranks; larger ones only
/// ring neighbours (n − 1 rounds would cost too much start-up time).
pub const ALL_PAIRS_UP_TO: usize = 8;
/// Timed exchanges per round of the rank-to-rank measurement.
const LINK_REPS: u32 = 3;

/// The shifts `s` of the rank-to-rank rounds in a group of `n`.
pub fn link_shifts(n: usize) -> Vec<usize> {
    match n {
        0 | 1 => Vec::new(),
        2..=ALL_PAIRS_UP_TO => (1..n).collect(),
        _ => vec![1, n - 1],
    }
}

/// Time rank-to-rank exchanges of 4 MiB (see [`CommProfile`]); host
/// tensors, as the network between hosts is what it measures.
fn links(pg: &crate::c10d::ProcessGroup) -> Result<Vec<(usize, f64)>> {
    let (n, r) = (pg.world_size(), pg.rank());
    let mut send = Tensor::zeros([LARGE], (Kind::Float, Device::Cpu));
    let mut recv = Tensor::zeros([LARGE], (Kind::Float, Device::Cpu));
    let mut out = Vec::new();
    for s in link_shifts(n) {
        let (to, from) = ((r + s) % n, (r + n - s) % n);
        let tag = s as i32;
        let mut round = || -> Result<()> {
            let sent = pg.send_async(&mut send, to, tag)?;
            let got = pg.recv_async(&mut recv, from, tag)?;
            sent.wait()?;
            got.wait()
        };
        round()?; // warm-up: the pair's connection
        let start = Instant::now();
        for _ in 0..LINK_REPS {
            round()?;
        }
        let seconds = start.elapsed().as_secs_f64() / f64::from(LINK_REPS);
        out.push((from, (LARGE * 4) as f64 / seconds.max(1e-9)));
    }
    out.sort_by_key(|l| l.0);
    Ok(out)
}

/// Measure [`CommProfile`] on `pg` with tensors on `device`.
pub fn collective(pg: &crate::c10d::ProcessGroup, device: Device) -> Result<CommProfile> {
    let _g = tch::no_grad_guard();
    let mut small = Tensor::zeros([SMALL], (Kind::Float, device));
    let mut large = Tensor::zeros([LARGE], (Kind::Float, device));
    let time = |t: &mut Tensor, reps: u32| -> Result<f64> {
        pg.all_reduce_sum(t)?; // warm-up: connections, buffers
        sync(device);
        let start = Instant::now();
        for _ in 0..reps {
            pg.all_reduce_sum(t)?;
        }
        sync(device);
        Ok(start.elapsed().as_secs_f64() / f64::from(reps))
    };
    let latency = time(&mut small, LATENCY_REPS)?;
    let large_seconds = time(&mut large, BANDWIDTH_REPS)?;
    let n = pg.world_size() as f64;
    let bytes = (LARGE * 4) as f64;
    Ok(CommProfile {
        latency_seconds: latency,
        bus_bandwidth_bytes_per_second: bytes / large_seconds.max(1e-9) * 2.0 * (n - 1.0) / n,
        links: links(pg)?,
    })
}

/// Largest local batch that fits: memory per sample from the growth of
/// memory in use between the smallest and largest probe, against the
/// available memory with headroom; never below the largest probe (it ran).
fn max_batch(
    device: Device,
    info: &DeviceInfo,
    mem_at: &[(u32, u64)],
    param_bytes: u64,
    sizes: &[u32],
) -> u32 {
    let largest = sizes.iter().copied().max().unwrap_or(1);
    let (Some(&(b0, m0)), Some(&(b1, m1))) = (mem_at.first(), mem_at.last()) else {
        return largest;
    };
    if m1 == 0 {
        // A GPU without NVML: nothing to measure against.
        return largest;
    }
    // At least the optimizer's copies of the weights must stay free.
    let per_sample = if b1 > b0 && m1 > m0 {
        (m1 - m0) as f64 / f64::from(b1 - b0)
    } else {
        // Growth hidden by the allocator: assume the whole use is per sample.
        m1 as f64 / f64::from(b1.max(1)) * 0.25
    }
    .max(1024.0);
    let free = match device {
        Device::Cuda(_) => (info.memory_bytes as f64 * MEMORY_USE - m1 as f64).max(0.0),
        _ => (info.memory_bytes as f64 * MEMORY_USE - 2.0 * param_bytes as f64).max(0.0),
    };
    let extra = (free / per_sample) as u64;
    let fit = (u64::from(b1) + extra).min(MAX_BATCH_CAP);
    (fit as u32).max(largest)
}

#[cfg(test)]
mod tests {
    use super::{link_shifts, probe_sizes, ALL_PAIRS_UP_TO};

    #[test]
    fn probes_above_the_global_batch_are_left_out() {
        assert_eq!(probe_sizes(&[32, 8, 16, 8], None), [8, 16, 32]);
        assert_eq!(probe_sizes(&[8, 16, 32], Some(16)), [8, 16]);
        // A size no rank can train (4e9 samples) is not allocated.
        assert_eq!(probe_sizes(&[8, 4_000_000_000], Some(64)), [8]);
        // None left: the global batch itself.
        assert_eq!(probe_sizes(&[64, 128], Some(12)), [12]);
        assert_eq!(probe_sizes(&[64], Some(0)), [64]);
    }

    #[test]
    fn small_groups_measure_every_pair_large_ones_their_ring_neighbours() {
        assert!(link_shifts(1).is_empty());
        assert_eq!(link_shifts(2), [1]);
        // Round s pairs r with r + s and r − s: shifts 1..n cover every
        // ordered pair once.
        let n = ALL_PAIRS_UP_TO;
        let mut seen = std::collections::BTreeSet::new();
        for s in link_shifts(n) {
            for r in 0..n {
                assert!(seen.insert((r, (r + n - s) % n)), "pair measured twice");
            }
        }
        assert_eq!(seen.len(), n * (n - 1));
        assert_eq!(link_shifts(n + 4), [1, n + 3]);
    }
}
