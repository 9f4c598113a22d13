//! The training loop: rendezvous, initial sync, per-step plan agreement,
//! heterogeneous batches with exact gradient maths, the optimizer update
//! sharded by local batch, evaluation, checkpoints, and a clean stop on
//! SIGTERM.
//!
//! [`run`] builds the fixed [`setup::Parts`], joins the group and drives a
//! [`Trainer`]: `resume`, then per step `boundary` (agreement), `step`
//! (data, forward, backward with the overlapped gradient exchange, update)
//! and `end_of_step` (evaluation, balancing, status, checkpoints), then
//! `finish`.

mod epoch;
mod resume;
mod setup;
mod step;
mod team;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use heterotrain_crds::BatchPlan;
use tch::{Device, Tensor};
use typed_arena::Arena;

use crate::c10d::{self, ProcessGroup, Reducer, SlotBinding};
use crate::checkpoint::{self, Snapshot};
use crate::cli::{BalancerMode, TrainerArgs};
use crate::control;
use crate::data::prefetch::Prefetcher;
use crate::error::{Result, TrainerError};
use crate::local_balance::{self, Interval, LocalBalancer};
use crate::log::JsonlLog;
use crate::optim::Optimizer;
use crate::plan_source::{PlanGate, PlanSource};
use crate::sampler::{HeteroSampler, SamplerPosition};
use crate::shard::Layout;

pub use setup::{apply_threads, open_gpu, pick_device};
use setup::{Named, Parts, Plans};
use team::Team;

/// What a finished run reports.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSummary {
    pub steps: u64,
    pub stopped_by_signal: bool,
    pub last_eval_accuracy: Option<f64>,
}

/// Run training with `cfg` until done or stopped; `stop` is set by SIGTERM.
pub fn run(cfg: &TrainerArgs, stop: Arc<AtomicBool>) -> Result<RunSummary> {
    crate::cli::validate(cfg).map_err(TrainerError::Config)?;
    apply_threads(&cfg.dist);
    if cfg.optim.deterministic {
        c10d::set_deterministic(true);
    }
    let (mut parts, plans) = Parts::build(cfg)?;
    let pg = setup::join(&cfg.dist, parts.device)?;
    let pg = pg.as_ref();
    if let (Some(pg), false) = (pg, cfg.obs.no_profile) {
        setup::profile_collectives(pg, &mut parts)?;
    }
    let subgroups = Arena::new();
    let mut t = Trainer::new(cfg, &parts, plans, pg, &subgroups)?;
    while t.step < parts.total {
        let started = Instant::now();
        if !t.boundary(stop.load(Ordering::SeqCst))? {
            break;
        }
        t.step(started, &stop)?;
        t.end_of_step()?;
    }
    t.finish()
}

/// The helper that gathers each next batch ahead (see [`Prefetcher`]);
/// none with `--no-prefetch`, or with a warning where it cannot start.
fn start_prefetch(cfg: &TrainerArgs, p: &Parts) -> Option<Prefetcher> {
    if cfg.data.no_prefetch {
        return None;
    }
    match Prefetcher::start(&p.data.train_x, &p.data.train_y, cfg.data.prefetch_wait) {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!(
                "rank {}: warning: no batch prefetch (its thread did not start: {e}); \
                 each batch is gathered when its step starts",
                cfg.dist.rank
            );
            None
        }
    }
}

/// The run's changing state, over the fixed [`Parts`] and the group.
struct Trainer<'a> {
    cfg: &'a TrainerArgs,
    p: &'a Parts,
    /// The whole job's group.
    pg: Option<&'a ProcessGroup>,
    /// The ranks that train under the plan, and their group.
    team: Team<'a>,
    /// PyTorch's DDP engine over the parameters, on the team's group (a
    /// member of a group only).
    reducer: Option<Reducer<'a>>,
    /// Synchronised BatchNorm's link to the team's group.
    bound: Option<SlotBinding<'a>>,
    /// The team agreed to run the sharded update inside backward (every
    /// member on the CPU, none asked for `--update-after-backward`).
    update_in_backward: bool,
    opt: Optimizer,
    /// Who updates which parameters; follows the plan.
    layout: Layout,
    plan: BatchPlan,
    source: Box<dyn PlanSource>,
    gate: PlanGate,
    /// Rank 0's local balancer (`--balancer local`) and its next plan.
    balancer: Option<LocalBalancer>,
    pending: Option<BatchPlan>,
    interval: Interval,
    /// The share of its CPU quota this rank used, for the local balancer.
    quota: crate::metrics::QuotaMeter,
    /// The step after a plan change (its compute is not measured).
    warm: bool,
    status_since: (Instant, u64),
    sampler: HeteroSampler,
    pos: SamplerPosition,
    /// The next step's batch, gathered during this one (none with
    /// `--no-prefetch`, or where the helper thread could not start).
    prefetch: Option<Prefetcher>,
    /// The current step's batch came from `prefetch`.
    prefetched: bool,
    step: u64,
    /// The agreement for the next step boundary, from the control words
    /// due at the end of the previous step (none: nothing new).
    carried: Option<control::Agreement>,
    /// The control words in flight, and the lag they are started with.
    words: control::Pipeline<'a>,
    lag: u32,
    /// Steps from one control word to the next (agreed), and the step at
    /// which the next word starts.
    word_every: u32,
    next_word: u64,
    /// The current step started a control word.
    word_now: bool,
    /// Rank 0: its recent wall time per step (seconds, smoothed; all of
    /// it, boundaries and pauses included), which sets the interval it
    /// proposes, and when the last step ended.
    step_ema: f64,
    last_end: Option<Instant>,
    /// The first boundary (a blocking agreement) is behind us.
    begun: bool,
    /// Rank 0's newest proposal, possibly still in flight (the base of the
    /// next one, so that a lagged word never proposes an older plan).
    offer: Option<BatchPlan>,
    log: JsonlLog,
    /// The last step's loss over the global batch.
    global_loss: f64,
    last_acc: Option<f64>,
    stopped: bool,
}

impl<'a> Trainer<'a> {
    fn new(
        cfg: &'a TrainerArgs,
        p: &'a Parts,
        plans: Plans,
        pg: Option<&'a ProcessGroup>,
        subgroups: &'a Arena<ProcessGroup>,
    ) -> Result<Trainer<'a>> {
        // Replicated (whole state everywhere) until the first agreed plan.
        let layout = Layout::Replicated { len: p.flat.len() };
        let mut t = Trainer {
            cfg,
            p,
            pg,
            team: Team::new(pg, subgroups, cfg.dist.world_size),
            reducer: None,
            bound: None,
            update_in_backward: false,
            opt: Optimizer::new(&cfg.optim, &p.flat, layout.own(cfg.dist.rank)),
            layout,
            plan: plans.plan,
            source: plans.source,
            gate: plans.gate,
            balancer: None,
            pending: None,
            interval: Interval::default(),
            quota: crate::metrics::QuotaMeter::default(),
            warm: true,
            status_since: (Instant::now(), 0),
            sampler: HeteroSampler::new(p.data.train_len(), cfg.optim.seed, !cfg.data.no_shuffle),
            pos: SamplerPosition {
                epoch: 0,
                step_in_epoch: 0,
            },
            prefetch: start_prefetch(cfg, p),
            prefetched: false,
            step: 0,
            carried: None,
            words: control::Pipeline::default(),
            lag: 0,
            word_every: 1,
            next_word: 0,
            word_now: false,
            step_ema: 0.0,
            last_end: None,
            begun: false,
            offer: None,
            log: JsonlLog::open(&cfg.output.output_dir, cfg.dist.rank)?,
            global_loss: f64::NAN,
            last_acc: None,
            stopped: false,
        };
        t.resume()?;
        t.status_since.1 = t.step;
        p.mx.set_position(t.step, t.pos.epoch, p.total);
        p.mx.set_plan(t.plan.generation, t.local_batch());
        t.start_local_balancer()?;
        let members = t.plan.members();
        t.regroup(members)?;
        Ok(t)
    }

    /// Train with `members` from now on: the old exchange is taken down
    /// before the new one hooks the gradients; members get a Reducer and
    /// synchronised BatchNorm on their group, a left-out rank neither.
    fn regroup(&mut self, members: Vec<usize>) -> Result<()> {
        self.reducer = None;
        self.bound = None;
        self.update_in_backward = false;
        self.team.switch(self.cfg.dist.rank, members)?;
        if let Some(g) = self.team.group() {
            // Every member must take the same path (the messages differ):
            // one small sum of votes, "cannot update inside backward" and
            // "trains on CUDA" (which sets the first bucket's size).
            let on_cpu = self.p.flat.device() == Device::Cpu;
            let able = !self.cfg.optim.update_after_backward && on_cpu;
            let mut votes = Tensor::from_slice(&[i64::from(!able), i64::from(!on_cpu)]);
            g.all_reduce_sum_async(&mut votes)?.wait()?;
            self.update_in_backward = votes.int64_value(&[0]) == 0;
            let bucket = self.cfg.dist.bucket_mib.max(1) << 20;
            let first = first_bucket_bytes(
                self.cfg.dist.first_bucket_mib,
                bucket,
                votes.int64_value(&[1]) > 0,
            );
            self.reducer = Some(g.reducer(&self.p.params, bucket, first)?);
            self.bound = Some(self.p.group_slot.bind(g));
        }
        self.shard_reduction()
    }

    /// Under a sharded layout the Reducer sums each gradient element only
    /// for its owner (group rank i is member i); replicated, for everyone.
    fn shard_reduction(&self) -> Result<()> {
        let Some(r) = &self.reducer else {
            return Ok(());
        };
        match &self.layout {
            Layout::Sharded { .. } => {
                let bounds: Vec<(i64, i64)> = self
                    .team
                    .members()
                    .iter()
                    .map(|&m| self.layout.own(m))
                    .collect();
                let flat = self.p.flat.range((0, self.p.flat.len()));
                r.set_shards(Some((&flat, &bounds)))
            }
            Layout::Replicated { .. } => r.set_shards(None),
        }
    }

    /// Bring every rank's parameters to rank 0's (a left-out rank's are
    /// stale). Collective over the whole group.
    fn catch_up(&self) -> Result<()> {
        let Some(pg) = self.pg else { return Ok(()) };
        let _guard = tch::no_grad_guard();
        let mut flat = self.p.flat.range((0, self.p.flat.len()));
        pg.broadcast(&mut flat, 0)
    }

    /// This rank's local batch under the current plan.
    fn local_batch(&self) -> u32 {
        self.plan
            .batch_sizes
            .get(self.cfg.dist.rank)
            .copied()
            .unwrap_or(0)
    }

    /// This rank's share b_r / B of the global batch.
    fn share(&self) -> f64 {
        f64::from(self.local_batch()) / f64::from(self.plan.global_batch_size.max(1))
    }

    /// Bare-metal balancing: profiles are gathered once; rank 0 decides.
    fn start_local_balancer(&mut self) -> Result<()> {
        if self.cfg.plan.balancer != BalancerMode::Local {
            return Ok(());
        }
        let profiles = local_balance::gather_profiles(self.pg, self.p.hw_profile.as_ref())?;
        if self.cfg.dist.rank == 0 {
            let cfg = self.cfg;
            let mut lb = LocalBalancer::new(
                &cfg.plan,
                cfg.optim.batch_size,
                cfg.model.min_local_batch(),
                cfg.dist.world_size,
            )?;
            lb.observe_profiles(&profiles);
            if profiles.iter().all(Option::is_some) {
                self.pending = lb.round(&[], &self.plan);
            }
            self.balancer = Some(lb);
        }
        Ok(())
    }

    /// The whole optimizer state, named per parameter. Collective under a
    /// sharded layout (pass the group); `None` reads this rank's own state,
    /// which is whole before the first step.
    fn whole_optimizer_state(&self, pg: Option<&ProcessGroup>) -> Result<Named> {
        let (flat, rank) = (&self.p.flat, self.cfg.dist.rank);
        let whole = self.opt.gather(pg, rank, &self.layout, flat.len())?;
        Ok(self.opt.named(&whole, flat, &self.p.param_names))
    }

    /// A checkpoint of the current state. Every rank calls it at the same
    /// step (the optimizer state is gathered from its owners); rank 0 writes.
    fn save(&self) -> Result<()> {
        let optimizer = self.whole_optimizer_state(self.pg)?;
        let Some(dir) = self
            .cfg
            .output
            .checkpoint_dir
            .as_ref()
            .filter(|_| self.cfg.dist.rank == 0)
        else {
            return Ok(());
        };
        checkpoint::save(
            dir,
            &Snapshot {
                step: self.step,
                position: self.pos,
                seed: self.cfg.optim.seed,
                shuffle: !self.cfg.data.no_shuffle,
                optimizer_steps: self.opt.steps,
                plan: &self.plan,
                model: &self.p.model_name,
                fingerprint: &self.p.fingerprint,
                weights: &self.p.all_vars,
                optimizer: &optimizer,
            },
        )?;
        Ok(())
    }

    /// The end of the run: buffers agreed, a last checkpoint, the weights.
    fn finish(mut self) -> Result<RunSummary> {
        self.words.drain(self.cfg.dist.rank)?;
        epoch::agree_buffers(&self.cfg.model, self.pg, &self.p.all_vars, self.share())?;
        self.save()?;
        self.p.mx.set_finished();
        if self.cfg.dist.rank == 0 {
            let out = &self.cfg.output.output_dir;
            write_weights(&out.join("model.safetensors"), &self.p.all_vars)?;
            if let Some(s) = self.p.model.scripted() {
                // The module itself, with the trained parameters.
                s.save(&out.join("model.pt"), self.p.flat.kind())?;
            }
        }
        if let Some(pg) = self.pg {
            pg.barrier()?;
        }
        Ok(RunSummary {
            steps: self.step,
            stopped_by_signal: self.stopped,
            last_eval_accuracy: self.last_acc,
        })
    }
}

/// DDP's first bucket: small, so that the exchange starts early in
/// backward.
const DDP_FIRST_BUCKET_BYTES: usize = 1 << 20;

/// The Reducer's first bucket: `--first-bucket-mib` where given; else
/// DDP's 1 MiB on a team with a CUDA rank (there the exchange runs beside
/// the GPU, so starting it early pays), and on a CPU-only team the size
/// of the other buckets: there the exchange takes CPU from backward on the
/// same cores, and one message fewer a step measured faster (see
/// docs/design.md). Never larger than `bucket`.
fn first_bucket_bytes(explicit_mib: Option<u64>, bucket: usize, any_cuda: bool) -> usize {
    let wanted = match explicit_mib {
        Some(mib) => usize::try_from(mib)
            .unwrap_or(usize::MAX)
            .saturating_mul(1 << 20),
        None if any_cuda => DDP_FIRST_BUCKET_BYTES,
        None => bucket,
    };
    wanted.min(bucket)
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

#[cfg(test)]
mod tests {
    use super::first_bucket_bytes;

    const MIB: usize = 1 << 20;

    #[test]
    fn the_first_bucket_is_small_only_beside_a_cuda_rank_unless_asked() {
        // CPU-only team: the first bucket is as large as the others.
        assert_eq!(first_bucket_bytes(None, 25 * MIB, false), 25 * MIB);
        // A CUDA rank in the team: DDP's 1 MiB.
        assert_eq!(first_bucket_bytes(None, 25 * MIB, true), MIB);
        // Asked for: that size, on either team.
        assert_eq!(first_bucket_bytes(Some(4), 25 * MIB, false), 4 * MIB);
        assert_eq!(first_bucket_bytes(Some(4), 25 * MIB, true), 4 * MIB);
        // Never above the other buckets.
        assert_eq!(first_bucket_bytes(Some(64), 8 * MIB, false), 8 * MIB);
        assert_eq!(first_bucket_bytes(None, MIB / 2, true), MIB / 2);
    }
}
