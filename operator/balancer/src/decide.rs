//! [`Balancer::decide`]: the rules that turn the ranks' models into the
//! next plan — bounds, the current plan's validity, the best membership
//! ([`crate::subset`]), hysteresis and damping — and the reason text.

use std::fmt::Write as _;

use crate::decision::{gain_percent, list, noise_margin_percent, ranks_named};
use crate::policy::{policy_models, seed_models};
use crate::split::max_step;
use crate::subset::{self, secs};
use crate::{Balancer, BalancerError, Decision, Policy, StepModel};

impl Balancer {
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
        // Rank 0 writes checkpoints: it always trains.
        if let (Some(lo), Some(&hi)) = (lower.first_mut(), upper.first()) {
            *lo = (*lo).max(1).min(hi);
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
        let policy = self.config.policy;
        (0..n).find_map(|r| match current[r] {
            0 if r > 0 && self.leaves_out() => None,
            0 if r > 0 => Some(format!(
                "rank {r} is left out (batch 0), but {}",
                if policy.measures() {
                    "leaveOutSlowRanks is off".to_string()
                } else {
                    format!("{policy} never leaves ranks out")
                }
            )),
            b if b < lower[r] || b > upper[r] => Some(format!(
                "rank {r}'s batch {b} is outside [{}, {}]",
                lower[r], upper[r]
            )),
            _ => None,
        })
    }

    /// Whether this balancer may leave ranks out.
    fn leaves_out(&self) -> bool {
        self.config.leave_out_slow_ranks && self.config.policy.measures()
    }

    /// Decides the next plan given the `current` one (pass `&[]` for the
    /// initial plan). A current plan of the wrong length or sum, or outside
    /// the bounds, is replaced unconditionally; otherwise a new plan is only
    /// returned when it beats the current one by `minGainPercent` (plus a
    /// noise margin). Measurement policies may leave slow ranks out (batch
    /// 0) and re-admit them for measurement after `readmitAfterDecisions`
    /// decisions, see [`crate::subset`].
    ///
    /// Errors: no ranks, or no feasible split (typed, with the numbers).
    pub fn decide(&mut self, current: &[u32]) -> Result<Decision, BalancerError> {
        if self.ranks.is_empty() {
            return Err(BalancerError::NoRanks);
        }
        let cfg = self.config.clone();
        let n = self.ranks.len();
        let problem = self.current_problem(current);
        let cur = problem.is_none().then_some(current);
        for (i, r) in self.ranks.iter_mut().enumerate() {
            // A left-out rank trains no samples: its silence is expected.
            let left_out = cur.is_some_and(|c| c[i] == 0);
            if !r.reported_since_decision && r.ever_reported() && !left_out {
                r.missed_decisions = r.missed_decisions.saturating_add(1);
            }
        }
        if let Some(c) = cur {
            subset::count_left_out(&mut self.ranks, c);
        }
        let stale: Vec<usize> = (0..n)
            .filter(|&i| self.ranks[i].is_stale(cfg.stale_after_decisions))
            .collect();
        let stragglers: Vec<usize> = (0..n)
            .filter(|&i| self.ranks[i].refits_since_decision > 0)
            .collect();
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
        let no_data = pm.known == 0 && cfg.policy.measures();
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
            left_out: Vec::new(),
        };
        if no_data && cur.is_some() {
            out.reason = format!(
                "{}: no measurements yet; keeping the current plan",
                cfg.policy
            );
            return Ok(self.finish(out, cur));
        }

        let unknown = n - pm.known;
        let unknown_note = if unknown > 0 && cfg.policy != Policy::Static {
            format!("; {unknown} rank(s) without data use the median model")
        } else {
            String::new()
        };
        // Who is due back for measurement, and who may be left out: never
        // rank 0, a stale rank, a rank without data of its own, or one whose
        // measurement after a re-admission is not in yet.
        let mut readmit = match cur {
            Some(c) if self.leaves_out() => {
                subset::due_for_readmission(&self.ranks, c, &out.stale_ranks, &cfg)
            }
            _ => Vec::new(),
        };
        let eligible: Vec<usize> = if self.leaves_out() {
            (1..n)
                .filter(|&r| pm.has_data[r] && !out.stale_ranks.contains(&r))
                .filter(|&r| !readmit.contains(&r) && !subset::on_open_trial(&self.ranks[r], &cfg))
                .collect()
        } else {
            Vec::new()
        };
        let current_out: Vec<usize> =
            cur.map_or_else(Vec::new, |c| (1..n).filter(|&r| c[r] == 0).collect());
        let margin = cfg.leave_out_margin_percent;
        let choice = subset::choose(
            split_models,
            cfg.global_batch_size,
            &lower,
            &upper,
            &eligible,
            &current_out,
            margin,
        )?;
        let leave_out_note = choice.leave_out_note(split_models, &lower, margin);
        let mut plan = choice.batches;
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
            push_note(&mut out.reason, &leave_out_note);
            return Ok(self.finish(out, None));
        };
        // Only those the plan has room for come back now; the others wait.
        readmit.retain(|&r| plan[r] > 0);
        if !readmit.is_empty() {
            out.reason = self.readmission_reason(&readmit, &plan, predicted);
            subset::start_trials(&mut self.ranks, &readmit);
            push_note(&mut out.reason, &leave_out_note);
            out.gain_percent = gain_percent(current_pred, predicted);
            out.plan = Some(plan);
            return Ok(self.finish(out, Some(cur)));
        }
        if plan == cur {
            out.reason = format!("{}: the current plan is already optimal", cfg.policy);
            return Ok(self.finish(out, Some(cur)));
        }
        let gain = gain_percent(current_pred, predicted);
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
                let margin = noise_margin_percent(pm.relative_error, n);
                let threshold = f64::from(cfg.min_gain_percent) + margin;
                if gain <= 0.0 || gain < threshold {
                    out.reason = format!(
                        "{}: predicted gain {gain:.1}% is below minGainPercent {}% + {margin:.1}% noise margin; keeping the current plan",
                        cfg.policy, cfg.min_gain_percent
                    );
                    return Ok(self.finish(out, Some(cur)));
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
                    let global = cfg.global_batch_size;
                    if let Some(damped) = subset::damp(cur, &plan, alpha, global, &lower, &upper) {
                        if damped == cur {
                            out.reason = format!(
                                "{}: damped move ({:.0}% of the way, young measurements) rounds to the current plan",
                                cfg.policy,
                                alpha * 100.0
                            );
                            return Ok(self.finish(out, Some(cur)));
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
        out.gain_percent = gain_percent(current_pred, predicted);
        out.reason = reason;
        out.reason.push_str(&unknown_note);
        push_note(&mut out.reason, &leave_out_note);
        let back: Vec<usize> = current_out.into_iter().filter(|&r| plan[r] > 0).collect();
        for r in back {
            let b = plan[r];
            let _ = write!(
                out.reason,
                "; rank {r} re-admitted: its model predicts {} at batch {b}, within the {} step of the new plan, so including it pays",
                secs(predict_models[r].predict(b)),
                secs(predicted)
            );
        }
        out.plan = Some(plan);
        Ok(self.finish(out, Some(cur)))
    }

    /// Why `readmit` (left-out ranks whose wait is over) are back in `plan`.
    fn readmission_reason(&self, readmit: &[usize], plan: &[u32], predicted: f64) -> String {
        let cfg = &self.config;
        let mut s = format!("{}: ", cfg.policy);
        for (i, &r) in readmit.iter().enumerate() {
            let rank = &self.ranks[r];
            let doubled = (rank.readmit_factor * 2).min(crate::config::MAX_READMIT_FACTOR);
            let _ = write!(
                s,
                "{}rank {r} re-admitted with batch {} to be measured again after {} decisions left out (readmitAfterDecisions {}); if fresh measurements leave it out again, it waits {} decisions",
                if i > 0 { "; " } else { "" },
                plan.get(r).copied().unwrap_or(0),
                rank.out_decisions,
                cfg.readmit_after_decisions,
                cfg.readmit_after_decisions.saturating_mul(doubled)
            );
        }
        let _ = write!(s, "; predicted step {}", secs(predicted));
        s
    }

    /// Settles the leave-out bookkeeping for the plan to run (the new one,
    /// else `current`), appends left-out/straggler/stale notes and clears
    /// the per-decision counters.
    fn finish(&mut self, mut d: Decision, current: Option<&[u32]>) -> Decision {
        let decided: Vec<u32> = match (&d.plan, current) {
            (Some(p), _) => p.clone(),
            (None, Some(c)) => c.to_vec(),
            (None, None) => Vec::new(),
        };
        d.left_out = (0..decided.len()).filter(|&r| decided[r] == 0).collect();
        let notes = subset::settle(&mut self.ranks, &decided, &self.config);
        d.reason.push_str(&notes);
        if d.plan.is_none() && !d.left_out.is_empty() {
            let _ = write!(d.reason, "; left out: {}", ranks_named(&d.left_out));
            let next = d
                .left_out
                .iter()
                .filter(|r| !d.stale_ranks.contains(r))
                .filter_map(|&r| self.ranks.get(r))
                .map(|r| subset::readmit_wait(r, &self.config).saturating_sub(r.out_decisions))
                .min();
            if let Some(k) = next {
                let _ = write!(
                    d.reason,
                    " (next re-admission for measurement in {k} decisions)"
                );
            }
        }
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

/// Appends `; note` unless `note` is empty.
fn push_note(reason: &mut String, note: &str) {
    if !note.is_empty() {
        reason.push_str("; ");
        reason.push_str(note);
    }
}
