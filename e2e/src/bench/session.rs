//! A bench session's training part: for each model and scenario the two
//! ideals, then every policy's run; the 2- and 4-node scenarios in interleaved
//! rounds (concurrent ideal, static, dynamic, …) so that paired ratios
//! compare runs made under the same load.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};

use super::analysis::{self, cluster_steps, summarise, ClusterStep};
use super::runner::{BenchCluster, ThrottlePlan};
use super::spec::{job, node_cpus, nodes_file, JobParams, NodeCpus};
use super::{ideal, report, split, BenchNode, ModelRun, Results, RunResult, Scenario, Series};

/// What to train, from the command line.
pub struct TrainingOptions {
    pub models: Vec<ModelRun>,
    pub scenarios: Vec<Scenario>,
    /// In the order they run; static first, the others are compared with it.
    pub policies: Vec<String>,
    /// Rounds of the 2- and 4-node scenarios (later rounds run static and dynamic).
    pub rounds: u32,
    pub core_unit: f64,
    /// The jobs' `training.optimizerSharding`.
    pub optimizer_sharding: heterotrain_crds::OptimizerSharding,
    pub rebalance_interval: f64,
    /// Which CPUs the nodes' pods run on ([`super::spec::node_cpus`]).
    pub node_cpus: NodeCpus,
    pub verbose: bool,
}

pub use super::state::{say, short, State};

/// The ideals of one round: sequential and concurrent, at the scenario's
/// speeds and (throttle scenario) with the node throttled.
#[derive(Clone, Copy, Debug, Default)]
struct Ideals {
    seq: f64,
    seq_throttled: Option<f64>,
    conc: f64,
    conc_throttled: Option<f64>,
    best_subset: Option<f64>,
}

/// The scenario's nodes with the throttled node at its throttled speed.
fn throttled_nodes(sc: &Scenario) -> Option<Vec<BenchNode>> {
    let t = sc.throttle.as_ref()?;
    let mut nodes = sc.nodes.clone();
    nodes[t.node].speed = t.speed;
    Some(nodes)
}

/// Policies of round `round`: all in the first, static and dynamic after;
/// never static in a scenario measured against its best subset. `dynamic`
/// and `dynamic-uncapped` swap places every other round (A B, B A, A B, …):
/// a run measured second in its round ran up to 9% faster than the first
/// at the same final plan, so a fixed order would favour one of them.
fn round_policies<'p>(policies: &'p [String], round: u32, sc: &Scenario) -> Vec<&'p str> {
    let with_static = sc.best_subset.is_empty();
    let mut out: Vec<&str> = policies
        .iter()
        .map(String::as_str)
        .filter(|p| round == 0 || matches!(*p, "static" | "dynamic" | "dynamic-uncapped"))
        .filter(|p| with_static || *p != "static")
        .collect();
    let at = |name: &str| out.iter().position(|p| *p == name);
    if let (true, Some(a), Some(b)) = (round % 2 == 1, at("dynamic"), at("dynamic-uncapped")) {
        out.swap(a, b);
    }
    out
}

/// Rounds of `sc`: interleaved for up to 4 nodes (the 2- and 4-node
/// scenarios, whose targets are judged on paired medians), one otherwise.
fn rounds_of(o: &TrainingOptions, sc: &Scenario) -> u32 {
    if sc.nodes.len() <= 4 {
        o.rounds.max(1)
    } else {
        1
    }
}

/// A whole run's ideal when its steps were split between phases: the same
/// work at each phase's ideal rate.
fn phase_mix(cs: &[ClusterStep], (t1, t2): (f64, f64), normal: f64, throttled: f64) -> f64 {
    let n_t = cs.iter().filter(|s| s.start >= t1 && s.end <= t2).count() as f64;
    let n_n = cs.len() as f64 - n_t;
    if normal > 0.0 && throttled > 0.0 {
        (n_n + n_t) / (n_n / normal + n_t / throttled)
    } else {
        normal
    }
}

fn series(cs: &[ClusterStep], ranks: usize) -> Series {
    let t0 = cs[0].start;
    let per_rank = |f: &dyn Fn(&ClusterStep, usize) -> f64| -> Vec<Vec<f64>> {
        (0..ranks)
            .map(|r| cs.iter().map(|s| f(s, r)).collect())
            .collect()
    };
    Series {
        t: cs.iter().map(|s| s.end - t0).collect(),
        step: cs.iter().map(|s| s.step).collect(),
        step_seconds: cs.iter().map(|s| s.seconds).collect(),
        batches: (0..ranks)
            .map(|r| cs.iter().map(|s| s.batches[r]).collect())
            .collect(),
        compute_seconds: per_rank(&|s, r| s.compute_seconds[r]),
        allreduce_seconds: per_rank(&|s, r| s.allreduce_seconds[r]),
        optimizer_seconds: per_rank(&|s, r| s.optimizer_seconds[r]),
        rolling_rate: analysis::rolling_rates(cs, analysis::ROLLING)
            .iter()
            .map(|r| r.unwrap_or(0.0))
            .collect(),
    }
}

async fn cluster_run(
    cl: &BenchCluster,
    st: &mut State,
    (m, sc): (&ModelRun, &Scenario),
    policy: &str,
    round: u32,
    ideals: Ideals,
) -> Result<RunResult> {
    let steps = if sc.throttle.is_some() {
        m.steps * 3 / 2
    } else {
        m.steps
    };
    let name = format!("{}-{}-{policy}-r{round}", short(&m.model), sc.name);
    let job = job(&JobParams {
        name: &name,
        model: m,
        nodes: &sc.nodes,
        policy,
        global_batch: m.global_batch,
        steps,
        core_unit: cl.core_unit,
        profiling: true,
        optimizer_sharding: cl.optimizer_sharding,
    })?;
    let throttle = sc.throttle.as_ref().map(|t| ThrottlePlan {
        node: sc.nodes[t.node].name.clone(),
        speed: t.speed,
        normal_speed: sc.nodes[t.node].speed,
        at_step: (steps as f64 * t.at).round() as u64,
        restore_step: (steps as f64 * t.restore).round() as u64,
    });
    st.done += 1;
    say(&format!(
        "==> [{}/{}] {} · {} · {policy} (round {}): {} steps of global batch {}",
        st.done,
        st.total,
        m.model,
        sc.title,
        round + 1,
        steps,
        m.global_batch
    ));
    let run = cl
        .run(job, throttle.as_ref(), Duration::from_secs(1200))
        .await?;
    let cs = cluster_steps(&run.ranks);
    if cs.is_empty() {
        bail!("{name}: no step ran on every rank");
    }
    let mut summary = summarise(&cs, &run.evals);
    let (mut ideal, mut conc) = (ideals.seq, ideals.conc);
    let (mut recovery, mut window) = (None, None);
    if let (Some((t1, t2)), Some(ti)) = (run.throttle_times, ideals.seq_throttled) {
        ideal = phase_mix(&cs, (t1, t2), ideal, ti);
        conc = phase_mix(&cs, (t1, t2), conc, ideals.conc_throttled.unwrap_or(0.0));
        summary.samples_per_second = analysis::rate_over(&cs);
        summary.samples_per_second_longest_rank = analysis::rate_over_longest_rank(&cs);
        recovery = Some(analysis::recovery(&cs, t1, t2, ti));
        window = Some((t1 - cs[0].start, t2 - cs[0].start));
    }
    let rate = summary.samples_per_second;
    let static_rate = st
        .results
        .runs
        .iter()
        .find(|r| {
            (&r.model, &r.scenario, r.policy.as_str(), r.round)
                == (&m.model, &sc.name, "static", round)
        })
        .map(|r| r.summary.samples_per_second)
        .or_else(|| (policy == "static").then_some(rate));
    let result = RunResult {
        model: m.model.clone(),
        scenario: sc.name.clone(),
        policy: policy.into(),
        nodes: run.nodes.clone(),
        speeds: sc.speeds(),
        global_batch: m.global_batch,
        round,
        efficiency: if ideal > 0.0 { rate / ideal } else { 0.0 },
        ideal_concurrent: (conc > 0.0).then_some(conc),
        ideal_concurrent_bracket: None,
        efficiency_concurrent: (conc > 0.0).then(|| rate / conc),
        speedup_vs_static: static_rate.filter(|s| *s > 0.0).map(|s| rate / s),
        best_subset: ideals.best_subset,
        optimizer_elements: cs
            .last()
            .map(|s| s.optimizer_elements.clone())
            .unwrap_or_default(),
        summary,
        ideal,
        recovery,
        throttle_window: window,
        propagation_seconds: super::propagation::propagation_latencies(
            &run.ranks,
            &run.plan_writes,
        ),
        plans: run.plans.clone(),
        wall_seconds: run.wall_seconds,
        series: series(&cs, run.ranks.len()),
    };
    say(&report::run_line(&result));
    Ok(result)
}

/// Train every model × scenario × policy; results go to `st` and, after
/// every run, to `out`.
pub async fn training(o: &TrainingOptions, st: &mut State, out: &Path) -> Result<()> {
    let all_nodes: Vec<BenchNode> = o.scenarios.iter().flat_map(|s| s.nodes.clone()).collect();
    for n in &all_nodes {
        st.base_speed.entry(n.name.clone()).or_insert(n.speed);
    }
    let mut data: Vec<&str> = o.models.iter().map(|m| m.dataset.as_str()).collect();
    data.sort_unstable();
    data.dedup();
    for m in &o.models {
        for sc in o.scenarios.iter().filter(|s| m.scenarios.contains(&s.name)) {
            st.total += (0..rounds_of(o, sc))
                .map(|k| round_policies(&o.policies, k, sc).len())
                .sum::<usize>();
        }
    }
    // The real data the jobs train on, from `make setup`'s cache.
    for d in &data {
        let dir = crate::datasets::dir(d)?;
        say(&format!("==> dataset {d}: {}", dir.display()));
    }
    let cpus = node_cpus(
        &o.scenarios,
        &crate::nodesim::config::usable_cpus(),
        o.node_cpus,
    );
    for (node, c) in &cpus {
        say(&format!("==> node {node}: runs on CPUs {c:?}"));
    }
    let nodes = nodes_file(&all_nodes, &cpus);
    say(&format!(
        "==> starting the local control plane with {} simulated nodes and the operator",
        nodes.nodes.len()
    ));
    let mut cl =
        BenchCluster::start(nodes, &data, o.core_unit, o.rebalance_interval, o.verbose).await?;
    cl.optimizer_sharding = o.optimizer_sharding;
    let outcome = async {
        for m in &o.models {
            for sc in o.scenarios.iter().filter(|s| m.scenarios.contains(&s.name)) {
                scenario(o, &cl, st, m, sc, out).await?;
            }
        }
        anyhow::Ok(())
    }
    .await;
    cl.system.stop().await;
    outcome
}

async fn scenario(
    o: &TrainingOptions,
    cl: &BenchCluster,
    st: &mut State,
    m: &ModelRun,
    sc: &Scenario,
    out: &Path,
) -> Result<()> {
    say(&format!(
        "==> {} · {}: each rank alone first",
        m.model, sc.title
    ));
    let throttled = throttled_nodes(sc);
    let mut ideals = Ideals {
        seq: ideal::sequential(cl, st, m, &sc.nodes).await?,
        ..Default::default()
    };
    if let Some(nodes) = &throttled {
        ideals.seq_throttled = Some(ideal::sequential(cl, st, m, nodes).await?);
    }
    let subset: Vec<BenchNode> = sc
        .best_subset
        .iter()
        .filter_map(|&i| sc.nodes.get(i).cloned())
        .collect();
    // The concurrent ideal measured before each round's runs; with one
    // more after the last round, each round's runs are held to the mean of
    // the measurements that bracket them (the machine's load drifts).
    let mut conc_before = Vec::new();
    let mut rounds_run = 0;
    for round in 0..rounds_of(o, sc) {
        let policies = round_policies(&o.policies, round, sc);
        if policies.is_empty() {
            break;
        }
        ideals.conc = ideal::concurrent(cl, st, m, &sc.nodes, round).await?;
        conc_before.push(ideals.conc);
        rounds_run = round + 1;
        if !subset.is_empty() {
            ideals.best_subset = Some(ideal::best_subset(cl, st, m, &subset, round).await?);
        }
        if let Some(nodes) = &throttled {
            ideals.conc_throttled = Some(ideal::concurrent(cl, st, m, nodes, round).await?);
        }
        for policy in policies {
            match cluster_run(cl, st, (m, sc), policy, round, ideals).await {
                Ok(r) => st.results.runs.push(r),
                Err(e) => {
                    let msg = format!("{} · {} · {policy} failed: {e:#}", m.model, sc.name);
                    eprintln!("    {msg}");
                    st.results
                        .notes
                        .push(msg.lines().next().unwrap_or("").to_string());
                }
            }
            report::write_all(out, &st.results)?;
        }
    }
    if throttled.is_none() && rounds_run > 0 {
        // A failed measurement after the last round leaves the runs held
        // to the ideal before them (noted), not the scenario without its
        // paired ratios.
        match ideal::concurrent(cl, st, m, &sc.nodes, rounds_run).await {
            Ok(after) => {
                conc_before.push(after);
                bracket_concurrent(&mut st.results.runs, (&m.model, &sc.name), &conc_before);
            }
            Err(e) => {
                let msg = format!(
                    "{} · {}: the concurrent ideal after the last round failed ({e:#}); the last round is held to the one before it",
                    m.model, sc.name
                );
                eprintln!("    {msg}");
                st.results
                    .notes
                    .push(msg.lines().next().unwrap_or("").to_string());
            }
        }
    }
    if let Some(note) = faster_together(&m.model, &sc.name, ideals.seq, &conc_before) {
        say(&format!("    caution: {note}"));
        st.results.cautions.push(note);
    }
    st.results
        .paired
        .retain(|p| (&p.model, &p.scenario) != (&m.model, &sc.name));
    st.results
        .paired
        .push(split::paired(&st.results.runs, &m.model, &sc.name));
    report::write_all(out, &st.results)
}

/// How far above the sequential ideal a concurrent one may come out before
/// the report says so.
const FASTER_TOGETHER: f64 = 1.10;

/// A caution when a concurrent ideal of `model` / `scenario` (`conc`, in
/// measurement order) came out more than [`FASTER_TOGETHER`] × the
/// sequential one (`seq`). On an unchanged machine the same ranks cannot
/// step faster sharing it than each with the machine to itself, so the two
/// measurements saw different machine states (a shared host's load moves),
/// and ratios against the one or the other differ by as much.
fn faster_together(model: &str, scenario: &str, seq: f64, conc: &[f64]) -> Option<String> {
    let over: Vec<String> = conc
        .iter()
        .enumerate()
        .filter(|(_, &c)| seq > 0.0 && c > FASTER_TOGETHER * seq)
        .map(|(i, c)| format!("{c:.0} (measurement {})", i + 1))
        .collect();
    (!over.is_empty()).then(|| {
        format!(
            "{model} · {scenario}: the concurrent ideal came out above the sequential one ({seq:.0}) by more than {:.0}%: {}. On an unchanged machine the ranks cannot step faster together than each alone, so the two saw different machine states; ratios against the one or the other differ by as much",
            (FASTER_TOGETHER - 1.0) * 100.0,
            over.join(", ")
        )
    })
}

/// Hold round k's runs of `model` and `scenario` to the mean of the
/// concurrent ideals measured just before (`conc[k]`) and just after
/// (`conc[k + 1]`) them; runs of a round without both measurements (or
/// with a failed one, 0) keep theirs.
fn bracket_concurrent(runs: &mut [RunResult], (model, scenario): (&str, &str), conc: &[f64]) {
    for r in runs
        .iter_mut()
        .filter(|r| (r.model.as_str(), r.scenario.as_str()) == (model, scenario))
    {
        let k = r.round as usize;
        let (Some(&before), Some(&after)) = (conc.get(k), conc.get(k + 1)) else {
            continue;
        };
        if !(before > 0.0 && after > 0.0) {
            continue;
        }
        let mean = (before + after) / 2.0;
        r.ideal_concurrent = Some(mean);
        r.ideal_concurrent_bracket = Some((before, after));
        r.efficiency_concurrent = Some(r.summary.samples_per_second / mean);
    }
}

/// Results with the run's start time, machine and settings.
pub fn new_results(settings: serde_json::Value) -> Results {
    let started = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let cg = crate::nodesim::cgroup::detect();
    Results {
        started,
        machine: format!("{cpus} CPUs, cgroup {cg:?}"),
        settings,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_rounds_interleave_static_and_dynamic_only() {
        let all: Vec<String> = ["static", "proportional", "dynamic", "hybrid"]
            .map(String::from)
            .to_vec();
        let scs = super::super::scenarios();
        let two = scs.iter().find(|s| s.name == "two-node").unwrap();
        assert_eq!(round_policies(&all, 0, two).len(), 4);
        assert_eq!(round_policies(&all, 2, two), vec!["static", "dynamic"]);
        let ab: Vec<String> = ["static", "dynamic", "dynamic-uncapped", "hybrid"]
            .map(String::from)
            .to_vec();
        // The cap's pair alternates which runs first.
        assert_eq!(
            round_policies(&ab, 1, two),
            vec!["static", "dynamic-uncapped", "dynamic"]
        );
        assert_eq!(
            round_policies(&ab, 2, two),
            vec!["static", "dynamic", "dynamic-uncapped"]
        );
        assert_eq!(
            round_policies(&ab, 0, two),
            vec!["static", "dynamic", "dynamic-uncapped", "hybrid"]
        );
        assert!(round_policies(&["hybrid".to_string()], 1, two).is_empty());
        // Against its best subset: no static.
        let slow = scs.iter().find(|s| s.name == "slow-node").unwrap();
        assert_eq!(
            round_policies(&all, 0, slow),
            vec!["proportional", "dynamic", "hybrid"]
        );
        assert_eq!(round_policies(&all, 1, slow), vec!["dynamic"]);
    }

    #[test]
    fn a_round_is_held_to_the_mean_of_the_ideals_around_it() {
        use crate::bench::tests::test_run;
        let mut runs = vec![
            test_run("four-node", "dynamic", 1000.0, 2000.0, None),
            test_run("four-node", "dynamic", 1500.0, 2000.0, None),
            test_run("four-node", "static", 600.0, 2000.0, None),
            test_run("two-node", "dynamic", 900.0, 2000.0, None),
        ];
        runs[1].round = 1;
        runs[2].round = 2;
        // Before round 1: 2000; between 1 and 2: 3000; before round 3: 2500,
        // and no measurement after it.
        bracket_concurrent(
            &mut runs,
            ("simple_cnn", "four-node"),
            &[2000.0, 3000.0, 2500.0],
        );
        assert_eq!(runs[0].ideal_concurrent, Some(2500.0));
        assert_eq!(runs[0].ideal_concurrent_bracket, Some((2000.0, 3000.0)));
        assert_eq!(runs[0].efficiency_concurrent, Some(0.4));
        assert_eq!(runs[1].ideal_concurrent, Some(2750.0));
        // Round 3 has no measurement after it: unchanged.
        assert_eq!(runs[2].ideal_concurrent, None);
        assert_eq!(runs[2].ideal_concurrent_bracket, None);
        // Another scenario: unchanged.
        assert_eq!(runs[3].ideal_concurrent, None);
        // A failed measurement (0) leaves the round's runs as they were.
        bracket_concurrent(&mut runs, ("simple_cnn", "two-node"), &[0.0, 3000.0]);
        assert_eq!(runs[3].efficiency_concurrent, None);
    }

    #[test]
    fn a_concurrent_ideal_above_the_sequential_one_is_noted() {
        // Within 10% of the sequential ideal: no note.
        assert_eq!(faster_together("m", "s", 2500.0, &[2400.0, 2740.0]), None);
        assert_eq!(faster_together("m", "s", 0.0, &[2400.0]), None);
        let note = faster_together("simple_cnn", "four-node", 2567.0, &[2301.0, 2988.0, 3557.0])
            .expect("a note");
        assert!(
            note.starts_with(
                "simple_cnn · four-node: the concurrent ideal came out above the sequential one (2567) by more than 10%: 2988 (measurement 2), 3557 (measurement 3)."
            ),
            "{note}"
        );
    }

    #[test]
    fn a_throttled_run_is_held_to_each_phase_s_ideal() {
        let step = |i: u64| ClusterStep {
            step: i,
            start: i as f64,
            end: i as f64 + 1.0,
            seconds: 1.0,
            longest_rank_seconds: 1.0,
            global_batch: 1,
            generation: 0,
            batches: vec![1],
            compute_seconds: vec![1.0],
            allreduce_seconds: vec![0.0],
            optimizer_seconds: vec![0.0],
            optimizer_elements: vec![1],
            loss: 0.0,
        };
        let cs: Vec<ClusterStep> = (0..4).map(step).collect();
        // Steps 1 and 2 throttled: 2 steps at 100/s and 2 at 50/s → 4 / 0.06.
        let mix = phase_mix(&cs, (1.0, 3.0), 100.0, 50.0);
        assert!((mix - 4.0 / 0.06).abs() < 1e-9, "{mix}");
        assert_eq!(phase_mix(&cs, (1.0, 3.0), 100.0, 0.0), 100.0);
    }
}
