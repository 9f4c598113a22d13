//! Gang restarts: failures counted toward `backoffLimit`, disruptions
//! (eviction, deletion, `DisruptionTarget`, a SIGTERM stop) not counted,
//! and permanent exit codes that fail the job at once.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;

use super::*;

#[test]
fn failed_rank_with_backoff_left_restarts_the_gang() {
    let c = Case::load("failed");
    let (d, s) = c.run();
    let msg = "rank 1 (pod lc-1) exited with code 1, reason Error: loss is NaN; \
               recreating the gang from the latest checkpoint (restart 1 of backoffLimit 2)";
    assert_eq!(d.phase, JobPhase::Pending);
    assert_eq!(d.restarts, 1);
    assert_eq!(d.delete_pods, names(&["lc-0", "lc-1"]));
    assert!(d.create_ranks.is_empty());
    assert!(!d.complete && !d.balance);
    assert_eq!(d.requeue_after, Some(Duration::from_secs(1)));
    assert_eq!(events(&d), [(true, "GangRestarting", msg)]);
    assert_eq!(
        conditions(&s),
        [
            ("Failed", "False", "SpecAccepted"),
            ("Created", "True", "GangCreated"),
            ("Running", "False", "GangRestarting"),
        ]
    );
    assert_eq!(message(&s, "Running"), msg);
    assert_eq!(s.restarts, 1);
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    assert_eq!(s.completion_time, None);
    // The old gang's pods are not ready pods of the new one.
    assert_eq!(s.groups[0].ready, 0);
}

#[test]
fn failed_rank_past_backoff_limit_fails_the_job() {
    let c = Case::load("backoff_exhausted");
    let (d, s) = c.run();
    let msg = "rank 0 (pod lc-0) exited with code 137, reason OOMKilled; \
               backoffLimit 2 reached after 2 restart(s)";
    assert_eq!(d.phase, JobPhase::Failed);
    assert_eq!(d.restarts, 2);
    // Only the live rank is stopped; the failed pod stays for its logs.
    assert_eq!(d.delete_pods, names(&["lc-1"]));
    assert!(d.complete);
    assert!(!d.delete_job && !d.balance);
    assert_eq!(d.requeue_after, None);
    assert_eq!(events(&d), [(true, "BackoffLimitExceeded", msg)]);
    assert_eq!(
        conditions(&s),
        [
            ("Failed", "True", "BackoffLimitExceeded"),
            ("Created", "True", "GangCreated"),
            ("Running", "False", "BackoffLimitExceeded"),
        ]
    );
    assert_eq!(message(&s, "Failed"), msg);
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(s.completion_time, Some(c.now.clone()));
}

/// A restart that does not count: one more restart and one more
/// disruption, `delete` deleted, a Normal Event and the Running message.
fn assert_disruption(c: &Case, msg: &str, delete: &[&str]) {
    let before = c.job.status.clone().unwrap_or_default();
    let (d, s) = c.run();
    assert_eq!(d.phase, JobPhase::Pending);
    assert_eq!(d.restarts, before.restarts + 1);
    assert_eq!(d.disruptions, before.disruptions + 1);
    assert_eq!(d.delete_pods, names(delete));
    assert!(d.create_ranks.is_empty() && !d.complete && !d.balance);
    assert_eq!(d.requeue_after, Some(Duration::from_secs(1)));
    assert_eq!(events(&d), [(false, "GangRestarting", msg)]);
    assert_eq!(message(&s, "Running"), msg);
    assert_eq!(
        conditions(&s),
        [
            ("Failed", "False", "SpecAccepted"),
            ("Created", "True", "GangCreated"),
            ("Running", "False", "GangRestarting"),
        ]
    );
    assert_eq!((s.restarts, s.disruptions), (d.restarts, d.disruptions));
    let json = serde_json::to_value(&s).expect("json");
    assert_eq!(json["disruptions"], serde_json::json!(d.disruptions));
}

#[test]
fn an_evicted_rank_restarts_the_gang_uncounted() {
    // backoffLimit 1 and one restart so far: a failure would end the job.
    let c = Case::load("evicted");
    assert_disruption(
        &c,
        "disruption (evicted) of rank 1: not counted toward backoffLimit; pod lc-1: \
         The node was low on resource: memory.; recreating the gang from the latest \
         checkpoint (restart 2; 1 of backoffLimit 1 used)",
        &["lc-0", "lc-1"],
    );
    // The same pod failed without the eviction: counted, and the limit is reached.
    let mut failed = Case::load("evicted");
    failed.pods[1].status.as_mut().expect("status").reason = None;
    let (d, s) = failed.run();
    assert_eq!(d.phase, JobPhase::Failed);
    assert_eq!(
        cond::get(&s.conditions, "Failed").expect("Failed").reason,
        "BackoffLimitExceeded"
    );
}

#[test]
fn a_disruption_target_rank_restarts_the_gang_uncounted() {
    // Rank 1's exit 1 is the consequence of rank 0's eviction.
    let c = Case::load("disruption_target");
    assert_disruption(
        &c,
        "disruption (evicted, DisruptionTarget EvictionByEvictionAPI) of rank 0: not counted \
         toward backoffLimit; pod lc-0; recreating the gang from the latest checkpoint \
         (restart 1; 0 of backoffLimit 2 used)",
        &["lc-0", "lc-1"],
    );
}

#[test]
fn a_deleted_rank_restarts_the_gang_uncounted() {
    let c = Case::load("deleted");
    assert_disruption(
        &c,
        "disruption (deleted) of rank 1: not counted toward backoffLimit; pod lc-1; \
         recreating the gang from the latest checkpoint (restart 1; 0 of backoffLimit 2 used)",
        &["lc-0"],
    );
}

#[test]
fn a_rank_stopped_by_sigterm_restarts_the_gang_uncounted() {
    let c = Case::load("sigterm_exit0");
    assert_disruption(
        &c,
        "disruption (stopped by SIGTERM) of rank 1: not counted toward backoffLimit; pod lc-1: \
         heterotrain: stopped by signal after step 40, checkpoint written; recreating the gang \
         from the latest checkpoint (restart 1; 0 of backoffLimit 2 used)",
        &["lc-0", "lc-1"],
    );
    // Every rank stopped (they agree on the stop): still not the end of training.
    let mut all = Case::load("sigterm_exit0");
    all.pods[0] = all.pods[1].clone();
    all.pods[0].metadata.name = Some("lc-0".into());
    if let Some(l) = all.pods[0].metadata.labels.as_mut() {
        l.insert("heterotrain.dev/rank".into(), "0".into());
    }
    let (d, _) = all.run();
    assert_eq!(
        (d.phase, d.restarts, d.disruptions),
        (JobPhase::Pending, 1, 1)
    );
}

#[test]
fn a_rank_that_exited_0_waits_for_the_others_then_counts_as_stopped() {
    // No stop message: 10 s after it exited, the others may be finishing.
    let mut c = Case::load("sigterm_exit0");
    let state = c.pods[1]
        .status
        .as_mut()
        .and_then(|s| s.container_statuses.as_mut())
        .and_then(|cs| cs[0].state.as_mut())
        .and_then(|s| s.terminated.as_mut())
        .expect("terminated");
    state.message = None;
    let (d, _) = c.run();
    assert_eq!((d.restarts, d.disruptions), (0, 0));
    assert!(d.delete_pods.is_empty() && d.events.is_empty());
    // Wait out the default collective timeout (300 s) after it exited.
    assert_eq!(d.requeue_after, Some(Duration::from_secs(290)));
    // Past it, rank 0 still runs: the exit was a stop.
    let later = Time(c.now.0 + SignedDuration::from_secs(290));
    let (d, _) = c.run_at(&later);
    assert_eq!((d.restarts, d.disruptions), (1, 1));
    assert_eq!(d.delete_pods, names(&["lc-0", "lc-1"]));
    assert!(d.events[0]
        .note
        .starts_with("disruption (exited 0 before the others finished) of rank 1: not counted"));
}

#[test]
fn a_permanent_exit_code_fails_the_job_without_a_restart() {
    let c = Case::load("permanent");
    let (d, s) = c.run();
    let msg = "rank 1 (pod lc-1) exited with code 2, reason Error: error: unexpected argument \
               '--bogus' found; exit code 2 is permanent (runPolicy.permanentExitCodes): the job \
               is not restarted";
    assert_eq!(d.phase, JobPhase::Failed);
    assert_eq!((d.restarts, d.disruptions), (0, 0));
    assert_eq!(d.delete_pods, names(&["lc-0"]));
    assert!(d.complete);
    assert_eq!(events(&d), [(true, "PermanentExitCode", msg)]);
    assert_eq!(
        conditions(&s),
        [
            ("Failed", "True", "PermanentExitCode"),
            ("Created", "True", "GangCreated"),
            ("Running", "False", "PermanentExitCode"),
        ]
    );
    assert_eq!(message(&s, "Failed"), msg);
    assert_eq!(s.phase.as_deref(), Some("Failed"));

    // With no permanent codes, 2 is retried like any other.
    let mut retry = Case::load("permanent");
    retry.job.spec.run_policy.permanent_exit_codes = Vec::new();
    let (d, _) = retry.run();
    assert_eq!(
        (d.phase, d.restarts, d.disruptions),
        (JobPhase::Pending, 1, 0)
    );
    assert!(d.events[0].note.ends_with("(restart 1 of backoffLimit 3)"));
}

#[test]
fn disruptions_do_not_use_up_the_backoff_limit() {
    // Two restarts, one of them a disruption: one failure of 2 used.
    let mut c = Case::load("backoff_exhausted");
    c.job.status.as_mut().expect("status").disruptions = 1;
    let (d, s) = c.run();
    assert_eq!(d.phase, JobPhase::Pending);
    assert_eq!((d.restarts, d.disruptions), (3, 1));
    assert_eq!(
        events(&d),
        [(
            true,
            "GangRestarting",
            "rank 0 (pod lc-0) exited with code 137, reason OOMKilled; recreating the gang \
             from the latest checkpoint (restart 2 of backoffLimit 2; restart 3 in all)"
        )]
    );
    assert_eq!((s.restarts, s.disruptions), (3, 1));
}

#[test]
fn a_previous_gang_pod_stuck_terminating_is_force_deleted() {
    let c = Case::load("stuck_terminating");
    let (d, s) = c.run();
    // lc-1 is 90 s past its grace period: deleted from the API now; lc-0
    // (5 s to go) is left to its kubelet. No new pods until both are gone.
    assert_eq!(d.force_delete_pods, names(&["lc-1"]));
    assert!(d.create_ranks.is_empty());
    assert_eq!(d.restarts, 1, "force deletion is not another restart");
    let ev = events(&d);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!((ev[0].0, ev[0].1), (true, "ForceDeleted"));
    assert!(
        ev[0].2.contains("lc-1") && !ev[0].2.contains("lc-0"),
        "{}",
        ev[0].2
    );
    assert!(message(&s, "Running").contains("previous gang"));
    // 29 s past the grace period: not yet.
    let (d, _) = c.run_at(&at("2025-01-01T00:58:59Z"));
    assert!(d.force_delete_pods.is_empty());
    assert_eq!(d.requeue_after, Some(Duration::from_secs(1)));
}

#[test]
fn waiting_ranks_are_named_and_the_job_fails_after_the_pods_ready_timeout() {
    let c = Case::load("waiting");
    let (d, s) = c.run();
    assert_eq!(d.phase, JobPhase::Pending);
    let running = cond::get(&s.conditions, "Running").expect("Running");
    assert_eq!(
        (running.status.as_str(), running.reason.as_str()),
        ("False", "ImagePullBackOff")
    );
    let m = &running.message;
    assert!(
        m.starts_with(
            "0 of 2 ranks running; rank 0 (pod lc-0): ImagePullBackOff: Back-off pulling image"
        ),
        "{m}"
    );
    assert!(
        m.contains("rank 1 (pod lc-1): Unschedulable: 0/3 nodes are available"),
        "{m}"
    );
    // The new cause is announced once, as a warning.
    let ev = events(&d);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!((ev[0].0, ev[0].1), (true, "ImagePullBackOff"));
    // Requeued for the timeout (300 s after 00:59:00, now 01:00:00).
    assert_eq!(d.requeue_after, Some(Duration::from_secs(240)));
    // At 01:04:00 the 300 s have passed: Failed, PodsNotReady, pods deleted.
    let (d, s) = c.run_at(&at("2025-01-01T01:04:00Z"));
    assert_eq!(d.phase, JobPhase::Failed);
    assert_eq!(d.delete_pods, names(&["lc-0", "lc-1"]));
    let failed = cond::get(&s.conditions, "Failed").expect("Failed");
    assert_eq!(failed.reason, "PodsNotReady");
    assert!(
        failed.message.contains("ImagePullBackOff")
            && failed.message.contains("podsReadyTimeoutSeconds 300"),
        "{}",
        failed.message
    );
    // Without a timeout the job keeps waiting.
    let mut c = c;
    c.job.spec.run_policy.pods_ready_timeout_seconds = None;
    let (d, _) = c.run_at(&at("2025-01-02T00:00:00Z"));
    assert_eq!(d.phase, JobPhase::Pending);
}

#[test]
fn a_stalled_gang_is_restarted_by_the_progress_deadline() {
    let c = Case::load("stalled");
    // 300 s since the step moved, past the 240 s deadline: a counted restart.
    let (d, s) = c.run();
    assert_eq!(d.restarts, 1);
    assert_eq!(d.disruptions, 0);
    assert_eq!(d.delete_pods, names(&["lc-0", "lc-1"]));
    let ev = events(&d);
    assert_eq!((ev[0].0, ev[0].1), (true, "GangRestarting"));
    assert!(ev[0].2.contains("no training step for 300s"), "{}", ev[0].2);
    assert_eq!(s.restarts, 1);
    // 200 s since it moved: running, balanced, checked again when the 240 s are up.
    let (d, _) = c.run_at(&at("2025-01-01T00:58:20Z"));
    assert_eq!(d.phase, JobPhase::Running);
    assert!(d.balance);
    assert_eq!(d.requeue_after, Some(Duration::from_secs(40)));
    // A new gang counts from its pods' creation, not from an older step.
    let mut c2 = Case::load("stalled");
    for p in &mut c2.pods {
        p.metadata.creation_timestamp = Some(at("2025-01-01T00:59:00Z"));
    }
    let (d, _) = c2.run();
    assert_eq!(d.phase, JobPhase::Running);
    // Unset: no watchdog.
    let mut c3 = Case::load("stalled");
    c3.job.spec.run_policy.progress_deadline_seconds = None;
    assert_eq!(c3.run().0.phase, JobPhase::Running);
}

#[test]
fn a_gang_held_by_a_queue_is_not_timed_out_until_it_is_admitted() {
    let mut c = Case::load("queued");
    // 600 s after creation, past the 120 s timeout, but rank 0 is still
    // gated: queued, not stuck — named, and no clock runs.
    let (d, s) = c.run();
    assert_eq!(d.phase, JobPhase::Pending);
    let running = cond::get(&s.conditions, "Running").expect("Running");
    assert_eq!(running.reason, "SchedulingGated");
    assert!(
        running
            .message
            .contains("rank 0 (pod lc-0): SchedulingGated: held by kueue.x-k8s.io/admission"),
        "{}",
        running.message
    );
    // Admitted: the clock runs from the last scheduling (00:58:00), not
    // from the creation ten minutes ago.
    c.pods[0].spec.as_mut().expect("spec").scheduling_gates = None;
    let (d, _) = c.run_at(&at("2025-01-01T00:59:00Z"));
    assert_eq!(d.phase, JobPhase::Pending);
    assert_eq!(d.requeue_after, Some(Duration::from_secs(60)));
    let (d, s) = c.run();
    assert_eq!(d.phase, JobPhase::Failed);
    assert_eq!(
        cond::get(&s.conditions, "Failed").expect("Failed").reason,
        "PodsNotReady"
    );
}
