//! The fold of one reading of the ranks' metrics into the job's balancing
//! state and the figures for status: no client, no clock of its own (the
//! reading carries when it finished).

use std::collections::BTreeMap;

use heterotrain_crds::bottleneck::{self, PhaseTimes};
use heterotrain_crds::{BalanceStatus, RankBottleneck};

use super::collect::Reading;
use super::state::JobState;
use crate::scrape::{RankMetrics, RankProfile};
use crate::status::Extras;
use crate::validate::ValidatedJob;

/// What one reading adds up to, beyond the figures it sets.
#[derive(Debug, Default)]
pub(super) struct Folded {
    /// The job's step: the ranks' `heterotrain_step` (the global step, the
    /// same on every rank; the highest one read wins when some lag a
    /// scrape).
    pub job_step: Option<u64>,
    /// The plan generation each rank runs, where read.
    pub generations: Vec<Option<u64>>,
    /// Profiles first reported in this reading, to cache.
    pub new_profiles: BTreeMap<usize, RankProfile>,
    /// Ranks whose metrics could not be read.
    pub unread: usize,
}

/// Per-rank rates and phase times of one reading.
struct Rates {
    samples_per_second: Vec<Option<f64>>,
    phases: Vec<Option<PhaseTimes>>,
}

/// Feeds `reading` to `st`'s balancer and sets the figures of `x`: rank 0's
/// progress, each rank's samples per second and bottleneck, the balance
/// quality. `profile_cache`: whether new profiles are cached.
pub(super) fn fold(
    v: &ValidatedJob<'_>,
    profile_cache: bool,
    reading: &Reading,
    st: &mut JobState,
    x: &mut Extras,
) -> Folded {
    let world = v.ranks();
    let mut out = Folded {
        generations: vec![None; world],
        ..Folded::default()
    };
    let mut rates = Rates {
        samples_per_second: vec![None; world],
        phases: vec![None; world],
    };
    let mut sampled = 0usize;
    for (r, res) in reading.ranks.iter().enumerate().take(world) {
        let m = match res {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(rank = r, error = %e, "metrics not read");
                out.unread += 1;
                st.balancer.missing(r);
                continue;
            }
        };
        out.job_step = out.job_step.max(m.step);
        let had_profile = st.balancer.profiles().get(r).is_some_and(Option::is_some);
        sampled += usize::from(st.balancer.observe(r, m));
        out.generations[r] = m.plan_generation;
        if r == 0 {
            x.step = m.step.or(x.step);
            x.epoch = m.epoch.or(x.epoch);
            x.total_steps = m.total_steps.or(x.total_steps);
        }
        rank_rates(r, m, reading, st, &mut rates);
        if !had_profile && profile_cache && !st.cached[r] {
            if let Some(p) = st.balancer.profiles().get(r).cloned().flatten() {
                out.new_profiles.insert(r, p);
            }
        }
    }
    if rates.phases.iter().any(Option::is_some) {
        x.rank_bottlenecks = Some(rank_bottlenecks(v, &rates.phases));
    }
    let sps = rates.samples_per_second;
    if sps.iter().any(Option::is_some) {
        x.cluster_samples_per_second = Some(sps.iter().flatten().sum());
        x.rank_samples_per_second = sps;
    }
    if sampled > 0 {
        let q = st.balancer.quality();
        x.balance = Some(BalanceStatus {
            cv_percent: q.cv_percent,
            class: q.class.as_str().into(),
        });
    }
    out
}

/// Rank `r`'s samples per second and per-step phase times since the
/// previous reading (kept in `st` for the next one).
fn rank_rates(r: usize, m: &RankMetrics, reading: &Reading, st: &mut JobState, rates: &mut Rates) {
    if let Some(total) = m.samples_total {
        if let Some((prev, t)) = st.last_samples[r] {
            let dt = reading.at.saturating_duration_since(t).as_secs_f64();
            if total >= prev && dt > 0.0 {
                rates.samples_per_second[r] = Some((total - prev) / dt);
            }
        }
        st.last_samples[r] = Some((total, reading.at));
    }
    if let (Some(now), Some(steps)) = (m.phase_seconds_total, m.steps_total) {
        if let Some((before, steps_before)) = st.last_phases[r] {
            rates.phases[r] = now.per_step_since(&before, steps - steps_before);
        }
        st.last_phases[r] = Some((now, steps));
    }
}

/// What bounds each training rank's step, from its per-step phase times
/// over the last interval (`heterotrain_crds::bottleneck`), with the job's
/// straggler threshold.
fn rank_bottlenecks(v: &ValidatedJob<'_>, phases: &[Option<PhaseTimes>]) -> Vec<RankBottleneck> {
    let factor = f64::from(v.spec().load_balancing.straggler_threshold_percent) / 100.0;
    let round = |x: f64| (x * 1e5).round() / 1e5;
    bottleneck::classify(phases, factor.max(1.01))
        .into_iter()
        .zip(phases)
        .enumerate()
        .filter_map(|(rank, (b, p))| {
            let (b, p) = (b?, p.as_ref()?);
            Some(RankBottleneck {
                rank: u32::try_from(rank).ok()?,
                bottleneck: b,
                data_seconds: round(p.data),
                compute_seconds: round(p.compute),
                communication_seconds: round(p.communication),
                update_seconds: round(p.update),
            })
        })
        .collect()
}
