//! Events on a job: what a stage wants said ([`EventSpec`]), and publishing
//! it (failures are logged, never fatal).

use heterotrain_crds::HeteroTrainingJob;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Resource, ResourceExt};
use tracing::warn;

/// An Event to publish on the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

/// The Event for `e` (notes are cut at 1000 characters).
pub fn event(e: &EventSpec) -> Event {
    Event {
        type_: if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: e.reason.clone(),
        note: Some(e.note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    }
}

/// Publish `e` on `job`.
pub async fn publish(recorder: &Recorder, job: &HeteroTrainingJob, e: &EventSpec) {
    if let Err(err) = recorder.publish(&event(e), &job.object_ref(&())).await {
        warn!(job = %job.name_any(), error = %err, "publishing event failed");
    }
}
