//! The training loop: rendezvous, initial sync, per-step plan agreement,
//! heterogeneous batches with exact gradient maths, evaluation, checkpoints,
//! and a clean stop on SIGTERM.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use heterotrain_crds::BatchPlan;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::c10d::{self, GroupSlot, ProcessGroup, RendezvousConfig};
use crate::checkpoint::{self, Fingerprint, Snapshot};
use crate::cli::{
    BackendKind, BalancerMode, BatchNormMode, DeviceArg, OptimizerSharding, ResumeMode, TrainConfig,
};
use crate::control;
use crate::data::{self, Dataset};
use crate::error::{Result, TrainerError};
use crate::local_balance::{self, Interval, LocalBalancer};
use crate::log::{EvalRecord, JsonlLog, StepRecord, StepTimings};
use crate::metrics::{self, TrainerMetrics};
use crate::models::{self, Model};
use crate::nvml::Gpu;
use crate::optim::{self, Optimizer};
use crate::plan_source::{FilePlanSource, NoPlanSource, PlanGate, PlanSource};
use crate::plan_watch::ConfigMapPlanSource;
use crate::profile;
use crate::sampler::{steps_per_epoch, HeteroSampler, SamplerPosition};
use crate::shard::{FlatParams, Layout};

/// What a finished run reports.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    pub steps: u64,
    pub stopped_by_signal: bool,
    pub last_eval_accuracy: Option<f64>,
}

pub fn pick_device(cfg: &TrainConfig) -> Result<Device> {
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

fn sync_device(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// Join the group (none for a single process) and pick NCCL when allowed.
fn join(cfg: &TrainConfig, device: Device) -> Result<Option<ProcessGroup>> {
    if cfg.world_size == 1 {
        return Ok(None);
    }
    c10d::quiet_c10_logging();
    let mut pg = ProcessGroup::join(&RendezvousConfig {
        master_addr: cfg.master_addr.clone(),
        master_port: cfg.master_port,
        rank: cfg.rank,
        world_size: cfg.world_size,
        rendezvous_timeout: Duration::from_secs(cfg.rendezvous_timeout_secs),
        collective_timeout: Duration::from_secs(cfg.collective_timeout_secs),
        bind_host: cfg.bind_addr.clone(),
        iface: cfg.gloo_socket_ifname.clone(),
    })?;
    // Agree on NCCL: only when every rank is CUDA and wants it.
    let wants = device.is_cuda() && cfg.backend != BackendKind::Gloo && cfg!(feature = "nccl");
    let mut t = Tensor::from_slice(&[i64::from(wants)]);
    pg.all_reduce_sum(&mut t)?;
    let all = t.int64_value(&[0]) == cfg.world_size as i64;
    if all {
        pg.enable_nccl()?;
    } else if cfg.backend == BackendKind::Nccl && cfg.rank == 0 {
        eprintln!(
            "warning: --backend nccl needs every rank on CUDA with an nccl build; using Gloo (CUDA tensors staged through host memory)"
        );
    }
    Ok(Some(pg))
}

/// Tensors with their VarStore names.
type Named = Vec<(String, Tensor)>;

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

fn broadcast_all(pg: Option<&ProcessGroup>, tensors: &[(String, Tensor)]) -> Result<()> {
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

/// The starting plan and where later plans come from. `gate` learns
/// whether the start is the built-in equal split.
fn initial_plan(
    cfg: &TrainConfig,
    gate: &mut PlanGate,
    metrics: &TrainerMetrics,
) -> Result<(BatchPlan, Box<dyn PlanSource>)> {
    let ws = cfg.world_size;
    let equal = BatchPlan::equal(0, cfg.batch_size, ws);
    match &cfg.plan_file {
        None => {
            gate.current_is_default = true;
            let Some(name) = cfg.plan_configmap.clone().filter(|_| cfg.rank == 0) else {
                return Ok((equal, Box::new(NoPlanSource)));
            };
            let mut src = match ConfigMapPlanSource::start(name.clone(), cfg.namespace.clone(), ws)
            {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("warning: cannot start the plan watch: {e}; plans stay fixed");
                    return Ok((equal, Box::new(NoPlanSource)));
                }
            };
            eprintln!(
                "rank 0: watching ConfigMap {name} for {}",
                heterotrain_crds::plan::PLAN_KEY
            );
            let mut plan = equal;
            if let Some(p) = src.wait_first(Duration::from_secs(5)) {
                match gate.consider(p, &plan, ws) {
                    Some(p) => plan = p,
                    None => {
                        if let Some(r) = gate.last_reason.take() {
                            metrics.plan_rejected(r);
                        }
                    }
                }
            }
            Ok((plan, Box::new(src)))
        }
        Some(path) => {
            let mut src = FilePlanSource::new(path.clone(), ws);
            let plan = src.read_now().map_err(TrainerError::Config)?;
            plan.validate_for(ws, cfg.batch_size)
                .map_err(|e| TrainerError::Config(format!("plan file {}: {e}", path.display())))?;
            if let Some(why) = gate.below_floor(&plan) {
                return Err(TrainerError::Config(format!(
                    "plan file {}: {why}",
                    path.display()
                )));
            }
            Ok((plan, Box::new(src)))
        }
    }
}

/// Evaluate on the held-out split (each rank a shard, results all-reduced).
fn evaluate(
    cfg: &TrainConfig,
    model: &Model,
    data: &Dataset,
    device: Device,
    pg: Option<&ProcessGroup>,
) -> Result<(f64, f64, f64)> {
    let _guard = tch::no_grad_guard();
    let n = data.eval_len();
    let mine: Vec<usize> = (cfg.rank..n).step_by(cfg.world_size).collect();
    let (mut correct, mut count, mut loss) = (0.0, 0.0, 0.0);
    for chunk in mine.chunks(256) {
        let (x, y) = data.eval_batch(chunk, device);
        let logits = model.forward(&x, false);
        let (c, k, l) = model.score(&logits, &y);
        correct += c;
        count += k;
        loss += l;
    }
    let mut t = Tensor::from_slice(&[correct, count, loss]);
    if let Some(pg) = pg {
        pg.all_reduce_sum(&mut t)?;
    }
    let v = Vec::<f64>::try_from(&t).unwrap_or_default();
    let (c, k, l) = (v[0], v[1].max(1.0), v[2]);
    Ok((c / k, l / k, v[1]))
}

/// Set libtorch's thread counts from the config.
pub fn apply_threads(cfg: &TrainConfig) {
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

/// Start the metrics endpoint (a bind failure is a warning, not an error).
fn serve_metrics(cfg: &TrainConfig, mx: &Arc<TrainerMetrics>) {
    if cfg.metrics_port != 0 {
        let addr = cfg
            .metrics_addr
            .clone()
            .filter(|a| !a.is_empty())
            .unwrap_or_else(|| "0.0.0.0".into());
        match metrics::serve(Arc::clone(mx), &addr, cfg.metrics_port) {
            Ok(a) => eprintln!("rank {}: metrics on http://{a}/metrics", cfg.rank),
            Err(e) => eprintln!(
                "warning: rank {}: no metrics endpoint on {addr}:{}: {e}",
                cfg.rank, cfg.metrics_port
            ),
        }
    }
}

/// Run training with `cfg` until done or stopped; `stop` is set by SIGTERM.
pub fn run(cfg: &TrainConfig, stop: Arc<AtomicBool>) -> Result<RunSummary> {
    cfg.validate().map_err(TrainerError::Config)?;
    apply_threads(cfg);
    if cfg.deterministic {
        c10d::set_deterministic(true);
    }
    let device = pick_device(cfg)?;
    let gpu = open_gpu(device);
    let mx = Arc::new(TrainerMetrics::new(gpu.clone()));
    mx.set_device(&profile::device_info(device, gpu.as_ref()));
    let mut gate = PlanGate {
        min_local_batch: cfg.min_local_batch(),
        ..PlanGate::default()
    };
    let (mut plan, mut source) = initial_plan(cfg, &mut gate, &mx)?;
    let data = data::load(cfg)?;
    // After the configuration is known good: errors stay one line.
    serve_metrics(cfg, &mx);
    let hw_profile = if cfg.no_profile {
        None
    } else {
        let t = Instant::now();
        let p = profile::measure(cfg, device, &data, gpu.as_ref())?;
        mx.set_profile(&p);
        eprintln!(
            "rank {}: profile in {:.1}s: {} {:.2e} FLOP/s, {:.2e} B/s, t(b) = {:.4} + {:.6}·b s, max batch {}",
            cfg.rank,
            t.elapsed().as_secs_f64(),
            p.device.name,
            p.matmul_flops,
            p.memory_bandwidth_bytes_per_second,
            p.fixed_seconds,
            p.per_sample_seconds,
            p.max_batch_size
        );
        Some(p)
    };
    let spe = steps_per_epoch(data.train_len(), cfg.batch_size);
    let total = match (cfg.max_steps, cfg.epochs) {
        (Some(steps), Some(epochs)) => steps.min(epochs.saturating_mul(spe)),
        (Some(steps), None) => steps,
        (None, epochs) => epochs.unwrap_or(1).saturating_mul(spe),
    };

    tch::manual_seed(cfg.seed as i64);
    let vs = VarStore::new(device);
    // Synchronised BatchNorm reaches the group through this slot, bound
    // once the group exists.
    let group_slot = GroupSlot::default();
    let model = models::build(&vs.root(), cfg, &data.shape, &group_slot)?;
    let (all_vars, trainable) = named_vars(&vs);
    let params: Vec<Tensor> = trainable.iter().map(|(_, t)| t.shallow_clone()).collect();
    let param_names: Vec<String> = trainable.iter().map(|(n, _)| n.clone()).collect();
    // One flat buffer under every parameter; the optimizer updates a range.
    let flat = FlatParams::new(&params)?;
    let n_flat = flat.len();
    let sharded = cfg.optimizer_sharding == OptimizerSharding::Proportional;
    // Replicated (whole state everywhere) until the first agreed plan.
    let mut layout = Layout::Replicated { len: n_flat };
    let mut opt = Optimizer::new(cfg, &flat, layout.own(cfg.rank));

    let pg = join(cfg, device)?;
    let pg = pg.as_ref();
    let _bound = pg.map(|pg| group_slot.bind(pg));
    let rank = cfg.rank;
    let mut log = JsonlLog::open(&cfg.output_dir, rank)?;

    // Resume: rank 0 finds and loads the checkpoint, then everything below
    // is broadcast, so ranks need no shared filesystem.
    let mut pos = SamplerPosition {
        epoch: 0,
        step_in_epoch: 0,
    };
    let mut step = 0u64;
    let mut meta = vec![0i64; 5];
    // Only this run's checkpoints: others are skipped, one that fails to
    // load falls back to the next older one (each with a warning).
    let fingerprint = Fingerprint::of(cfg, data.train_len());
    if rank == 0 && cfg.resume == ResumeMode::Auto {
        if let Some(dir) = &cfg.checkpoint_dir {
            let optim_state = opt.named(
                &opt.gather(None, rank, &layout, n_flat)?,
                &flat,
                &param_names,
            );
            let found = checkpoint::resume(dir, &fingerprint, |m| {
                checkpoint::load_files(
                    dir,
                    &[(&m.weights, &all_vars), (&m.optimizer, &optim_state)],
                )
            });
            if found.is_none() {
                eprintln!(
                    "rank 0: no checkpoint of this run (fingerprint {}) in {}; starting from step 0",
                    fingerprint.hash(),
                    dir.display()
                );
            }
            if let Some(m) = found {
                eprintln!(
                    "rank 0: resuming from checkpoint at step {} (fingerprint {})",
                    m.step,
                    fingerprint.hash()
                );
                meta = vec![
                    1,
                    m.step as i64,
                    m.position.epoch as i64,
                    m.position.step_in_epoch as i64,
                    m.optimizer_steps as i64,
                ];
                if m.plan.validate_for(cfg.world_size, cfg.batch_size).is_ok()
                    && gate.below_floor(&m.plan).is_none()
                    && m.plan.generation > plan.generation
                {
                    plan = m.plan.clone();
                }
            }
        }
    }
    if let Some(pg) = pg {
        let mut t = Tensor::from_slice(&meta);
        pg.broadcast(&mut t, 0)?;
        meta = Vec::<i64>::try_from(&t).unwrap_or(meta);
    }
    broadcast_all(pg, &all_vars)?;
    if meta[0] == 1 {
        let whole = opt.gather(None, rank, &layout, n_flat)?;
        broadcast_all(pg, &opt.named(&whole, &flat, &param_names))?;
        step = meta[1] as u64;
        pos = SamplerPosition {
            epoch: meta[2] as u64,
            step_in_epoch: meta[3] as u64,
        };
        opt.steps = meta[4] as u64;
    }

    mx.set_position(step, pos.epoch);
    mx.set_plan(
        plan.generation,
        plan.batch_sizes.get(rank).copied().unwrap_or(0),
    );

    // Bare-metal balancing: profiles are gathered once; rank 0 decides.
    let local = cfg.balancer == BalancerMode::Local;
    let mut balancer = None;
    let mut pending: Option<BatchPlan> = None;
    if local {
        let profiles = local_balance::gather_profiles(pg, hw_profile.as_ref())?;
        if rank == 0 {
            let mut lb = LocalBalancer::new(cfg)?;
            lb.observe_profiles(&profiles);
            if profiles.iter().all(Option::is_some) {
                pending = lb.round(&[], &plan);
            }
            balancer = Some(lb);
        }
    }
    let mut interval = Interval::default();
    let mut warm = true;
    let mut status_since = (Instant::now(), step);

    // PyTorch's DDP engine over the trainable parameters (a group only).
    let reducer = match pg {
        Some(g) => Some(g.reducer(
            &params,
            cfg.bucket_mib.max(1) << 20,
            FIRST_BUCKET_BYTES.min(cfg.bucket_mib.max(1) << 20),
        )?),
        None => None,
    };
    let mut sampler = HeteroSampler::new(data.train_len(), cfg.seed, !cfg.no_shuffle);
    let mut last_acc = None;
    let mut stopped = false;
    let model_name = serde_json::to_value(cfg.model)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();

    // Every rank calls it at the same step: the optimizer state is
    // gathered from its owners; rank 0 writes.
    let save = |step: u64,
                pos: SamplerPosition,
                plan: &BatchPlan,
                opt: &Optimizer,
                layout: &Layout|
     -> Result<()> {
        let whole = opt.gather(pg, rank, layout, n_flat)?;
        if rank != 0 {
            return Ok(());
        }
        let Some(dir) = &cfg.checkpoint_dir else {
            return Ok(());
        };
        checkpoint::save(
            dir,
            &Snapshot {
                step,
                position: pos,
                seed: cfg.seed,
                shuffle: !cfg.no_shuffle,
                optimizer_steps: opt.steps,
                plan,
                model: &model_name,
                fingerprint: &fingerprint,
                weights: &all_vars,
                optimizer: &opt.named(&whole, &flat, &param_names),
            },
        )?;
        Ok(())
    };

    // The agreement for the next step boundary, from the previous step's
    // control all-reduce (none before the first step).
    let mut carried: Option<control::Agreement> = None;
    while step < total {
        let step_start = Instant::now();
        // Step boundary: every rank applies the same agreement.
        let agreed = match carried.take() {
            Some(a) => a,
            None => {
                let proposed = propose(rank, &plan, &mut pending, source.as_mut(), &mut gate, &mx);
                control::agree(pg, rank, &proposed, stop.load(Ordering::SeqCst))?
            }
        };
        if agreed.stop {
            stopped = true;
            break;
        }
        // Generation 0 from a ConfigMap may replace the built-in equal split
        // of the same generation: compare the batches too.
        if agreed.plan.generation != plan.generation || agreed.plan.batch_sizes != plan.batch_sizes
        {
            agreed
                .plan
                .validate_for(cfg.world_size, cfg.batch_size)
                .map_err(|e| TrainerError::Config(format!("agreed plan is invalid: {e}")))?;
            if rank == 0 {
                eprintln!(
                    "rank 0: step {}: switching to plan generation {} {:?}",
                    step + 1,
                    agreed.plan.generation,
                    agreed.plan.batch_sizes
                );
            }
            plan = agreed.plan;
            mx.set_plan(plan.generation, plan.batch_sizes[rank]);
            warm = true;
        }

        // The optimizer ranges follow the plan (the state moves with them).
        let wanted = Layout::for_plan(n_flat, &plan.batch_sizes, sharded);
        if wanted != layout {
            let whole = opt.gather(pg, rank, &layout, n_flat)?;
            opt.adopt(&whole, wanted.own(rank));
            layout = wanted;
        }

        let b_local = plan.batch_sizes[rank];
        let b_global = plan.global_batch_size;
        let scale = f64::from(b_local) / f64::from(b_global);
        let mut tm = StepTimings::default();
        let t0 = Instant::now();

        // Rank 0's next proposal and every stop request: a small all-reduce
        // started now, overlapped with this step's compute and waited at its
        // end; it takes effect at the next step boundary.
        let proposed = propose(rank, &plan, &mut pending, source.as_mut(), &mut gate, &mx);
        let stop_now = stop.load(Ordering::SeqCst);
        let mut word = control::encode(rank, cfg.world_size, &proposed, stop_now);
        let word_work = match pg {
            Some(g) => Some(g.all_reduce_sum_async(&mut word)?),
            None => None,
        };
        let waited0 = c10d::autograd_collective_seconds();

        let idx = sampler.rank_indices(pos, &plan, rank);
        let (x, y) = data.train_batch(&idx, device);
        sync_device(device);
        let t1 = Instant::now();
        tm.data_seconds = (t1 - t0).as_secs_f64();

        if let Some(r) = &reducer {
            r.prepare_forward()?;
        }
        let logits = model.forward(&x, true);
        if let Some(msg) = group_slot.take_error() {
            return Err(TrainerError::Collective {
                op: "batch_norm",
                msg,
            });
        }
        let loss = model.loss(&logits, &y);
        let local_loss = loss.double_value(&[]);
        sync_device(device);
        let t2 = Instant::now();
        // Waiting inside synchronised BatchNorm is communication, not compute.
        let waited1 = c10d::autograd_collective_seconds();
        let forward_wait = (waited1 - waited0).max(0.0);
        tm.forward_seconds = ((t2 - t1).as_secs_f64() - forward_wait).max(0.0);
        let mut loss_sum = Tensor::from_slice(&[local_loss * scale]);
        let loss_work = match pg {
            Some(g) => Some(g.all_reduce_sum_async(&mut loss_sum)?),
            None => None,
        };

        zero_grads(&params);
        // The b_r / B weight goes into the loss, so the SUM of the ranks'
        // gradients is the gradient of the mean loss over the global batch,
        // and cross-rank terms (synchronised BatchNorm) are weighted right.
        // With a group, PyTorch's Reducer SUM-all-reduces gradient buckets
        // while backward still runs; they are reduced when it returns.
        let scaled = &loss * scale;
        if let Some(r) = &reducer {
            r.prepare_backward(&scaled)?;
        }
        scaled.f_backward().map_err(|e| TrainerError::Collective {
            op: "backward",
            msg: e.to_string().lines().next().unwrap_or_default().to_string(),
        })?;
        sync_device(device);
        let t3 = Instant::now();
        let backward_wait = (c10d::autograd_collective_seconds() - waited1).max(0.0);
        let trace = reducer.as_ref().map(|r| r.trace());
        let local_backward = match &trace {
            Some(t) if t.backward_seconds > 0.0 => t.backward_seconds,
            _ => (t3 - t2).as_secs_f64(),
        };
        tm.backward_seconds = (local_backward - backward_wait).max(0.0);

        if let Some(w) = word_work {
            w.wait()?;
        }
        if let Some(w) = loss_work {
            w.wait()?;
        }
        carried = Some(control::decode(&word, rank, &proposed));
        let global_loss = if pg.is_some() {
            loss_sum.double_value(&[0])
        } else {
            local_loss
        };
        sync_device(device);
        let t4 = Instant::now();
        // Exposed communication: everything in forward and backward that
        // was not local compute, plus the final waits.
        tm.allreduce_seconds =
            ((t4 - t1).as_secs_f64() - tm.forward_seconds - tm.backward_seconds).max(0.0);
        let overlap = trace
            .as_ref()
            .map(|t| (t.overlapped_launches(), t.ready_at_launch.len()));

        let lr = optim::lr_at(cfg, step + 1, total);
        opt.step(&flat, lr);
        sync_device(device);
        let t5 = Instant::now();
        tm.optimizer_seconds = (t5 - t4).as_secs_f64();
        // Owners hand out their updated ranges (sharded layout only).
        layout.share(pg, &flat.range((0, n_flat)))?;
        sync_device(device);
        tm.allreduce_seconds += t5.elapsed().as_secs_f64();

        step += 1;
        // Includes the step-boundary agreement.
        let step_s = step_start.elapsed().as_secs_f64();
        log.write(&StepRecord {
            event: "step",
            rank,
            step,
            epoch: pos.epoch,
            generation: plan.generation,
            batch_size: b_local,
            global_batch_size: b_global,
            loss: local_loss,
            global_loss,
            lr,
            timings: tm,
            compute_seconds: tm.compute_seconds(),
            step_seconds: step_s,
            samples_per_second: f64::from(b_global) / step_s.max(1e-12),
            invalid_plans: gate.invalid_plans,
            buckets: overlap.map(|o| o.1),
            overlapped_buckets: overlap.map(|o| o.0),
            optimizer_elements: opt.range().1 - opt.range().0,
            unix_seconds: crate::log::unix_seconds(),
        });
        mx.observe_step(step, pos.epoch, b_local, &tm, step_s, local_loss);
        interval.record(b_local, tm.compute_seconds(), !warm);
        warm = false;
        if !global_loss.is_finite() {
            return Err(TrainerError::Data(format!(
                "loss became {global_loss} at step {step}; lower --lr"
            )));
        }

        pos.step_in_epoch += 1;
        let epoch_end = pos.step_in_epoch >= spe;
        if (epoch_end || step == total) && data.eval_len() > 0 {
            {
                agree_buffers(cfg, pg, &all_vars, scale)?;
                let (acc, eval_loss, n) = evaluate(cfg, &model, &data, device, pg)?;
                last_acc = Some(acc);
                mx.set_eval(acc, eval_loss);
                log.write(&EvalRecord {
                    event: "eval",
                    rank,
                    step,
                    epoch: pos.epoch,
                    eval_loss,
                    eval_accuracy: acc,
                    eval_samples: n as u64,
                });
                if rank == 0 {
                    eprintln!(
                        "rank 0: epoch {} step {step}: eval accuracy {:.4}, loss {:.4}",
                        pos.epoch, acc, eval_loss
                    );
                }
            }
        }
        if epoch_end {
            pos = SamplerPosition {
                epoch: pos.epoch + 1,
                step_in_epoch: 0,
            };
        }
        // Every rank takes part (same step on all): balancing round and status.
        let balance_now = local && step % cfg.balance_every == 0;
        let status_now = cfg.status_every > 0 && step % cfg.status_every == 0;
        if balance_now || status_now {
            let reports = local_balance::gather(pg, interval.report())?;
            if balance_now {
                interval.reset();
                if let Some(lb) = balancer.as_mut() {
                    pending = lb.round(&reports, &plan);
                }
            }
            if status_now && rank == 0 {
                let (t, s0) = status_since;
                let sps =
                    (step - s0) as f64 * f64::from(b_global) / t.elapsed().as_secs_f64().max(1e-9);
                eprintln!(
                    "{}",
                    local_balance::status_line(step, total, global_loss, sps, &plan, &reports)
                );
                status_since = (Instant::now(), step);
            }
        }
        if cfg.checkpoint_every > 0 && step % cfg.checkpoint_every == 0 && step < total {
            agree_buffers(
                cfg,
                pg,
                &all_vars,
                f64::from(plan.batch_sizes[rank]) / f64::from(plan.global_batch_size),
            )?;
            save(step, pos, &plan, &opt, &layout)?;
        }
        if cfg.step_sleep_ms > 0 {
            std::thread::sleep(Duration::from_millis(cfg.step_sleep_ms));
        }
    }

    agree_buffers(
        cfg,
        pg,
        &all_vars,
        f64::from(plan.batch_sizes.get(rank).copied().unwrap_or(0))
            / f64::from(plan.global_batch_size.max(1)),
    )?;
    save(step, pos, &plan, &opt, &layout)?;
    mx.set_finished();
    if rank == 0 {
        write_weights(&cfg.output_dir.join("model.safetensors"), &all_vars)?;
    }
    if let Some(pg) = pg {
        pg.barrier()?;
    }
    let _ = Kind::Float;
    Ok(RunSummary {
        steps: step,
        stopped_by_signal: stopped,
        last_eval_accuracy: last_acc,
    })
}

/// The Reducer's first bucket (as DDP's): small, so communication starts
/// early in backward.
const FIRST_BUCKET_BYTES: usize = 1 << 20;

/// Zero the gradients in place (they may be views into the Reducer's
/// bucket buffers, which must stay in place).
fn zero_grads(params: &[Tensor]) {
    let _guard = tch::no_grad_guard();
    for p in params {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.f_zero_();
        }
    }
}

/// Rank 0: the plan to propose for the next step (the local balancer's
/// pending plan, then the plan source's, each through the gate). Other
/// ranks propose nothing (their control word carries only a stop request).
fn propose(
    rank: usize,
    plan: &BatchPlan,
    pending: &mut Option<BatchPlan>,
    source: &mut dyn PlanSource,
    gate: &mut PlanGate,
    mx: &TrainerMetrics,
) -> BatchPlan {
    let mut proposed = plan.clone();
    if rank != 0 {
        return proposed;
    }
    for p in [pending.take().map(Ok), source.poll()]
        .into_iter()
        .flatten()
    {
        match gate.consider(p, &proposed, plan.batch_sizes.len()) {
            Some(p) => proposed = p,
            None => {
                if let Some(r) = gate.last_reason.take() {
                    mx.plan_rejected(r);
                }
            }
        }
    }
    proposed
}

/// Make the ranks' buffers (BatchNorm running statistics) agree before
/// evaluation and checkpoints. Per-rank BatchNorm (`local`): the average
/// over ranks weighted by local batch (`weight` = b_r / B). Synchronised
/// BatchNorm keeps them equal by construction; rank 0's are broadcast as a
/// guard. Every rank must call it at the same step.
fn agree_buffers(
    cfg: &TrainConfig,
    pg: Option<&ProcessGroup>,
    vars: &[(String, Tensor)],
    weight: f64,
) -> Result<()> {
    let Some(pg) = pg else { return Ok(()) };
    let buffers: Vec<(String, Tensor)> = vars
        .iter()
        .filter(|(_, t)| !t.requires_grad())
        .map(|(n, t)| (n.clone(), t.shallow_clone()))
        .collect();
    if buffers.is_empty() {
        return Ok(());
    }
    if cfg.batch_norm == BatchNormMode::Local && cfg.model.has_batch_norm() {
        let _guard = tch::no_grad_guard();
        for (_, t) in &buffers {
            let mut w = (t * weight).contiguous();
            pg.all_reduce_sum(&mut w)?;
            t.shallow_clone().copy_(&w);
        }
        Ok(())
    } else {
        broadcast_all(Some(pg), &buffers)
    }
}

/// Final weights as safetensors (names = VarStore paths), written atomically.
fn write_weights(path: &Path, vars: &[(String, Tensor)]) -> Result<()> {
    let tmp = path.with_extension("safetensors.tmp");
    let cpu: Vec<(String, Tensor)> = vars
        .iter()
        .map(|(n, t)| (n.clone(), t.to_device(Device::Cpu).contiguous()))
        .collect();
    Tensor::write_safetensors(&cpu, &tmp)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| TrainerError::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| TrainerError::io(path, e))
}
