//! Bare-metal balancing (`--balancer local`) and the status line: every few
//! steps all ranks all-gather their measurements over c10d; rank 0 feeds
//! them to the balancer library (the operator's, same policies) and offers
//! the resulting plan at the next step boundary, where every rank switches
//! together. The same gathered numbers give the status line's balance class.

use heterotrain_balancer::{balance_quality, Balancer, BalancerConfig, Policy};
use heterotrain_crds::{BatchPlan, HardwareProfile};
use tch::Tensor;

use crate::c10d::ProcessGroup;
use crate::cli::PlanArgs;
use crate::error::{Result, TrainerError};

/// Profile points carried in the start-up gather (more are dropped).
const MAX_POINTS: usize = 8;

/// A rank's gathered profile: `(batch, seconds)` points and its memory cap.
pub type GatheredProfile = Option<RankProfileFigures>;

/// One rank's profile as gathered for the local balancer.
#[derive(Clone, Debug, PartialEq)]
pub struct RankProfileFigures {
    /// `(batch size, seconds)` at each probe batch size.
    pub points: Vec<(u32, f64)>,
    /// Largest local batch that fits.
    pub cap: u32,
    /// Start-up communication: all-reduce latency (s) and slowest-link
    /// bandwidth (B/s), when measured.
    pub link: Option<(f64, f64)>,
    /// Bytes of gradient each step exchanges.
    pub gradient_bytes: Option<u64>,
}

/// One rank's measurements since the last balancing round.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RankReport {
    /// Local batch the measurements were taken at.
    pub batch: u32,
    /// Mean compute seconds per step over the interval (0 when none).
    pub mean_compute_seconds: f64,
    /// Steps measured in the interval.
    pub samples: u32,
    /// Compute seconds of the last step.
    pub last_compute_seconds: f64,
    /// Mean whole step (compute + exposed communication) over the same
    /// measured steps (0 when none): what leave-out trials compare.
    pub mean_step_seconds: f64,
    /// How far the rank's slow steps' compute runs over its typical one
    /// (as `heterotrain_compute_spread_seconds`; 0 before enough steps).
    pub spread_seconds: f64,
    /// The share of its CPU quota the rank used lately (as
    /// `heterotrain_cpu_quota_used_ratio`; 0 without a quota).
    pub quota_used: f64,
}

/// Accumulates a rank's compute and whole-step times at one batch size.
#[derive(Clone, Debug, Default)]
pub struct Interval {
    batch: u32,
    sum: f64,
    step_sum: f64,
    n: u32,
    last: f64,
    /// Recent steps' compute, and the last spread it gave (kept across
    /// plan changes until the new batch has enough steps).
    recent: crate::metrics::Spread,
    spread: f64,
}

impl Interval {
    /// One step's compute seconds and whole step (compute + exposed
    /// communication) at local batch `batch`; `measure` false for warm-up
    /// steps (first of a run or of a plan), which are not averaged.
    pub fn record(&mut self, batch: u32, compute_seconds: f64, step_seconds: f64, measure: bool) {
        self.last = compute_seconds;
        if let Some(s) = self.recent.push(batch, compute_seconds) {
            self.spread = s;
        }
        if batch != self.batch {
            *self = Interval {
                batch,
                last: compute_seconds,
                recent: std::mem::take(&mut self.recent),
                spread: self.spread,
                ..Default::default()
            };
        }
        if measure && compute_seconds.is_finite() && compute_seconds > 0.0 {
            self.sum += compute_seconds;
            self.step_sum += step_seconds.max(compute_seconds);
            self.n += 1;
        }
    }

    pub fn report(&self) -> RankReport {
        RankReport {
            batch: self.batch,
            mean_compute_seconds: if self.n > 0 {
                self.sum / f64::from(self.n)
            } else {
                0.0
            },
            samples: self.n,
            last_compute_seconds: self.last,
            mean_step_seconds: if self.n > 0 {
                self.step_sum / f64::from(self.n)
            } else {
                0.0
            },
            spread_seconds: self.spread,
            quota_used: 0.0,
        }
    }

    /// Start a new interval (after a balancing round).
    pub fn reset(&mut self) {
        self.sum = 0.0;
        self.step_sum = 0.0;
        self.n = 0;
    }
}

/// Every rank's report (`pg` None: just ours).
pub fn gather(pg: Option<&ProcessGroup>, mine: RankReport) -> Result<Vec<RankReport>> {
    let Some(pg) = pg else { return Ok(vec![mine]) };
    let t = Tensor::from_slice(&[
        f64::from(mine.batch),
        mine.mean_compute_seconds,
        f64::from(mine.samples),
        mine.last_compute_seconds,
        mine.mean_step_seconds,
        mine.spread_seconds,
        mine.quota_used,
    ]);
    let outs = pg.all_gather(&t)?;
    Ok(outs
        .iter()
        .map(|o| {
            let v = Vec::<f64>::try_from(o).unwrap_or_default();
            let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
            RankReport {
                batch: at(0).max(0.0) as u32,
                mean_compute_seconds: at(1),
                samples: at(2).max(0.0) as u32,
                last_compute_seconds: at(3),
                mean_step_seconds: at(4),
                spread_seconds: at(5),
                quota_used: at(6).max(0.0),
            }
        })
        .collect())
}

/// Every rank's profile points and memory cap, if it profiled.
pub fn gather_profiles(
    pg: Option<&ProcessGroup>,
    mine: Option<&HardwareProfile>,
) -> Result<Vec<GatheredProfile>> {
    // [present, cap, (batch, seconds) × MAX_POINTS, latency, bandwidth,
    // gradient bytes]; 0 where unknown.
    let comm = 2 + 2 * MAX_POINTS;
    let mut v = vec![0f64; comm + 3];
    if let Some(p) = mine {
        v[0] = 1.0;
        v[1] = f64::from(p.max_batch_size);
        for (i, pt) in p.points.iter().take(MAX_POINTS).enumerate() {
            v[2 + 2 * i] = f64::from(pt.batch_size);
            v[3 + 2 * i] = pt.seconds;
        }
        v[comm] = p.allreduce_latency_seconds.unwrap_or(0.0);
        v[comm + 1] = p
            .slowest_link_bytes_per_second
            .or(p.allreduce_bus_bandwidth_bytes_per_second)
            .unwrap_or(0.0);
        v[comm + 2] = p.gradient_bytes.unwrap_or(0) as f64;
    }
    let all: Vec<Vec<f64>> = match pg {
        None => vec![v],
        Some(pg) => pg
            .all_gather(&Tensor::from_slice(&v))?
            .iter()
            .map(|t| Vec::<f64>::try_from(t).unwrap_or_default())
            .collect(),
    };
    Ok(all
        .into_iter()
        .map(|v| {
            if v.len() < comm + 3 || v[0] < 0.5 {
                return None;
            }
            let points: Vec<(u32, f64)> = (0..MAX_POINTS)
                .map(|i| (v[2 + 2 * i], v[3 + 2 * i]))
                .filter(|(b, t)| *b >= 1.0 && *t > 0.0)
                .map(|(b, t)| (b as u32, t))
                .collect();
            let (latency, bandwidth, gradient) = (v[comm], v[comm + 1], v[comm + 2]);
            Some(RankProfileFigures {
                points,
                cap: v[1].max(1.0) as u32,
                link: (latency > 0.0 && bandwidth > 0.0).then_some((latency, bandwidth)),
                gradient_bytes: (gradient >= 1.0).then_some(gradient as u64),
            })
        })
        .collect())
}

/// Rank 0's balancer.
pub struct LocalBalancer {
    inner: Balancer,
    policy: Policy,
}

impl LocalBalancer {
    /// A balancer for `world_size` ranks sharing `global_batch`, each given
    /// at least `min_local_batch` samples, with the plan group's policy.
    pub fn new(
        plan: &PlanArgs,
        global_batch: u32,
        min_local_batch: u32,
        world_size: usize,
    ) -> Result<LocalBalancer> {
        let policy: Policy = plan
            .policy
            .parse()
            .map_err(|e| TrainerError::Config(format!("--policy: {e}")))?;
        let inner = Balancer::new(
            BalancerConfig {
                policy,
                global_batch_size: global_batch,
                min_local_batch,
                min_gain_percent: plan.min_gain_percent,
                ..BalancerConfig::default()
            },
            world_size,
        )
        .map_err(|e| TrainerError::Config(format!("balancer: {e}")))?;
        Ok(LocalBalancer { inner, policy })
    }

    /// Feed the start-up profiles.
    pub fn observe_profiles(&mut self, profiles: &[GatheredProfile]) {
        for (r, p) in profiles.iter().enumerate() {
            let Some(p) = p else { continue };
            if let Err(e) = self.inner.observe_profile(r, &p.points, p.cap) {
                eprintln!("warning: balancer: rank {r}'s profile: {e}");
            }
            if let Some(g) = p.gradient_bytes {
                self.inner.set_gradient_bytes(g);
            }
            if let Some((latency, bandwidth)) = p.link {
                if let Err(e) = self.inner.observe_link(r, latency, bandwidth) {
                    eprintln!("warning: balancer: rank {r}'s link figures: {e}");
                }
            }
        }
    }

    /// One round: feed the reports, decide against `current`; a new plan
    /// (generation + 1) when the balancer finds one worth switching to.
    /// Like the operator's policies, it also feeds each rank's whole step,
    /// exposed communication and share of its CPU quota used, so a rank
    /// whose share of the exchange costs the gang more than its samples
    /// save is tried without and left out (batch 0) when the gang measures
    /// faster so — and a left-out rank is re-admitted for measurement now
    /// and then; a rank that spent its quota gets no more samples.
    pub fn round(&mut self, reports: &[RankReport], current: &BatchPlan) -> Option<BatchPlan> {
        for (r, rep) in reports.iter().enumerate() {
            if rep.batch == 0 {
                let _ = self.inner.observe_idle(r);
                continue;
            }
            if rep.samples > 0 {
                let _ = self
                    .inner
                    .observe_step(r, rep.batch, rep.mean_compute_seconds);
                let _ = self.inner.observe_compute_spread(r, rep.spread_seconds);
                if rep.quota_used > 0.0 {
                    let _ = self.inner.observe_quota_use(r, rep.quota_used);
                }
                if rep.mean_step_seconds > 0.0 {
                    let comm = (rep.mean_step_seconds - rep.mean_compute_seconds).max(0.0);
                    let _ = self.inner.observe_communication(r, comm);
                    // The mean of `samples` measured steps counts as that
                    // many (the balancer wants a few per decision).
                    for _ in 0..rep.samples.min(16) {
                        let _ = self
                            .inner
                            .observe_step_time(r, rep.batch, rep.mean_step_seconds);
                    }
                }
            }
        }
        match self.inner.decide(&current.batch_sizes) {
            Ok(d) => {
                let batches = d.plan?;
                if batches == current.batch_sizes {
                    return None;
                }
                Some(BatchPlan {
                    generation: current.generation.saturating_add(1),
                    global_batch_size: current.global_batch_size,
                    batch_sizes: batches,
                    policy: self.policy.as_str().into(),
                    reason: format!("local balancer: {} (gain {:.1}%)", d.reason, d.gain_percent),
                    predicted_step_seconds: Some(d.predicted_step_seconds),
                    predicted_communication_seconds: None,
                })
            }
            Err(e) => {
                eprintln!("warning: balancer: {e}; keeping the plan");
                None
            }
        }
    }
}

/// The one-line status rank 0 prints every `--status-every` steps.
pub fn status_line(
    step: u64,
    total: u64,
    loss: f64,
    samples_per_second: f64,
    plan: &BatchPlan,
    reports: &[RankReport],
) -> String {
    let compute: Vec<f64> = reports
        .iter()
        .map(|r| r.last_compute_seconds)
        .filter(|s| s.is_finite() && *s > 0.0)
        .collect();
    let q = balance_quality(&compute);
    let total = if total == u64::MAX {
        String::new()
    } else {
        format!("/{total}")
    };
    let batches: Vec<String> = plan.batch_sizes.iter().map(u32::to_string).collect();
    format!(
        "status: step {step}{total} loss {loss:.4} {samples_per_second:.1} samples/s batches [{}] gen {} compute cv {:.1}% {}",
        batches.join(","),
        plan.generation,
        q.cv_percent,
        q.class.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interval_averages_measured_steps_at_one_batch() {
        let mut i = Interval::default();
        i.record(8, 0.5, 0.7, false);
        i.record(8, 0.2, 0.3, true);
        i.record(8, 0.4, 0.5, true);
        let r = i.report();
        assert_eq!((r.batch, r.samples), (8, 2));
        assert!((r.mean_compute_seconds - 0.3).abs() < 1e-12);
        assert!((r.mean_step_seconds - 0.4).abs() < 1e-12);
        i.record(12, 0.6, 0.6, true);
        assert_eq!(i.report().samples, 1);
        assert_eq!(i.report().batch, 12);
    }

    #[test]
    fn interval_reports_the_spread_and_keeps_it_across_a_plan_change() {
        let mut i = Interval::default();
        for k in 0..32 {
            i.record(8, if k % 4 == 0 { 0.5 } else { 0.3 }, 0.6, true);
        }
        assert!((i.report().spread_seconds - 0.2).abs() < 1e-12);
        // A new batch: the last figure stands until it has steps enough.
        i.record(12, 0.45, 0.6, true);
        assert!((i.report().spread_seconds - 0.2).abs() < 1e-12);
        // Eight steps, confirmed by three more.
        for _ in 0..9 {
            i.record(12, 0.45, 0.6, true);
        }
        assert!((i.report().spread_seconds - 0.2).abs() < 1e-12);
        i.record(12, 0.45, 0.6, true);
        assert_eq!(i.report().spread_seconds, 0.0);
    }

    #[test]
    fn local_round_plans_a_jumpy_rank_at_its_slow_steps() {
        let cfg = test_cfg();
        let cur = BatchPlan::equal(0, 64, 2);
        let report = |spread: f64| RankReport {
            batch: 32,
            mean_compute_seconds: 0.064,
            samples: 5,
            last_compute_seconds: 0.064,
            mean_step_seconds: 0.07,
            spread_seconds: spread,
            quota_used: 0.0,
        };
        let mut lb = LocalBalancer::new(&cfg.plan, 64, 1, 2).expect("balancer");
        for _ in 0..4 {
            assert_eq!(lb.round(&[report(0.0), report(0.0)], &cur), None);
        }
        let mut lb = LocalBalancer::new(&cfg.plan, 64, 1, 2).expect("balancer");
        let p = (0..4)
            .find_map(|_| lb.round(&[report(0.0), report(0.024)], &cur))
            .expect("a new plan");
        assert!(p.batch_sizes[0] > 32, "{:?}", p.batch_sizes);
    }

    #[test]
    fn status_line_is_one_compact_line() {
        let plan = BatchPlan::equal(3, 64, 2);
        let reps = [
            RankReport {
                batch: 32,
                last_compute_seconds: 0.1,
                ..Default::default()
            },
            RankReport {
                batch: 32,
                last_compute_seconds: 0.3,
                ..Default::default()
            },
        ];
        let s = status_line(120, 500, 0.5, 1000.0, &plan, &reps);
        assert!(!s.contains('\n'));
        assert!(s.contains("step 120/500") && s.contains("[32,32]") && s.contains("gen 3"));
        assert!(s.contains("cv 50.0%"), "{s}");
    }

    #[test]
    fn local_round_moves_samples_to_the_faster_rank() {
        let cfg = test_cfg();
        let mut lb = LocalBalancer::new(&cfg.plan, 64, 1, 2).expect("balancer");
        let cur = BatchPlan::equal(0, 64, 2);
        let reps = [
            RankReport {
                batch: 32,
                mean_compute_seconds: 0.1,
                samples: 5,
                last_compute_seconds: 0.1,
                mean_step_seconds: 0.3,
                spread_seconds: 0.0,
                quota_used: 0.0,
            },
            RankReport {
                batch: 32,
                mean_compute_seconds: 0.3,
                samples: 5,
                last_compute_seconds: 0.3,
                mean_step_seconds: 0.3,
                spread_seconds: 0.0,
                quota_used: 0.0,
            },
        ];
        let p = lb.round(&reps, &cur).expect("a new plan");
        assert_eq!(p.generation, 1);
        assert_eq!(p.batch_sizes.iter().sum::<u32>(), 64);
        assert!(p.batch_sizes[0] > 32, "{:?}", p.batch_sizes);
    }

    /// Rank 1 computes faster than rank 0, so the balancer moves samples to
    /// it, unless it reports having used its CPU quota (the operator's rule,
    /// fed from the gathered reports).
    #[test]
    fn local_round_holds_a_rank_that_used_its_cpu_quota() {
        let cfg = test_cfg();
        let cur = BatchPlan::equal(0, 64, 2);
        let report = |compute: f64, quota_used: f64| RankReport {
            batch: 32,
            mean_compute_seconds: compute,
            samples: 5,
            last_compute_seconds: compute,
            mean_step_seconds: 0.3,
            spread_seconds: 0.0,
            quota_used,
        };
        let mut lb = LocalBalancer::new(&cfg.plan, 64, 1, 2).expect("balancer");
        let p = lb
            .round(&[report(0.3, 0.5), report(0.1, 0.5)], &cur)
            .expect("a new plan");
        assert!(p.batch_sizes[1] > 32, "{:?}", p.batch_sizes);
        let mut lb = LocalBalancer::new(&cfg.plan, 64, 1, 2).expect("balancer");
        for _ in 0..4 {
            if let Some(p) = lb.round(&[report(0.3, 0.5), report(0.1, 0.97)], &cur) {
                assert!(p.batch_sizes[1] <= 32, "{:?}", p.batch_sizes);
            }
        }
    }

    /// Rank 1's compute is small at its share, but every step it takes part
    /// in lasts ten times the compute (its share of the exchange stalls):
    /// the compute models alone keep it; the measured steps get it tried
    /// without and left out, as the operator's policies do.
    #[test]
    fn local_round_leaves_out_a_rank_whose_steps_cost_more_than_it_brings() {
        let cfg = test_cfg();
        let mut lb = LocalBalancer::new(&cfg.plan, 64, 1, 2).expect("balancer");
        let mut cur = BatchPlan::equal(0, 64, 2);
        let report = |b: u32, per_sample: f64, step: f64| RankReport {
            batch: b,
            mean_compute_seconds: 0.002 + per_sample * f64::from(b),
            samples: if b > 0 { 5 } else { 0 },
            last_compute_seconds: 0.002 + per_sample * f64::from(b),
            mean_step_seconds: step,
            spread_seconds: 0.0,
            quota_used: 0.0,
        };
        let mut left_out_at = None;
        for round in 0..60 {
            let b = &cur.batch_sizes;
            let with_rank_1 = b[1] > 0;
            // Alone, rank 0's step is its compute; with rank 1, 0.5 s.
            let step0 = if with_rank_1 {
                0.5
            } else {
                0.002 + 0.001 * f64::from(b[0])
            };
            let reps = [
                report(b[0], 0.001, step0),
                report(b[1], 0.002, if with_rank_1 { 0.5 } else { 0.0 }),
            ];
            if let Some(p) = lb.round(&reps, &cur) {
                cur = p;
            }
            if cur.batch_sizes[1] == 0 && left_out_at.is_none() {
                left_out_at = Some(round);
            }
        }
        assert!(left_out_at.is_some(), "rank 1 never left out: {cur:?}");
        assert_eq!(cur.batch_sizes, vec![64, 0], "{cur:?}");
    }

    fn test_cfg() -> crate::cli::TrainerArgs {
        use clap::Parser;
        match crate::cli::Cli::try_parse_from(["t", "train", "--policy", "dynamic"]) {
            Ok(crate::cli::Cli {
                command: crate::cli::Command::Train(c),
            }) => *c,
            other => panic!("parse: {other:?}"),
        }
    }
}
