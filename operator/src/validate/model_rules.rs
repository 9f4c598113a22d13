//! The rules on what only the built-in trainer reads: its model and data
//! (checked when a spec names both), and the fields a job of its own
//! commands must leave alone.

use heterotrain_crds::{HeteroTrainingJobSpec, ModelName};

/// The rules on the model and the data the built-in trainer reads.
pub(super) fn model_and_data(
    model: &heterotrain_crds::ModelSpec,
    dataset: &heterotrain_crds::DatasetSpec,
    bad: &mut dyn FnMut(&str, String),
) {
    let text_model = model.name == ModelName::Gpt;
    let text_data = dataset.name.is_text();
    if text_model != text_data {
        bad(
            "spec.dataset.name",
            format!(
                "model {} needs {} data, but dataset is {}",
                model.name.as_str(),
                if text_model {
                    "token (synthetic_text or tokens)"
                } else {
                    "image or tensors"
                },
                dataset.name.as_str()
            ),
        );
    }
    torchscript(model, dataset, text_data, bad);
    sizes(model, text_model, bad);
    data_source(model, dataset, bad);
}

/// A TorchScript model: its file, and data read from files (or tokens).
fn torchscript(
    model: &heterotrain_crds::ModelSpec,
    dataset: &heterotrain_crds::DatasetSpec,
    text_data: bool,
    bad: &mut dyn FnMut(&str, String),
) {
    let scripted = model.name == ModelName::Torchscript;
    match &model.file {
        None if scripted => bad(
            "spec.model.file",
            "model torchscript needs file: the path of the TorchScript module (torch.jit.save) inside the pod".into(),
        ),
        Some(_) if !scripted => bad(
            "spec.model.file",
            format!(
                "file is only for model torchscript, not {}",
                model.name.as_str()
            ),
        ),
        Some(f) if !f.starts_with('/') => {
            bad("spec.model.file", format!("{f:?} must be an absolute path"))
        }
        _ => {}
    }
    if scripted && !text_data && !dataset.name.from_files() {
        bad(
            "spec.dataset.name",
            format!(
                "model torchscript trains on a dataset read from files (tensors, mnist, cifar10, cifar100), not {}",
                dataset.name.as_str()
            ),
        );
    }
}

/// The model's sizes: the schema's minimums, heads dividing the width.
fn sizes(model: &heterotrain_crds::ModelSpec, text_model: bool, bad: &mut dyn FnMut(&str, String)) {
    // The schema's minimums, again here: a spec may reach validation
    // without the API server's schema (a dry run, a CRD installed by hand).
    for (field, value, min) in [
        ("spec.model.hidden", model.hidden, 1),
        ("spec.model.layers", model.layers, 1),
        ("spec.model.heads", model.heads, 1),
        ("spec.model.context", model.context, 1),
        ("spec.model.vocab", model.vocab, 2),
    ] {
        if let Some(v) = value.filter(|&v| v < min) {
            bad(
                field,
                format!("{v} is below the smallest allowed value, {min}"),
            );
        }
    }
    if let (Some(h), Some(heads)) = (model.hidden, model.heads.filter(|&n| n > 0)) {
        if text_model && h % heads != 0 {
            bad(
                "spec.model.heads",
                format!("hidden width {h} is not divisible by {heads} heads"),
            );
        }
    }
}

/// Where the data comes from: files need a path; synthetic data fits the
/// memory limit.
fn data_source(
    model: &heterotrain_crds::ModelSpec,
    dataset: &heterotrain_crds::DatasetSpec,
    bad: &mut dyn FnMut(&str, String),
) {
    if dataset.name.from_files() && dataset.path.is_none() && dataset.claim_name.is_none() {
        bad(
            "spec.dataset",
            format!(
                "dataset {} is read from files: set path (and claimName to mount a volume)",
                dataset.name.as_str()
            ),
        );
    }
    if let Some(n) = dataset.synthetic_samples {
        let context = model
            .context
            .map_or(heterotrain_crds::trainer::DEFAULT_CONTEXT as u64, u64::from);
        let limit = heterotrain_crds::MAX_SYNTHETIC_BYTES;
        if let Some(b) = dataset.name.synthetic_bytes(u64::from(n), context) {
            if b > limit {
                bad(
                    "spec.dataset.syntheticSamples",
                    format!(
                        "{n} samples of {} would take {:.1} GiB of each rank's memory, over the {} GiB limit; use fewer",
                        dataset.name.as_str(),
                        b as f64 / f64::from(1u32 << 30),
                        limit >> 30
                    ),
                );
            }
        }
    }
}

/// Fields set in `spec` that only the built-in trainer reads (fields with a
/// default count when they differ from it), by their paths.
pub(super) fn builtin_only_fields(spec: &HeteroTrainingJobSpec) -> Vec<String> {
    let t = &spec.training;
    // The defaults, as the API server fills them in (serde's defaults).
    let Ok(d) = serde_json::from_value::<heterotrain_crds::TrainingSpec>(
        serde_json::json!({"globalBatchSize": t.global_batch_size}),
    ) else {
        return Vec::new();
    };
    let mut fields: Vec<&str> = Vec::new();
    if let Some(m) = &spec.model {
        for (name, set) in [
            ("spec.model.hidden", m.hidden.is_some()),
            ("spec.model.layers", m.layers.is_some()),
            ("spec.model.heads", m.heads.is_some()),
            ("spec.model.context", m.context.is_some()),
            ("spec.model.vocab", m.vocab.is_some()),
            ("spec.model.file", m.file.is_some()),
        ] {
            if set {
                fields.push(name);
            }
        }
    }
    if spec
        .dataset
        .as_ref()
        .is_some_and(|d| d.synthetic_samples.is_some())
    {
        fields.push("spec.dataset.syntheticSamples");
    }
    for (name, set) in [
        ("spec.training.optimizer", t.optimizer != d.optimizer),
        (
            "spec.training.learningRate",
            t.learning_rate != d.learning_rate,
        ),
        ("spec.training.momentum", t.momentum.is_some()),
        ("spec.training.weightDecay", t.weight_decay.is_some()),
        ("spec.training.schedule", t.schedule != d.schedule),
        (
            "spec.training.warmupSteps",
            t.warmup_steps != d.warmup_steps,
        ),
        ("spec.training.batchNorm", t.batch_norm != d.batch_norm),
        (
            "spec.training.optimizerSharding",
            t.optimizer_sharding != d.optimizer_sharding,
        ),
    ] {
        if set {
            fields.push(name);
        }
    }
    fields.into_iter().map(String::from).collect()
}
