//! The validation rules: checks beyond the OpenAPI schema, rules that need
//! several fields at once, or that the 1.20 API server cannot enforce (no
//! CEL). Each problem names the field and says how to fix it. Never panics
//! on any spec.

use heterotrain_crds::resources::{cpu_limit, whole_cpus};
use heterotrain_crds::trainer::env;
use heterotrain_crds::{Backend, Device, HeteroTrainingJobSpec, MetricsSource, WorkerGroup};

use crate::names;

use super::model_rules::{builtin_only_fields, model_and_data};

/// Most ranks one job may have.
pub const MAX_RANKS: u32 = 4096;
/// Env vars the operator sets itself; a group may not override them.
pub const RESERVED_ENV: [&str; 13] = [
    env::RANK,
    env::WORLD_SIZE,
    env::LOCAL_RANK,
    env::MASTER_ADDR,
    env::MASTER_PORT,
    env::POD_IP,
    env::BIND_ADDR,
    env::NAMESPACE,
    env::PLAN_CONFIGMAP,
    env::RESTART_COUNT,
    env::JOB_UID,
    env::BATCH_SIZE,
    env::METRICS_PORT,
];

/// One semantic problem of a spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// JSON path of the offending field, e.g. `spec.training.globalBatchSize`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// All problems as one message for a condition or Event.
pub fn summary(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn is_dns1035_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

fn decimal(s: &str) -> Option<f64> {
    s.trim().parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Where each check reports a problem: the field and what to do.
type Bad<'a> = &'a mut dyn FnMut(&str, String);

/// Check `spec` of job `name`. `default_prometheus` is the operator's
/// `--prometheus-url`, which satisfies `metricsSource: prometheus` jobs
/// without their own URL. The checks run in order (the problems come in
/// the order of the spec's sections), each reporting every problem it
/// finds.
pub fn validate(
    name: &str,
    spec: &HeteroTrainingJobSpec,
    default_prometheus: Option<&str>,
) -> Result<(), Vec<Problem>> {
    let mut p = Vec::new();
    let mut sink = |field: &str, message: String| {
        p.push(Problem {
            field: field.to_string(),
            message,
        })
    };
    let bad: Bad = &mut sink;
    let ranks: u64 = spec.workers.iter().map(|g| u64::from(g.replicas)).sum();
    name_and_ranks(name, spec, ranks, bad);
    let mut seen = std::collections::BTreeSet::new();
    for (i, g) in spec.workers.iter().enumerate() {
        if !seen.insert(g.name.as_str()) {
            bad(
                &format!("spec.workers[{i}].name"),
                format!(
                    "group name {:?} is used twice; group names must be unique",
                    g.name
                ),
            );
        }
        group(spec, i, g, bad);
    }
    commands_and_backend(spec, ranks, bad);
    batches(spec, ranks, bad);
    training(spec, default_prometheus, bad);
    model_and_dataset(spec, bad);
    super::checkpoint_rules::check_checkpoint(name, spec, bad);
    if spec.profiling.probe_batch_sizes.contains(&0) {
        bad(
            "spec.profiling.probeBatchSizes",
            "probe batch sizes must be ≥ 1".into(),
        );
    }
    super::network_rules::check_egress(spec, bad);
    if spec.master_port == spec.metrics_port {
        bad(
            "spec.metricsPort",
            format!(
                "metricsPort {} is also masterPort; use two different ports",
                spec.metrics_port
            ),
        );
    }
    if p.is_empty() {
        Ok(())
    } else {
        Err(p)
    }
}

/// The job's name (a DNS-1035 label that leaves room for the pods'
/// hostnames) and its number of ranks.
fn name_and_ranks(name: &str, spec: &HeteroTrainingJobSpec, ranks: u64, bad: Bad) {
    let last_rank = ranks.saturating_sub(1);
    if !is_dns1035_label(name) || name.len() + 1 + last_rank.to_string().len() > 63 {
        bad(
            "metadata.name",
            format!(
                "job name {name:?} must be a DNS-1035 label (lower-case letters, digits, '-', starting with a letter) short enough that pod hostname \"{}\" fits in 63 characters",
                names::pod_name(name, last_rank.min(u64::from(u32::MAX)) as u32)
            ),
        );
    }
    if spec.workers.is_empty() {
        bad("spec.workers", "at least one worker group is needed".into());
    }
    if ranks == 0 {
        bad(
            "spec.workers",
            "the job has no ranks; give a group replicas ≥ 1".into(),
        );
    }
    if ranks > u64::from(MAX_RANKS) {
        bad(
            "spec.workers",
            format!("{ranks} ranks in total; at most {MAX_RANKS} are supported"),
        );
    }
}

/// One worker group: replicas, device and GPUs, the CPU limit, reserved
/// env vars, commands, and the pod rules ([`super::pod_rules`]).
fn group(spec: &HeteroTrainingJobSpec, i: usize, g: &WorkerGroup, bad: Bad) {
    let f = |x: &str| format!("spec.workers[{i}].{x}");
    if g.replicas == 0 {
        bad(&f("replicas"), format!("group {:?} has 0 replicas", g.name));
    }
    let gpus = g.resources.as_ref().and_then(|r| {
        r.limits
            .as_ref()
            .and_then(|l| l.get("nvidia.com/gpu"))
            .or_else(|| r.requests.as_ref().and_then(|q| q.get("nvidia.com/gpu")))
    });
    match g.device {
        Device::Cuda if gpus.is_none() => bad(
            &f("resources"),
            format!(
                "group {:?} trains on cuda but requests no GPU; add resources.limits.\"nvidia.com/gpu\": 1",
                g.name
            ),
        ),
        Device::Cpu if gpus.is_some() => bad(
            &f("device"),
            format!(
                "group {:?} requests nvidia.com/gpu but trains on cpu; set device: cuda or drop the GPU request",
                g.name
            ),
        ),
        _ => {}
    }
    if let Some(cpu) = cpu_limit(g.resources.as_ref()) {
        if whole_cpus(&cpu.0).is_none() {
            bad(
                &f("resources.limits.cpu"),
                format!("cpu limit {:?} is not a valid quantity", cpu.0),
            );
        }
    }
    for e in &g.env {
        if RESERVED_ENV.contains(&e.name.as_str()) {
            bad(
                &f("env"),
                format!("{} is set by the operator and cannot be overridden", e.name),
            );
        }
    }
    if !g.args.is_empty() && g.command.is_empty() && spec.command.is_empty() {
        bad(
            &f("args"),
            format!(
                "group {:?} sets args but no command runs them: the built-in trainer's flags come from the spec; set command (the group's or spec.command) to run your own trainer",
                g.name
            ),
        );
    }
    if g.command.iter().any(|c| c.trim().is_empty()) {
        bad(&f("command"), "command entries must not be empty".into());
    }
    super::pod_rules::check_group(spec, i, g, bad);
}

/// Scheduling, the job's own command and args, and the backend.
fn commands_and_backend(spec: &HeteroTrainingJobSpec, ranks: u64, bad: Bad) {
    if let Some(policy) = &spec.run_policy.scheduling_policy {
        super::pod_rules::check_scheduling(policy, ranks, bad);
    }
    if !spec.args.is_empty() && spec.command.is_empty() {
        bad(
            "spec.args",
            "args are given but no command runs them: the built-in trainer's flags come from the spec; set spec.command to run your own trainer".into(),
        );
    }
    if spec.command.iter().any(|c| c.trim().is_empty()) {
        bad("spec.command", "command entries must not be empty".into());
    }
    if spec.backend == Backend::Nccl {
        for g in spec.workers.iter().filter(|g| g.device == Device::Cpu) {
            bad(
                "spec.backend",
                format!(
                    "backend nccl needs every rank on cuda, but group {:?} is cpu; use backend gloo or auto",
                    g.name
                ),
            );
        }
    }
}

/// The global batch against the ranks' local-batch bounds.
fn batches(spec: &HeteroTrainingJobSpec, ranks: u64, bad: Bad) {
    let lb = &spec.load_balancing;
    let t = &spec.training;
    let min_local = spec.effective_min_local_batch();
    let min_sum = ranks * u64::from(min_local);
    if min_local > lb.min_local_batch && u64::from(t.global_batch_size) < min_sum {
        bad(
            "spec.training.batchNorm",
            format!(
                "batchNorm local gives each rank its own BatchNorm statistics, which need at least 2 samples per rank, but global batch {} over {ranks} ranks cannot give every rank 2; use batchNorm: sync (exact under any split) or raise globalBatchSize to at least {min_sum}",
                t.global_batch_size
            ),
        );
    } else if u64::from(t.global_batch_size) < min_sum {
        bad(
            "spec.training.globalBatchSize",
            format!(
                "global batch {} is below {ranks} ranks × minLocalBatch {} = {min_sum}; raise globalBatchSize or lower minLocalBatch/replicas",
                t.global_batch_size, lb.min_local_batch
            ),
        );
    }
    if let Some(max) = lb
        .max_local_batch
        .filter(|&m| m < min_local && min_local > lb.min_local_batch)
    {
        bad(
            "spec.loadBalancing.maxLocalBatch",
            format!(
                "maxLocalBatch {max} is below 2, the smallest local batch batchNorm local allows; use batchNorm: sync or raise maxLocalBatch"
            ),
        );
    }
    if let Some(max) = lb.max_local_batch {
        if max < lb.min_local_batch {
            bad(
                "spec.loadBalancing.maxLocalBatch",
                format!(
                    "maxLocalBatch {max} is below minLocalBatch {}",
                    lb.min_local_batch
                ),
            );
        }
        let cap_sum = ranks * u64::from(max);
        if ranks > 0 && cap_sum < u64::from(t.global_batch_size) {
            bad(
                "spec.loadBalancing.maxLocalBatch",
                format!(
                    "{ranks} ranks × maxLocalBatch {max} = {cap_sum} cannot hold global batch {}; raise maxLocalBatch or add ranks",
                    t.global_batch_size
                ),
            );
        }
    }
}

/// The metrics source and the training hyper-parameters.
fn training(spec: &HeteroTrainingJobSpec, default_prometheus: Option<&str>, bad: Bad) {
    let (lb, t) = (&spec.load_balancing, &spec.training);
    if lb.metrics_source == MetricsSource::Prometheus
        && lb.prometheus_url.is_none()
        && default_prometheus.is_none()
    {
        bad(
            "spec.loadBalancing.prometheusUrl",
            "metricsSource prometheus needs prometheusUrl (or the operator's --prometheus-url)"
                .into(),
        );
    }
    if t.epochs.is_none() && t.max_steps.is_none() {
        bad(
            "spec.training",
            "set epochs or maxSteps, or training never ends".into(),
        );
    }
    match decimal(&t.learning_rate) {
        Some(lr) if lr > 0.0 => {}
        _ => bad(
            "spec.training.learningRate",
            format!("learning rate {:?} must be a number > 0", t.learning_rate),
        ),
    }
    if let Some(m) = &t.momentum {
        match decimal(m) {
            Some(v) if (0.0..1.0).contains(&v) => {}
            _ => bad(
                "spec.training.momentum",
                format!("momentum {m:?} must be in [0, 1)"),
            ),
        }
    }
    if let Some(w) = &t.weight_decay {
        if decimal(w).is_none() {
            bad(
                "spec.training.weightDecay",
                format!("weight decay {w:?} is not a number"),
            );
        }
    }
}

/// The built-in trainer's model and dataset, and the fields only it reads.
fn model_and_dataset(spec: &HeteroTrainingJobSpec, bad: Bad) {
    match (&spec.model, &spec.dataset) {
        (Some(model), Some(dataset)) => model_and_data(model, dataset, bad),
        _ if spec.runs_builtin_trainer() => {
            for (field, missing) in [
                ("spec.model", spec.model.is_none()),
                ("spec.dataset", spec.dataset.is_none()),
            ] {
                if missing {
                    bad(
                        field,
                        format!(
                            "the built-in trainer needs {}: set it, or give every group a command to run your own trainer",
                            field.trim_start_matches("spec.")
                        ),
                    );
                }
            }
        }
        _ => {}
    }
    if let Some(path) = spec.dataset.as_ref().and_then(|d| d.path.as_ref()) {
        if !path.starts_with('/') {
            bad(
                "spec.dataset.path",
                format!("{path:?} must be an absolute path"),
            );
        }
    }
    if !spec.runs_builtin_trainer() {
        for field in builtin_only_fields(spec) {
            bad(
                &field,
                "only the built-in trainer reads it, and every group runs its own command: pass it to your script (args, env), or remove it".into(),
            );
        }
    }
}
