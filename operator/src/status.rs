//! Status stage: fold the lifecycle decision and the balancing results into
//! `status` (conditions first) with [`next`] (pure), and patch it only when
//! it changed ([`Writer`]).

use heterotrain_crds::{
    BalanceStatus, BatchPlan, GroupStatus, HeteroTrainingJob, HeteroTrainingJobStatus,
    ProgressStatus, RebalanceStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch};
use kube::{Client, ResourceExt};

use crate::apply::ssa;
use crate::conditions::{self, Desired};
use crate::error::Result;
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

/// Next status from the lifecycle `d`, the observed pods and balancing `x`.
pub fn next(
    v: &ValidatedJob,
    d: &Decision,
    obs: &Observed,
    x: &Extras,
    now: &Time,
) -> HeteroTrainingJobStatus {
    let job = v.job;
    let mut s = v.status();
    let generation = job.metadata.generation;
    for c in d.conditions.iter().chain(&x.conditions) {
        conditions::set(&mut s.conditions, c.clone(), generation, now);
    }
    s.phase = Some(d.phase.as_str().into());
    s.observed_generation = generation;
    s.ranks = v.world_size;
    s.restarts = d.restarts;
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
    if let Some(p) = &x.plan {
        s.plan_generation = p.generation;
        s.left_out_ranks = p
            .left_out()
            .into_iter()
            .filter_map(|r| u32::try_from(r).ok())
            .collect();
    }
    let plan = x.plan.as_ref();
    s.groups = v
        .spec()
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
        .collect();
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
    }
    let old_step = job.status.as_ref().map_or(0, |o| o.step);
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
            conditions::set(&mut s.conditions, c, generation, now);
        }
    }
    if d.phase == JobPhase::Succeeded {
        // The last scrape may predate the last step: a finished run did
        // them all.
        if let Some(p) = &s.progress {
            s.step = s.step.max(p.total_steps);
        }
    }
    s
}

/// Steps per second from the measured cluster throughput (B samples a step).
fn steps_per_second(x: &Extras, global_batch: u32) -> Option<f64> {
    x.cluster_samples_per_second
        .filter(|v| v.is_finite() && *v > 0.0 && global_batch > 0)
        .map(|v| v / f64::from(global_batch))
}

/// Progress from the run's total steps (kept from `old` when not read this
/// round), rank 0's `step` and the throughput; `done` once the job
/// Succeeded. None until the total is known.
pub fn progress(
    old: Option<ProgressStatus>,
    total_steps: Option<u64>,
    step: u64,
    old_step: u64,
    steps_per_second: Option<f64>,
    done: bool,
    now: &Time,
) -> Option<ProgressStatus> {
    let total = total_steps
        .or(old.as_ref().map(|o| o.total_steps))
        .filter(|&t| t > 0)?;
    let step = if done { total } else { step.min(total) };
    let percent = if done {
        100
    } else {
        ((step as f64 / total as f64) * 100.0).floor().min(99.0) as u32
    };
    let remaining = if done {
        Some(0)
    } else {
        steps_per_second
            .map(|r| ((total - step) as f64 / r).ceil() as u64)
            .or(old.as_ref().and_then(|o| o.estimated_remaining_seconds))
    };
    let moved = step != old_step || done != (old.as_ref().map(|o| o.percent) == Some(100));
    Some(ProgressStatus {
        total_steps: total,
        percent,
        percent_text: format!("{percent}%"),
        estimated_remaining_seconds: remaining,
        eta: remaining.map(duration_text),
        last_update_time: if moved || old.is_none() {
            Some(now.clone())
        } else {
            old.and_then(|o| o.last_update_time)
        },
    })
}

/// Seconds without a step before a running job counts as stalled: ten
/// measured steps, and never under a minute (evaluations and checkpoints
/// take a while).
pub fn stall_after_seconds(step_seconds: Option<f64>) -> f64 {
    step_seconds
        .filter(|s| s.is_finite() && *s > 0.0)
        .map_or(STALL_FLOOR_SECONDS, |s| (10.0 * s).max(STALL_FLOOR_SECONDS))
}

const STALL_FLOOR_SECONDS: f64 = 60.0;

/// The `Progressing` condition of a running job: True while rank 0's step
/// moves, False (`Stalled`) once it has not for [`stall_after_seconds`].
/// None until progress is known.
pub fn progressing(
    p: Option<&ProgressStatus>,
    step: u64,
    step_seconds: Option<f64>,
    now: &Time,
) -> Option<Desired> {
    let since = p?.last_update_time.as_ref()?;
    let idle = (now.0.as_millisecond() - since.0.as_millisecond()) as f64 / 1000.0;
    let limit = stall_after_seconds(step_seconds);
    Some(if idle > limit {
        Desired::no(
            conditions::types::PROGRESSING,
            conditions::reasons::STALLED,
            format!(
                "no step for {idle:.0} s (at step {step}, over the {limit:.0} s allowed); a hung or stopped rank fails the gang after runPolicy.collectiveTimeoutSeconds"
            ),
        )
    } else {
        Desired::yes(
            conditions::types::PROGRESSING,
            conditions::reasons::STEP_ADVANCING,
            format!("at step {step}"),
        )
    })
}

/// "1h2m", "4m10s", "12s", as `kubectl` prints ages.
pub fn duration_text(seconds: u64) -> String {
    let (h, m, s) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// Round to 3 significant digits so measured figures do not churn status.
pub fn round3(v: f64) -> f64 {
    if !v.is_finite() || v == 0.0 {
        return 0.0;
    }
    let mag = 10f64.powi(2 - v.abs().log10().floor() as i32);
    (v * mag).round() / mag
}

/// Patches a job's status, each time only when it differs from the last
/// status known to be on the server.
pub struct Writer<'a> {
    client: &'a Client,
    namespace: &'a str,
    name: String,
    current: Option<HeteroTrainingJobStatus>,
}

impl<'a> Writer<'a> {
    /// A writer for `job` in `namespace`, starting from its status as watched.
    pub fn new(client: &'a Client, job: &HeteroTrainingJob, namespace: &'a str) -> Writer<'a> {
        Writer {
            client,
            namespace,
            name: job.name_any(),
            current: job.status.clone(),
        }
    }

    /// Patch `status` unless it is already there; whether it patched.
    pub async fn write(&mut self, status: HeteroTrainingJobStatus) -> Result<bool> {
        if self.current.as_ref() == Some(&status) {
            return Ok(false);
        }
        let api: Api<HeteroTrainingJob> = Api::namespaced(self.client.clone(), self.namespace);
        let body = serde_json::json!({
            "apiVersion": "heterotrain.dev/v1alpha1",
            "kind": "HeteroTrainingJob",
            "status": status,
        });
        api.patch_status(&self.name, &ssa(), &Patch::Apply(body))
            .await?;
        self.current = Some(status);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::round3;

    #[test]
    fn rounds_to_three_digits() {
        assert_eq!(round3(1234.5), 1230.0);
        assert_eq!(round3(0.012345), 0.0123);
        assert_eq!(round3(f64::NAN), 0.0);
    }
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    fn at(s: &str) -> Time {
        Time(s.parse().expect("time"))
    }

    #[test]
    fn progress_percent_eta_and_finish() {
        let t0 = at("2026-01-01T00:00:00Z");
        let t1 = at("2026-01-01T00:01:00Z");
        // Nothing before the total is known.
        assert_eq!(progress(None, None, 10, 0, Some(2.0), false, &t0), None);
        // 250 of 1000 steps at 2 steps/s: 25%, 375 s left.
        let p = progress(None, Some(1000), 250, 0, Some(2.0), false, &t0).unwrap();
        assert_eq!((p.percent, p.percent_text.as_str()), (25, "25%"));
        assert_eq!(p.estimated_remaining_seconds, Some(375));
        assert_eq!(p.eta.as_deref(), Some("6m15s"));
        assert_eq!(p.last_update_time, Some(t0.clone()));
        // No new throughput or total: both kept; the step did not move, so
        // neither did the update time.
        let q = progress(Some(p.clone()), None, 250, 250, None, false, &t1).unwrap();
        assert_eq!(q.total_steps, 1000);
        assert_eq!(q.estimated_remaining_seconds, Some(375));
        assert_eq!(q.last_update_time, Some(t0.clone()));
        // 999 of 1000 is not done; a Succeeded job is, whatever was read.
        let r = progress(Some(q), None, 999, 250, Some(2.0), false, &t1).unwrap();
        assert_eq!(
            (r.percent, r.last_update_time.clone()),
            (99, Some(t1.clone()))
        );
        let done = progress(Some(r), None, 998, 999, None, true, &t1).unwrap();
        assert_eq!(done.percent, 100);
        assert_eq!(done.estimated_remaining_seconds, Some(0));
        assert_eq!(done.eta.as_deref(), Some("0s"));
    }

    #[test]
    fn a_step_that_stops_moving_turns_progressing_false() {
        let t0 = at("2026-01-01T00:00:00Z");
        let p = progress(None, Some(1000), 40, 0, Some(10.0), false, &t0).unwrap();
        let c = |now: &str, step_s: Option<f64>| {
            progressing(Some(&p), 40, step_s, &at(now)).expect("condition")
        };
        assert!(c("2026-01-01T00:00:30Z", Some(0.1)).status);
        let stalled = c("2026-01-01T00:01:01Z", Some(0.1));
        assert!(!stalled.status);
        assert_eq!(stalled.reason, conditions::reasons::STALLED);
        assert!(
            stalled.message.contains("no step for 61 s"),
            "{}",
            stalled.message
        );
        // Slow steps (20 s each) get ten of them.
        assert!(c("2026-01-01T00:03:00Z", Some(20.0)).status);
        assert!(!c("2026-01-01T00:03:21Z", Some(20.0)).status);
        assert_eq!(progressing(None, 40, None, &t0), None);
    }

    #[test]
    fn durations_read_like_kubectl() {
        assert_eq!(duration_text(0), "0s");
        assert_eq!(duration_text(59), "59s");
        assert_eq!(duration_text(61), "1m1s");
        assert_eq!(duration_text(3725), "1h2m");
    }
}
