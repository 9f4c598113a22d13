//! [`Balancer::decide`]: the rules that turn the ranks' models into the
//! next plan — bounds, the current plan's validity, the best membership
//! ([`crate::subset`]), hysteresis and damping — and the reason text.

use std::fmt::Write as _;

use crate::decision::{gain_percent, noise_margin_percent};
use crate::measured::{self, Review, Trial};
use crate::policy::{policy_models, seed_models};
use crate::rules::{push_note, quota_note};
use crate::split::max_step;
use crate::subset::{self, secs};
use crate::{Balancer, BalancerError, Decision, Policy, StepModel};

impl Balancer {
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
        let mut bounds = self.bounds(cur, &stale);

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
            measured_step_seconds: 0.0,
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
        // The live policies also compare measured steps between memberships
        // (crate::measured): verdicts first, a new leave-out trial below.
        let live = self.leaves_out() && matches!(cfg.policy, Policy::Dynamic | Policy::Hybrid);
        let needed = subset::trial_samples_needed(&cfg);
        let measured = cur.filter(|_| live).and_then(|c| {
            measured::window_step(&self.ranks, self.measured.plan.as_deref(), c, needed)
        });
        out.measured_step_seconds = measured.unwrap_or(0.0);
        if let Some(c) = cur {
            subset::count_probes(&mut self.ranks, c, measured);
        }
        let previous_window = std::mem::replace(
            &mut self.measured.last_window,
            cur.zip(measured).map(|(c, w)| (c.to_vec(), w)),
        );
        let review = match cur {
            Some(c) if live => measured::review(
                &mut self.ranks,
                &mut self.measured,
                c,
                measured,
                &readmit,
                &cfg,
            ),
            _ => {
                self.measured.trial = None;
                Review::default()
            }
        };
        self.measured.note = review.note.clone();
        for &r in &review.held_out {
            bounds.hold_out(r);
        }
        let quota_held = self.hold_quota_bound(cur, &mut bounds);
        let eligible: Vec<usize> = if self.leaves_out() {
            (1..n)
                .filter(|&r| pm.has_data[r] && !out.stale_ranks.contains(&r))
                .filter(|&r| !readmit.contains(&r) && !subset::on_open_trial(&self.ranks[r], &cfg))
                .filter(|r| !review.held_out.contains(r) && !review.back.contains(r))
                .collect()
        } else {
            Vec::new()
        };
        let current_out: Vec<usize> =
            cur.map_or_else(Vec::new, |c| (1..n).filter(|&r| c[r] == 0).collect());
        let margin = cfg.leave_out_margin_percent;
        // Membership follows the exchange only once live measurements
        // calibrated how much of it the steps expose.
        let exchange = self.exchange().filter(|m| m.is_calibrated());
        // A plan's step with its exchange (compute alone without a model).
        let with_exchange = |compute: f64, batches: &[u32]| {
            compute + exchange.as_ref().map_or(0.0, |m| m.seconds(batches))
        };
        let choice = subset::choose(
            split_models,
            &bounds,
            &eligible,
            &current_out,
            margin,
            exchange.as_ref(),
        )?;
        let leave_out_note =
            choice.leave_out_note(split_models, &bounds.lower, margin, exchange.as_ref());
        let mut plan = choice.batches;
        let mut predicted = max_step(predict_models, &plan);
        out.predicted_step_seconds = predicted;
        let held_note = quota_note(&quota_held, &plan, &bounds.upper, predict_models, predicted);
        self.measured.add_note(&held_note);
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
        // Measured verdicts change membership whatever the compute models
        // predict: no hysteresis, no damping.
        let forced =
            review.back.iter().any(|&r| plan[r] > 0) || review.held_out.iter().any(|&r| cur[r] > 0);
        if !readmit.is_empty() || forced {
            out.reason = if readmit.is_empty() {
                format!("{}: predicted step {}", cfg.policy, secs(predicted))
            } else {
                self.readmission_reason(&readmit, &plan, predicted)
            };
            subset::start_trials(&mut self.ranks, &readmit, measured);
            push_note(&mut out.reason, &leave_out_note);
            out.gain_percent = gain_percent(
                with_exchange(current_pred, cur),
                with_exchange(predicted, &plan),
            );
            out.plan = Some(plan);
            return Ok(self.finish(out, Some(cur)));
        }
        // Compute comes first: a trial only once the split has settled —
        // the best split's predicted gain is below the hysteresis that a
        // re-split must clear (minGainPercent plus the noise margin, as
        // below): a split that will not move is as settled as it gets.
        let settled_split = gain_percent(
            with_exchange(current_pred, cur),
            with_exchange(predicted, &plan),
        ) < f64::from(cfg.min_gain_percent)
            + noise_margin_percent(pm.relative_error, n);
        let quiet = settled_split
            && !review.settled
            && self.measured.trial.is_none()
            && self.measured.cooldown == 0;
        let no_new_out = choice.left_out.iter().all(|r| current_out.contains(r));
        // No trial while a re-admitted rank's measurement is open (a stale
        // one's may never close: it does not block).
        let no_open = (0..n)
            .all(|r| !subset::on_open_trial(&self.ranks[r], &cfg) || out.stale_ranks.contains(&r));
        // Nor while a rank's compute runs ahead of its model (a slowdown
        // not yet re-fitted): the step's excess is then compute.
        let outrun = measured
            .filter(|_| quiet && no_new_out && no_open)
            .and_then(|_| measured::compute_outrun(&self.ranks, predict_models, cur, margin));
        if let Some(o) = outrun {
            self.measured.add_note(&measured::outrun_note(o, margin));
        }
        if let (Some(w), true) = (measured, quiet && no_new_out && no_open && outrun.is_none()) {
            let mut kept_out = bounds.clone();
            for &r in &current_out {
                kept_out.hold_out(r);
            }
            let models = measured::Models {
                split: split_models,
                predict: predict_models,
                global: cfg.global_batch_size,
            };
            let (pred, m) = (current_pred, margin);
            let start =
                measured::trial_start(&self.ranks, &models, &kept_out, cur, &eligible, w, pred, m)
                    .map_err(|note| {
                        if let Some(note) = note {
                            self.measured.add_note(&note);
                        }
                    })
                    .ok();
            // And only on an excess seen over two intervals in a row —
            // for a rank on a quota whose samples save less than the margin
            // (on either ground), two intervals at this plan, whatever the
            // first measured: a trial on a passing excess costs it no more
            // than its share, and on CPU quotas the step moves 10% between
            // intervals at one plan.
            let small_share = f64::from(m.min(100)) / 100.0;
            let start = match start.map(|t| {
                let steady = measured::steady(previous_window.as_ref(), cur, w, m);
                let cheap = t.cheap.is_some() || (t.quota_use.is_some() && t.margin < small_share);
                let steady = match steady {
                    Err(Some(_)) if cheap => Ok(()),
                    other => other,
                };
                (steady, t)
            }) {
                Some((Err(why), t)) => {
                    self.measured
                        .add_note(&measured::unsteady_note(t.rank, w, why, m));
                    None
                }
                other => other.map(|(_, t)| t),
            };
            if let Some(t) = start {
                let why = measured::trial_reason(&t, cur, w, pred, m);
                out.reason = format!("{}: {why}", cfg.policy);
                self.measured.trial = Some(Trial {
                    rank: t.rank,
                    with_seconds: w,
                    margin: t.margin,
                    decisions: 0,
                });
                out.predicted_step_seconds = t.predicted_seconds;
                out.gain_percent = gain_percent(current_pred, t.predicted_seconds);
                out.plan = Some(t.plan);
                return Ok(self.finish(out, Some(cur)));
            }
        }
        if plan == cur {
            out.reason = format!("{}: the current plan is already optimal", cfg.policy);
            return Ok(self.finish(out, Some(cur)));
        }
        let (step_now, step_new) = (
            with_exchange(current_pred, cur),
            with_exchange(predicted, &plan),
        );
        let gain = gain_percent(step_now, step_new);
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
                // A rank kept in by its re-admission's verdict grows from
                // its probe share within the growth bound: each step of a
                // small rank gains little by itself, and under the
                // hysteresis a rank back at 1 of 120 samples beside three
                // equal ranks stayed at 1. While the bound is what holds
                // it back, its steps skip the hysteresis; after, it is a
                // rank like any other.
                let needed = subset::trial_samples_needed(&cfg);
                // A climb ends when its last step measured a longer step
                // than the interval before it: its compute model, fitted on
                // a few samples at a small batch (on a CPU quota, timed
                // between throttled periods), promised a gain the step
                // does not show. On four quota-bound ranks a re-admitted
                // 0.15-core rank climbed 1 → 2 → 4 → 7 → 16 while the
                // measured step went 27.6 → 28.3 → 28.1 → 33.5 → 42.1 ms.
                if let (Some((before_plan, before)), Some(w)) = (&previous_window, measured) {
                    if before_plan.as_slice() != cur && w > *before {
                        let ended: Vec<usize> = (0..n)
                            .filter(|&r| self.ranks[r].climbing)
                            .filter(|&r| before_plan.get(r).is_some_and(|&b| b < cur[r]))
                            .collect();
                        for &r in &ended {
                            self.ranks[r].climbing = false;
                        }
                        if !ended.is_empty() {
                            self.measured.add_note(&format!(
                                "{} no longer climbs: the step measured at its last climb, {}, is longer than the {} before it",
                                crate::decision::ranks_named(&ended),
                                subset::secs(w),
                                subset::secs(*before)
                            ));
                        }
                    }
                }
                let verdict_in = |r: &crate::rank::RankState| {
                    r.climbing || r.trial_samples.is_some_and(|k| k >= needed)
                };
                let climbing: Vec<usize> = (0..n)
                    .filter(|&r| verdict_in(&self.ranks[r]))
                    .filter(|&r| plan[r] > cur[r] && plan[r] >= bounds.upper[r])
                    .collect();
                for (r, rank) in self.ranks.iter_mut().enumerate() {
                    rank.climbing = climbing.contains(&r);
                }
                if gain <= 0.0 || (gain < threshold && climbing.is_empty()) {
                    out.reason = format!(
                        "{}: predicted gain {gain:.1}% is below minGainPercent {}% + {margin:.1}% noise margin; keeping the current plan",
                        cfg.policy, cfg.min_gain_percent
                    );
                    return Ok(self.finish(out, Some(cur)));
                }
                if gain >= threshold {
                    let _ = write!(
                        reason,
                        "{}: predicted step {step_new:.4}s vs {step_now:.4}s now (gain {gain:.1}% ≥ minGainPercent {}% + {margin:.1}% noise margin)",
                        cfg.policy, cfg.min_gain_percent
                    );
                } else {
                    let _ = write!(
                        reason,
                        "{}: predicted step {step_new:.4}s vs {step_now:.4}s now (gain {gain:.1}%); {} grows from its probe share within the growth bound, kept in by its re-admission's verdict (no hysteresis)",
                        cfg.policy,
                        crate::decision::ranks_named(&climbing)
                    );
                }
                let alpha = pm
                    .young
                    .iter()
                    .map(|&(_, n)| n as f64 / (cfg.window / 2).max(1) as f64)
                    .fold(1.0, f64::min)
                    .max(cfg.min_damping);
                if alpha < 1.0 {
                    let global = cfg.global_batch_size;
                    if let Some(damped) =
                        subset::damp(cur, &plan, alpha, global, &bounds.lower, &bounds.upper)
                    {
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
        out.gain_percent = gain_percent(
            with_exchange(current_pred, cur),
            with_exchange(predicted, &plan),
        );
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
}
