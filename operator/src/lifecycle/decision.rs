//! What the lifecycle stage decides: the job's phase, the conditions that
//! say why, and the actions (deletes, creates, Events, requeue) the apply
//! stage carries out.

use std::time::Duration;

use crate::conditions::{reasons, types, Desired};
use crate::events::EventSpec;
use crate::fetch::RankPod;

/// Summary phase for `kubectl get`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Suspended,
}

impl JobPhase {
    /// As written in `status.phase`.
    pub fn as_str(&self) -> &'static str {
        match self {
            JobPhase::Pending => "Pending",
            JobPhase::Running => "Running",
            JobPhase::Succeeded => "Succeeded",
            JobPhase::Failed => "Failed",
            JobPhase::Suspended => "Suspended",
        }
    }
}

/// How `startTime` changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartTime {
    Keep,
    SetNow,
    Clear,
}

/// What to do with the gang this reconcile.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub phase: JobPhase,
    pub conditions: Vec<Desired>,
    /// Pods to delete (by name).
    pub delete_pods: Vec<String>,
    /// Pods to delete now, without waiting for a kubelet (grace period 0):
    /// a previous gang's pods stuck Terminating on a node that is gone.
    pub force_delete_pods: Vec<String>,
    /// Create the Service, the plan (if missing) and these ranks' pods.
    pub create_ranks: Vec<u32>,
    /// `status.restarts` after this decision.
    pub restarts: u32,
    /// `status.disruptions` after this decision.
    pub disruptions: u32,
    pub start_time: StartTime,
    /// Set `completionTime` (if not yet set).
    pub complete: bool,
    /// Delete the job itself (TTL after finishing).
    pub delete_job: bool,
    /// Reconcile again after this long at the latest.
    pub requeue_after: Option<Duration>,
    /// Every rank is running: read metrics and balance.
    pub balance: bool,
    pub events: Vec<EventSpec>,
}

impl Decision {
    /// Take the gang down: delete `pods` (those not already going) and say
    /// why in the Running condition (False, `GangRestarting`).
    pub(super) fn take_down(&mut self, pods: &[&RankPod], message: String) {
        self.delete_pods = pods
            .iter()
            .filter(|p| !p.deleting)
            .map(|p| p.name.clone())
            .collect();
        self.conditions.push(Desired::no(
            types::RUNNING,
            reasons::GANG_RESTARTING,
            message,
        ));
    }

    pub(super) fn new(phase: JobPhase, restarts: u32, disruptions: u32) -> Decision {
        Decision {
            phase,
            conditions: Vec::new(),
            delete_pods: Vec::new(),
            force_delete_pods: Vec::new(),
            create_ranks: Vec::new(),
            restarts,
            disruptions,
            start_time: StartTime::Keep,
            complete: false,
            delete_job: false,
            requeue_after: None,
            balance: false,
            events: Vec::new(),
        }
    }

    pub(super) fn event(&mut self, warning: bool, reason: &str, note: impl Into<String>) {
        self.events.push(EventSpec {
            warning,
            reason: reason.into(),
            note: note.into(),
        });
    }

    /// The job fails for good (`reason`, `msg`): Failed, not Running, a
    /// warning Event, and `pods` deleted.
    pub(super) fn fail(&mut self, reason: &str, msg: String, pods: Vec<String>) {
        self.phase = JobPhase::Failed;
        self.delete_pods = pods;
        self.complete = true;
        self.conditions
            .push(Desired::yes(types::FAILED, reason, msg.clone()));
        self.conditions
            .push(Desired::no(types::RUNNING, reason, msg.clone()));
        self.event(true, reason, msg);
    }

    pub fn requeue(&mut self, d: Duration) {
        self.requeue_after = Some(self.requeue_after.map_or(d, |r| r.min(d)));
    }
}
