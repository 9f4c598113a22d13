//! The first two stages of a decision: the [`Frame`] (bookkeeping, the
//! current plan's validity, models and bounds) and what the measured steps
//! say ([`Observed`]).

use super::{Frame, Observed};
use crate::measured::{self, Review};
use crate::policy::{policy_models, seed_models};
use crate::{subset, Balancer, Policy, StepModel};

impl Balancer {
    /// The frame of one decision given the `current` plan: counts the
    /// ranks' missed decisions and left-out decisions, finds the stale
    /// ranks and stragglers, the bounds and the policy's models.
    pub(super) fn frame(&mut self, current: &[u32]) -> Frame {
        let cfg = self.config.clone();
        let n = self.ranks.len();
        let problem = self.current_problem(current);
        let cur = problem.is_none().then(|| current.to_vec());
        self.count_missed(cur.as_deref());
        let stale: Vec<usize> = (0..n)
            .filter(|&i| self.ranks[i].is_stale(cfg.stale_after_decisions))
            .collect();
        let stragglers: Vec<usize> = (0..n)
            .filter(|&i| self.ranks[i].refits_since_decision > 0)
            .collect();
        let bounds = self.bounds(cur.as_deref(), &stale);
        let pm = policy_models(cfg.policy, &mut self.ranks, cfg.prior_weight, cfg.window);
        // Predictions use the policy's models, except where the policy has
        // none of its own (static, seed formula): then the best estimate.
        let predict = if matches!(cfg.policy, Policy::Static | Policy::SeedFormula) {
            policy_models(Policy::Hybrid, &mut self.ranks, 0.0, cfg.window).models
        } else {
            pm.models.clone()
        };
        let split: Vec<StepModel> = if cfg.policy == Policy::SeedFormula {
            seed_models(&self.ranks)
        } else {
            pm.models.clone()
        };
        let current_pred = cur
            .as_deref()
            .map_or(0.0, |c| crate::split::max_step(&predict, c));
        let unknown = n - pm.known;
        let unknown_note = if unknown > 0 && cfg.policy != Policy::Static {
            format!("; {unknown} rank(s) without data use the median model")
        } else {
            String::new()
        };
        Frame {
            no_data: pm.known == 0 && cfg.policy.measures(),
            communication_seconds: self.communication_seconds(),
            cfg,
            problem,
            cur,
            stale,
            stragglers,
            bounds,
            pm,
            predict,
            split,
            current_pred,
            unknown_note,
        }
    }

    /// Counts a decision missed by each rank that has reported before but
    /// not since the last decision (a left-out rank's silence is
    /// expected), and the decisions each left-out rank has waited.
    fn count_missed(&mut self, cur: Option<&[u32]>) {
        for (i, r) in self.ranks.iter_mut().enumerate() {
            let left_out = cur.is_some_and(|c| c[i] == 0);
            if !r.reported_since_decision && r.ever_reported() && !left_out {
                r.missed_decisions = r.missed_decisions.saturating_add(1);
            }
        }
        if let Some(c) = cur {
            subset::count_left_out(&mut self.ranks, c);
        }
    }

    /// What the measured steps say: who is due back for measurement, the
    /// measured step of the current plan, the verdicts of leave-out trials
    /// (which hold ranks out of `frame.bounds`), the quota holds, and who
    /// may be left out.
    pub(super) fn observe(&mut self, frame: &mut Frame) -> Observed {
        let cfg = &frame.cfg;
        let cur = frame.cur.as_deref();
        // Who is due back for measurement, and who may be left out: never
        // rank 0, a stale rank, a rank without data of its own, or one whose
        // measurement after a re-admission is not in yet.
        let readmit = match cur {
            Some(c) if self.leaves_out() => {
                subset::due_for_readmission(&self.ranks, c, &frame.stale, cfg)
            }
            _ => Vec::new(),
        };
        // The live policies also compare measured steps between memberships
        // (crate::measured): verdicts first, a new leave-out trial later.
        let live = self.leaves_out() && matches!(cfg.policy, Policy::Dynamic | Policy::Hybrid);
        let needed = subset::trial_samples_needed(cfg);
        let measured = cur.filter(|_| live).and_then(|c| {
            measured::window_step(&self.ranks, self.measured.plan.as_deref(), c, needed)
        });
        if let Some(c) = cur {
            subset::count_probes(&mut self.ranks, c, measured);
        }
        let previous_window = std::mem::replace(
            &mut self.measured.last_window,
            cur.zip(measured).map(|(c, w)| (c.to_vec(), w)),
        );
        let review = match cur {
            Some(c) if live => {
                let (ranks, m) = (&mut self.ranks, &mut self.measured);
                measured::review(ranks, m, c, measured, &readmit, cfg)
            }
            _ => {
                self.measured.trial = None;
                Review::default()
            }
        };
        self.measured.note = review.note.clone();
        for &r in &review.held_out {
            frame.bounds.hold_out(r);
        }
        let quota_held = self.hold_quota_bound(cur, &mut frame.bounds);
        let eligible = self.eligible(frame, &readmit, &review);
        let current_out =
            cur.map_or_else(Vec::new, |c| (1..c.len()).filter(|&r| c[r] == 0).collect());
        Observed {
            readmit,
            measured,
            previous_window,
            review,
            quota_held,
            eligible,
            current_out,
        }
    }

    /// The ranks a split may leave out: never rank 0, a rank without data
    /// of its own, a stale one, one due back or on an open trial, nor one a
    /// verdict just decided on.
    fn eligible(&self, frame: &Frame, readmit: &[usize], review: &Review) -> Vec<usize> {
        if !self.leaves_out() {
            return Vec::new();
        }
        let cfg = &frame.cfg;
        (1..self.ranks.len())
            .filter(|&r| frame.pm.has_data[r] && !frame.stale.contains(&r))
            .filter(|&r| !readmit.contains(&r) && !subset::on_open_trial(&self.ranks[r], cfg))
            .filter(|r| !review.held_out.contains(r) && !review.back.contains(r))
            .collect()
    }
}
