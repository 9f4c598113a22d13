//! Status stage: fold the lifecycle decision and the balancing results into
//! `status` (conditions first) with [`next`] (pure; the run's progress in
//! [`progress()`]), and patch it only when it changed ([`Writer`]).

mod progress;
mod writer;

use heterotrain_crds::{
    BalanceStatus, BatchPlan, GroupStatus, HeteroTrainingJob, HeteroTrainingJobStatus,
    RankBottleneck, RebalanceStatus, PLAN_HISTORY_LEN,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

pub use progress::{duration_text, progress, progressing, stall_after_seconds};
pub use writer::Writer;

use crate::conditions::{self, Desired};
use crate::fetch::{Observed, Phase};
use crate::lifecycle::{Decision, JobPhase, StartTime};
use crate::validate::ValidatedJob;

/// Balancing results for status (all optional: kept from before when absent).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Extras {
    /// The plan currently in the ConfigMap.
    pub plan: Option<BatchPlan>,
    /// Conditions from the balancing stage (Profiled, Rebalanced).
    pub conditions: Vec<Desired>,
    pub last_rebalance: Option<RebalanceStatus>,
    pub balance: Option<BalanceStatus>,
    pub cluster_samples_per_second: Option<f64>,
    /// Samples per second per rank, when measured.
    pub rank_samples_per_second: Vec<Option<f64>>,
    pub step: Option<u64>,
    pub epoch: Option<u32>,
    /// The step the run ends at (rank 0's `heterotrain_total_steps`).
    pub total_steps: Option<u64>,
    /// What bounds each training rank's step, when measured.
    pub rank_bottlenecks: Option<Vec<RankBottleneck>>,
}

impl Extras {
    /// No measured figures, only the plan in the ConfigMap.
    pub fn with_plan(plan: Option<BatchPlan>) -> Extras {
        Extras {
            plan,
            ..Default::default()
        }
    }
}

/// Status for an invalid spec: `Failed` with reason `Invalid` and the message.
pub fn invalid(job: &HeteroTrainingJob, message: &str, now: &Time) -> HeteroTrainingJobStatus {
    let mut s = job.status.clone().unwrap_or_default();
    let generation = job.metadata.generation;
    conditions::set(
        &mut s.conditions,
        Desired::yes(
            conditions::types::FAILED,
            conditions::reasons::INVALID,
            message,
        ),
        generation,
        now,
    );
    s.phase = Some("Failed".into());
    s.observed_generation = generation;
    s
}

/// `Durable`: True with a checkpoint claim, else False with what to do.
pub fn durability(v: &ValidatedJob) -> Desired {
    use conditions::{reasons, types};
    match &v.spec().checkpoint.claim_name {
        Some(claim) => Desired::yes(
            types::DURABLE,
            reasons::CHECKPOINT_CLAIM,
            format!(
                "checkpoints and the trained model go to claim {claim}, directory {}",
                v.checkpoint_dir()
            ),
        ),
        None => Desired::no(
            types::DURABLE,
            reasons::EPHEMERAL_STORAGE,
            conditions::EPHEMERAL_MESSAGE,
        ),
    }
}

/// `NetworkIsolated`: False (a warning with what to do) when the spec
/// turned the job's NetworkPolicies off; back to True once they are on
/// again (isolated jobs, the default, do not carry it otherwise).
pub fn isolation(v: &ValidatedJob, current: &[Condition]) -> Option<Desired> {
    use conditions::{reasons, types};
    if v.spec().isolation.network_policy {
        conditions::get(current, types::NETWORK_ISOLATED)?;
        Some(Desired::yes(
            types::NETWORK_ISOLATED,
            reasons::NETWORK_POLICIES,
            "only the job's own pods reach its ranks; /metrics only from the allowed namespaces",
        ))
    } else {
        Some(Desired::no(
            types::NETWORK_ISOLATED,
            reasons::ISOLATION_DISABLED,
            "spec.isolation.networkPolicy is false: any pod that can reach the ranks can join \
             the c10d rendezvous or read /metrics; remove the field to isolate the job",
        ))
    }
}

/// Append `r` to `history` unless its generation is already the newest
/// there (a decision is carried into several status writes), keeping the
/// last [`PLAN_HISTORY_LEN`].
fn remember_decision(history: &mut Vec<RebalanceStatus>, r: &RebalanceStatus) {
    if history.last().is_some_and(|h| h.generation == r.generation) {
        return;
    }
    history.push(r.clone());
    let extra = history.len().saturating_sub(PLAN_HISTORY_LEN);
    history.drain(..extra);
}

/// Next status from the lifecycle `d`, the observed pods and balancing `x`:
/// the conditions, the lifecycle's fields, the balancing figures, then the
/// progress.
pub fn next(
    v: &ValidatedJob,
    d: &Decision,
    obs: &Observed,
    x: &Extras,
    now: &Time,
) -> HeteroTrainingJobStatus {
    let mut s = v.status();
    let generation = v.job.metadata.generation;
    for c in d.conditions.iter().chain(&x.conditions) {
        conditions::set(&mut s.conditions, c.clone(), generation, now);
    }
    if let Some(c) = isolation(v, &s.conditions) {
        conditions::set(&mut s.conditions, c, generation, now);
    }
    conditions::set(&mut s.conditions, durability(v), generation, now);
    lifecycle_fields(&mut s, v, d, now);
    balancing_figures(&mut s, d, x);
    s.groups = groups(v, d, obs, x);
    progress_fields(&mut s, v, d, obs, x, now);
    s
}

/// What the lifecycle decided: phase, counts, start and completion times.
fn lifecycle_fields(s: &mut HeteroTrainingJobStatus, v: &ValidatedJob, d: &Decision, now: &Time) {
    s.phase = Some(d.phase.as_str().into());
    // Recorded with the first phase, so the directory never changes.
    s.checkpoint_dir = v
        .spec()
        .checkpoint
        .claim_name
        .as_ref()
        .map(|_| v.checkpoint_dir());
    s.observed_generation = v.job.metadata.generation;
    s.ranks = v.world_size;
    s.restarts = d.restarts;
    s.disruptions = d.disruptions;
    match d.start_time {
        StartTime::Keep => {}
        StartTime::SetNow => s.start_time = Some(now.clone()),
        StartTime::Clear => s.start_time = None,
    }
    if d.complete {
        if s.completion_time.is_none() {
            s.completion_time = Some(now.clone());
        }
    } else {
        s.completion_time = None;
    }
}

/// What balancing measured and decided: the plan, throughput, step and
/// epoch, balance quality, the last decision, bottlenecks.
fn balancing_figures(s: &mut HeteroTrainingJobStatus, d: &Decision, x: &Extras) {
    if let Some(p) = &x.plan {
        s.plan_generation = p.generation;
        s.left_out_ranks = p
            .left_out()
            .into_iter()
            .filter_map(|r| u32::try_from(r).ok())
            .collect();
    }
    if let Some(v) = x.cluster_samples_per_second {
        s.cluster_samples_per_second = Some(round3(v));
    }
    if let Some(v) = x.step {
        s.step = v;
    }
    if let Some(v) = x.epoch {
        s.epoch = v;
    }
    if let Some(b) = &x.balance {
        s.balance = Some(BalanceStatus {
            cv_percent: round3(b.cv_percent),
            class: b.class.clone(),
        });
    }
    if let Some(r) = &x.last_rebalance {
        s.last_rebalance = Some(r.clone());
        remember_decision(&mut s.plan_history, r);
    }
    if d.phase != JobPhase::Running {
        s.rank_bottlenecks.clear();
    } else if let Some(b) = &x.rank_bottlenecks {
        s.rank_bottlenecks = b.clone();
    }
}

/// Progress (steps, rate, ETA), `Progressing` while running, and the last
/// step of a finished run.
fn progress_fields(
    s: &mut HeteroTrainingJobStatus,
    v: &ValidatedJob,
    d: &Decision,
    obs: &Observed,
    x: &Extras,
    now: &Time,
) {
    let old_step = v.job.status.as_ref().map_or(0, |o| o.step);
    s.progress = progress(
        s.progress.take(),
        x.total_steps,
        s.step,
        old_step,
        steps_per_second(x, v.global_batch),
        d.phase == JobPhase::Succeeded,
        now,
    );
    if d.phase == JobPhase::Running {
        let step_seconds = steps_per_second(x, v.global_batch).map(|r| 1.0 / r);
        if let Some(c) = progressing(s.progress.as_ref(), s.step, step_seconds, now) {
            conditions::set(&mut s.conditions, c, v.job.metadata.generation, now);
        }
    }
    if d.phase == JobPhase::Succeeded {
        // The last scrape may predate the last step, or there was none (a
        // run shorter than the first read): a finished run did them all,
        // and its ranks say at which step they ended.
        if let Some(p) = &s.progress {
            s.step = s.step.max(p.total_steps);
        }
        s.step = s.step.max(finished_step(obs, d.restarts).unwrap_or(0));
    }
}

/// The last step the current gang's ranks name in their termination
/// messages ([`heterotrain_crds::FINISHED_AT_STEP`]), if any does.
fn finished_step(obs: &Observed, restart: u32) -> Option<u64> {
    obs.pods
        .iter()
        .filter(|p| p.restart == Some(restart))
        .filter_map(|p| {
            p.message
                .as_deref()
                .and_then(heterotrain_crds::finished_step)
        })
        .max()
}

/// Each worker group's status: ready ranks of the current restart, batches
/// under the plan and measured throughput (kept from before when unmeasured).
fn groups(v: &ValidatedJob, d: &Decision, obs: &Observed, x: &Extras) -> Vec<GroupStatus> {
    let job = v.job;
    let plan = x.plan.as_ref();
    v.spec()
        .workers
        .iter()
        .enumerate()
        .map(|(gi, g)| {
            let ranks: Vec<usize> = (0..v.ranks()).filter(|&r| v.layout[r].0 == gi).collect();
            let ready = ranks
                .iter()
                .filter(|&&r| {
                    obs.pods.iter().any(|p| {
                        p.rank == Some(r as u32)
                            && p.restart == Some(d.restarts)
                            && p.phase == Phase::Running
                            && !p.deleting
                    })
                })
                .count() as u32;
            let sps: Vec<f64> = ranks
                .iter()
                .filter_map(|&r| x.rank_samples_per_second.get(r).copied().flatten())
                .collect();
            let old = job
                .status
                .as_ref()
                .and_then(|s| s.groups.iter().find(|o| o.name == g.name));
            GroupStatus {
                name: g.name.clone(),
                device: g.device,
                replicas: g.replicas,
                ready,
                batch_sizes: plan
                    .map(|p| {
                        ranks
                            .iter()
                            .filter_map(|&r| p.batch_sizes.get(r).copied())
                            .collect()
                    })
                    .unwrap_or_default(),
                samples_per_second: if sps.is_empty() {
                    old.and_then(|o| o.samples_per_second)
                } else {
                    Some(round3(sps.iter().sum()))
                },
            }
        })
        .collect()
}

/// Steps per second from the measured cluster throughput (B samples a step).
fn steps_per_second(x: &Extras, global_batch: u32) -> Option<f64> {
    x.cluster_samples_per_second
        .filter(|v| v.is_finite() && *v > 0.0 && global_batch > 0)
        .map(|v| v / f64::from(global_batch))
}

/// Round to 3 significant digits so measured figures do not churn status.
pub fn round3(v: f64) -> f64 {
    if !v.is_finite() || v == 0.0 {
        return 0.0;
    }
    let mag = 10f64.powi(2 - v.abs().log10().floor() as i32);
    (v * mag).round() / mag
}

#[cfg(test)]
mod tests {
    use super::{remember_decision, round3, RebalanceStatus, PLAN_HISTORY_LEN};

    #[test]
    fn plan_history_keeps_each_decision_once_and_the_newest_few() {
        let mut h = Vec::new();
        let at = |generation: u64| RebalanceStatus {
            generation,
            reason: format!("g{generation}"),
            ..Default::default()
        };
        for g in 1..=3 {
            remember_decision(&mut h, &at(g));
            remember_decision(&mut h, &at(g)); // carried into a later write
        }
        let gens: Vec<u64> = h.iter().map(|r| r.generation).collect();
        assert_eq!(gens, [1, 2, 3]);
        for g in 4..=40 {
            remember_decision(&mut h, &at(g));
        }
        assert_eq!(h.len(), PLAN_HISTORY_LEN);
        assert_eq!(
            h.first().map(|r| r.generation),
            Some(41 - PLAN_HISTORY_LEN as u64)
        );
        assert_eq!(h.last().map(|r| r.generation), Some(40));
    }

    #[test]
    fn rounds_to_three_digits() {
        assert_eq!(round3(1234.5), 1230.0);
        assert_eq!(round3(0.012345), 0.0123);
        assert_eq!(round3(f64::NAN), 0.0);
    }
}
