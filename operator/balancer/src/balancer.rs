//! The stateful balancer: collects profiles and live measurements per rank;
//! [`Balancer::decide`] (in `decide.rs`) turns them into
//! [`crate::Decision`]s, applying hysteresis, damping, straggler and
//! staleness rules on top of the optimal split, and leaving out ranks that
//! only slow the step down ([`crate::subset`]).

use crate::measured::Measured;
use crate::model::{fit_profile, valid_sample, PushOutcome};
use crate::policy::{best_estimate, live_fixed};
use crate::rank::RankState;
use crate::{balance_quality, BalancerConfig, BalancerError, Quality, StepModel};

mod links;
mod smoothed;

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
