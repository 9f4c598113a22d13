//! Rules for `spec.checkpoint`: where checkpoints go, and which earlier
//! run `resumeFrom` may name.

use heterotrain_crds::HeteroTrainingJobSpec;

/// Check `spec.checkpoint` of job `name`, reporting each problem through
/// `bad(field, message)`.
pub fn check_checkpoint(
    name: &str,
    spec: &HeteroTrainingJobSpec,
    bad: &mut dyn FnMut(&str, String),
) {
    if !spec.checkpoint.path.starts_with('/') || spec.checkpoint.path == "/" {
        bad(
            "spec.checkpoint.path",
            format!(
                "{:?} must be an absolute directory other than /",
                spec.checkpoint.path
            ),
        );
    }
    if let Some(from) = &spec.checkpoint.resume_from {
        resume_from(name, from, spec, bad);
    }
}

/// `checkpoint.resumeFrom`: a run's UID or a relative directory of the
/// checkpoint claim, for the built-in trainer.
fn resume_from(
    name: &str,
    from: &str,
    spec: &HeteroTrainingJobSpec,
    bad: &mut dyn FnMut(&str, String),
) {
    let field = "spec.checkpoint.resumeFrom";
    if spec.checkpoint.claim_name.is_none() {
        bad(
            field,
            "resumeFrom reads an earlier run's directory in the checkpoint claim; set checkpoint.claimName to the claim it wrote to".into(),
        );
    }
    if !spec.runs_builtin_trainer() {
        bad(
            field,
            "only the built-in trainer resumes from an earlier run; your own script can read the claim itself".into(),
        );
    }
    let parts: Vec<&str> = from.trim_matches('/').split('/').collect();
    let plain = |p: &&str| {
        !p.is_empty()
            && *p != "."
            && *p != ".."
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    if from.starts_with('/') || parts.len() > 8 || !parts.iter().all(plain) {
        bad(
            field,
            format!("{from:?} must be a run's UID or a relative directory of the claim such as \"{name}/<UID>\" (letters, digits, '-', '_', '.'; no '..')"),
        );
    }
}
