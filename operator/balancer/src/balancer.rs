//! The stateful balancer: collects profiles and live measurements per rank
//! and turns them into [`Decision`]s, applying hysteresis, damping,
//! straggler and staleness rules on top of the optimal split.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::model::{fit_profile, valid_sample, PushOutcome};
use crate::policy::{best_estimate, live_fixed, policy_models, seed_models};
use crate::rank::RankState;
use crate::split::{max_step, optimal_split_bounded, round_to_sum};
use crate::{balance_quality, BalancerConfig, BalancerError, Policy, Quality, StepModel};

/// Outcome of one balancing round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// The new plan, or `None` to keep the current one.
    pub plan: Option<Vec<u32>>,
    /// Predicted step (compute) seconds of the best plan found — the new
    /// plan when `plan` is `Some`, else the candidate that was turned down
    /// (equal to the current prediction when nothing better exists).
    pub predicted_step_seconds: f64,
    /// Predicted step seconds of the current plan (0 when it is unusable).
    pub current_predicted_step_seconds: f64,
    /// `100 · (current − predicted) / current` (0 when not computable).
    pub gain_percent: f64,
    /// Why, in one line, for Events and status.
    pub reason: String,
    /// The policy that decided.
    pub policy: Policy,
    /// Ranks re-fitted fast since the previous decision (stragglers, or
    /// ranks that recovered).
    pub stragglers: Vec<usize>,
    /// Ranks that stopped reporting; each kept its last batch.
    pub stale_ranks: Vec<usize>,
    /// Communication per step no split removes (seconds; 0 before any
    /// measurement), see [`Balancer::communication_seconds`]. The step
    /// achievable under a plan is its predicted compute step plus this.
    #[serde(default)]
    pub communication_seconds: f64,
}

impl Decision {
    /// The plan to run: the new one if any, else `current`.
    pub fn batches_or<'a>(&'a self, current: &'a [u32]) -> &'a [u32] {
        self.plan.as_deref().unwrap_or(current)
    }
}

/// Balancer for one job. Pure: no I/O, no clock; call `observe_*` as data
/// arrives and [`Balancer::decide`] every rebalance interval.
#[derive(Debug, Clone)]
pub struct Balancer {
    config: BalancerConfig,
    ranks: Vec<RankState>,
}

impl Balancer {
    /// A balancer for `world_size` ranks. Errors when the config is invalid.
    pub fn new(config: BalancerConfig, world_size: usize) -> Result<Self, BalancerError> {
        config.validate()?;
        let ranks = (0..world_size)
            .map(|_| RankState::new(config.window))
            .collect();
        Ok(Balancer { config, ranks })
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
        let r = self.rank_mut(rank)?;
        if !valid_sample(batch, compute_seconds) {
            return Err(BalancerError::InvalidSample {
                rank,
                reason: format!("batch {batch}, compute seconds {compute_seconds}"),
            });
        }
        let fixed = live_fixed(r);
        let reference = r.live.last_model().or(r.profile);
        if r.live
            .push(batch, compute_seconds, reference, fixed, factor, patience)
            == PushOutcome::Refitted
        {
            r.refits_since_decision += 1;
            r.profile_trusted = false;
        }
        r.reported_since_decision = true;
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
        if !seconds.is_finite() || seconds < 0.0 {
            return Err(BalancerError::InvalidSample {
                rank,
                reason: format!("communication seconds {seconds}"),
            });
        }
        r.communication = Some(match r.communication {
            Some(old) => old + COMMUNICATION_SMOOTHING * (seconds - old),
            None => seconds,
        });
        Ok(())
    }

    /// The communication per step that no split removes: the smallest
    /// smoothed exposed communication over the ranks. Under a balanced
    /// plan the rank on the critical path waits for nobody, so what it
    /// reports is the exchange itself; the others add their waiting on
    /// top. 0 before any measurement.
    pub fn communication_seconds(&self) -> f64 {
        self.ranks
            .iter()
            .filter_map(|r| r.communication)
            .fold(None, |m: Option<f64>, c| Some(m.map_or(c, |m| m.min(c))))
            .unwrap_or(0.0)
    }

    /// The caller knows `rank` stopped reporting: until it reports again it
    /// keeps its last batch and never gets more.
    pub fn observe_missing(&mut self, rank: usize) -> Result<(), BalancerError> {
        self.rank_mut(rank)?.marked_missing = true;
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

    /// Balance quality of the latest reported compute times.
    pub fn quality(&self) -> Quality {
        let last: Vec<f64> = self.ranks.iter().filter_map(|r| r.last_seconds).collect();
        balance_quality(&last)
    }

    /// The model the balancer currently believes for each rank (live fit,
    /// else profile; `None` without data).
    pub fn models(&mut self) -> Vec<Option<StepModel>> {
        self.ranks.iter_mut().map(best_estimate).collect()
    }

    /// Per-rank bounds `(lower, upper)`; stale ranks are pinned to their
    /// current batch (or capped at their last batch).
    fn bounds(&self, current: Option<&[u32]>, stale: &[usize]) -> (Vec<u32>, Vec<u32>) {
        let c = &self.config;
        let global = c.global_batch_size;
        let mut lower = Vec::with_capacity(self.ranks.len());
        let mut upper = Vec::with_capacity(self.ranks.len());
        for r in &self.ranks {
            let hi = r
                .cap
                .unwrap_or(global)
                .min(c.max_local_batch.unwrap_or(global))
                .min(global);
            lower.push(c.min_local_batch);
            upper.push(hi);
        }
        for &s in stale {
            match current {
                Some(cur) => {
                    lower[s] = cur[s];
                    upper[s] = cur[s];
                }
                None => {
                    if let Some(b) = self.ranks[s].last_batch {
                        upper[s] = upper[s].min(b);
                        lower[s] = lower[s].min(upper[s]);
                    }
                }
            }
        }
        (lower, upper)
    }

    /// Why `current` cannot be kept, if it cannot.
    fn current_problem(&self, current: &[u32]) -> Option<String> {
        let n = self.ranks.len();
        if current.len() != n {
            return Some(format!(
                "current plan has {} entries for {n} ranks",
                current.len()
            ));
        }
        let sum: u64 = current.iter().map(|&b| u64::from(b)).sum();
        if sum != u64::from(self.config.global_batch_size) {
            return Some(format!(
                "current plan sums to {sum}, not the global batch {}",
                self.config.global_batch_size
            ));
        }
        let (lower, upper) = self.bounds(None, &[]);
        (0..n)
            .find(|&r| current[r] < lower[r] || current[r] > upper[r])
            .map(|r| {
                format!(
                    "rank {r}'s batch {} is outside [{}, {}]",
                    current[r], lower[r], upper[r]
                )
            })
    }

    /// Decides the next plan given the `current` one (pass `&[]` for the
    /// initial plan). A current plan of the wrong length or sum, or outside
    /// the bounds, is replaced unconditionally; otherwise a new plan is only
    /// returned when it beats the current one by `minGainPercent`.
    ///
    /// Errors: no ranks, or no feasible split (typed, with the numbers).
    pub fn decide(&mut self, current: &[u32]) -> Result<Decision, BalancerError> {
        if self.ranks.is_empty() {
            return Err(BalancerError::NoRanks);
        }
        let cfg = self.config.clone();
        for r in &mut self.ranks {
            if !r.reported_since_decision && r.ever_reported() {
                r.missed_decisions = r.missed_decisions.saturating_add(1);
            }
        }
        let stale: Vec<usize> = (0..self.ranks.len())
            .filter(|&i| self.ranks[i].is_stale(cfg.stale_after_decisions))
            .collect();
        let stragglers: Vec<usize> = (0..self.ranks.len())
            .filter(|&i| self.ranks[i].refits_since_decision > 0)
            .collect();
        let problem = self.current_problem(current);
        let cur = problem.is_none().then_some(current);
        let (lower, upper) = self.bounds(cur, &stale);

        let pm = policy_models(cfg.policy, &mut self.ranks, cfg.prior_weight, cfg.window);
        // Predictions use the policy's models, except where the policy has
        // none of its own (static, seed formula): then the best estimate.
        let best = matches!(cfg.policy, Policy::Static | Policy::SeedFormula)
            .then(|| policy_models(Policy::Hybrid, &mut self.ranks, 0.0, cfg.window).models);
        let predict_models: &[StepModel] = best.as_deref().unwrap_or(&pm.models);
        let seed = (cfg.policy == Policy::SeedFormula).then(|| seed_models(&self.ranks));
        let split_models: &[StepModel] = seed.as_deref().unwrap_or(&pm.models);

        let current_pred = cur.map_or(0.0, |c| max_step(predict_models, c));
        let no_data = pm.known == 0
            && matches!(
                cfg.policy,
                Policy::Proportional | Policy::Dynamic | Policy::Hybrid
            );
        let mut out = Decision {
            plan: None,
            predicted_step_seconds: current_pred,
            current_predicted_step_seconds: current_pred,
            gain_percent: 0.0,
            reason: String::new(),
            policy: cfg.policy,
            stragglers,
            stale_ranks: stale,
            communication_seconds: self.communication_seconds(),
        };
        if no_data && cur.is_some() {
            out.reason = format!(
                "{}: no measurements yet; keeping the current plan",
                cfg.policy
            );
            return Ok(self.finish(out));
        }

        let unknown = self.ranks.len() - pm.known;
        let unknown_note = if unknown > 0 && cfg.policy != Policy::Static {
            format!("; {unknown} rank(s) without data use the median model")
        } else {
            String::new()
        };
        let split = optimal_split_bounded(split_models, cfg.global_batch_size, &lower, &upper)?;
        let mut plan = split.batches;
        let mut predicted = max_step(predict_models, &plan);
        out.predicted_step_seconds = predicted;
        let Some(cur) = cur else {
            out.reason = format!(
                "{}: new plan because {}{}",
                cfg.policy,
                problem.unwrap_or_default(),
                if no_data {
                    " (no measurements yet: equal split)"
                } else {
                    ""
                }
            );
            out.plan = Some(plan);
            if !no_data {
                out.reason.push_str(&unknown_note);
            }
            return Ok(self.finish(out));
        };
        if plan == cur {
            out.reason = format!("{}: the current plan is already optimal", cfg.policy);
            return Ok(self.finish(out));
        }
        let gain = if current_pred > 0.0 {
            100.0 * (current_pred - predicted) / current_pred
        } else {
            0.0
        };
        out.gain_percent = gain;
        let mut reason = String::new();
        match cfg.policy {
            Policy::Static => {
                let _ = write!(reason, "static: back to the equal split");
            }
            Policy::SeedFormula => {
                let _ = write!(
                    reason,
                    "seed-formula: re-scored (predicted gain {gain:.1}%)"
                );
            }
            _ => {
                let margin = noise_margin_percent(pm.relative_error, self.ranks.len());
                let threshold = f64::from(cfg.min_gain_percent) + margin;
                if gain <= 0.0 || gain < threshold {
                    out.reason = format!(
                        "{}: predicted gain {gain:.1}% is below minGainPercent {}% + {margin:.1}% noise margin; keeping the current plan",
                        cfg.policy, cfg.min_gain_percent
                    );
                    return Ok(self.finish(out));
                }
                let _ = write!(
                    reason,
                    "{}: predicted step {predicted:.4}s vs {current_pred:.4}s now (gain {gain:.1}% ≥ minGainPercent {}% + {margin:.1}% noise margin)",
                    cfg.policy, cfg.min_gain_percent
                );
                let alpha = pm
                    .young
                    .iter()
                    .map(|&(_, n)| n as f64 / (cfg.window / 2).max(1) as f64)
                    .fold(1.0, f64::min)
                    .max(cfg.min_damping);
                if alpha < 1.0 {
                    let x: Vec<f64> = cur
                        .iter()
                        .zip(&plan)
                        .map(|(&c, &p)| f64::from(c) + alpha * (f64::from(p) - f64::from(c)))
                        .collect();
                    if let Some(damped) = round_to_sum(&x, cfg.global_batch_size, &lower, &upper) {
                        if damped == cur {
                            out.reason = format!(
                                "{}: damped move ({:.0}% of the way, young measurements) rounds to the current plan",
                                cfg.policy,
                                alpha * 100.0
                            );
                            return Ok(self.finish(out));
                        }
                        plan = damped;
                        predicted = max_step(predict_models, &plan);
                        let _ = write!(
                            reason,
                            "; damped to {:.0}% of the way (young measurements on {} rank(s))",
                            alpha * 100.0,
                            pm.young.len()
                        );
                    }
                }
            }
        }
        out.predicted_step_seconds = predicted;
        out.gain_percent = if current_pred > 0.0 {
            100.0 * (current_pred - predicted) / current_pred
        } else {
            0.0
        };
        out.reason = reason;
        out.plan = Some(plan);
        out.reason.push_str(&unknown_note);
        Ok(self.finish(out))
    }

    /// Appends straggler/stale notes, clears per-decision counters.
    fn finish(&mut self, mut d: Decision) -> Decision {
        if !d.stragglers.is_empty() {
            let _ = write!(d.reason, "; re-fitted fast: ranks {}", list(&d.stragglers));
        }
        if !d.stale_ranks.is_empty() {
            let _ = write!(
                d.reason,
                "; not reporting, kept at their batch: ranks {}",
                list(&d.stale_ranks)
            );
        }
        for r in &mut self.ranks {
            r.reported_since_decision = false;
            r.refits_since_decision = 0;
        }
        d
    }
}

/// Weight of a new communication sample in the smoothed estimate.
const COMMUNICATION_SMOOTHING: f64 = 0.3;

/// Part of a predicted gain that estimation noise alone would produce: the
/// current plan's predicted maximum is inflated by the largest of `n` model
/// errors, about `√(2 ln n)` standard errors, while the candidate's is not.
fn noise_margin_percent(relative_error: f64, n: usize) -> f64 {
    let n = n.max(2) as f64;
    let m = 100.0 * (2.0 * n.ln()).sqrt() * relative_error;
    if m.is_finite() {
        m.max(0.0)
    } else {
        0.0
    }
}

/// "1, 2, 3" (at most 8, then "+N more").
fn list(ranks: &[usize]) -> String {
    let mut s = ranks
        .iter()
        .take(8)
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if ranks.len() > 8 {
        let _ = write!(s, " +{} more", ranks.len() - 8);
    }
    s
}
