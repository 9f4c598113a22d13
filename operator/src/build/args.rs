//! The trainer's command line, from the spec: one pure function, so the
//! contract with `heterotrain-trainer train` is adjusted in one place.

use heterotrain_crds::{Backend, Device, HeteroTrainingJobSpec, WorkerGroup};

use crate::names;

/// The trainer binary inside the image.
pub const TRAINER_BINARY: &str = "heterotrain-trainer";
/// Where the trainer writes its logs and final weights (inside the scratch dir).
pub const OUTPUT_DIR: &str = "/scratch/output";

/// Threads for a group: `threads`, else the CPU limit rounded up, else 1.
pub fn group_threads(group: &WorkerGroup) -> u32 {
    group
        .threads
        .or_else(|| {
            group
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get("cpu"))
                .and_then(|q| quantity_to_threads(&q.0))
        })
        .unwrap_or(1)
        .max(1)
}

/// Whole CPUs in a CPU quantity, rounded up: "2" → 2, "1500m" → 2,
/// "0.5" → 1. `None` when the text is not a plain or milli quantity.
pub fn quantity_to_threads(q: &str) -> Option<u32> {
    let q = q.trim();
    let millis: f64 = if let Some(m) = q.strip_suffix('m') {
        m.parse::<f64>().ok()?
    } else {
        q.parse::<f64>().ok()? * 1000.0
    };
    if !millis.is_finite() || millis <= 0.0 {
        return None;
    }
    let cpus = (millis / 1000.0).ceil();
    (cpus <= f64::from(u32::MAX)).then_some(cpus as u32)
}

/// Directory the dataset is read from inside the pod, if any.
pub fn data_dir(spec: &HeteroTrainingJobSpec) -> Option<String> {
    spec.dataset.path.clone().or_else(|| {
        spec.dataset
            .claim_name
            .as_ref()
            .map(|_| names::DEFAULT_DATA_DIR.to_string())
    })
}

/// `heterotrain-trainer` arguments (after the binary) for one rank of `group`.
pub fn trainer_args(spec: &HeteroTrainingJobSpec, group: &WorkerGroup) -> Vec<String> {
    let mut a: Vec<String> = vec!["train".into()];
    let mut push = |k: &str, v: String| {
        a.push(format!("--{k}"));
        a.push(v);
    };
    let m = &spec.model;
    push("model", m.name.as_str().into());
    for (k, v) in [
        ("hidden", m.hidden),
        ("layers", m.layers),
        ("heads", m.heads),
        ("context", m.context),
        ("vocab", m.vocab),
    ] {
        if let Some(v) = v {
            push(k, v.to_string());
        }
    }
    push("dataset", spec.dataset.name.as_str().into());
    if let Some(dir) = data_dir(spec) {
        push("data-dir", dir);
    }
    if let Some(n) = spec.dataset.synthetic_samples {
        push("synthetic-samples", n.to_string());
    }
    let t = &spec.training;
    push("batch-size", t.global_batch_size.to_string());
    // maxSteps wins over epochs when both are set (see the CRD docs).
    match (t.max_steps, t.epochs) {
        (Some(s), _) => push("max-steps", s.to_string()),
        (None, Some(e)) => push("epochs", e.to_string()),
        (None, None) => {}
    }
    push("lr", t.learning_rate.clone());
    push(
        "optimizer",
        match t.optimizer {
            heterotrain_crds::Optimizer::Sgd => "sgd",
            heterotrain_crds::Optimizer::Adamw => "adamw",
        }
        .into(),
    );
    if let Some(v) = &t.momentum {
        push("momentum", v.clone());
    }
    if let Some(v) = &t.weight_decay {
        push("weight-decay", v.clone());
    }
    push(
        "schedule",
        match t.schedule {
            heterotrain_crds::Schedule::Constant => "constant",
            heterotrain_crds::Schedule::Cosine => "cosine",
            heterotrain_crds::Schedule::Step => "step",
        }
        .into(),
    );
    push("warmup-steps", t.warmup_steps.to_string());
    if m.name.has_batch_norm() {
        push("batch-norm", t.batch_norm.as_str().into());
    }
    push("optimizer-sharding", t.optimizer_sharding.as_str().into());
    push("seed", t.seed.to_string());
    push(
        "backend",
        match spec.backend {
            Backend::Auto => "auto",
            Backend::Gloo => "gloo",
            Backend::Nccl => "nccl",
        }
        .into(),
    );
    push(
        "device",
        match group.device {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
        .into(),
    );
    push("threads", group_threads(group).to_string());
    push("output-dir", OUTPUT_DIR.into());
    push("checkpoint-dir", spec.checkpoint.path.clone());
    push("checkpoint-every", spec.checkpoint.every_steps.to_string());
    push("resume", "auto".into());
    push("metrics-port", spec.metrics_port.to_string());
    let rp = &spec.run_policy;
    if let Some(t) = rp.collective_timeout_seconds {
        push("collective-timeout-secs", t.to_string());
    }
    if let Some(t) = rp.rendezvous_timeout_seconds {
        push("rendezvous-timeout-secs", t.to_string());
    }
    if spec.profiling.enabled {
        let sizes: Vec<String> = spec
            .profiling
            .probe_batch_sizes
            .iter()
            .map(u32::to_string)
            .collect();
        push("profile-batch-sizes", sizes.join(","));
    } else {
        a.push("--no-profile".into());
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quantities() {
        assert_eq!(quantity_to_threads("2"), Some(2));
        assert_eq!(quantity_to_threads("1500m"), Some(2));
        assert_eq!(quantity_to_threads("0.5"), Some(1));
        assert_eq!(quantity_to_threads("abc"), None);
        assert_eq!(quantity_to_threads("-1"), None);
        assert_eq!(quantity_to_threads("0"), None);
    }
}
