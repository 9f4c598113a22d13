//! What a run builds once before its first step: the device, the metrics
//! endpoint, the starting plan, the data, the hardware profile, the model
//! with its parameters in one flat buffer, and the process group.

use std::sync::Arc;
use std::time::{Duration, Instant};

use heterotrain_crds::{BatchPlan, HardwareProfile};
use tch::nn::VarStore;
use tch::{Device, Tensor};

use crate::c10d::{self, GroupSlot, ProcessGroup, RendezvousConfig};
use crate::checkpoint::Fingerprint;
use crate::cli::{Backend, DeviceArg, DistArgs, ObsArgs, TrainerArgs};
use crate::data::{self, Dataset};
use crate::error::{Result, TrainerError};
use crate::metrics::{self, TrainerMetrics};
use crate::models::{self, Model};
use crate::nvml::Gpu;
use crate::plan_source::{FilePlanSource, NoPlanSource, PlanGate, PlanSource};
use crate::plan_watch::ConfigMapPlanSource;
use crate::profile;
use crate::sampler::steps_per_epoch;
use crate::shard::FlatParams;

/// Tensors with their VarStore names.
pub(super) type Named = Vec<(String, Tensor)>;

pub fn pick_device(cfg: &DistArgs) -> Result<Device> {
    match cfg.device {
        DeviceArg::Cpu => Ok(Device::Cpu),
        DeviceArg::Cuda => {
            if !tch::Cuda::is_available() {
                return Err(TrainerError::Config(
                    "--device cuda but no CUDA device is available to libtorch".into(),
                ));
            }
            let n = tch::Cuda::device_count() as usize;
            Ok(Device::Cuda(cfg.local_rank % n.max(1)))
        }
    }
}

pub(super) fn sync_device(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// Set libtorch's thread counts from the config.
pub fn apply_threads(cfg: &DistArgs) {
    if cfg.threads > 0 {
        tch::set_num_threads(cfg.threads as i32);
        tch::set_num_interop_threads(1);
    }
}

/// NVML for a CUDA device (None on CPU or without NVML).
pub fn open_gpu(device: Device) -> Option<Gpu> {
    match device {
        Device::Cuda(i) => Gpu::open(i),
        _ => None,
    }
}

/// Join the group (none for a single process) and pick NCCL when allowed.
pub(super) fn join(dist: &DistArgs, device: Device) -> Result<Option<ProcessGroup>> {
    if dist.world_size == 1 {
        return Ok(None);
    }
    c10d::quiet_c10_logging();
    let mut pg = ProcessGroup::join(&RendezvousConfig {
        master_addr: dist.master_addr.clone(),
        master_port: dist.master_port,
        rank: dist.rank,
        world_size: dist.world_size,
        rendezvous_timeout: Duration::from_secs(dist.rendezvous_timeout_secs),
        collective_timeout: Duration::from_secs(dist.collective_timeout_secs),
        bind_host: dist.bind_addr.clone(),
        iface: dist.gloo_socket_ifname.clone(),
    })?;
    // Agree on NCCL: only when every rank is CUDA and wants it.
    let wants = device.is_cuda() && dist.backend != Backend::Gloo && cfg!(feature = "nccl");
    let mut t = Tensor::from_slice(&[i64::from(wants)]);
    pg.all_reduce_sum(&mut t)?;
    let all = t.int64_value(&[0]) == dist.world_size as i64;
    if all {
        pg.enable_nccl()?;
    } else if dist.backend == Backend::Nccl && dist.rank == 0 {
        eprintln!(
            "warning: --backend nccl needs every rank on CUDA with an nccl build; using Gloo (CUDA tensors staged through host memory)"
        );
    }
    Ok(Some(pg))
}

/// All variables (trainable and buffers) sorted by name, and the trainable ones.
fn named_vars(vs: &VarStore) -> (Named, Named) {
    let mut all: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    let trainable = all
        .iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    (all, trainable)
}

/// Broadcast every tensor from rank 0 (in place).
pub(super) fn broadcast_all(pg: Option<&ProcessGroup>, tensors: &[(String, Tensor)]) -> Result<()> {
    let Some(pg) = pg else { return Ok(()) };
    let _guard = tch::no_grad_guard();
    for (_, t) in tensors {
        let mut t = t.shallow_clone();
        if t.is_contiguous() {
            pg.broadcast(&mut t, 0)?;
        } else {
            let mut c = t.contiguous();
            pg.broadcast(&mut c, 0)?;
            t.copy_(&c);
        }
    }
    Ok(())
}

/// Where plans come from and which are accepted, with the starting plan.
pub(super) struct Plans {
    pub plan: BatchPlan,
    pub source: Box<dyn PlanSource>,
    pub gate: PlanGate,
}

impl Plans {
    /// The starting plan and where later plans come from. The gate learns
    /// whether the start is the built-in equal split.
    fn start(cfg: &TrainerArgs, metrics: &TrainerMetrics) -> Result<Plans> {
        let ws = cfg.dist.world_size;
        let mut gate = PlanGate {
            min_local_batch: cfg.model.min_local_batch(),
            ..PlanGate::default()
        };
        let equal = BatchPlan::equal(0, cfg.optim.batch_size, ws);
        let fixed = |plan, gate| -> Result<Plans> {
            Ok(Plans {
                plan,
                source: Box::new(NoPlanSource),
                gate,
            })
        };
        let Some(path) = &cfg.plan.plan_file else {
            gate.current_is_default = true;
            let Some(name) = cfg
                .plan
                .plan_configmap
                .clone()
                .filter(|_| cfg.dist.rank == 0)
            else {
                return fixed(equal, gate);
            };
            let mut src =
                match ConfigMapPlanSource::start(name.clone(), cfg.plan.namespace.clone(), ws) {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("warning: cannot start the plan watch: {e}; plans stay fixed");
                        return fixed(equal, gate);
                    }
                };
            eprintln!(
                "rank 0: watching ConfigMap {name} for {}",
                heterotrain_crds::plan::PLAN_KEY
            );
            let mut plan = equal;
            if let Some(p) = src.wait_first(Duration::from_secs(cfg.plan.first_plan_wait_secs)) {
                match gate.consider(p, &plan, ws) {
                    Some(p) => plan = p,
                    None => {
                        if let Some(r) = gate.last_reason.take() {
                            metrics.plan_rejected(r);
                        }
                    }
                }
            }
            return Ok(Plans {
                plan,
                source: Box::new(src),
                gate,
            });
        };
        let mut src = FilePlanSource::new(path.clone(), ws);
        let plan = src.read_now().map_err(TrainerError::Config)?;
        plan.validate_for(ws, cfg.optim.batch_size)
            .map_err(|e| TrainerError::Config(format!("plan file {}: {e}", path.display())))?;
        if let Some(why) = gate.below_floor(&plan) {
            return Err(TrainerError::Config(format!(
                "plan file {}: {why}",
                path.display()
            )));
        }
        Ok(Plans {
            plan,
            source: Box::new(src),
            gate,
        })
    }
}

/// Start the metrics endpoint (a bind failure is a warning, not an error).
fn serve_metrics(obs: &ObsArgs, rank: usize, mx: &Arc<TrainerMetrics>) {
    if obs.metrics_port != 0 {
        let addr = obs
            .metrics_addr
            .clone()
            .filter(|a| !a.is_empty())
            .unwrap_or_else(|| "0.0.0.0".into());
        match metrics::serve(Arc::clone(mx), &addr, obs.metrics_port) {
            Ok(a) => eprintln!("rank {}: metrics on http://{a}/metrics", rank),
            Err(e) => eprintln!(
                "warning: rank {}: no metrics endpoint on {addr}:{}: {e}",
                rank, obs.metrics_port
            ),
        }
    }
}

/// This device's hardware profile (none with --no-profile).
fn measure_profile(
    cfg: &TrainerArgs,
    device: Device,
    data: &Dataset,
    gpu: Option<&Gpu>,
    mx: &TrainerMetrics,
) -> Result<Option<HardwareProfile>> {
    if cfg.obs.no_profile {
        return Ok(None);
    }
    let t = Instant::now();
    let p = profile::measure(cfg, device, data, gpu, Some(cfg.optim.batch_size))?;
    mx.set_profile(&p);
    eprintln!(
        "rank {}: profile in {:.1}s: {} {:.2e} FLOP/s, {:.2e} B/s, t(b) = {:.4} + {:.6}·b s, max batch {}",
        cfg.dist.rank,
        t.elapsed().as_secs_f64(),
        p.device.name,
        p.matmul_flops,
        p.memory_bandwidth_bytes_per_second,
        p.fixed_seconds,
        p.per_sample_seconds,
        p.max_batch_size
    );
    Ok(Some(p))
}

/// Time the group's all-reduce at start-up and export it with the profile
/// (every rank runs it, right after joining).
pub(super) fn profile_collectives(pg: &crate::c10d::ProcessGroup, parts: &mut Parts) -> Result<()> {
    let c = profile::collective(pg, parts.device)?;
    parts.mx.set_collective(&c);
    if let Some(p) = parts.hw_profile.as_mut() {
        p.allreduce_latency_seconds = Some(c.latency_seconds);
        p.allreduce_bus_bandwidth_bytes_per_second = Some(c.bus_bandwidth_bytes_per_second);
        p.slowest_link_bytes_per_second = c.slowest_link();
    }
    let links: Vec<String> = c
        .links
        .iter()
        .map(|(peer, b)| format!("{peer}: {b:.2e}"))
        .collect();
    eprintln!(
        "rank {}: all-reduce among {} ranks: {:.0} µs for 1 KiB, {:.2e} B/s bus bandwidth at 4 MiB; from peers (B/s) {}",
        pg.rank(),
        pg.world_size(),
        c.latency_seconds * 1e6,
        c.bus_bandwidth_bytes_per_second,
        links.join(", ")
    );
    Ok(())
}

/// Bytes of the regular files directly in `dir` (a dataset's files).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// Everything a run fixes before its first step.
pub(super) struct Parts {
    pub device: Device,
    pub mx: Arc<TrainerMetrics>,
    pub data: Dataset,
    pub hw_profile: Option<HardwareProfile>,
    pub steps_per_epoch: u64,
    /// Steps of the whole run.
    pub total: u64,
    _vs: VarStore,
    /// Synchronised BatchNorm reaches the group through this slot, bound
    /// once the group exists.
    pub group_slot: GroupSlot,
    pub model: Model,
    /// Every variable (parameters and buffers), sorted by name.
    pub all_vars: Named,
    pub param_names: Vec<String>,
    pub params: Vec<Tensor>,
    /// The parameters' one buffer; the optimizer updates a range of it.
    pub flat: FlatParams,
    pub fingerprint: Fingerprint,
    pub model_name: String,
}

impl Parts {
    pub fn build(cfg: &TrainerArgs) -> Result<(Parts, Plans)> {
        let device = pick_device(&cfg.dist)?;
        let gpu = open_gpu(device);
        let mx = Arc::new(TrainerMetrics::new(gpu.clone()));
        mx.set_device(&profile::device_info(device, gpu.as_ref()));
        let plans = Plans::start(cfg, &mx)?;
        let loading = Instant::now();
        let data = data::load(&cfg.data, data::Needs::of(cfg))?;
        let data_read = cfg
            .data
            .data_dir
            .as_deref()
            .filter(|_| cfg.data.dataset.from_files())
            .map(|dir| dir_bytes(dir) as f64 / loading.elapsed().as_secs_f64())
            .filter(|r| r.is_finite() && *r > 0.0);
        if let Some(r) = data_read {
            mx.set_data_read(r);
        }
        // After the configuration is known good: errors stay one line.
        serve_metrics(&cfg.obs, cfg.dist.rank, &mx);
        let mut hw_profile = measure_profile(cfg, device, &data, gpu.as_ref(), &mx)?;
        if let Some(p) = hw_profile.as_mut() {
            p.data_read_bytes_per_second = data_read;
        }
        let spe = steps_per_epoch(data.train_len(), cfg.optim.batch_size);
        let total = match (cfg.optim.max_steps, cfg.optim.epochs) {
            (Some(steps), Some(epochs)) => steps.min(epochs.saturating_mul(spe)),
            (Some(steps), None) => steps,
            (None, epochs) => epochs.unwrap_or(1).saturating_mul(spe),
        };
        tch::manual_seed(cfg.optim.seed as i64);
        let vs = VarStore::new(device);
        let group_slot = GroupSlot::default();
        let model = models::build(&vs.root(), &cfg.model, &data.shape, &group_slot)?;
        let (all_vars, trainable) = named_vars(&vs);
        let params: Vec<Tensor> = trainable.iter().map(|(_, t)| t.shallow_clone()).collect();
        let flat = FlatParams::new(&params)?;
        let gradient_bytes: u64 = params
            .iter()
            .map(|t| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64)
            .sum();
        mx.set_gradient_bytes(gradient_bytes);
        if let Some(p) = hw_profile.as_mut() {
            p.gradient_bytes = Some(gradient_bytes);
        }
        let fingerprint = Fingerprint {
            model_file: model.scripted().map(|s| s.digest.clone()),
            ..Fingerprint::of(cfg, data.train_len())
        };
        let parts = Parts {
            device,
            mx,
            fingerprint,
            data,
            hw_profile,
            steps_per_epoch: spe,
            total,
            _vs: vs,
            group_slot,
            model,
            all_vars,
            param_names: trainable.into_iter().map(|(n, _)| n).collect(),
            params,
            flat,
            model_name: serde_json::to_value(cfg.model.arch)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
        };
        Ok((parts, plans))
    }
}
