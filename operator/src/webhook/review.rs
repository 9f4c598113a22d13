//! The admission decision: one `AdmissionReview` in, one out. The same
//! rules as reconcile ([`validate::problems`]), plus what only admission
//! can see: the object before an update, so a running gang's fixed
//! sections are refused instead of reported after the fact.

use heterotrain_crds::HeteroTrainingJob;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::DynamicObject;

use crate::build::hash::{changed_sections, spec_hash};
use crate::validate::{self, Admission, Problem};

/// Phases in which a gang's pods run with the spec's fixed sections.
const RUNNING_PHASES: [&str; 1] = ["Running"];

/// Answer the `AdmissionReview` in `body` for an operator watching
/// `watched` namespaces (empty: all). A job in a namespace it does not
/// watch is another release's business and passes. A body that is not a
/// review gets an `invalid` answer (the API server then applies the
/// failure policy).
pub fn review(
    body: &[u8],
    admission: Admission<'_>,
    watched: &[String],
) -> AdmissionReview<DynamicObject> {
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => {
            return AdmissionResponse::invalid(format!("not an AdmissionReview: {e}")).into_review()
        }
    };
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(r) => r,
        Err(_) => {
            return AdmissionResponse::invalid("an AdmissionReview without a request").into_review()
        }
    };
    let response = AdmissionResponse::from(&request);
    let ours = match &request.namespace {
        Some(ns) => watched.is_empty() || watched.contains(ns),
        None => true,
    };
    if !ours {
        return response.into_review();
    }
    let problems = decide(&request, admission);
    if problems.is_empty() {
        response.into_review()
    } else {
        response.deny(denial(&problems)).into_review()
    }
}

/// The message of a refusal: every problem, each with its field path.
pub fn denial(problems: &[Problem]) -> String {
    let n = problems.len();
    format!(
        "{n} problem{} in the HeteroTrainingJob: {}",
        if n == 1 { "" } else { "s" },
        validate::summary(problems)
    )
}

fn job_of(o: &DynamicObject) -> Result<HeteroTrainingJob, String> {
    serde_json::to_value(o)
        .and_then(serde_json::from_value)
        .map_err(|e| e.to_string())
}

/// Every reason to refuse `request` (none: admit).
pub fn decide(request: &AdmissionRequest<DynamicObject>, admission: Admission<'_>) -> Vec<Problem> {
    if !matches!(request.operation, Operation::Create | Operation::Update) {
        return Vec::new();
    }
    let Some(object) = &request.object else {
        return Vec::new();
    };
    let job = match job_of(object) {
        Ok(j) => j,
        Err(e) => {
            return vec![Problem {
                field: "spec".into(),
                message: format!("does not read as a HeteroTrainingJob: {e}"),
            }]
        }
    };
    let old = request.old_object.as_ref().and_then(|o| job_of(o).ok());
    if let Some(old) = &old {
        // Metadata and finalizer updates (the operator's own among them),
        // and a job on its way out, pass: only a spec change is judged, so
        // an object admitted before the webhook existed can still be
        // labelled, finalized and deleted.
        let same_spec =
            serde_json::to_value(&old.spec).ok() == serde_json::to_value(&job.spec).ok();
        if same_spec || job.metadata.deletion_timestamp.is_some() {
            return Vec::new();
        }
    }
    let name = match (&job.metadata.name, &job.metadata.generate_name) {
        (Some(n), _) if !n.is_empty() => n.clone(),
        // The API server appends 5 characters to generateName.
        (_, Some(prefix)) => format!("{prefix}xxxxx"),
        _ => request.name.clone(),
    };
    let mut problems = validate::problems(&name, &job.spec, admission);
    if let Some(old) = &old {
        problems.extend(fixed_while_running(old, &job));
    }
    problems
}

/// The sections a running gang was created from that `new` changes.
fn fixed_while_running(old: &HeteroTrainingJob, new: &HeteroTrainingJob) -> Vec<Problem> {
    let phase = old.status.as_ref().and_then(|s| s.phase.as_deref());
    if !phase.is_some_and(|p| RUNNING_PHASES.contains(&p)) {
        return Vec::new();
    }
    changed_sections(&spec_hash(&old.spec), &new.spec)
        .into_iter()
        .map(|s| Problem {
            field: format!("spec.{s}"),
            message: "cannot change while the job runs (its pods were created from the old value); revert it, or delete the job and create it again with the change".into(),
        })
        .collect()
}

#[cfg(test)]
mod tests;
