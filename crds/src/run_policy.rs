//! `spec.runPolicy`: restarts, the exit codes that are not worth a
//! restart, deadlines, clean-up and suspension.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a trainer that stopped early on SIGTERM (a drain, an eviction, a
/// preemption) begins its termination message (`/dev/termination-log`):
/// it exits 0 after its checkpoint, which is not the end of training.
pub const STOPPED_BY_SIGNAL: &str = "heterotrain: stopped by signal";

/// How a trainer that trained to the end begins its termination message,
/// followed by the last step (`heterotrain: finished at step 1500`): the
/// operator's `status.step` of a job that ended before the operator read
/// any rank's metrics.
pub const FINISHED_AT_STEP: &str = "heterotrain: finished at step";

/// The step a [`FINISHED_AT_STEP`] termination message names; `None` for
/// any other message.
pub fn finished_step(message: &str) -> Option<u64> {
    message
        .trim_start()
        .strip_prefix(FINISHED_AT_STEP)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Restarts, deadlines, clean-up and suspension.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunPolicy {
    /// How many times the whole gang is recreated after a rank fails before
    /// the job is marked Failed. Only failures count (`status.restarts`
    /// minus `status.disruptions`): a gang recreated because a rank was
    /// evicted, deleted, preempted or stopped by SIGTERM does not.
    #[serde(default = "default_backoff")]
    #[schemars(range(min = 0, max = 100))]
    pub backoff_limit: u32,
    /// Trainer exit codes that fail the job at once, without a restart
    /// (reason `PermanentExitCode`): errors a restart cannot fix. Every
    /// other non-zero code is retried within `backoffLimit`. Default
    /// `[2, 126, 127]`: 2 is a usage error (bad flags, as clap and argparse
    /// exit), 126 and 127 a command that cannot run or is not found. Set
    /// `[]` to retry every code.
    #[serde(default = "default_permanent_exit_codes")]
    #[schemars(length(max = 32))]
    pub permanent_exit_codes: Vec<i32>,
    /// Fail the job when it has been running longer than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub active_deadline_seconds: Option<u64>,
    /// Delete the job this long after it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<u32>,
    /// Stop the pods but keep plan and checkpoints; set back to false to resume.
    #[serde(default)]
    pub suspend: bool,
    /// Seconds one collective (a gradient bucket, the plan agreement, a
    /// checkpoint's gather) may take before the ranks give up and exit: how
    /// long a hung or stopped rank can stall the gang before it is
    /// restarted. Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 86400))]
    pub collective_timeout_seconds: Option<u32>,
    /// Seconds the ranks wait for each other at start-up before failing
    /// (naming the ranks that did not arrive). Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 86400))]
    pub rendezvous_timeout_seconds: Option<u32>,
    /// Fail the job (reason `PodsNotReady`) when a gang's ranks are not all
    /// running this long after its pods were created: an image that cannot
    /// be pulled, a nodeSelector no node matches, a missing claim. Unset:
    /// wait; either way the `Running` condition names what each waiting
    /// rank waits for (`ImagePullBackOff`, `Unschedulable`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub pods_ready_timeout_seconds: Option<u32>,
    /// Restart the gang (counted toward `backoffLimit`) when every rank runs
    /// but the training step has not advanced for this long: a hung or
    /// stopped rank. Measured from the step the operator reads from the
    /// ranks' metrics, and from the gang's start. Unset: only the ranks'
    /// own `collectiveTimeoutSeconds` ends such a stall.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 30, max = 86400))]
    pub progress_deadline_seconds: Option<u32>,
    /// Gang scheduling and queues: with Volcano or scheduler-plugins the
    /// operator creates a PodGroup for the job and points the pods at it;
    /// with Kueue the pods carry Kueue's pod-group labels so the gang is
    /// admitted as a whole. Used only where the scheduler's API is served;
    /// unset: pods are scheduled one by one by the default scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_policy: Option<SchedulingPolicy>,
}

/// Which gang scheduler wires a job's pods together.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum GangScheduler {
    /// The first whose API the cluster serves, in this order: Volcano
    /// (`scheduling.volcano.sh/v1beta1` PodGroup), scheduler-plugins
    /// (`scheduling.x-k8s.io/v1alpha1` PodGroup), Kueue
    /// (`kueue.x-k8s.io` at v1, v1beta2 or v1beta1, only with `queue` set). None served: no
    /// wiring, and a `GangSchedulerMissing` warning Event.
    #[default]
    Auto,
    /// A Volcano PodGroup (`minMember`, `queue`, `priorityClassName`);
    /// pods get `schedulerName: volcano` (unless `schedulerName` says
    /// otherwise) and the `scheduling.k8s.io/group-name` annotation.
    Volcano,
    /// A scheduler-plugins (coscheduling) PodGroup with `minMember`; pods
    /// get the `scheduling.x-k8s.io/pod-group` label. Set `schedulerName`
    /// to the name the plugins' scheduler runs under.
    SchedulerPlugins,
    /// Kueue's plain-pod groups: pods carry `kueue.x-k8s.io/queue-name`
    /// (`queue`, a LocalQueue), `kueue.x-k8s.io/pod-group-name` and the
    /// `kueue.x-k8s.io/pod-group-total-count` annotation.
    Kueue,
    /// No gang wiring: only `schedulerName` and `priorityClass` are applied.
    None,
}

/// `runPolicy.schedulingPolicy`, as Kubeflow's training operators name it.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingPolicy {
    /// Which gang scheduler to wire the pods to. Default `Auto`.
    #[serde(default)]
    pub gang_scheduler: GangScheduler,
    /// `schedulerName` of every rank pod. Default: `volcano` with a
    /// Volcano PodGroup, the cluster's default scheduler otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// The Volcano queue of the PodGroup, or the Kueue LocalQueue (in the
    /// job's namespace) that admits the gang. Required for Kueue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// PriorityClass of the PodGroup and of every rank pod whose worker
    /// group sets no `priorityClassName` of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
    /// How many ranks must be placeable together before any starts (the
    /// PodGroup's `minMember`). Default: every rank, since a gang with a
    /// missing rank cannot train.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_available: Option<u32>,
}

/// The trainer's collective timeout when `collectiveTimeoutSeconds` is unset.
pub const DEFAULT_COLLECTIVE_TIMEOUT_SECONDS: u32 = 300;

impl RunPolicy {
    /// Whether a rank exiting with `code` fails the job without a restart.
    pub fn is_permanent(&self, code: i32) -> bool {
        code != 0 && self.permanent_exit_codes.contains(&code)
    }

    /// `collectiveTimeoutSeconds` or its default.
    pub fn collective_timeout(&self) -> u32 {
        self.collective_timeout_seconds
            .unwrap_or(DEFAULT_COLLECTIVE_TIMEOUT_SECONDS)
    }
}

impl Default for RunPolicy {
    fn default() -> Self {
        RunPolicy {
            backoff_limit: default_backoff(),
            permanent_exit_codes: default_permanent_exit_codes(),
            active_deadline_seconds: None,
            ttl_seconds_after_finished: None,
            suspend: false,
            collective_timeout_seconds: None,
            rendezvous_timeout_seconds: None,
            pods_ready_timeout_seconds: None,
            progress_deadline_seconds: None,
            scheduling_policy: None,
        }
    }
}

fn default_backoff() -> u32 {
    3
}

fn default_permanent_exit_codes() -> Vec<i32> {
    vec![2, 126, 127]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_step_reads_only_its_own_message() {
        assert_eq!(
            finished_step("heterotrain: finished at step 1500"),
            Some(1500)
        );
        assert_eq!(
            finished_step("  heterotrain: finished at step 7\n"),
            Some(7)
        );
        assert_eq!(
            finished_step("heterotrain: stopped by signal after step 9, checkpoint written"),
            None
        );
        assert_eq!(finished_step("heterotrain: finished at step"), None);
        assert_eq!(finished_step("heterotrain: finished at step -3"), None);
        assert_eq!(finished_step("OOMKilled"), None);
    }
}
