//! What the bench asks the cluster for: its simulated nodes and the
//! HeteroTrainingJob of a run (one single-replica group pinned to each
//! node; jobs read the cached digits from a claim of the dataset's name).

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use heterotrain_crds::{labels, HeteroTrainingJob, OptimizerSharding};
use serde_json::json;

use super::{BenchNode, ModelRun, Scenario};
use crate::nodesim::{NodeConfig, NodesFile};

/// Nodes for `nodes` (name, speed): CPU-only, room for a few pods each,
/// on the CPUs `cpus` gives them (any CPU where absent).
pub fn nodes_file(nodes: &[BenchNode], cpus: &BTreeMap<String, Vec<usize>>) -> NodesFile {
    let mut seen = BTreeMap::new();
    for n in nodes {
        seen.entry(n.name.clone()).or_insert(n.speed);
    }
    NodesFile {
        nodes: seen
            .into_iter()
            .map(|(name, speed)| NodeConfig {
                cpus: cpus.get(&name).cloned().unwrap_or_default(),
                name,
                labels: BTreeMap::new(),
                speed,
                cpu: "2".into(),
                memory: "16Gi".into(),
                gpus: 0,
                gpu_product: None,
                max_pods: 20,
                run_processes: true,
            })
            .collect(),
    }
}

/// Which CPUs of this machine the simulated nodes' pods run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeCpus {
    /// In a scenario with no more nodes than CPUs, each node on CPUs of
    /// its own, as separate machines have; larger scenarios share every CPU.
    Own,
    /// As `own`, and in larger scenarios one CPU per node, the fastest
    /// first onto the CPU with the least speed on it so far.
    Spread,
    /// Every pod on any CPU.
    Shared,
}

/// CPUs for each node of every scenario under `mode`. With no more nodes
/// than `usable` has CPUs, node j of n gets the j-th of n equal runs of
/// `usable` (on 2 CPUs and 2 nodes, one each). With more nodes, under
/// `Spread`, each gets one CPU, the fastest first onto the CPU with the
/// least speed on it so far; otherwise none (any CPU). A node in several
/// scenarios keeps its first assignment.
pub fn node_cpus(
    scenarios: &[Scenario],
    usable: &[usize],
    mode: NodeCpus,
) -> BTreeMap<String, Vec<usize>> {
    let mut out = BTreeMap::new();
    if usable.is_empty() || mode == NodeCpus::Shared {
        return out;
    }
    for sc in scenarios {
        let n = sc.nodes.len();
        if n == 0 {
            continue;
        }
        if n <= usable.len() {
            let k = usable.len() / n;
            for (j, node) in sc.nodes.iter().enumerate() {
                out.entry(node.name.clone())
                    .or_insert_with(|| usable[j * k..(j + 1) * k].to_vec());
            }
            continue;
        }
        if mode != NodeCpus::Spread {
            continue;
        }
        let mut load = vec![0.0f64; usable.len()];
        let mut order: Vec<&BenchNode> = sc.nodes.iter().collect();
        order.sort_by(|a, b| b.speed.total_cmp(&a.speed));
        for node in order {
            let c = (0..load.len())
                .min_by(|a, b| load[*a].total_cmp(&load[*b]))
                .unwrap_or(0);
            load[c] += node.speed;
            out.entry(node.name.clone())
                .or_insert_with(|| vec![usable[c]]);
        }
    }
    out
}

/// A job's spec for the bench: one single-replica group per node, pinned
/// to it, 1 thread and `core_unit` cores each.
pub struct JobParams<'a> {
    pub name: &'a str,
    pub model: &'a ModelRun,
    pub nodes: &'a [BenchNode],
    pub policy: &'a str,
    pub global_batch: u32,
    pub steps: u64,
    pub core_unit: f64,
    pub profiling: bool,
    /// `training.optimizerSharding`.
    pub optimizer_sharding: OptimizerSharding,
}

/// Build the HeteroTrainingJob for `p`.
pub fn job(p: &JobParams) -> Result<HeteroTrainingJob> {
    let (format, cached) = crate::datasets::for_model(&p.model.model)?;
    if cached != p.model.dataset {
        bail!(
            "model {} reads {format} data, which dataset {} is not",
            p.model.model,
            p.model.dataset
        );
    }
    let millis = ((p.core_unit * 1000.0).round() as u64).max(10);
    let (policy, cap) = super::spec_policy(p.policy);
    let workers: Vec<serde_json::Value> = p
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            json!({
                "name": format!("n{i}"),
                "replicas": 1,
                "device": "cpu",
                "threads": 1,
                "nodeSelector": {labels::HOSTNAME: n.name},
                "resources": {
                    "requests": {"cpu": "50m", "memory": "256Mi"},
                    "limits": {"cpu": format!("{millis}m"), "memory": "2Gi"}
                }
            })
        })
        .collect();
    // rebalanceIntervalSteps 10: at simple_cnn's 40–140 ms steps that is
    // under the operator's 2 s --rebalance-interval, so the wall-clock floor
    // sets the decision period the throttle target is stated in; resnet18's
    // 0.5–0.8 s steps make it 5–8 s, a handful of decisions in 50 steps.
    let v = json!({
        "apiVersion": "heterotrain.dev/v1alpha1",
        "kind": "HeteroTrainingJob",
        "metadata": {"name": p.name, "labels": {labels::PART_OF: "heterotrain-bench"}},
        "spec": {
            "workers": workers,
            "model": {"name": p.model.model},
            "dataset": {"name": format, "claimName": p.model.dataset},
            "training": {
                "globalBatchSize": p.global_batch,
                "maxSteps": p.steps,
                "optimizer": "sgd",
                "learningRate": p.model.learning_rate,
                "momentum": "0.9",
                "seed": 1,
                "optimizerSharding": p.optimizer_sharding.as_str()
            },
            "loadBalancing": {
                "policy": policy,
                "rebalanceIntervalSteps": 10,
                "minGainPercent": 5,
                "capQuotaBoundRanks": cap
            },
            "profiling": {"enabled": p.profiling},
            "checkpoint": {"everySteps": 0},
            "runPolicy": {"backoffLimit": 0}
        }
    });
    serde_json::from_value(v).context("building the bench job")
}
