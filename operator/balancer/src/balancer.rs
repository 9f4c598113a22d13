//! The stateful balancer: collects profiles and live measurements per rank;
//! [`Balancer::decide`] (in `decide.rs`) turns them into
//! [`crate::Decision`]s, applying hysteresis, damping, straggler and
//! staleness rules on top of the optimal split, and leaving out ranks that
//! only slow the step down ([`crate::subset`]).

use crate::exchange::{self, Link};
use crate::measured::Measured;
use crate::model::{fit_profile, valid_sample, PushOutcome};
use crate::policy::{best_estimate, live_fixed};
use crate::rank::RankState;
use crate::{balance_quality, BalancerConfig, BalancerError, Quality, StepModel};

/// Balancer for one job. Pure: no I/O, no clock; call `observe_*` as data
/// arrives and [`Balancer::decide`] every rebalance interval.
#[derive(Debug, Clone)]
pub struct Balancer {
    pub(crate) config: BalancerConfig,
    pub(crate) ranks: Vec<RankState>,
    pub(crate) measured: Measured,
    /// Bytes of gradient each step exchanges (see [`crate::exchange`]).
    pub(crate) gradient_bytes: Option<f64>,
}

impl Balancer {
    /// A balancer for `world_size` ranks. Errors when the config is invalid.
    pub fn new(config: BalancerConfig, world_size: usize) -> Result<Self, BalancerError> {
        config.validate()?;
        let ranks = (0..world_size)
            .map(|_| RankState::new(config.window))
            .collect();
        Ok(Balancer {
            config,
            ranks,
            measured: Measured::default(),
            gradient_bytes: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BalancerConfig {
        &self.config
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.ranks.len()
    }

    /// Adds a rank at the end (a rank joining the job); returns its index.
    /// The next [`Balancer::decide`] must be given a plan of the old length,
    /// which forces a new plan.
    pub fn add_rank(&mut self) -> usize {
        self.ranks.push(RankState::new(self.config.window));
        self.ranks.len() - 1
    }

    /// Forgets everything about `rank` (its pod moved to another device).
    pub fn reset_rank(&mut self, rank: usize) -> Result<(), BalancerError> {
        let window = self.config.window;
        *self.rank_mut(rank)? = RankState::new(window);
        if self.measured.trial.is_some_and(|t| t.rank == rank) {
            self.measured.trial = None;
        }
        Ok(())
    }

    fn rank_mut(&mut self, rank: usize) -> Result<&mut RankState, BalancerError> {
        let world_size = self.ranks.len();
        self.ranks
            .get_mut(rank)
            .ok_or(BalancerError::RankOutOfRange { rank, world_size })
    }

    /// Start-up profile of `rank`: `(batch, seconds)` at probe batch sizes
    /// and the largest batch that fits in memory. Returns the fitted model;
    /// errors (and keeps the old profile) when no point is usable.
    pub fn observe_profile(
        &mut self,
        rank: usize,
        points: &[(u32, f64)],
        max_batch: u32,
    ) -> Result<StepModel, BalancerError> {
        let r = self.rank_mut(rank)?;
        r.cap = Some(max_batch);
        let model = fit_profile(points).ok_or_else(|| BalancerError::InvalidSample {
            rank,
            reason: format!("none of {} profile points is usable", points.len()),
        })?;
        r.profile = Some(model);
        r.profile_trusted = true;
        Ok(model)
    }

    /// Sets `rank`'s memory cap (largest local batch that fits).
    pub fn set_max_batch(&mut self, rank: usize, max_batch: u32) -> Result<(), BalancerError> {
        self.rank_mut(rank)?.cap = Some(max_batch);
        Ok(())
    }

    /// One live step of `rank`: its local batch and compute seconds
    /// (excluding the all-reduce wait). Bad samples are rejected and ignored.
    pub fn observe_step(
        &mut self,
        rank: usize,
        batch: u32,
        compute_seconds: f64,
    ) -> Result<(), BalancerError> {
        let (factor, patience) = (self.config.straggler_factor, self.config.straggler_patience);
        let plan_batch = self.measured.plan.as_ref().map(|p| p.get(rank).copied());
        let r = self.rank_mut(rank)?;
        if !valid_sample(batch, compute_seconds) {
            return Err(BalancerError::InvalidSample {
                rank,
                reason: format!("batch {batch}, compute seconds {compute_seconds}"),
            });
        }
        if plan_batch.is_none_or(|b| b == Some(batch)) {
            r.compute_time.0 += compute_seconds;
            r.compute_time.1 = r.compute_time.1.saturating_add(1);
        }
        let fixed = live_fixed(r);
        let reference = r.live.last_model().or(r.profile);
        if r.live
            .push(batch, compute_seconds, reference, fixed, factor, patience)
            == PushOutcome::Refitted
        {
            r.refits_since_decision += 1;
            r.profile_trusted = false;
            // A new level of compute: the spread seen while it set in (its
            // first slow steps against the old ones) is no jitter of the new
            // level, and falling slowly it would hold the rank's share down
            // for many decisions. The next figure starts it afresh.
            r.spread = None;
        }
        if let Some(n) = r.trial_samples.as_mut() {
            *n = n.saturating_add(1);
        }
        r.reported_since_decision = true;
        r.left_out = false;
        r.marked_missing = false;
        r.missed_decisions = 0;
        r.last_batch = Some(batch);
        r.last_seconds = Some(compute_seconds);
        Ok(())
    }

    /// One live measurement of `rank`'s exposed communication per step
    /// (seconds of the step not spent computing: waiting for peers and the
    /// exchanges themselves), smoothed exponentially.
    pub fn observe_communication(
        &mut self,
        rank: usize,
        seconds: f64,
    ) -> Result<(), BalancerError> {
        let r = self.rank_mut(rank)?;
        let seconds = non_negative(rank, seconds, "communication seconds")?;
        r.communication = Some(smooth(
            r.communication,
            seconds,
            COMMUNICATION_SMOOTHING,
            COMMUNICATION_SMOOTHING,
        ));
        Ok(())
    }

    /// How far `rank`'s slow steps' compute runs over its typical one (the
    /// trainer's 90th percentile minus median of recent steps), smoothed
    /// exponentially: up fast, down slowly. A synchronous step waits for
    /// the slowest rank of *that* step, so the live policies (dynamic,
    /// hybrid) plan each rank at its typical compute plus this spread
    /// (weighted by [`crate::spread_weight`]): a rank whose compute
    /// jumps (a CPU quota's next period) gets fewer samples than its mean
    /// alone would give it, and holds the others up less often. Errors
    /// when `seconds` is not finite and ≥ 0.
    pub fn observe_compute_spread(
        &mut self,
        rank: usize,
        seconds: f64,
    ) -> Result<(), BalancerError> {
        let r = self.rank_mut(rank)?;
        let seconds = non_negative(rank, seconds, "compute spread seconds")?;
        r.spread = Some(smooth(r.spread, seconds, SPREAD_RISE, SPREAD_FALL));
        Ok(())
    }

    /// The share of its CPU quota `rank` used over a recent interval (CPU
    /// time over the quota's allowance; 1 = every period's quota spent),
    /// smoothed exponentially. A rank saturated on its quota cannot run
    /// faster, whatever it waits for: when it is also the slowest per
    /// sample and trains few samples, a leave-out trial needs no excess of
    /// the measured step over the predicted one (see `measured.rs`).
    /// Errors when `ratio` is not finite and ≥ 0.
    pub fn observe_quota_use(&mut self, rank: usize, ratio: f64) -> Result<(), BalancerError> {
        let r = self.rank_mut(rank)?;
        let ratio = non_negative(rank, ratio, "CPU quota use")?;
        r.quota_use = Some(smooth(
            r.quota_use,
            ratio,
            QUOTA_USE_SMOOTHING,
            QUOTA_USE_SMOOTHING,
        ));
        Ok(())
    }

    /// One measured wall-clock step of `rank` at local batch `batch`: its
    /// compute plus its exposed communication, the whole synchronous step
    /// as it saw it (an average over several steps is one sample). The
    /// live policies compare these between memberships to leave out a rank
    /// whose cost the compute models do not show (leave-out trials).
    /// Counted only when `batch` is the rank's batch in the plan decided
    /// last (a sample of another plan is ignored); errors when `seconds` is
    /// not finite and > 0 or `batch` is 0.
    pub fn observe_step_time(
        &mut self,
        rank: usize,
        batch: u32,
        seconds: f64,
    ) -> Result<(), BalancerError> {
        let plan_batch = self.measured.plan.as_ref().map(|p| p.get(rank).copied());
        let r = self.rank_mut(rank)?;
        if !valid_sample(batch, seconds) {
            return Err(BalancerError::InvalidSample {
                rank,
                reason: format!("batch {batch}, step seconds {seconds}"),
            });
        }
        if plan_batch.is_none_or(|b| b == Some(batch)) {
            r.step_time.0 += seconds;
            r.step_time.1 = r.step_time.1.saturating_add(1);
        }
        Ok(())
    }

    /// The communication per step that no split removes: the smallest
    /// smoothed exposed communication over the ranks that train (not those
    /// left out of the last decided plan). Under a balanced
    /// plan the rank on the critical path waits for nobody, so what it
    /// reports is the exchange itself; the others add their waiting on
    /// top. Before any live measurement, the exchange the start-up figures
    /// predict for those ranks ([`Balancer::observe_link`]); else 0.
    pub fn communication_seconds(&self) -> f64 {
        self.live_communication()
            .or_else(|| Some(self.exchange()?.seconds(&self.members())))
            .unwrap_or(0.0)
    }

    /// The smallest smoothed exposed communication over the ranks that
    /// train.
    fn live_communication(&self) -> Option<f64> {
        self.ranks
            .iter()
            .filter(|r| !r.left_out)
            .filter_map(|r| r.communication)
            .reduce(f64::min)
    }

    /// 1 for each rank that trains (not left out of the last plan), else 0.
    fn members(&self) -> Vec<u32> {
        self.ranks.iter().map(|r| u32::from(!r.left_out)).collect()
    }

    /// Start-up communication figures of `rank`: the seconds of a small
    /// all-reduce and the bytes/s of its slowest link (rank to rank, else
    /// the group's all-reduce bus bandwidth). With every rank's figures and
    /// [`Balancer::set_gradient_bytes`], the balancer predicts each
    /// membership's gradient exchange (see `exchange.rs`): the
    /// communication it reports before live measurements, and, once the
    /// live exposed communication calibrated it, a term of the step when
    /// it chooses which ranks train.
    pub fn observe_link(
        &mut self,
        rank: usize,
        latency_seconds: f64,
        bandwidth_bytes_per_second: f64,
    ) -> Result<(), BalancerError> {
        let r = self.rank_mut(rank)?;
        if !(latency_seconds.is_finite()
            && latency_seconds >= 0.0
            && bandwidth_bytes_per_second.is_finite()
            && bandwidth_bytes_per_second > 0.0)
        {
            return Err(BalancerError::InvalidSample {
                rank,
                reason: format!(
                    "latency {latency_seconds} s, link bandwidth {bandwidth_bytes_per_second} B/s"
                ),
            });
        }
        r.link = Some(Link {
            latency_seconds,
            bandwidth_bytes_per_second,
        });
        Ok(())
    }

    /// Bytes of gradient each step exchanges (the model's trainable
    /// parameters); 0 forgets it.
    pub fn set_gradient_bytes(&mut self, bytes: u64) {
        self.gradient_bytes = (bytes > 0).then_some(bytes as f64);
    }

    /// Seconds of the gradient exchange among the ranks that train under
    /// `batches` that the step exposes, as the start-up figures predict
    /// it (scaled by the exposed fraction measured live, once there is
    /// one); `None` until every rank's figures and the gradient size are
    /// known.
    pub fn predicted_exchange_seconds(&self, batches: &[u32]) -> Option<f64> {
        Some(self.exchange()?.seconds(batches))
    }

    /// The exchange model, when every rank has figures.
    /// Calibrated by the live exposed communication: with overlap only
    /// part of the exchange lengthens the step.
    pub(crate) fn exchange(&self) -> Option<exchange::Model> {
        let m = exchange::model(
            self.gradient_bytes,
            self.ranks.iter().map(|r| r.link).collect(),
        )?;
        Some(m.calibrated(self.live_communication(), &self.members()))
    }

    /// The caller knows `rank` stopped reporting: until it reports again it
    /// keeps its last batch and never gets more.
    pub fn observe_missing(&mut self, rank: usize) -> Result<(), BalancerError> {
        self.rank_mut(rank)?.marked_missing = true;
        Ok(())
    }

    /// `rank` answered but trained no samples: it is left out of the plan
    /// it runs. Not a step sample, but proof that it still reports (it is
    /// no longer missing, so it can be re-admitted).
    pub fn observe_idle(&mut self, rank: usize) -> Result<(), BalancerError> {
        self.rank_mut(rank)?.marked_missing = false;
        Ok(())
    }

    /// Seed formula input: GPU utilisation and memory use of `rank`, as
    /// fractions in [0, 1] (clamped; non-finite values are rejected).
    pub fn observe_utilisation(
        &mut self,
        rank: usize,
        gpu_util_frac: f64,
        mem_frac: f64,
    ) -> Result<(), BalancerError> {
        let r = self.rank_mut(rank)?;
        if !(gpu_util_frac.is_finite() && mem_frac.is_finite()) {
            return Err(BalancerError::InvalidSample {
                rank,
                reason: format!("utilisation {gpu_util_frac}, memory {mem_frac}"),
            });
        }
        r.utilisation = Some((gpu_util_frac.clamp(0.0, 1.0), mem_frac.clamp(0.0, 1.0)));
        Ok(())
    }

    /// Seed formula input: hardware compute score of `rank` (e.g. matmul
    /// FLOP/s from the profile); must be finite and > 0.
    pub fn observe_compute_score(&mut self, rank: usize, score: f64) -> Result<(), BalancerError> {
        let r = self.rank_mut(rank)?;
        if !(score.is_finite() && score > 0.0) {
            return Err(BalancerError::InvalidSample {
                rank,
                reason: format!("compute score {score}"),
            });
        }
        r.compute_score = Some(score);
        Ok(())
    }

    /// Balance quality of the latest reported compute times (ranks left out
    /// of the last decided plan have none).
    pub fn quality(&self) -> Quality {
        let last: Vec<f64> = self
            .ranks
            .iter()
            .filter(|r| !r.left_out)
            .filter_map(|r| r.last_seconds)
            .collect();
        balance_quality(&last)
    }

    /// The model the balancer currently believes for each rank (live fit,
    /// else profile; `None` without data).
    pub fn models(&mut self) -> Vec<Option<StepModel>> {
        self.ranks.iter_mut().map(best_estimate).collect()
    }
}

/// `seconds` when finite and ≥ 0, else the sample error for `rank`.
fn non_negative(rank: usize, seconds: f64, what: &str) -> Result<f64, BalancerError> {
    if seconds.is_finite() && seconds >= 0.0 {
        Ok(seconds)
    } else {
        Err(BalancerError::InvalidSample {
            rank,
            reason: format!("{what} {seconds}"),
        })
    }
}

/// Exponential smoothing of `new` into `old`, with weight `rise` for a
/// sample above the smoothed value and `fall` for one below.
fn smooth(old: Option<f64>, new: f64, rise: f64, fall: f64) -> f64 {
    match old {
        Some(old) if new >= old => old + rise * (new - old),
        Some(old) => old + fall * (new - old),
        None => new,
    }
}

/// Weights of a new spread sample above and below the smoothed one. A
/// rank's spread depends on its batch: the smaller batch its spread earns
/// it shows a smaller spread (in the bench a 0.15-core rank's p90 − median
/// was 27.8 ms at 10 samples, 13.9 ms at 4), and a spread that fell as
/// fast as it rose would follow it down and hand samples back. With
/// symmetric smoothing that bench run went [62, 46, 16, 4] → [51, 41, 21,
/// 15] after nine seconds, at two thirds of the rate.
const SPREAD_RISE: f64 = 0.5;
const SPREAD_FALL: f64 = 0.05;

/// Weight of a new communication sample in the smoothed estimate.
const COMMUNICATION_SMOOTHING: f64 = 0.3;
/// Weight of a new CPU quota use sample.
const QUOTA_USE_SMOOTHING: f64 = 0.5;
