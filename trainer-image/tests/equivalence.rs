//! Exact maths: 3 ranks with unequal local batches (real processes, real
//! c10d on loopback) end with the same parameters as 1 process with the
//! whole global batch — also when the plan changes mid-run.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

/// Hyper-parameters where training is well conditioned (an unstable run
/// would amplify float rounding, not test the maths).
fn base(model: &str, out: &Path) -> Vec<String> {
    let mut a = args(&[
        "--model",
        model,
        "--dataset",
        "synthetic_image",
        "--synthetic-samples",
        "1024",
        "--hidden",
        "64",
        "--batch-size",
        "32",
        "--max-steps",
        "20",
        "--epochs",
        "100",
        "--lr",
        if model == "mlp" { "0.005" } else { "0.05" },
        "--momentum",
        "0.9",
        "--weight-decay",
        "0.0001",
        "--seed",
        "11",
        "--threads",
        "1",
    ]);
    a.extend(path_arg("--output-dir", out));
    a
}

fn single(model: &str, dir: &Path) -> std::collections::HashMap<String, tch::Tensor> {
    let out = dir.join("single");
    run_ok(1, &base(model, &out));
    load_weights(&out.join("model.safetensors"))
}

fn check_split(model: &str) {
    let dir = tempfile::tempdir().unwrap();
    let want = single(model, dir.path());
    let out = dir.path().join("multi");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[20, 9, 3]);
    let mut a = base(model, &out);
    a.extend(path_arg("--plan-file", &plan));
    run_ok(3, &a);
    let got = load_weights(&out.join("model.safetensors"));
    let d = max_abs_diff(&want, &got);
    assert!(d <= 1e-5, "{model}: max |Δparam| = {d:e}");
    // The split really was unequal, and every rank trained 20 steps.
    for (r, b) in [(0, 20), (1, 9), (2, 3)] {
        let s = steps(&log_records(&out, r))
            .iter()
            .map(|x| x["batch_size"].as_u64().unwrap())
            .collect::<Vec<_>>();
        assert_eq!(s, vec![b; 20], "rank {r} batch sizes");
    }
    // Sanity: training moved the weights.
    let init = {
        let o = dir.path().join("init");
        let mut a = base(model, &o);
        set_flag(&mut a, "--max-steps", "1");
        set_flag(&mut a, "--lr", "0.000001");
        run_ok(1, &a);
        load_weights(&o.join("model.safetensors"))
    };
    assert!(max_abs_diff(&init, &want) > 1e-3);
}

#[test]
fn equivalence_mlp_20_9_3_matches_single_process() {
    check_split("mlp");
}

#[test]
fn equivalence_simple_cnn_20_9_3_matches_single_process() {
    check_split("simple_cnn");
}

#[test]
fn equivalence_with_plan_change_mid_run() {
    for model in ["mlp", "simple_cnn"] {
        let dir = tempfile::tempdir().unwrap();
        let want = single(model, dir.path());
        let out = dir.path().join("multi");
        let plan = dir.path().join("plan.json");
        write_plan(&plan, 0, &[16, 8, 8]);
        let mut a = base(model, &out);
        a.extend(path_arg("--plan-file", &plan));
        a.extend(args(&["--step-sleep-ms", "150"]));
        let children = spawn_ranks(3, &a);
        assert!(
            wait_until(Duration::from_secs(60), || last_step(&out, 0) >= 9),
            "rank 0 never reached step 9"
        );
        write_plan(&plan, 1, &[28, 3, 1]);
        let outs = wait_all(children, Duration::from_secs(120));
        for (r, o) in outs.iter().enumerate() {
            assert!(
                o.status.success(),
                "rank {r}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let got = load_weights(&out.join("model.safetensors"));
        let d = max_abs_diff(&want, &got);
        assert!(d <= 1e-5, "{model}: max |Δparam| = {d:e}");
        // All ranks switched at the same step, from (16,8,8) to (28,3,1).
        let logs: Vec<Vec<(u64, u64, u64)>> = (0..3)
            .map(|r| {
                steps(&log_records(&out, r))
                    .iter()
                    .map(|s| {
                        (
                            s["step"].as_u64().unwrap(),
                            s["generation"].as_u64().unwrap(),
                            s["batch_size"].as_u64().unwrap(),
                        )
                    })
                    .collect()
            })
            .collect();
        let switch: Vec<u64> = logs
            .iter()
            .map(|l| l.iter().find(|x| x.1 == 1).expect("switched").0)
            .collect();
        assert!(
            switch.iter().all(|&s| s == switch[0]),
            "switch steps {switch:?}"
        );
        assert!(
            (10..=14).contains(&switch[0]),
            "switched at step {}",
            switch[0]
        );
        for (r, (before, after)) in [(16, 28), (8, 3), (8, 1)].into_iter().enumerate() {
            for &(step, gen, b) in &logs[r] {
                assert_eq!(
                    b,
                    if gen == 0 { before } else { after },
                    "rank {r} step {step}"
                );
            }
            assert_eq!(logs[r].len(), 20);
        }
    }
}
