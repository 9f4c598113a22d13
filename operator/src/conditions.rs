//! Condition types and reasons (constants, one place) and the rule that
//! keeps `lastTransitionTime` unless a condition's status flips.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types.
/// What `Durable=False` says: where the files are and how to keep them.
pub const EPHEMERAL_MESSAGE: &str =
    "checkpoints and the trained model are written to rank 0's emptyDir \
     and are lost with the pod (a drain, an eviction, the job's deletion or TTL); set \
     spec.checkpoint.claimName to a PersistentVolumeClaim to keep them";

pub mod types {
    /// The gang's Service, plan and pods exist.
    pub const CREATED: &str = "Created";
    /// Every rank reported its hardware profile.
    pub const PROFILED: &str = "Profiled";
    /// Every rank pod is running.
    pub const RUNNING: &str = "Running";
    /// True: the latest plan the balancer wrote (reason `Rebalanced`).
    /// False: its last decision failed (`BalancerError`), or it decides
    /// again after a failure and keeps the plan (`PlanKept`).
    pub const REBALANCED: &str = "Rebalanced";
    /// Every rank exited 0.
    pub const SUCCEEDED: &str = "Succeeded";
    /// The job failed (invalid spec, backoff limit, deadline).
    pub const FAILED: &str = "Failed";
    /// `runPolicy.suspend` stopped the pods.
    pub const SUSPENDED: &str = "Suspended";
    /// A field that cannot change while running was changed.
    pub const SPEC_CHANGE_REJECTED: &str = "SpecChangeRejected";
    /// Rank 0's step advances (False: it has not for a while).
    pub const PROGRESSING: &str = "Progressing";
    /// The job's NetworkPolicies guard its ranks (False: turned off).
    pub const NETWORK_ISOLATED: &str = "NetworkIsolated";
    /// Checkpoints and the trained model outlive the pods (False: they are
    /// in rank 0's emptyDir).
    pub const DURABLE: &str = "Durable";
}

/// Condition (and Event) reasons.
pub mod reasons {
    pub const INVALID: &str = "Invalid";
    pub const MALFORMED: &str = "Malformed";
    pub const GANG_CREATED: &str = "GangCreated";
    pub const CREATING: &str = "Creating";
    pub const PODS_RUNNING: &str = "PodsRunning";
    pub const PODS_PENDING: &str = "PodsPending";
    pub const PROFILES_REPORTED: &str = "ProfilesReported";
    pub const AWAITING_PROFILES: &str = "AwaitingProfiles";
    pub const REBALANCED: &str = "Rebalanced";
    /// `Rebalanced` False: the balancer decides again after an error and
    /// keeps the plan.
    pub const PLAN_KEPT: &str = "PlanKept";
    /// `Rebalanced` False and a Warning Event: the balancer could not
    /// decide (for instance the ranks' memory caps cannot hold the global
    /// batch); the plan in force stays.
    pub const BALANCER_ERROR: &str = "BalancerError";
    /// Event: a new plan gives ranks a local batch of 0 (left out).
    pub const RANKS_LEFT_OUT: &str = "RanksLeftOut";
    /// Event: a new plan brings left-out ranks back.
    pub const RANKS_READMITTED: &str = "RanksReadmitted";
    pub const ALL_RANKS_SUCCEEDED: &str = "AllRanksSucceeded";
    pub const BACKOFF_LIMIT_EXCEEDED: &str = "BackoffLimitExceeded";
    pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
    pub const RANK_FAILED: &str = "RankFailed";
    pub const GANG_RESTARTING: &str = "GangRestarting";
    pub const PERMANENT_EXIT_CODE: &str = "PermanentExitCode";
    pub const SUSPENDED: &str = "Suspended";
    pub const RESUMED: &str = "Resumed";
    pub const IMMUTABLE_FIELD_CHANGED: &str = "ImmutableFieldChanged";
    pub const SPEC_ACCEPTED: &str = "SpecAccepted";
    pub const TTL_EXPIRED: &str = "TTLExpired";
    pub const NOT_STARTED: &str = "NotStarted";
    pub const PLAN_RESTORED: &str = "PlanRestored";
    pub const FOREIGN_PODS: &str = "ForeignPods";
    /// Pods stuck Terminating past their grace period were force-deleted.
    pub const FORCE_DELETED: &str = "ForceDeleted";
    /// A gang's ranks were not all running `podsReadyTimeoutSeconds` after
    /// its pods were created.
    pub const PODS_NOT_READY: &str = "PodsNotReady";
    /// Every rank ran but the step stood still `progressDeadlineSeconds`.
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";
    /// The API server refused to create the job's objects (403/422/400).
    pub const CREATE_REFUSED: &str = "CreateRefused";
    pub const STEP_ADVANCING: &str = "StepAdvancing";
    pub const STALLED: &str = "Stalled";
    pub const NETWORK_POLICIES: &str = "NetworkPolicies";
    pub const ISOLATION_DISABLED: &str = "IsolationDisabled";
    /// `Durable`: checkpoints on a claim.
    pub const CHECKPOINT_CLAIM: &str = "CheckpointClaim";
    /// `Durable=False` and its Event: no claim, checkpoints in an emptyDir.
    pub const EPHEMERAL_STORAGE: &str = "EphemeralStorage";
    /// Event: `schedulingPolicy` asks for a gang scheduler the cluster
    /// does not serve; the gang is created without one.
    pub const GANG_SCHEDULER_MISSING: &str = "GangSchedulerMissing";
}

/// One desired condition (without timestamps).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl Desired {
    fn new(type_: &'static str, status: bool, reason: &str, message: impl Into<String>) -> Self {
        Desired {
            type_,
            status,
            reason: reason.to_string(),
            message: message.into(),
        }
    }

    /// A condition with status `True`.
    pub fn yes(type_: &'static str, reason: &str, message: impl Into<String>) -> Self {
        Desired::new(type_, true, reason, message)
    }

    /// A condition with status `False`.
    pub fn no(type_: &'static str, reason: &str, message: impl Into<String>) -> Self {
        Desired::new(type_, false, reason, message)
    }
}

fn status_str(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// Set `desired` in `conditions`: a new condition gets `now`; an existing
/// one keeps its `lastTransitionTime` unless its status flips.
pub fn set(conditions: &mut Vec<Condition>, desired: Desired, generation: Option<i64>, now: &Time) {
    let status = status_str(desired.status).to_string();
    let existing = conditions.iter_mut().find(|c| c.type_ == desired.type_);
    match existing {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = now.clone();
            }
            c.status = status;
            c.reason = desired.reason;
            c.message = desired.message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: desired.type_.to_string(),
            status,
            reason: desired.reason,
            message: desired.message,
            observed_generation: generation,
            last_transition_time: now.clone(),
        }),
    }
}

/// Whether condition `type_` is `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == "True")
}

/// The condition of `type_`, if set.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn t(s: i64) -> Time {
        Time(Timestamp::from_second(s).expect("time"))
    }

    #[test]
    fn keeps_transition_time_unless_status_flips() {
        let mut c = Vec::new();
        set(
            &mut c,
            Desired::no(types::RUNNING, "A", "a"),
            Some(1),
            &t(10),
        );
        set(
            &mut c,
            Desired::no(types::RUNNING, "B", "b"),
            Some(2),
            &t(20),
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time, t(10));
        assert_eq!(c[0].reason, "B");
        assert_eq!(c[0].observed_generation, Some(2));
        set(
            &mut c,
            Desired::yes(types::RUNNING, "C", "c"),
            Some(2),
            &t(30),
        );
        assert_eq!(c[0].last_transition_time, t(30));
        assert!(is_true(&c, types::RUNNING));
        assert!(!is_true(&c, types::FAILED));
    }
}
