use super::*;
use crate::bench::split::step_split;
use crate::bench::{Recovery, ScalePoint, Series};

use crate::bench::tests::test_run as run;

#[test]
fn step_split_separates_compute_from_the_rest() {
    let mut x = run("two-node", "dynamic", 1280.0, 1500.0, Some(2.0));
    // 4 steps; the steady half is the last 2: slowest ranks 40 and 60 ms.
    x.series = Series {
        t: vec![0.1, 0.2, 0.3, 0.4],
        batches: vec![vec![64; 4], vec![64; 4]],
        compute_seconds: vec![vec![0.09, 0.09, 0.04, 0.01], vec![0.01, 0.01, 0.02, 0.06]],
        rolling_rate: vec![0.0; 4],
        ..Default::default()
    };
    let (step, compute) = step_split(&x).unwrap();
    assert!((step - 100.0).abs() < 1e-9, "128 / 1280 samples/s = 100 ms");
    assert!((compute - 50.0).abs() < 1e-9, "{compute}");
    x.recovery = Some(Recovery::default());
    assert_eq!(step_split(&x), None);
}

#[test]
fn targets_follow_the_measurements() {
    let mut r = Results::default();
    r.runs
        .push(run("two-node", "dynamic", 960.0, 1000.0, Some(1.9)));
    r.runs
        .push(run("homogeneous", "static", 1000.0, 1100.0, None));
    r.runs
        .push(run("homogeneous", "dynamic", 970.0, 1100.0, Some(0.97)));
    let mut t = run("throttle", "dynamic", 800.0, 900.0, Some(1.5));
    t.recovery = Some(Recovery {
        throttled_samples_per_second: 500.0,
        throttled_ideal: 600.0,
        seconds_to_ideal_95: None,
        ..Default::default()
    });
    r.runs.push(t);
    r.scale.push(ScalePoint {
        jobs: 500,
        pods: 4000,
        reconciles: 10,
        reconcile_p50_seconds: Some(0.01),
        reconcile_p99_seconds: Some(0.2),
        burst_reconciles: 10,
        burst_p50_seconds: None,
        burst_p99_seconds: Some(3.0),
        rss_mib: Some(151.0),
        burst_stage_p99_seconds: [("apply".to_string(), 2.5)].into_iter().collect(),
        burst_api_p99_seconds: [("APPLY roles".to_string(), (300, 0.9))]
            .into_iter()
            .collect(),
        seconds_to_running: 1.0,
    });
    let c = check_targets(&r, 2.0);
    let met: Vec<Option<bool>> = c.iter().map(|t| t.met).collect();
    // two-node met; throttle never reached → missed; homogeneous 0.97 → missed;
    // scale: RSS over 150 MiB → missed.
    assert_eq!(met, vec![Some(true), Some(false), Some(false), Some(false)]);
    assert!(c[1].measured.starts_with("never"), "{}", c[1].measured);
    r.runs[0].speedup_vs_static = Some(1.7);
    assert_eq!(check_targets(&r, 2.0)[0].met, Some(false));
    r.targets = c;
    r.runs[0].ideal_concurrent = Some(1200.0);
    r.runs[0].efficiency_concurrent = Some(0.8);
    r.runs[0].ideal_concurrent_bracket = Some((1100.0, 1300.0));
    r.paired.push(crate::bench::split::paired(
        &r.runs,
        "simple_cnn",
        "homogeneous",
    ));
    let md = markdown(&r);
    assert!(
        md.contains(
            "| simple_cnn | two-node | dynamic | 1 | 960 | 1000 | 1200 (1100, 1300) | 0.96 | 0.80 | 1.70 |"
        ),
        "{md}"
    );
    assert!(
        md.contains("| simple_cnn | homogeneous | 1 | 0.97 (n=1) | - | - |"),
        "{md}"
    );
    assert!(md.contains("**missed**"));
    // No dynamic-uncapped runs: no section for them.
    assert!(!md.contains("The quota cap"), "{md}");
    let mut dy = run("two-node", "dynamic", 1000.0, 1100.0, None);
    dy.efficiency_concurrent = Some(0.8);
    let mut un = run("two-node", "dynamic-uncapped", 900.0, 1100.0, None);
    un.efficiency_concurrent = Some(0.72);
    let p = crate::bench::split::paired(&[dy, un], "simple_cnn", "two-node");
    let mut ab = r.clone();
    ab.paired = vec![p];
    let md_ab = markdown(&ab);
    assert!(
        md_ab.contains("| simple_cnn | two-node | 0.90 (n=1) | 0.72 (n=1) | 0.80 (n=1) |"),
        "{md_ab}"
    );
    // No run with plans: no section.
    assert!(!md.contains("## Plans written"), "{md}");
    r.runs[0].plans.push(crate::bench::PlanChange {
        generation: 3,
        batches: vec![100, 28],
        reason: "dynamic: predicted step 0.0600s | a note".into(),
        predicted_gain_percent: 12.0,
        predicted_step_seconds: Some(0.06),
    });
    let md = markdown(&r);
    assert!(
        md.contains(
            "| simple_cnn | two-node | dynamic | 1 | 3 | [100, 28] | 60.0 | dynamic: predicted step 0.0600s / a note |"
        ),
        "{md}"
    );
    assert!(
        md.contains("p99 per reconcile stage: apply 2500 ms; the API server's slowest p99s: APPLY roles 900 ms (300 requests)."),
        "{md}"
    );
    let csv = csv(&r);
    assert_eq!(csv.lines().count(), 5);
    assert!(csv.lines().nth(1).unwrap().contains(",96 32,"));
}

#[test]
fn the_slow_node_scenario_is_held_to_its_best_subset() {
    let mut r = Results::default();
    let mut d = run("slow-node", "dynamic", 950.0, 1100.0, None);
    d.best_subset = Some(1000.0);
    d.summary.final_plan = vec![128, 0];
    r.runs.push(d);
    let c = check_targets(&r, 2.0);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0].met, Some(false), "0.95 × the best subset");
    assert!(
        c[0].measured.starts_with("0.95 (n=1) ×"),
        "{}",
        c[0].measured
    );
    assert!(
        run_line(&r.runs[0]).contains("0.95 × the best subset (1000)"),
        "{}",
        run_line(&r.runs[0])
    );
    r.runs[0].summary.samples_per_second = 1010.0;
    assert_eq!(check_targets(&r, 2.0)[0].met, Some(true));
    // Over rounds, each run is held to its own round's subset and the
    // median decides: 1.01, 0.90, 0.95 → 0.95, missed.
    for (round, (rate, best)) in [(900.0, 1000.0), (1140.0, 1200.0)].into_iter().enumerate() {
        let mut d = run("slow-node", "dynamic", rate, 1100.0, None);
        d.round = round as u32 + 1;
        d.best_subset = Some(best);
        r.runs.push(d);
    }
    let c = check_targets(&r, 2.0);
    assert_eq!(c[0].met, Some(false), "{c:?}");
    assert!(
        c[0].measured.starts_with("0.95 (0.90–1.01, n=3) ×"),
        "{}",
        c[0].measured
    );
    // The paired table shows the same spread.
    let p = crate::bench::split::paired(&r.runs, "simple_cnn", "slow-node");
    let s = p.dynamic_vs_best_subset.expect("paired spread");
    assert_eq!((s.n, format!("{:.2}", s.median)), (3, "0.95".to_string()));
    r.runs.truncate(1);
    // Without the subset's measurement there is nothing to hold it to.
    r.runs[0].best_subset = None;
    assert!(check_targets(&r, 2.0).is_empty());
}
