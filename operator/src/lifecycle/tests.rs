//! Lifecycle and status from the YAML fixtures in
//! `operator/tests/fixtures/lifecycle`: each fixture is a job (spec and
//! status as last written), its observed pods, the plan in its ConfigMap
//! and the time `now`. Each test checks what [`decide`] decides and the
//! status [`status::next`] makes of it, without an API server.

use std::time::Duration;

use heterotrain_crds::{BatchPlan, HeteroTrainingJob, HeteroTrainingJobStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::Deserialize;

use super::*;
use crate::conditions as cond;
use crate::fetch::RankPod;
use crate::plan::{self, Stored};
use crate::status::{self, Extras};
use crate::testing::{load, valid};

/// One fixture.
#[derive(Deserialize)]
struct Case {
    now: Time,
    job: HeteroTrainingJob,
    #[serde(default)]
    pods: Vec<Pod>,
    /// The plan in `<job>-plan`, if the ConfigMap exists.
    #[serde(default)]
    plan: Option<BatchPlan>,
}

impl Case {
    fn load(name: &str) -> Case {
        load(&format!("lifecycle/{name}.yaml"))
    }

    fn observed(&self) -> Observed {
        Observed {
            pods: self.pods.iter().map(RankPod::from_pod).collect(),
            foreign: Vec::new(),
            plan: Stored {
                exists: self.plan.is_some(),
                plan: self.plan.clone(),
                generation: self.plan.as_ref().map(|p| p.generation),
            },
        }
    }

    /// The decision at `now`, and the status it leads to.
    fn run_at(&self, now: &Time) -> (Decision, HeteroTrainingJobStatus) {
        let v = valid(&self.job);
        let obs = self.observed();
        let d = decide(&v, &obs, &now.0);
        let x = Extras::with_plan(plan::current(&v, &obs.plan));
        let s = status::next(&v, &d, &obs, &x, now);
        (d, s)
    }

    fn run(&self) -> (Decision, HeteroTrainingJobStatus) {
        self.run_at(&self.now)
    }
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// `(warning, reason, note)` of each Event.
fn events(d: &Decision) -> Vec<(bool, &str, &str)> {
    d.events
        .iter()
        .map(|e| (e.warning, e.reason.as_str(), e.note.as_str()))
        .collect()
}

/// `(type, status, reason)` of each condition, in order; `Durable`, which
/// depends on the checkpoint claim alone, is left to its own test.
fn conditions(s: &HeteroTrainingJobStatus) -> Vec<(&str, &str, &str)> {
    s.conditions
        .iter()
        .filter(|c| c.type_ != types::DURABLE)
        .map(|c| (c.type_.as_str(), c.status.as_str(), c.reason.as_str()))
        .collect()
}

fn message<'a>(s: &'a HeteroTrainingJobStatus, type_: &str) -> &'a str {
    &cond::get(&s.conditions, type_).expect(type_).message
}

fn at(s: &str) -> Time {
    Time(s.parse::<Timestamp>().expect("time"))
}

const CREATED_MSG: &str = "created the Service, the plan and 2 rank pod(s)";

#[test]
fn new_job_creates_the_gang() {
    let c = Case::load("new");
    let (d, s) = c.run();
    assert_eq!(d.phase, JobPhase::Pending);
    assert_eq!(d.create_ranks, [0, 1]);
    assert!(d.delete_pods.is_empty());
    assert_eq!(d.restarts, 0);
    assert_eq!(d.start_time, StartTime::SetNow);
    assert!(!d.complete && !d.delete_job && !d.balance);
    assert_eq!(d.requeue_after, None);
    assert_eq!(
        events(&d),
        [
            (false, "GangCreated", CREATED_MSG),
            (
                true,
                "EphemeralStorage",
                crate::conditions::EPHEMERAL_MESSAGE
            )
        ]
    );
    assert_eq!(
        conditions(&s),
        [
            ("Failed", "False", "SpecAccepted"),
            ("Created", "True", "GangCreated"),
            ("Running", "False", "PodsPending"),
        ]
    );
    assert_eq!(message(&s, "Running"), "0 of 2 ranks running");
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    assert_eq!(s.start_time, Some(c.now.clone()));
    assert_eq!(s.completion_time, None);
    assert_eq!(s.observed_generation, Some(2));
    assert_eq!(s.ranks, 2);
    assert_eq!(s.groups.len(), 1);
    assert_eq!((s.groups[0].replicas, s.groups[0].ready), (2, 0));
    assert!(s.conditions.iter().all(|x| x.last_transition_time == c.now));
}

#[test]
fn a_job_without_network_isolation_warns_and_says_how_to_restore_it() {
    let mut c = Case::load("new");
    c.job.spec.isolation.network_policy = false;
    let (_, s) = c.run();
    let off = conditions(&s);
    assert!(
        off.contains(&("NetworkIsolated", "False", "IsolationDisabled")),
        "{off:?}"
    );
    assert!(message(&s, "NetworkIsolated").contains("remove the field"));
    // Turned back on: True again (an isolated job carries it only then).
    c.job.status = Some(s);
    c.job.spec.isolation.network_policy = true;
    let (_, s) = c.run();
    assert!(conditions(&s).contains(&("NetworkIsolated", "True", "NetworkPolicies")));
}

#[test]
fn pending_pods_wait_and_a_pod_without_ip_is_not_running() {
    let c = Case::load("pending");
    let (d, s) = c.run();
    assert_eq!(d.phase, JobPhase::Pending);
    assert!(d.create_ranks.is_empty() && d.delete_pods.is_empty());
    assert_eq!(d.start_time, StartTime::Keep);
    assert!(!d.balance && !d.complete);
    assert!(d.events.is_empty());
    assert_eq!(d.requeue_after, None);
    assert_eq!(
        conditions(&s),
        [
            ("Failed", "False", "SpecAccepted"),
            ("Created", "True", "GangCreated"),
            ("Running", "False", "PodsPending"),
        ]
    );
    // Rank 1's pod runs but has no IP yet: not running for balancing, yet
    // ready for its group.
    assert_eq!(message(&s, "Running"), "0 of 2 ranks running");
    assert_eq!(s.groups[0].ready, 1);
    assert_eq!(s.start_time, Some(at("2025-01-01T00:59:00Z")));
    // Nothing flipped: transition times are the ones on record (the
    // recorded status predates `Durable`).
    assert!(s
        .conditions
        .iter()
        .filter(|c| c.type_ != types::DURABLE)
        .all(|c| c.last_transition_time == at("2025-01-01T00:59:00Z")));
}

#[test]
fn running_gang_balances_and_requeues_by_its_deadline() {
    let c = Case::load("running");
    let (d, s) = c.run();
    assert_eq!(d.phase, JobPhase::Running);
    assert!(d.balance);
    assert!(d.create_ranks.is_empty() && d.delete_pods.is_empty());
    assert!(d.events.is_empty());
    // 600 s into a 3600 s deadline.
    assert_eq!(d.requeue_after, Some(Duration::from_secs(3000)));
    assert_eq!(
        conditions(&s),
        [
            ("Failed", "False", "SpecAccepted"),
            ("Created", "True", "GangCreated"),
            ("Running", "True", "PodsRunning"),
        ]
    );
    assert_eq!(message(&s, "Running"), "all 2 ranks running");
    let running = cond::get(&s.conditions, "Running").expect("Running");
    assert_eq!(running.last_transition_time, c.now, "False → True flips");
    let created = cond::get(&s.conditions, "Created").expect("Created");
    assert_eq!(created.last_transition_time, at("2025-01-01T00:50:00Z"));
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(s.plan_generation, 3);
    assert_eq!(s.groups[0].batch_sizes, [20, 12]);
    assert_eq!(s.groups[0].ready, 2);
    assert!(s.left_out_ranks.is_empty());
}

#[test]
fn a_plan_that_leaves_a_rank_out_is_reported_in_status() {
    let c = Case::load("running_left_out");
    let (d, s) = c.run();
    assert_eq!(d.phase, JobPhase::Running);
    assert!(d.balance);
    assert!(
        d.delete_pods.is_empty() && d.create_ranks.is_empty(),
        "its pod stays"
    );
    assert_eq!(s.plan_generation, 4);
    assert_eq!(s.groups[0].batch_sizes, [32, 0]);
    assert_eq!(s.left_out_ranks, [1]);
    let json = serde_json::to_value(&s).expect("json");
    assert_eq!(json["leftOutRanks"], serde_json::json!([1]));

    // Re-admitted: the list empties (and leaves the JSON).
    let mut back = Case::load("running_left_out");
    back.job.status.as_mut().expect("status").left_out_ranks = vec![1];
    if let Some(p) = back.plan.as_mut() {
        p.generation = 5;
        p.batch_sizes = vec![31, 1];
    }
    let (_, s) = back.run();
    assert!(s.left_out_ranks.is_empty());
    assert!(serde_json::to_value(&s)
        .expect("json")
        .get("leftOutRanks")
        .is_none());
}

#[test]
fn suspended_job_stops_its_pods() {
    let c = Case::load("suspended");
    let (d, s) = c.run();
    let msg = "runPolicy.suspend is true: pods stopped; the plan and checkpoints are kept";
    assert_eq!(d.phase, JobPhase::Suspended);
    assert_eq!(d.delete_pods, names(&["lc-0", "lc-1"]));
    assert!(d.create_ranks.is_empty());
    assert_eq!(d.start_time, StartTime::Clear);
    assert!(!d.complete && !d.balance);
    assert_eq!(events(&d), [(false, "Suspended", msg)]);
    assert_eq!(
        conditions(&s),
        [
            ("Failed", "False", "SpecAccepted"),
            ("Created", "True", "GangCreated"),
            ("Running", "False", "Suspended"),
            ("Suspended", "True", "Suspended"),
        ]
    );
    assert_eq!(message(&s, "Suspended"), msg);
    assert_eq!(s.phase.as_deref(), Some("Suspended"));
    assert_eq!(s.start_time, None);
}

#[test]
fn resumed_job_recreates_the_gang() {
    let c = Case::load("resumed");
    let (d, s) = c.run();
    let msg = "runPolicy.suspend is false: recreating the gang from the latest checkpoint";
    assert_eq!(d.phase, JobPhase::Pending);
    assert_eq!(d.create_ranks, [0, 1]);
    assert_eq!(d.start_time, StartTime::SetNow);
    // Created was already True: only the resume is announced.
    assert_eq!(events(&d), [(false, "Resumed", msg)]);
    assert_eq!(
        conditions(&s),
        [
            ("Failed", "False", "SpecAccepted"),
            ("Created", "True", "GangCreated"),
            ("Running", "False", "PodsPending"),
            ("Suspended", "False", "Resumed"),
        ]
    );
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    assert_eq!(s.start_time, Some(c.now.clone()));
}

#[test]
fn active_deadline_exceeded_fails_the_job() {
    let c = Case::load("deadline_exceeded");
    let (d, s) = c.run();
    let msg = "the job ran longer than activeDeadlineSeconds 600";
    assert_eq!(d.phase, JobPhase::Failed);
    assert_eq!(d.delete_pods, names(&["lc-0", "lc-1"]));
    assert!(d.complete && !d.balance && !d.delete_job);
    assert_eq!(d.requeue_after, None);
    assert_eq!(events(&d), [(true, "DeadlineExceeded", msg)]);
    assert_eq!(
        conditions(&s),
        [
            ("Failed", "True", "DeadlineExceeded"),
            ("Created", "True", "GangCreated"),
            ("Running", "False", "DeadlineExceeded"),
        ]
    );
    assert_eq!(message(&s, "Failed"), msg);
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(s.completion_time, Some(c.now.clone()));
    // Ten seconds earlier the deadline is 9 s away: keep running, come back then.
    let before = Time(c.now.0 - SignedDuration::from_secs(10));
    let (d, _) = c.run_at(&before);
    assert_eq!(d.phase, JobPhase::Running);
    assert!(d.delete_pods.is_empty() && !d.complete);
    assert_eq!(d.requeue_after, Some(Duration::from_secs(9)));
}

#[test]
fn all_ranks_exiting_zero_succeeds_and_waits_for_the_ttl() {
    let c = Case::load("succeeded");
    let (d, s) = c.run();
    assert_eq!(d.phase, JobPhase::Succeeded);
    assert!(d.complete && !d.delete_job && !d.balance);
    assert!(d.delete_pods.is_empty() && d.create_ranks.is_empty());
    assert_eq!(d.requeue_after, Some(Duration::from_secs(60)));
    assert_eq!(
        events(&d),
        [(false, "AllRanksSucceeded", "all 2 ranks exited 0")]
    );
    assert_eq!(
        conditions(&s),
        [
            ("Failed", "False", "SpecAccepted"),
            ("Created", "True", "GangCreated"),
            ("Running", "False", "AllRanksSucceeded"),
            ("Succeeded", "True", "AllRanksSucceeded"),
        ]
    );
    assert_eq!(s.phase.as_deref(), Some("Succeeded"));
    assert_eq!(s.completion_time, Some(c.now.clone()));
    // No metrics were ever read: the step is rank 0's termination message.
    assert_eq!(c.job.status.as_ref().map(|s| s.step), Some(0));
    assert_eq!(s.step, 100);
}

#[test]
fn finished_job_is_deleted_after_its_ttl() {
    let c = Case::load("ttl_expired");
    let (d, s) = c.run();
    assert_eq!(d.phase, JobPhase::Succeeded);
    assert!(d.delete_job && d.complete);
    assert!(d.delete_pods.is_empty(), "succeeded pods are not live");
    assert!(d.conditions.is_empty(), "a finished job's conditions stay");
    assert_eq!(
        events(&d),
        [(
            false,
            "TTLExpired",
            "deleting the job 60s after it finished"
        )]
    );
    assert_eq!(
        conditions(&s),
        [
            ("Failed", "False", "SpecAccepted"),
            ("Created", "True", "GangCreated"),
            ("Running", "False", "AllRanksSucceeded"),
            ("Succeeded", "True", "AllRanksSucceeded"),
        ]
    );
    // Completion time is the recorded one, not now.
    assert_eq!(s.completion_time, Some(at("2025-01-01T00:58:59Z")));
    // 20 s after finishing: 40 s left, nothing deleted.
    let (d, _) = c.run_at(&at("2025-01-01T00:59:19Z"));
    assert!(!d.delete_job);
    assert!(d.events.is_empty());
    assert_eq!(d.requeue_after, Some(Duration::from_secs(40)));
}

mod restarts;

#[test]
fn rank_bottlenecks_are_reported_while_running_and_dropped_after() {
    use heterotrain_crds::{Bottleneck, RankBottleneck};
    let measured = vec![RankBottleneck {
        rank: 1,
        bottleneck: Bottleneck::Straggler,
        data_seconds: 0.0,
        compute_seconds: 0.3,
        communication_seconds: 0.01,
        update_seconds: 0.01,
    }];
    let with = |c: &Case| {
        let v = valid(&c.job);
        let obs = c.observed();
        let d = decide(&v, &obs, &c.now.0);
        let x = Extras {
            rank_bottlenecks: Some(measured.clone()),
            ..Extras::with_plan(plan::current(&v, &obs.plan))
        };
        status::next(&v, &d, &obs, &x, &c.now)
    };
    let running = Case::load("running");
    assert_eq!(with(&running).rank_bottlenecks, measured);
    // Unmeasured this round: the last figures stay.
    let mut c = Case::load("running");
    c.job
        .status
        .get_or_insert_with(Default::default)
        .rank_bottlenecks = measured.clone();
    assert_eq!(c.run().1.rank_bottlenecks, measured);
    // A job no longer running has no bottleneck to show.
    let mut done = Case::load("succeeded");
    done.job
        .status
        .get_or_insert_with(Default::default)
        .rank_bottlenecks = measured.clone();
    assert!(with(&done).rank_bottlenecks.is_empty());
}

/// `replicas` changed under a running gang: reported, and the gang goes on
/// as it was created — no rank created into it, none taken for lost, no
/// restart, no plan of the new shape.
#[test]
fn changed_replicas_under_a_running_gang_leave_it_running() {
    for replicas in [3, 1] {
        let mut c = Case::load("running");
        let hash = crate::build::hash::spec_hash(&c.job.spec);
        for p in &mut c.pods {
            p.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(
                    heterotrain_crds::labels::SPEC_HASH_ANNOTATION.into(),
                    hash.clone(),
                );
        }
        let (d, s) = c.run();
        assert_eq!(d.phase, JobPhase::Running, "unchanged spec");
        assert!(d.balance);
        c.job.spec.workers[0].replicas = replicas;
        let (d, s2) = c.run();
        assert_eq!(d.phase, JobPhase::Running, "replicas {replicas}: {d:?}");
        assert!(d.create_ranks.is_empty() && d.delete_pods.is_empty());
        assert_eq!((d.restarts, s2.restarts), (0, s.restarts));
        assert!(!d.balance, "no plan for {replicas} ranks onto a gang of 2");
        let rejected = s2
            .conditions
            .iter()
            .find(|c| c.type_ == "SpecChangeRejected")
            .map(|c| (c.status.as_str(), c.message.as_str()));
        assert!(
            rejected.is_some_and(|(st, m)| st == "True" && m.contains("spec.workers")),
            "{rejected:?}"
        );
        assert!(
            s2.conditions
                .iter()
                .any(|c| c.type_ == "Running" && c.message == "all 2 ranks running"),
            "{:?}",
            s2.conditions
        );
    }
}

/// `Durable`: False with what to do and one warning Event with the first
/// gang when checkpoints are in an emptyDir; True naming the claim and the
/// run's directory otherwise; no second Event when a gang is recreated.
#[test]
fn checkpoints_without_a_claim_are_reported_as_ephemeral() {
    let c = Case::load("new");
    let (d, s) = c.run();
    let durable = cond::get(&s.conditions, types::DURABLE).expect("Durable");
    assert_eq!(
        (durable.status.as_str(), durable.reason.as_str()),
        ("False", "EphemeralStorage")
    );
    assert!(durable.message.contains("set spec.checkpoint.claimName"));
    assert_eq!(
        events(&d)
            .iter()
            .filter(|e| e.1 == "EphemeralStorage")
            .count(),
        1
    );

    let mut c = Case::load("new");
    c.job.spec.checkpoint.claim_name = Some("ckpt".into());
    let (d, s) = c.run();
    let durable = cond::get(&s.conditions, types::DURABLE).expect("Durable");
    assert_eq!(durable.status, "True");
    let uid = c.job.metadata.uid.clone().expect("uid");
    assert!(
        durable.message.contains(&format!(
            "claim ckpt, directory {}/{uid}",
            c.job.metadata.name.clone().unwrap_or_default()
        )),
        "{}",
        durable.message
    );
    assert!(events(&d).iter().all(|e| e.1 != "EphemeralStorage"));

    // A gang created again (Created already True) says it no more.
    let c = Case::load("resumed");
    let (d, _) = c.run();
    assert!(
        events(&d).iter().all(|e| e.1 != "EphemeralStorage"),
        "{:?}",
        events(&d)
    );
}
