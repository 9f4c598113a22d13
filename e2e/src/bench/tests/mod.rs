use super::*;
use crate::bench::analysis::RunSummary;

#[test]
fn ideal_split_is_proportional_and_sums_to_the_global_batch() {
    assert_eq!(ideal_split(128, &[1.0, 0.33]), vec![96, 32]);
    let b = ideal_split(128, &[1.0, 0.7, 0.4, 0.25]);
    assert_eq!(b.iter().sum::<u32>(), 128);
    assert!(b.windows(2).all(|w| w[0] >= w[1]), "{b:?}");
    assert_eq!(ideal_split(64, &[1.0, 1.0]), vec![32, 32]);
    assert_eq!(ideal_split(3, &[1.0, 0.001, 0.001]), vec![1, 1, 1]);
}

#[test]
fn scenarios_use_distinct_nodes_except_the_throttle_reuse() {
    let sc = scenarios();
    assert_eq!(sc.len(), 5);
    let t = sc.iter().find(|s| s.throttle.is_some()).unwrap();
    let two = sc.iter().find(|s| s.name == "two-node").unwrap();
    assert_eq!(t.nodes, two.nodes);
    let mut all: Vec<&str> = sc
        .iter()
        .filter(|s| s.throttle.is_none())
        .flat_map(|s| s.nodes.iter().map(|n| n.name.as_str()))
        .collect();
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n);
}

/// A two-rank run for the report's unit tests.
pub(crate) fn test_run(
    scenario: &str,
    policy: &str,
    rate: f64,
    ideal: f64,
    vs: Option<f64>,
) -> RunResult {
    RunResult {
        model: "simple_cnn".into(),
        scenario: scenario.into(),
        policy: policy.into(),
        nodes: vec!["a".into(), "b".into()],
        speeds: vec![1.0, 0.33],
        global_batch: 128,
        round: 0,
        summary: RunSummary {
            samples_per_second: rate,
            final_plan: vec![96, 32],
            ..Default::default()
        },
        ideal,
        efficiency: rate / ideal,
        ideal_concurrent: None,
        ideal_concurrent_bracket: None,
        efficiency_concurrent: None,
        speedup_vs_static: vs,
        best_subset: None,
        optimizer_elements: vec![],
        recovery: None,
        throttle_window: None,
        propagation_seconds: vec![],
        plans: vec![],
        wall_seconds: 1.0,
        series: Series::default(),
    }
}

#[test]
fn nodes_get_cpus_of_their_own_where_there_are_enough() {
    use super::spec::{node_cpus, nodes_file, NodeCpus};
    let sc = scenarios();
    let two = node_cpus(&sc, &[0, 1], NodeCpus::Own);
    assert_eq!(two["two-fast"], vec![0]);
    assert_eq!(two["two-slow"], vec![1]);
    assert_eq!(two["crawl-slow"], vec![1]);
    // 4 nodes on 2 CPUs share both.
    assert!(!two.contains_key("four-a"), "{two:?}");
    // Spread: one CPU each, the speeds spread (1.0 + 0.25 against 0.7 + 0.4).
    let spread = node_cpus(&sc, &[0, 1], NodeCpus::Spread);
    assert_eq!(spread["two-slow"], vec![1]);
    assert_eq!(spread["four-a"], vec![0]);
    assert_eq!(spread["four-b"], vec![1]);
    assert_eq!(spread["four-c"], vec![1]);
    assert_eq!(spread["four-d"], vec![0]);
    assert!(node_cpus(&sc, &[0, 1], NodeCpus::Shared).is_empty());
    let wide = node_cpus(&sc, &(0..16).collect::<Vec<_>>(), NodeCpus::Own);
    assert_eq!(wide["two-fast"], (0..8).collect::<Vec<_>>());
    assert_eq!(wide["two-slow"], (8..16).collect::<Vec<_>>());
    assert_eq!(wide["four-d"], vec![12, 13, 14, 15]);
    let file = nodes_file(&sc[0].nodes, &two);
    let fast = file.nodes.iter().find(|n| n.name == "two-fast").unwrap();
    assert_eq!(fast.cpus, vec![0]);
    let one = node_cpus(&sc, &[3], NodeCpus::Spread);
    assert!(one.values().all(|c| c == &vec![3]), "{one:?}");
    assert!(node_cpus(&sc, &[], NodeCpus::Spread).is_empty());
}

#[test]
fn the_uncapped_variant_is_dynamic_without_the_quota_cap() {
    use super::spec::{job, JobParams};
    let m = model_runs(1.0)
        .into_iter()
        .find(|m| m.model == "simple_cnn")
        .expect("simple_cnn");
    let nodes = scenarios()
        .into_iter()
        .find(|s| s.name == "two-node")
        .expect("two-node")
        .nodes;
    let spec_of = |policy: &str| {
        let j = job(&JobParams {
            name: "j",
            model: &m,
            nodes: &nodes,
            policy,
            global_batch: 128,
            steps: 10,
            core_unit: 0.6,
            profiling: false,
            optimizer_sharding: heterotrain_crds::OptimizerSharding::default(),
        })
        .expect("a job");
        let lb = j.spec.load_balancing;
        (lb.policy.as_str().to_string(), lb.cap_quota_bound_ranks)
    };
    assert_eq!(spec_of("dynamic"), ("dynamic".to_string(), true));
    assert_eq!(spec_of("dynamic-uncapped"), ("dynamic".to_string(), false));
    assert_eq!(spec_of("hybrid"), ("hybrid".to_string(), true));
}
