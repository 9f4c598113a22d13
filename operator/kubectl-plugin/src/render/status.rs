//! `kubectl heterotrain status`: the job, its groups, its ranks, the last
//! decisions and its conditions.

use std::fmt::Write as _;

use heterotrain_crds::{HeteroTrainingJob, HeteroTrainingJobStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::{age, decisions, list, opt, rate};
use crate::fetch::JobView;
use crate::table::Table;

fn phase(p: &Pod) -> String {
    let st = p.status.as_ref();
    if p.metadata.deletion_timestamp.is_some() {
        return "Terminating".into();
    }
    st.and_then(|s| s.phase.clone())
        .unwrap_or_else(|| "Pending".into())
}

/// Local batch of each rank: the plan ConfigMap, else the last rebalance,
/// else the groups' batches.
pub fn rank_batches(v: &JobView) -> Vec<Option<u32>> {
    let world = v.job.spec.world_size() as usize;
    if let Some(p) = &v.plan {
        return p.batch_sizes.iter().copied().map(Some).collect();
    }
    let st = v.job.status.clone().unwrap_or_default();
    if let Some(r) = st.last_rebalance.filter(|r| r.batch_sizes.len() == world) {
        return r.batch_sizes.into_iter().map(Some).collect();
    }
    let flat: Vec<u32> = st
        .groups
        .iter()
        .flat_map(|g| g.batch_sizes.clone())
        .collect();
    if flat.len() == world {
        return flat.into_iter().map(Some).collect();
    }
    vec![None; world]
}

fn policy(job: &HeteroTrainingJob) -> &'static str {
    job.spec.load_balancing.policy.as_str()
}

/// `kubectl heterotrain status`: the seeds' "Load Balancer Status" box —
/// the job's summary, its plan and balance, a table of groups, one of
/// ranks, the last decisions and the conditions.
pub fn status(v: &JobView, now: Timestamp) -> String {
    let st = v.job.status.clone().unwrap_or_default();
    let mut out = summary(v, &st, now);
    out.push_str(&plan_and_balance(v, &st, now));
    out.push('\n');
    out.push_str(&groups_table(v, &st));
    out.push('\n');
    out.push_str(&ranks_table(v));
    if !v.rebalances.is_empty() {
        out.push_str("\nLast decisions:\n");
        out.push_str(&decisions(v, now, 5));
    }
    if !st.conditions.is_empty() {
        let mut c = Table::new(&["CONDITION", "STATUS", "REASON", "MESSAGE"]);
        for cond in &st.conditions {
            c.row(vec![
                cond.type_.clone(),
                cond.status.clone(),
                cond.reason.clone(),
                cond.message.clone(),
            ]);
        }
        out.push('\n');
        out.push_str(&c.render());
    }
    out
}

/// Name, age, phase, progress, ranks, throughput, policy, checkpoints.
fn summary(v: &JobView, st: &HeteroTrainingJobStatus, now: Timestamp) -> String {
    let job = &v.job;
    let ns = job.metadata.namespace.clone().unwrap_or_default();
    let mut out = String::new();
    let created = job.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let _ = writeln!(
        out,
        "Job:             {} (namespace {ns}, age {})",
        v.name(),
        age(created, now)
    );
    let _ = writeln!(
        out,
        "Phase:           {}   restarts {}",
        st.phase.clone().unwrap_or_else(|| "Pending".into()),
        st.restarts
    );
    let done = st.progress.as_ref().map_or(String::new(), |p| {
        format!(
            " of {} ({}%, ETA {})",
            p.total_steps,
            p.percent,
            p.eta.as_deref().unwrap_or("unknown")
        )
    });
    let _ = writeln!(
        out,
        "Progress:        step {}{done}   epoch {}",
        st.step, st.epoch
    );
    let _ = writeln!(
        out,
        "Ranks:           {} in {} group(s)",
        job.spec.world_size(),
        job.spec.workers.len()
    );
    if !st.left_out_ranks.is_empty() {
        let _ = writeln!(
            out,
            "Left out:        ranks {} (no samples under this plan; re-admitted to be measured)",
            list(&st.left_out_ranks)
        );
    }
    let _ = writeln!(
        out,
        "Throughput:      {} samples/s",
        rate(st.cluster_samples_per_second)
    );
    let _ = writeln!(out, "Policy:          {}", policy(job));
    let ckpt = &job.spec.checkpoint;
    let _ = match (&ckpt.claim_name, &st.checkpoint_dir) {
        (Some(claim), dir) => writeln!(
            out,
            "Checkpoints:     claim {claim}, directory {}{}",
            dir.as_deref().unwrap_or("(not yet recorded)"),
            ckpt.resume_from
                .as_ref()
                .map_or(String::new(), |f| format!("   continuing {f}"))
        ),
        (None, _) => writeln!(
            out,
            "Checkpoints:     rank 0's emptyDir: lost with the pod (set spec.checkpoint.claimName to keep them)"
        ),
    };
    out
}

/// The plan in force, the balance quality and the last rebalance.
fn plan_and_balance(v: &JobView, st: &HeteroTrainingJobStatus, now: Timestamp) -> String {
    let mut out = String::new();
    match &v.plan {
        Some(p) => {
            let _ = writeln!(
                out,
                "Plan:            generation {}   global batch {}   batches {}",
                p.generation,
                p.global_batch_size,
                list(&p.batch_sizes)
            );
        }
        None => {
            let _ = writeln!(
                out,
                "Plan:            generation {}   ({})",
                st.plan_generation,
                v.plan_error.clone().unwrap_or_default()
            );
        }
    }
    let _ = writeln!(
        out,
        "Balance:         {}",
        st.balance.as_ref().map_or_else(
            || "-".to_string(),
            |b| format!("CV {:.1} %  {}", b.cv_percent, b.class)
        )
    );
    let _ = writeln!(
        out,
        "Last rebalance:  {}",
        st.last_rebalance.as_ref().map_or_else(
            || "none".to_string(),
            |r| format!(
                "generation {} {} ago, predicted gain {:.1} %: {}",
                r.generation,
                age(r.time.as_ref().map(|t| t.0), now),
                r.predicted_gain_percent,
                r.reason
            )
        )
    );

    out
}

/// One row a worker group: device, ready pods, batches, throughput.
fn groups_table(v: &JobView, st: &HeteroTrainingJobStatus) -> String {
    let job = &v.job;
    let mut groups = Table::new(&["GROUP", "DEVICE", "READY", "BATCHES", "SAMPLES/S"]);
    for (i, g) in job.spec.workers.iter().enumerate() {
        let gs = st
            .groups
            .iter()
            .find(|s| s.name == g.name)
            .or(st.groups.get(i));
        let device = match g.device {
            heterotrain_crds::Device::Cpu => "cpu",
            heterotrain_crds::Device::Cuda => "cuda",
        };
        groups.row(vec![
            g.name.clone(),
            device.into(),
            format!("{}/{}", gs.map_or(0, |s| s.ready), g.replicas),
            gs.map_or_else(|| "-".into(), |s| list(&s.batch_sizes)),
            rate(gs.and_then(|s| s.samples_per_second)),
        ]);
    }
    groups.render()
}

/// One row a rank: group, pod, node, phase, batch, what bounds its step.
fn ranks_table(v: &JobView) -> String {
    let job = &v.job;
    let batches = rank_batches(v);
    let mut ranks = Table::new(&["RANK", "GROUP", "POD", "NODE", "PHASE", "BATCH", "BOUND BY"]);
    let bound = job
        .status
        .as_ref()
        .map(|s| s.rank_bottlenecks.as_slice())
        .unwrap_or_default();
    for (rank, (gi, _)) in job.spec.rank_layout().into_iter().enumerate() {
        let rank = rank as u32;
        let pod = v.pod_of(rank);
        ranks.row(vec![
            rank.to_string(),
            job.spec.workers[gi].name.clone(),
            pod.and_then(|p| p.metadata.name.clone())
                .unwrap_or_else(|| "-".into()),
            opt(pod.and_then(|p| p.spec.as_ref()?.node_name.clone())),
            pod.map_or_else(|| "-".into(), phase),
            opt(batches.get(rank as usize).copied().flatten()),
            opt(bound
                .iter()
                .find(|b| b.rank == rank)
                .map(|b| b.bottleneck.as_str())),
        ]);
    }
    ranks.render()
}
