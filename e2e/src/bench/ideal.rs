//! The two ideals a cluster run is measured against, both without
//! communication: every rank of a scenario training alone on its node one
//! after another (sequential: no other load on the machine), and all of
//! them training alone at the same time (concurrent: the CPU contention of
//! a cluster run on this shared machine, without its all-reduce).

use std::time::Duration;

use anyhow::Result;

use super::analysis::{cluster_steps, overlap_rates, summarise, ClusterStep};
use super::runner::BenchCluster;
use super::spec::{job, JobParams};
use super::state::{say, short, State};
use super::{ideal_split, BenchNode, ModelRun, Standalone};

/// A rank's job: `node` alone at `batch` for `steps`, no profiling.
fn solo_job(
    cl: &BenchCluster,
    m: &ModelRun,
    name: &str,
    (node, batch, steps): (&BenchNode, u32, u64),
) -> Result<heterotrain_crds::HeteroTrainingJob> {
    job(&JobParams {
        name,
        model: m,
        nodes: std::slice::from_ref(node),
        policy: "static",
        global_batch: batch,
        steps,
        core_unit: cl.core_unit,
        profiling: false,
        optimizer_sharding: cl.optimizer_sharding,
    })
}

/// Run `f` with `nodes` at their speeds, then give each its usual speed.
async fn at_speeds<T>(
    cl: &BenchCluster,
    st: &State,
    nodes: &[BenchNode],
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let changed: Vec<(&BenchNode, f64)> = nodes
        .iter()
        .filter_map(|n| {
            let base = st.base_speed.get(&n.name).copied().unwrap_or(n.speed);
            ((n.speed - base).abs() > 1e-9).then_some((n, base))
        })
        .collect();
    for (n, _) in &changed {
        cl.system.sim.set_speed(&n.name, n.speed)?;
    }
    let out = f.await;
    for (n, base) in &changed {
        cl.system.sim.set_speed(&n.name, *base)?;
    }
    out
}

/// samples/s of one rank alone on `node` at `batch` (measured once).
async fn standalone(
    cl: &BenchCluster,
    st: &mut State,
    m: &ModelRun,
    node: &BenchNode,
    batch: u32,
) -> Result<f64> {
    let key = (
        m.model.clone(),
        node.name.clone(),
        node.speed.to_bits(),
        batch,
    );
    if let Some(r) = st.standalone.get(&key) {
        return Ok(*r);
    }
    let name = format!(
        "solo-{}-{}-{}-b{batch}",
        short(&m.model),
        node.name,
        (node.speed * 100.0).round() as u32
    );
    let rate = alone(cl, st, m, (node, batch, 0, false), &name).await?;
    st.standalone.insert(key, rate);
    Ok(rate)
}

/// The best subset's rate in round `round`, measured afresh (so that each
/// round's runs are held to a measurement taken minutes before them): its
/// ranks alone, one after another, at their ideal split of the global
/// batch (one node: the whole batch).
pub async fn best_subset(
    cl: &BenchCluster,
    st: &mut State,
    m: &ModelRun,
    nodes: &[BenchNode],
    round: u32,
) -> Result<f64> {
    let speeds: Vec<f64> = nodes.iter().map(|n| n.speed).collect();
    let mut sum = 0.0;
    for (n, b) in nodes.iter().zip(ideal_split(m.global_batch, &speeds)) {
        let name = format!(
            "subset-{}-{}-{}-b{b}-r{round}",
            short(&m.model),
            n.name,
            (n.speed * 100.0).round() as u32
        );
        sum += alone(cl, st, m, (n, b, round, true), &name).await?;
    }
    Ok(sum)
}

/// samples/s of one rank alone on `node` at `batch`, as job `name` (in
/// `round`; `subset`: a measurement of the best subset).
async fn alone(
    cl: &BenchCluster,
    st: &mut State,
    m: &ModelRun,
    (node, batch, round, subset): (&BenchNode, u32, u32, bool),
    name: &str,
) -> Result<f64> {
    let speed = node.speed;
    let j = solo_job(cl, m, name, (node, batch, m.standalone_steps))?;
    let run = at_speeds(cl, st, std::slice::from_ref(node), async {
        cl.run(j, None, Duration::from_secs(900)).await
    })
    .await?;
    let rate = summarise(&cluster_steps(&run.ranks), &run.evals).samples_per_second;
    say(&format!(
        "    alone: {} on {} (speed {speed}), batch {batch}: {rate:.1} samples/s",
        m.model, node.name
    ));
    st.results.standalone.push(Standalone {
        model: m.model.clone(),
        node: node.name.clone(),
        speed,
        batch,
        samples_per_second: rate,
        together: false,
        round,
        best_subset: subset,
    });
    Ok(rate)
}

/// The sequential ideal: Σ standalone rates of the ideal split of `nodes`.
pub async fn sequential(
    cl: &BenchCluster,
    st: &mut State,
    m: &ModelRun,
    nodes: &[BenchNode],
) -> Result<f64> {
    let speeds: Vec<f64> = nodes.iter().map(|n| n.speed).collect();
    let mut sum = 0.0;
    for (n, b) in nodes.iter().zip(ideal_split(m.global_batch, &speeds)) {
        sum += standalone(cl, st, m, n, b).await?;
    }
    Ok(sum)
}

/// The concurrent ideal: every rank of `nodes` alone at its ideal-split
/// batch, all at the same time for twice a standalone run's steps; Σ of
/// their rates while all of them step.
pub async fn concurrent(
    cl: &BenchCluster,
    st: &mut State,
    m: &ModelRun,
    nodes: &[BenchNode],
    round: u32,
) -> Result<f64> {
    let speeds: Vec<f64> = nodes.iter().map(|n| n.speed).collect();
    let split = ideal_split(m.global_batch, &speeds);
    // Twice a standalone run: the rate counts only while every rank steps,
    // and the pods start seconds apart, so the window of a standalone
    // run's length is short enough for one hiccup to swing the sum.
    let steps = m.standalone_steps.saturating_mul(2);
    let mut jobs = Vec::new();
    for (n, b) in nodes.iter().zip(&split) {
        let name = format!(
            "together-{}-{}-{}-r{round}",
            short(&m.model),
            n.name,
            (n.speed * 100.0).round() as u32
        );
        jobs.push(solo_job(cl, m, &name, (n, *b, steps))?);
    }
    let runs = at_speeds(cl, st, nodes, async {
        cl.run_together(jobs, Duration::from_secs(900)).await
    })
    .await?;
    let steps: Vec<Vec<ClusterStep>> = runs.iter().map(|r| cluster_steps(&r.ranks)).collect();
    let rates = overlap_rates(&steps);
    for ((n, b), rate) in nodes.iter().zip(&split).zip(&rates) {
        st.results.standalone.push(Standalone {
            model: m.model.clone(),
            node: n.name.clone(),
            speed: n.speed,
            batch: *b,
            samples_per_second: *rate,
            together: true,
            round,
            best_subset: false,
        });
    }
    let sum: f64 = rates.iter().sum();
    let each: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
    say(&format!(
        "    together (round {}): {} at speeds {speeds:?}: {} = {sum:.0} samples/s",
        round + 1,
        m.model,
        each.join(" + ")
    ));
    Ok(sum)
}
