//! Synchronised BatchNorm is exact under unequal batches: a narrow ResNet-18
//! trained by 3 ranks (20, 9, 3), re-split mid-run to (28, 3, 1) and across
//! an epoch boundary, then to (31, 0, 1) (rank 1 left out: the statistics
//! are reduced over the other two), ends with the same parameters *and
//! running statistics* as one process with B = 32 — with one rank at a
//! local batch of 1 and no NaN anywhere; so does a step of a narrow
//! ResNet-50 (Bottleneck blocks) split (9, 6, 1), up to the subgradient a
//! float tie picks. Per-rank (`local`) BatchNorm refuses local batches below 2.
//! Real processes, real c10d on loopback.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use common::*;

fn base(out: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = args(&[
        "--model",
        "resnet18",
        "--resnet-width",
        "8",
        "--dataset",
        "synthetic_image",
        // 320 samples / B 32 = 10 steps per epoch: 20 steps cross a boundary.
        "--synthetic-samples",
        "352",
        "--eval-fraction",
        "0.09",
        "--batch-size",
        "32",
        "--max-steps",
        "20",
        "--epochs",
        "100",
        // Well conditioned: at larger rates this small ResNet's training is
        // chaotic (two thread counts of one process drift apart), which
        // would test float rounding, not the maths.
        "--lr",
        "0.002",
        "--momentum",
        "0.9",
        "--weight-decay",
        "0.0001",
        "--seed",
        "5",
        "--threads",
        "1",
        "--no-profile",
    ]);
    for pair in extra.chunks(2) {
        match pair {
            [flag, value] if a.iter().any(|x| x == flag) => set_flag(&mut a, flag, value),
            _ => a.extend(args(pair)),
        }
    }
    a.extend(path_arg("--output-dir", out));
    a
}

fn assert_finite(w: &HashMap<String, tch::Tensor>, what: &str) {
    for (n, t) in w {
        let bad = t.isnan().logical_or(&t.isinf()).any().int64_value(&[]);
        assert_eq!(bad, 0, "{what}: {n} has NaN/inf");
    }
}

fn max_diff_of(
    a: &HashMap<String, tch::Tensor>,
    b: &HashMap<String, tch::Tensor>,
    pick: impl Fn(&str) -> bool,
) -> (f64, String) {
    a.iter()
        .filter(|(n, _)| pick(n))
        .map(|(n, t)| ((t - &b[n]).abs().max().double_value(&[]), n.clone()))
        .fold((0.0, String::new()), |m, x| if x.0 > m.0 { x } else { m })
}

#[test]
fn sync_batch_norm_resnet18_20_9_3_resplit_matches_single_process() {
    let dir = tempfile::tempdir().unwrap();
    let single = dir.path().join("single");
    let outs = run_ok(1, &base(&single, &[]));
    let want = load_weights(&single.join("model.safetensors"));
    assert_finite(&want, "single process");
    // The run crossed an epoch boundary.
    let recs = log_records(&single, 0);
    let epochs: Vec<u64> = steps(&recs)
        .iter()
        .map(|s| s["epoch"].as_u64().unwrap())
        .collect();
    assert!(epochs.contains(&0) && epochs.contains(&1), "{epochs:?}");
    drop(outs);

    let multi = dir.path().join("multi");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[20, 9, 3]);
    let mut a = base(&multi, &["--step-sleep-ms", "150"]);
    a.extend(path_arg("--plan-file", &plan));
    let children = spawn_ranks(3, &a);
    // Each plan lands 2 or 3 steps after the step rank 0 last logged when
    // it was written (a step takes over 150 ms: a control word at every
    // step). Generation 1 is written early, to be in force before the
    // epoch boundary (after step 10); generation 2 as soon as rank 0 has
    // evaluated there, which leaves it 8 steps (over 1.2 s for this thread
    // to get the CPU) to land before the end.
    assert!(
        wait_until(Duration::from_secs(120), || last_step(&multi, 0) >= 3),
        "rank 0 never reached step 3"
    );
    write_plan(&plan, 1, &[28, 3, 1]);
    let evaluated = || {
        std::fs::read_to_string(multi.join("rank-0.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|r| r["event"] == "eval")
    };
    assert!(
        wait_until(Duration::from_secs(120), evaluated),
        "rank 0 never evaluated at the end of epoch 0"
    );
    write_plan(&plan, 2, &[31, 0, 1]);
    let outs = wait_all(children, Duration::from_secs(240));
    assert_all_ok(&outs);
    let got = load_weights(&multi.join("model.safetensors"));
    assert_finite(&got, "3 ranks");
    let (dp, np) = max_diff_of(&want, &got, |n| {
        !n.ends_with("running_mean") && !n.ends_with("running_var")
    });
    let (ds, ns) = max_diff_of(&want, &got, |n| {
        n.ends_with("running_mean") || n.ends_with("running_var")
    });
    assert!(!ns.is_empty(), "the model has running statistics");
    assert!(dp <= 1e-4, "max |Δparam| = {dp:e} at {np}");
    assert!(ds <= 1e-4, "max |Δrunning stat| = {ds:e} at {ns}");
    // The split was unequal, changed mid-run, and rank 2 trained on 1 sample.
    let b2: Vec<u64> = steps(&log_records(&multi, 2))
        .iter()
        .map(|s| s["batch_size"].as_u64().unwrap())
        .collect();
    assert_eq!(b2.len(), 20);
    assert_eq!(b2[0], 3);
    assert_eq!(*b2.last().unwrap(), 1, "rank 2 batches {b2:?}");
    let b1: Vec<u64> = steps(&log_records(&multi, 1))
        .iter()
        .map(|s| s["batch_size"].as_u64().unwrap())
        .collect();
    assert_eq!(*b1.last().unwrap(), 0, "rank 1 was never left out: {b1:?}");
    for r in 0..3 {
        for s in steps(&log_records(&multi, r)) {
            assert!(s["global_loss"].as_f64().is_some_and(f64::is_finite));
        }
    }
    // Sanity: training moved the running statistics away from (0, 1).
    let rv = &want["layer4.1.bn2.running_var"];
    assert!((rv - 1.0).abs().max().double_value(&[]) > 1e-3);
}

#[test]
fn sync_batch_norm_resnet50_9_6_1_matches_single_process_up_to_ties() {
    // ResNet-50's Bottleneck blocks (1×1, 3×3, 1×1 convolutions, each with
    // BatchNorm, and a projected shortcut with its own), narrow, one step
    // of B = 16 split [9, 6, 1], one rank at a single sample. Forward
    // quantities — the loss and every running statistic — are those of
    // one process. The update is too, up to a tie: this net's gradients
    // grow ~80× from the head to the stem at initialisation, and where a
    // ReLU input or two max-pool inputs lie within float rounding of each
    // other, the split's rounding picks the other subgradient. Measured
    // on two-rank splits of B = 16: every split gave one of two results,
    // each within 4e-6 of the others of its kind; the two differ by 0.44%
    // of the largest update, conv1's (3.1e-4 of 0.071). So parameters must
    // match within 1% of the largest update, and the loss and statistics
    // within 1e-5.
    let dir = tempfile::tempdir().unwrap();
    let extra = |lr: &'static str| {
        [
            "--model",
            "resnet50",
            "--batch-size",
            "16",
            "--max-steps",
            "1",
            "--lr",
            lr,
        ]
    };
    // The initial weights: one step at a rate too small to move them.
    let init = dir.path().join("init");
    run_ok(1, &base(&init, &extra("1e-30")));
    let init = load_weights(&init.join("model.safetensors"));
    let single = dir.path().join("single");
    run_ok(1, &base(&single, &extra("0.002")));
    let want = load_weights(&single.join("model.safetensors"));
    assert_finite(&want, "single process");
    assert!(
        want.contains_key("layer1.0.bn3.running_var")
            && want.contains_key("layer1.0.downsample.1.running_var"),
        "a Bottleneck ResNet"
    );
    let multi = dir.path().join("multi");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[9, 6, 1]);
    let mut a = base(&multi, &extra("0.002"));
    a.extend(path_arg("--plan-file", &plan));
    let outs = wait_all(spawn_ranks(3, &a), Duration::from_secs(240));
    assert_all_ok(&outs);
    let got = load_weights(&multi.join("model.safetensors"));
    assert_finite(&got, "3 ranks");
    let loss = |d: &Path| {
        steps(&log_records(d, 0))[0]["global_loss"]
            .as_f64()
            .unwrap()
    };
    let (l1, l3) = (loss(&single), loss(&multi));
    assert!((l1 - l3).abs() <= 1e-5, "loss {l1} vs {l3}");
    let stat = |n: &str| n.ends_with("running_mean") || n.ends_with("running_var");
    let (ds, ns) = max_diff_of(&want, &got, stat);
    assert!(ds <= 1e-5, "max |Δrunning stat| = {ds:e} at {ns}");
    // The largest update any parameter took, and the largest difference.
    let params = |a: &HashMap<String, tch::Tensor>, b: &HashMap<String, tch::Tensor>| {
        max_diff_of(a, b, |n| !stat(n))
    };
    let (step, _) = params(&want, &init);
    let (off, at) = params(&want, &got);
    assert!(step > 0.0, "the step moved nothing");
    assert!(
        off <= 0.01 * step,
        "{at} differs by {off:e}, {:.2}% of the largest update ({step:e})",
        100.0 * off / step
    );
    let b2: Vec<u64> = steps(&log_records(&multi, 2))
        .iter()
        .map(|s| s["batch_size"].as_u64().unwrap())
        .collect();
    assert_eq!(b2, [1]);
}

#[test]
fn local_batch_norm_refuses_a_rank_with_one_sample() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[31, 1]);
    let mut a = base(&out, &["--batch-norm", "local", "--max-steps", "2"]);
    a.extend(path_arg("--plan-file", &plan));
    let outs = wait_all(spawn_ranks(2, &a), Duration::from_secs(120));
    let err = String::from_utf8_lossy(&outs[0].stderr);
    assert!(!outs[0].status.success(), "rank 0 must refuse: {err}");
    assert!(err.contains("minimum local batch 2"), "{err}");
    assert!(!out.join("model.safetensors").exists());
    // The same plan trains under synchronised BatchNorm.
    let out = dir.path().join("sync");
    let mut a = base(&out, &["--max-steps", "2"]);
    a.extend(path_arg("--plan-file", &plan));
    run_ok(2, &a);
    assert_finite(&load_weights(&out.join("model.safetensors")), "sync");
}

#[test]
fn local_batch_norm_averages_running_statistics_by_local_batch() {
    // After one step from the initial statistics (0, 1), the first layer's
    // running mean is 0.1 × the mean of its input. With per-rank statistics
    // averaged weighted by b_r / B, that is 0.1 × the global batch's mean:
    // the single process's value. Rank 0's own (24 of 32 samples) is not.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[24, 8]);
    let mut a = base(&out, &["--batch-norm", "local", "--max-steps", "1"]);
    a.extend(path_arg("--plan-file", &plan));
    run_ok(2, &a);
    let local = load_weights(&out.join("model.safetensors"));
    assert_finite(&local, "local");
    let single = dir.path().join("single");
    run_ok(1, &base(&single, &["--max-steps", "1"]));
    let want = load_weights(&single.join("model.safetensors"));
    let d = (&want["bn1.running_mean"] - &local["bn1.running_mean"])
        .abs()
        .max()
        .double_value(&[]);
    assert!(d <= 1e-6, "bn1.running_mean differs by {d:e}");
    // Deeper layers saw per-rank normalisation: not the global batch's.
    let (deep, _) = max_diff_of(&want, &local, |n| n.ends_with("bn2.running_var"));
    assert!(deep > 1e-6, "local BatchNorm unexpectedly equal to sync");
}
