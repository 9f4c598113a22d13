use super::*;
use crate::bench::tests::test_run;
use crate::bench::Series;

#[test]
fn spread_is_median_and_range() {
    assert_eq!(Spread::of(&[]), None);
    let s = Spread::of(&[1.2, f64::NAN, 0.9, 1.5]).unwrap();
    assert_eq!((s.median, s.min, s.max, s.n), (1.2, 0.9, 1.5, 3));
    let even = Spread::of(&[1.0, 2.0]).unwrap();
    assert!((even.median - 1.5).abs() < 1e-12);
    assert_eq!(Spread::show(&Some(s)), "1.20 (0.90–1.50, n=3)");
    assert_eq!(Spread::show(&None), "-");
}

#[test]
fn paired_ratios_pair_runs_of_the_same_round() {
    let mut runs = Vec::new();
    for (round, stat, dynamic, conc) in [(0, 100.0, 200.0, 250.0), (1, 50.0, 150.0, 200.0)] {
        for (policy, rate) in [("static", stat), ("dynamic", dynamic)] {
            let mut x = test_run("two-node", policy, rate, 300.0, None);
            x.round = round;
            x.ideal_concurrent = Some(conc);
            x.efficiency_concurrent = Some(rate / conc);
            runs.push(x);
        }
    }
    // Another scenario's run is not paired in.
    runs.push(test_run("homogeneous", "static", 1.0, 300.0, None));
    let p = paired(&runs, "simple_cnn", "two-node");
    assert_eq!(p.rounds, 2);
    let d = p.dynamic_vs_static.unwrap();
    // Round 0: 2.0, round 1: 3.0 (not 150 / 100 across rounds).
    assert_eq!((d.min, d.max, d.n), (2.0, 3.0, 2));
    let c = p.dynamic_vs_concurrent.unwrap();
    assert!((c.median - (0.8 + 0.75) / 2.0).abs() < 1e-12, "{c:?}");
    assert!((p.static_vs_concurrent.unwrap().max - 0.4).abs() < 1e-12);
}

#[test]
fn rank_time_split_over_the_steady_state() {
    let mut x = test_run("two-node", "dynamic", 1280.0, 1500.0, None);
    x.optimizer_elements = vec![60, 40];
    // 4 steps of 100 ms; the steady half is the last 2.
    x.series = Series {
        t: vec![0.1, 0.2, 0.3, 0.4],
        step: vec![1, 2, 3, 4],
        step_seconds: vec![0.1; 4],
        batches: vec![vec![64, 64, 96, 96], vec![64, 64, 32, 32]],
        compute_seconds: vec![vec![0.09, 0.09, 0.06, 0.06], vec![0.02, 0.02, 0.05, 0.05]],
        allreduce_seconds: vec![vec![0.0, 0.0, 0.03, 0.03], vec![0.0, 0.0, 0.02, 0.02]],
        optimizer_seconds: vec![vec![0.01; 4], vec![0.005; 4]],
        rolling_rate: vec![0.0; 4],
    };
    let s = rank_splits(&x);
    assert_eq!(s.len(), 2);
    let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
    assert_eq!((s[0].batch, s[1].batch), (96, 32));
    assert!(close(s[0].step_ms, 100.0));
    assert!(close(s[0].compute_ms, 50.0) && close(s[0].optimizer_ms, 10.0));
    assert!(close(s[0].comm_ms, 30.0) && close(s[0].other_ms, 10.0));
    assert!(close(s[1].compute_ms, 45.0) && close(s[1].comm_ms, 20.0));
    assert!(close(s[1].other_ms, 30.0), "{:?}", s[1]);
    assert_eq!(s[1].optimizer_elements, 40);
    // A run logged without the all-reduce times has no split.
    x.series.allreduce_seconds.clear();
    assert!(rank_splits(&x).is_empty());
}
