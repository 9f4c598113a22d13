//! The trainer's command line, from the spec: one pure function, so the
//! contract with `heterotrain-trainer train` is adjusted in one place.

use heterotrain_crds::trainer::ResumeMode;
use heterotrain_crds::{HeteroTrainingJobSpec, TrainerArgs, WorkerGroup};

use crate::error::Error;
use crate::names;
pub use crate::rank_pod::{data_dir, group_threads};

/// The trainer binary inside the image.
pub const TRAINER_BINARY: &str = "heterotrain-trainer";
/// Where the trainer writes its logs and final weights (inside the scratch dir).
pub const OUTPUT_DIR: &str = "/scratch/output";

/// The trainer's settings for one rank of `group`: the contract type the
/// trainer parses, filled from the spec (flags the spec does not mention
/// keep the trainer's defaults).
pub fn trainer_settings(
    spec: &HeteroTrainingJobSpec,
    group: &WorkerGroup,
) -> Result<TrainerArgs, Error> {
    let mut a = TrainerArgs::defaults().map_err(|e| Error::Invalid(e.to_string()))?;
    // Validation refuses a spec whose groups run the built-in trainer
    // without a model and a dataset.
    let (Some(m), Some(dataset)) = (&spec.model, &spec.dataset) else {
        return Err(Error::Invalid(
            "spec.model and spec.dataset are required for the built-in trainer".into(),
        ));
    };
    a.model.arch = m.name;
    for (field, v) in [
        (&mut a.model.hidden, m.hidden),
        (&mut a.model.layers, m.layers),
        (&mut a.model.heads, m.heads),
        (&mut a.model.context, m.context),
        (&mut a.model.vocab, m.vocab),
    ] {
        if let Some(v) = v {
            *field = i64::from(v);
        }
    }
    a.model.model_file = m.file.as_ref().map(Into::into);
    a.data.dataset = dataset.name;
    a.data.data_dir = data_dir(spec).map(Into::into);
    if let Some(n) = dataset.synthetic_samples {
        a.data.synthetic_samples = n as usize;
    }
    optimizer_settings(spec, &mut a)?;
    a.dist.backend = spec.backend;
    a.dist.device = group.device;
    a.dist.threads = group_threads(group) as usize;
    let rp = &spec.run_policy;
    if let Some(t) = rp.collective_timeout_seconds {
        a.dist.collective_timeout_secs = u64::from(t);
    }
    if let Some(t) = rp.rendezvous_timeout_seconds {
        a.dist.rendezvous_timeout_secs = u64::from(t);
    }
    a.output.output_dir = OUTPUT_DIR.into();
    a.output.checkpoint_dir = Some(spec.checkpoint.path.clone().into());
    a.output.checkpoint_every = u64::from(spec.checkpoint.every_steps);
    a.output.resume = ResumeMode::Auto;
    if spec.checkpoint.resume_from.is_some() && spec.checkpoint.claim_name.is_some() {
        a.output.resume_from = Some(names::RESUME_FROM_DIR.into());
    }
    a.obs.metrics_port = spec.metrics_port;
    if spec.profiling.enabled {
        a.obs.profile_batch_sizes = spec.profiling.probe_batch_sizes.clone();
    } else {
        a.obs.no_profile = true;
    }
    Ok(a)
}

/// `spec.training` into the optimiser's settings of `a`.
fn optimizer_settings(spec: &HeteroTrainingJobSpec, a: &mut TrainerArgs) -> Result<(), Error> {
    let number = |field: &str, v: &str| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .ok_or_else(|| Error::Invalid(format!("spec.training.{field} {v:?} is not a number")))
    };
    let t = &spec.training;
    a.optim.batch_size = t.global_batch_size;
    // maxSteps wins over epochs when both are set (see the CRD docs).
    (a.optim.max_steps, a.optim.epochs) = match t.max_steps {
        Some(s) => (Some(s), None),
        None => (None, t.epochs.map(u64::from)),
    };
    a.optim.lr = number("learningRate", &t.learning_rate)?;
    a.optim.optimizer = t.optimizer;
    if let Some(v) = &t.momentum {
        a.optim.momentum = number("momentum", v)?;
    }
    if let Some(v) = &t.weight_decay {
        a.optim.weight_decay = number("weightDecay", v)?;
    }
    a.optim.schedule = t.schedule;
    a.optim.warmup_steps = u64::from(t.warmup_steps);
    a.model.batch_norm = t.batch_norm;
    a.optim.optimizer_sharding = t.optimizer_sharding;
    a.optim.seed = t.seed;
    Ok(())
}

/// `heterotrain-trainer` arguments (after the binary) for one rank of `group`.
pub fn trainer_args(
    spec: &HeteroTrainingJobSpec,
    group: &WorkerGroup,
) -> Result<Vec<String>, Error> {
    let mut args = vec!["train".to_string()];
    args.extend(
        trainer_settings(spec, group)?
            .to_args()
            .map_err(|e| Error::Invalid(e.to_string()))?,
    );
    Ok(args)
}
