//! Why a gang ended early, and what follows: a permanent exit code fails
//! the job, a disruption (eviction, deletion, preemption, a SIGTERM stop)
//! recreates the gang without counting toward `backoffLimit`, any other
//! failure recreates it counted.

use std::time::Duration;

use heterotrain_crds::{RunPolicy, STOPPED_BY_SIGNAL};
use k8s_openapi::jiff::Timestamp;

use super::{live, seconds_between, Decision};
use crate::conditions::reasons;
use crate::fetch::{Phase, RankPod};

/// What ended the current gang.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Cause {
    /// A rank exited with a permanent code: fail the job, no restart.
    Permanent(String),
    /// A rank was disrupted: recreate the gang, not counted.
    Disruption(String),
    /// Anything else: recreate the gang within `backoffLimit`.
    Failure(String),
}

/// The pod's message (termination message, else the pod's), shortened.
fn detail(p: &RankPod) -> Option<String> {
    p.message
        .as_deref()
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| m.chars().take(200).collect())
}

fn rank_of(p: &RankPod) -> String {
    p.rank.map_or_else(|| "?".to_string(), |r| r.to_string())
}

/// How a failed or lost rank is described: rank, pod, exit code, reason
/// and the container's termination message.
pub(super) fn failure_text(p: &RankPod) -> String {
    let mut s = format!("rank {} (pod {})", rank_of(p), p.name);
    match (p.exit_code, p.phase) {
        (Some(code), _) => s.push_str(&format!(" exited with code {code}")),
        (None, Phase::Failed) => s.push_str(" failed"),
        _ => s.push_str(" was lost"),
    }
    if let Some(r) = &p.reason {
        s.push_str(&format!(", reason {r}"));
    }
    if let Some(m) = detail(p) {
        s.push_str(&format!(": {m}"));
    }
    s
}

/// The kind of disruption a `DisruptionTarget` reason names.
fn target_kind(reason: &str) -> String {
    if reason.starts_with("Eviction") {
        "evicted".into()
    } else if reason.starts_with("Preemption") {
        "preempted".into()
    } else if reason.starts_with("Deletion") {
        "deleted".into()
    } else if reason.starts_with("Termination") {
        "terminated".into()
    } else {
        reason.to_lowercase()
    }
}

/// Whether `p` was disrupted rather than failed, and how. `others_live`:
/// another rank of the gang still runs; `grace_s`: how long a rank that
/// exited 0 may wait for the others before it counts as stopped early.
fn disruption(p: &RankPod, others_live: bool, grace_s: f64, now: &Timestamp) -> Option<String> {
    if let Some(r) = &p.disruption_target {
        return Some(format!("{}, DisruptionTarget {r}", target_kind(r)));
    }
    if p.phase == Phase::Failed && p.pod_reason.as_deref() == Some("Evicted") {
        return Some("evicted".into());
    }
    if p.deleting {
        return Some("deleted".into());
    }
    if p.phase != Phase::Succeeded {
        return None;
    }
    if p.message
        .as_deref()
        .is_some_and(|m| m.trim_start().starts_with(STOPPED_BY_SIGNAL))
    {
        return Some("stopped by SIGTERM".into());
    }
    let waited = p.finished_at.as_ref().map(|t| seconds_between(t, now));
    (others_live && waited.is_some_and(|w| w >= grace_s))
        .then(|| "exited 0 before the others finished".into())
}

/// Why the current gang (`current`, with `lost` naming ranks whose pods
/// vanished after the gang started) ended, if it did. Permanent exit codes
/// come first, then disruptions, then other failures; each picks the
/// lowest rank. Also returns how long until a rank that exited 0 while
/// others run would count as stopped early.
pub(super) fn cause(
    rp: &RunPolicy,
    current: &[&RankPod],
    lost: Option<String>,
    now: &Timestamp,
) -> (Option<Cause>, Option<Duration>) {
    let grace = f64::from(rp.collective_timeout());
    let live_count = current.iter().filter(|p| live(p)).count();
    let others_live = |p: &RankPod| live_count > usize::from(live(p));
    let mut ranked: Vec<&RankPod> = current.to_vec();
    ranked.sort_by_key(|p| p.rank);

    let disrupted: Vec<(&RankPod, String)> = ranked
        .iter()
        .filter_map(|p| disruption(p, others_live(p), grace, now).map(|k| (*p, k)))
        .collect();
    let permanent = ranked.iter().find(|p| {
        p.phase == Phase::Failed
            && p.exit_code.is_some_and(|c| rp.is_permanent(c))
            && !disrupted.iter().any(|(d, _)| d.name == p.name)
    });
    if let Some(p) = permanent {
        let code = p.exit_code.unwrap_or_default();
        return (
            Some(Cause::Permanent(format!(
                "{}; exit code {code} is permanent (runPolicy.permanentExitCodes): the job is not restarted",
                failure_text(p)
            ))),
            None,
        );
    }
    if let Some((p, kind)) = disrupted.first() {
        let mut s = format!(
            "disruption ({kind}) of rank {}: not counted toward backoffLimit; pod {}",
            rank_of(p),
            p.name
        );
        if let Some(m) = detail(p) {
            s.push_str(&format!(": {m}"));
        }
        return (Some(Cause::Disruption(s)), None);
    }
    if let Some(p) = ranked.iter().find(|p| p.phase == Phase::Failed) {
        return (Some(Cause::Failure(failure_text(p))), None);
    }
    if let Some(why) = lost {
        return (Some(Cause::Failure(why)), None);
    }
    // A rank exited 0 while others run: normal at the end of training, a
    // stop if the others are still running after the grace period.
    let wait = ranked
        .iter()
        .filter(|p| p.phase == Phase::Succeeded && others_live(p))
        .filter_map(|p| p.finished_at.as_ref())
        .map(|t| grace - seconds_between(t, now))
        .fold(None, |acc: Option<f64>, w| {
            Some(acc.map_or(w, |a| a.min(w)))
        });
    (None, wait.map(|w| Duration::from_secs_f64(w.max(0.1))))
}

/// Act on `cause`: fail, or recreate the gang counting only failures.
pub(super) fn apply(d: &mut Decision, rp: &RunPolicy, current: &[&RankPod], cause: Cause) {
    let restarts = d.restarts;
    let disruptions = d.disruptions.min(restarts);
    let counted = restarts - disruptions;
    let limit = rp.backoff_limit;
    let still: Vec<String> = current
        .iter()
        .filter(|p| live(p))
        .map(|p| p.name.clone())
        .collect();
    let (why, disrupted) = match cause {
        Cause::Permanent(why) => {
            d.fail(reasons::PERMANENT_EXIT_CODE, why, still);
            return;
        }
        Cause::Failure(why) if counted >= limit => {
            let also = if disruptions > 0 {
                format!(" (and {disruptions} disruption(s), not counted)")
            } else {
                String::new()
            };
            let msg =
                format!("{why}; backoffLimit {limit} reached after {counted} restart(s){also}");
            d.fail(reasons::BACKOFF_LIMIT_EXCEEDED, msg, still);
            return;
        }
        Cause::Failure(why) => (why, false),
        Cause::Disruption(why) => (why, true),
    };
    d.restarts = restarts.saturating_add(1);
    let msg = if disrupted {
        d.disruptions = disruptions.saturating_add(1);
        format!(
            "{why}; recreating the gang from the latest checkpoint (restart {}; {counted} of backoffLimit {limit} used)",
            d.restarts
        )
    } else {
        let total = if disruptions > 0 {
            format!("; restart {} in all", d.restarts)
        } else {
            String::new()
        };
        format!(
            "{why}; recreating the gang from the latest checkpoint (restart {} of backoffLimit {limit}{total})",
            counted.saturating_add(1)
        )
    };
    d.take_down(current, msg.clone());
    d.event(!disrupted, reasons::GANG_RESTARTING, msg);
    d.requeue(Duration::from_secs(1));
}
