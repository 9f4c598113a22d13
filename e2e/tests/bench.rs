//! `heterotrain-bench` end to end, shortened: the throttle scenario under
//! `dynamic` with simple_cnn on the digits, on the real control plane,
//! operator, trainers and c10d. Checks that every output is written and holds what the run
//! measured (the throughput numbers are the benchmark's, not asserted; the
//! held-out accuracy must show the model learnt the real data).

use std::process::Command;

use heterotrain_e2e::bench::Results;

#[test]
fn throttle_scenario_writes_results_and_plots() {
    let out = std::env::temp_dir().join(format!("ht-bench-test-{}", std::process::id()));
    let run = Command::new(env!("CARGO_BIN_EXE_heterotrain-bench"))
        .args([
            "--quick",
            "--models",
            "simple_cnn",
            "--scenarios",
            "throttle",
            "--policies",
            "dynamic",
            "--no-scale",
            "--no-ddp",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("run heterotrain-bench");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "bench failed:\n{stdout}\n{stderr}");
    let r: Results =
        serde_json::from_slice(&std::fs::read(out.join("results.json")).expect("results.json"))
            .expect("results.json parses");
    assert!(r.notes.is_empty(), "a run failed: {:?}\n{stderr}", r.notes);
    assert_eq!(r.runs.len(), 1, "{stdout}");
    let x = &r.runs[0];
    assert_eq!(
        (x.scenario.as_str(), x.policy.as_str()),
        ("throttle", "dynamic")
    );
    assert_eq!(
        x.nodes,
        vec!["two-fast", "two-slow"],
        "ranks pinned to the scenario's nodes"
    );
    // 120 quick steps × 1.5 for the throttle scenario, every one on both ranks.
    assert_eq!(x.summary.steps, 180);
    assert_eq!(x.series.t.len(), 180);
    assert!(x.series.batches.iter().all(|b| b.len() == 180));
    // Every plan kept the global batch.
    for i in 0..180 {
        let sum: u32 = x.series.batches.iter().map(|b| b[i]).sum();
        assert_eq!(sum, 128, "step {i}");
    }
    assert!(x.summary.samples_per_second > 0.0 && x.ideal > 0.0);
    // Real data (the digits from `make setup`), so the held-out accuracy is
    // far above the 10% of chance.
    let acc = x.summary.final_accuracy.expect("held-out accuracy");
    assert!(acc >= 0.9, "held-out accuracy {acc} on the digits");
    // The node was slowed and restored mid-run, and the phases measured.
    let (a, b) = x.throttle_window.expect("throttle window");
    assert!(0.0 < a && a < b, "{a} {b}");
    let rc = x.recovery.as_ref().expect("recovery");
    assert!(rc.throttled_samples_per_second > 0.0 && rc.throttled_ideal > 0.0);
    // Alone runs: both nodes at their speeds, plus the fast one throttled.
    let alone: Vec<(&str, f64)> = r
        .standalone
        .iter()
        .map(|s| (s.node.as_str(), s.speed))
        .collect();
    assert!(alone.contains(&("two-fast", 1.0)), "{alone:?}");
    assert!(alone.contains(&("two-fast", 0.4)), "{alone:?}");
    assert!(alone.contains(&("two-slow", 0.33)), "{alone:?}");
    assert!(r.standalone.iter().all(|s| s.samples_per_second > 0.0));
    // The concurrent ideal: both ranks together, at both phases' speeds.
    let together: Vec<(&str, f64)> = r
        .standalone
        .iter()
        .filter(|s| s.together)
        .map(|s| (s.node.as_str(), s.speed))
        .collect();
    assert!(together.contains(&("two-fast", 0.4)), "{together:?}");
    assert!(together.contains(&("two-slow", 0.33)), "{together:?}");
    assert!(x.ideal_concurrent.is_some_and(|i| i > 0.0));
    assert!(x.efficiency_concurrent.is_some());
    // One round (--quick), its paired ratios, and the per-rank time split.
    assert_eq!(r.paired.len(), 1);
    assert_eq!(r.paired[0].rounds, 1);
    assert!(x.series.allreduce_seconds.iter().all(|a| a.len() == 180));
    assert!(x.series.optimizer_seconds.iter().all(|a| a.len() == 180));
    assert_eq!(x.optimizer_elements.len(), 2);
    let md = std::fs::read_to_string(out.join("results.md")).expect("results.md");
    assert!(
        md.contains("| simple_cnn | throttle | dynamic | 1 |"),
        "{md}"
    );
    assert!(md.contains("exposed comm"), "{md}");
    let csv = std::fs::read_to_string(out.join("results.csv")).expect("results.csv");
    assert_eq!(csv.lines().count(), 2);
    for png in [
        "throughput-simple_cnn.png",
        "recovery-simple_cnn.png",
        "batches-simple_cnn-throttle.png",
        "time-split-simple_cnn-throttle.png",
    ] {
        let bytes = std::fs::read(out.join(png)).unwrap_or_default();
        assert!(bytes.len() > 1000 && &bytes[1..4] == b"PNG", "{png}");
    }
    let _ = std::fs::remove_dir_all(&out);
}
