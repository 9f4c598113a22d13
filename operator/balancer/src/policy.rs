//! Which step model each policy uses for each rank, and the seeds' scoring
//! formula (kept only as a benchmark baseline).

use crate::model::median;
use crate::rank::RankState;
use crate::{Policy, StepModel};

/// Models one policy assigns to all ranks.
pub(crate) struct PolicyModels {
    /// One model per rank (ranks without data get the median model).
    pub models: Vec<StepModel>,
    /// Ranks with data of their own for this policy.
    pub known: usize,
    /// Per rank: whether its model is its own (not the median fallback).
    pub has_data: Vec<bool>,
    /// Ranks whose model is live-fitted from fewer than half a window of
    /// samples (and not a deliberate straggler re-fit), with that count.
    pub young: Vec<(usize, u64)>,
    /// Median relative standard error of the live-fitted ranks' models (0
    /// when the policy does not use live data).
    pub relative_error: f64,
}

/// The fixed cost `a` the live fit uses for this rank: the profile's when
/// there is one (the profile sees several batch sizes, live steps mostly
/// one), else 0 — the fitted rate then absorbs the fixed cost at the current
/// batch and re-planning converges by fixed-point iteration, see
/// [`crate::model::LiveModel`].
pub(crate) fn live_fixed(rank: &RankState) -> f64 {
    rank.profile.map_or(0.0, |p| p.fixed_seconds)
}

/// The model of one rank under `policy`, from its own data only. The live
/// policies plan a rank at its typical compute plus its weighted spread
/// (at most the compute it last reported; see [`spread_weight`]): a
/// synchronous step waits for whichever of the `training` ranks is slowest
/// that step, so a rank whose compute jumps is planned nearer its slow
/// steps than its mean.
fn own_model(
    policy: Policy,
    rank: &mut RankState,
    prior_weight: f64,
    training: usize,
) -> Option<StepModel> {
    let model = base_model(policy, rank, prior_weight)?;
    if !policy.is_live() {
        return Some(model);
    }
    let spread = (spread_weight(training) * rank.spread.unwrap_or(0.0))
        .min(rank.last_seconds.unwrap_or(0.0))
        .max(0.0);
    Some(StepModel {
        fixed_seconds: model.fixed_seconds + spread,
        ..model
    })
}

/// E[max of n standard normal draws], n = 1..=16.
const EXPECTED_MAX: [f64; 16] = [
    0.0, 0.5642, 0.8463, 1.0294, 1.1630, 1.2672, 1.3522, 1.4236, 1.4850, 1.5388, 1.5864, 1.6292,
    1.6680, 1.7034, 1.7359, 1.7660,
];
/// The standard normal's 90th percentile: (p90 − median) / this = σ.
const NORMAL_P90: f64 = 1.2816;

/// What a rank's spread (its 90th percentile minus median compute) adds
/// to its planned compute when `n` ranks train: the slowest of n ranks
/// with compute times spread like normals with σ = spread / 1.2816 runs
/// about e_n·σ over their mean (e_2 = 0.56, e_4 = 1.03, e_8 = 1.42; past
/// 16 ranks the Gumbel limit √(2 ln n) − (ln ln n + ln 4π − 2γ) / (2√(2 ln
/// n))). So with two ranks a spread counts at 0.44 of its size, with four
/// at 0.80, with eight at 1.11; with one, not at all.
pub fn spread_weight(n: usize) -> f64 {
    let e = match n {
        0 | 1 => 0.0,
        n if n <= EXPECTED_MAX.len() => EXPECTED_MAX[n - 1],
        n => {
            let l = (2.0 * (n as f64).ln()).sqrt();
            let gumbel = ((n as f64).ln().ln() + (4.0 * std::f64::consts::PI).ln()
                - 2.0 * 0.577_215_664_9)
                / (2.0 * l);
            (l - gumbel).max(EXPECTED_MAX[EXPECTED_MAX.len() - 1])
        }
    };
    e / NORMAL_P90
}

fn base_model(policy: Policy, rank: &mut RankState, prior_weight: f64) -> Option<StepModel> {
    match policy {
        Policy::Static | Policy::SeedFormula => best_estimate(rank),
        Policy::Proportional => rank.profile,
        Policy::Dynamic => rank.live.model(live_fixed(rank)),
        Policy::Hybrid => {
            let fixed = live_fixed(rank);
            let live = rank.live.model(fixed);
            match (rank.profile, live) {
                (Some(p), Some(l)) => {
                    let w = if rank.profile_trusted {
                        prior_weight
                    } else {
                        0.0
                    };
                    let n = rank.live.total() as f64;
                    // The live fit's fixed cost is the profile's unless its
                    // steps came near or under it (see `LiveModel`).
                    let blend = |prior: f64, live: f64| (w * prior + n * live) / (w + n);
                    Some(StepModel {
                        fixed_seconds: blend(p.fixed_seconds, l.fixed_seconds),
                        per_sample_seconds: blend(p.per_sample_seconds, l.per_sample_seconds),
                    })
                }
                (p, l) => l.or(p),
            }
        }
    }
}

/// Best available description of a rank regardless of policy: live fit
/// (with the profile's fixed cost when known), else the profile.
pub(crate) fn best_estimate(rank: &mut RankState) -> Option<StepModel> {
    let fixed = live_fixed(rank);
    rank.live.model(fixed).or(rank.profile)
}

/// Models for every rank under `policy`. Ranks without data borrow the
/// median fixed and per-sample cost of the others; with no data at all,
/// every rank gets the same unit model (an equal split).
pub(crate) fn policy_models(
    policy: Policy,
    ranks: &mut [RankState],
    prior_weight: f64,
    window: usize,
) -> PolicyModels {
    // The ranks that train now: the step is the slowest of them.
    let training = ranks
        .iter()
        .filter(|r| !r.left_out && r.last_batch.is_some_and(|b| b > 0))
        .count();
    let own: Vec<Option<StepModel>> = ranks
        .iter_mut()
        .map(|r| own_model(policy, r, prior_weight, training).filter(StepModel::is_valid))
        .collect();
    let mut a: Vec<f64> = own.iter().flatten().map(|m| m.fixed_seconds).collect();
    let mut c: Vec<f64> = own.iter().flatten().map(|m| m.per_sample_seconds).collect();
    let known = c.len();
    let has_data = own.iter().map(Option::is_some).collect();
    let fallback = match (median(&mut a), median(&mut c)) {
        (Some(a), Some(c)) => StepModel {
            fixed_seconds: a,
            per_sample_seconds: c,
        },
        _ => StepModel {
            fixed_seconds: 0.0,
            per_sample_seconds: 1.0,
        },
    };
    let half = (window / 2).max(1) as u64;
    let uses_live = matches!(policy, Policy::Dynamic | Policy::Hybrid);
    let young = if uses_live {
        ranks
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                let n = r.live.total();
                n > 0 && n < half && !r.live.fast_refit()
            })
            .map(|(i, r)| (i, r.live.total()))
            .collect()
    } else {
        Vec::new()
    };
    let mut errors: Vec<f64> = if uses_live {
        ranks
            .iter()
            .filter(|r| r.live.total() > 0)
            .map(|r| r.live.relative_error())
            .collect()
    } else {
        Vec::new()
    };
    let relative_error = median(&mut errors).unwrap_or(0.0);
    let models = if policy == Policy::Static {
        vec![fallback_unit(); ranks.len()]
    } else {
        own.into_iter().map(|m| m.unwrap_or(fallback)).collect()
    };
    PolicyModels {
        models,
        known,
        has_data,
        young,
        relative_error,
    }
}

fn fallback_unit() -> StepModel {
    StepModel {
        fixed_seconds: 0.0,
        per_sample_seconds: 1.0,
    }
}

/// Split models that make the optimal split allocate in proportion to the
/// seed formula's scores: `t_r(b) = b / score_r`. Hardware score: the
/// observed compute score, else the profile's samples per second.
pub(crate) fn seed_models(ranks: &[RankState]) -> Vec<StepModel> {
    let hardware: Vec<Option<f64>> = ranks
        .iter()
        .map(|r| {
            r.compute_score
                .or(r.profile.map(|p| 1.0 / p.per_sample_seconds))
        })
        .collect();
    let times: Vec<Option<f64>> = ranks.iter().map(|r| r.live.mean_seconds()).collect();
    let util: Vec<Option<(f64, f64)>> = ranks.iter().map(|r| r.utilisation).collect();
    seed_scores(&hardware, &times, &util)
        .iter()
        .map(|s| StepModel {
            fixed_seconds: 0.0,
            per_sample_seconds: (1.0 / s).clamp(1e-300, 1e300),
        })
        .collect()
}

/// Weight of the hardware score in the seed formula.
const SEED_BASE_WEIGHT: f64 = 0.6;
/// Weight of the runtime factor (1 / iteration time) in the seed formula.
const SEED_PERF_WEIGHT: f64 = 0.4;
/// Penalty per unit of GPU utilisation and of memory use.
const SEED_PENALTY: f64 = 0.2;
/// A rank slower than this × the median is a straggler in the seed formula.
const SEED_STRAGGLER_RATIO: f64 = 1.5;

/// Seed 003's dynamic score per rank:
/// `(0.6·compute_score + 0.4·(1/avg_iteration_time)) · (1 − 0.2·util) ·
/// (1 − 0.2·mem) · (0.5 if iteration time > 1.5 × median)`.
///
/// The seed adds a FLOP/s score to an inverse time, which have different
/// units; here each of the two is first normalised to sum 1 over the ranks
/// (the only reading under which the 0.6/0.4 weights mean anything).
/// Missing inputs borrow the median of the ranks that have them; utilisation
/// and memory are fractions in [0, 1]. "Iteration time" is the mean compute
/// time over the live window.
pub fn seed_scores(
    compute_score: &[Option<f64>],
    mean_seconds: &[Option<f64>],
    utilisation: &[Option<(f64, f64)>],
) -> Vec<f64> {
    let n = compute_score.len();
    let base = normalise(&fill_median(compute_score, n));
    let times = fill_median(mean_seconds, n);
    let have_perf = mean_seconds
        .iter()
        .flatten()
        .any(|t| t.is_finite() && *t > 0.0);
    let perf = normalise(&times.iter().map(|t| 1.0 / t).collect::<Vec<_>>());
    let mut sorted = times.clone();
    let median_time = median(&mut sorted).unwrap_or(1.0);
    (0..n)
        .map(|r| {
            let mix = if have_perf {
                SEED_BASE_WEIGHT * base[r] + SEED_PERF_WEIGHT * perf[r]
            } else {
                base[r]
            };
            let (u, m) = utilisation.get(r).copied().flatten().unwrap_or((0.0, 0.0));
            let straggler = if have_perf && times[r] > SEED_STRAGGLER_RATIO * median_time {
                0.5
            } else {
                1.0
            };
            let score = mix
                * (1.0 - SEED_PENALTY * clamp01(u))
                * (1.0 - SEED_PENALTY * clamp01(m))
                * straggler;
            if score.is_finite() && score > 0.0 {
                score
            } else {
                f64::MIN_POSITIVE
            }
        })
        .collect()
}

fn clamp01(x: f64) -> f64 {
    if x.is_finite() {
        x.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// Positive finite values, missing ones replaced by the median (1 if none).
fn fill_median(values: &[Option<f64>], n: usize) -> Vec<f64> {
    let ok = |v: &f64| v.is_finite() && *v > 0.0;
    let mut present: Vec<f64> = values.iter().flatten().copied().filter(ok).collect();
    let med = median(&mut present).unwrap_or(1.0);
    (0..n)
        .map(|r| values.get(r).copied().flatten().filter(ok).unwrap_or(med))
        .collect()
}

fn normalise(values: &[f64]) -> Vec<f64> {
    let sum: f64 = values.iter().sum();
    if sum > 0.0 && sum.is_finite() {
        values.iter().map(|v| v / sum).collect()
    } else {
        vec![1.0 / values.len().max(1) as f64; values.len()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_formula_matches_the_pseudo_code() {
        // Two ranks, equal hardware, rank 1 twice as slow per iteration.
        let s = seed_scores(
            &[Some(1.0), Some(1.0)],
            &[Some(1.0), Some(2.0)],
            &[None, None],
        );
        // base 0.5/0.5, perf 2/3 and 1/3.
        assert!((s[0] - (0.6 * 0.5 + 0.4 * 2.0 / 3.0)).abs() < 1e-12);
        assert!((s[1] - (0.6 * 0.5 + 0.4 / 3.0)).abs() < 1e-12);
    }

    #[test]
    fn seed_formula_penalises_busy_and_straggling_ranks() {
        let s = seed_scores(
            &[Some(1.0), Some(1.0), Some(1.0)],
            &[Some(1.0), Some(1.0), Some(1.6)],
            &[Some((1.0, 1.0)), Some((0.0, 0.0)), Some((0.0, 0.0))],
        );
        // Full utilisation and memory: × 0.8 × 0.8.
        assert!((s[0] / s[1] - 0.64).abs() < 1e-12);
        // 1.6 > 1.5 × median 1.0: halved (on top of its lower perf term).
        let unhalved = 0.6 / 3.0 + 0.4 * (1.0 / 1.6) / (2.0 + 1.0 / 1.6);
        assert!((s[2] - 0.5 * unhalved).abs() < 1e-12);
    }

    #[test]
    fn seed_formula_survives_garbage() {
        let s = seed_scores(
            &[Some(f64::NAN), None],
            &[Some(-1.0), Some(f64::INFINITY)],
            &[None],
        );
        assert_eq!(s.len(), 2);
        assert!(s.iter().all(|x| x.is_finite() && *x > 0.0));
    }
}
