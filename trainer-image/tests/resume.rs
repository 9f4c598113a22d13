//! Checkpoints and resume: SIGKILL mid-run + `--resume auto` ends with the
//! same parameters as an uninterrupted run, skipping a truncated newest
//! checkpoint; checkpoints of a different run (other batch size or model)
//! are skipped and the run starts from step 0; a checkpoint whose weights
//! fail to load, or whose position is past the epoch, falls back to the
//! previous one; SIGTERM finishes the step,
//! checkpoints and exits 0; weights load in PyTorch under the model's names.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use sha2::{Digest, Sha256};

fn base(out: &Path, ckpt: &Path) -> Vec<String> {
    let mut a = args(&[
        "--model",
        "mlp",
        "--synthetic-samples",
        "512",
        "--hidden",
        "32",
        "--batch-size",
        "24",
        "--max-steps",
        "40",
        "--epochs",
        "100",
        "--lr",
        "0.005",
        "--optimizer",
        "sgd",
        "--threads",
        "1",
        "--deterministic",
        "--checkpoint-every",
        "5",
        "--seed",
        "5",
    ]);
    a.extend(path_arg("--output-dir", out));
    a.extend(path_arg("--checkpoint-dir", ckpt));
    a
}

fn newest_ckpt_step(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.strip_prefix("ckpt-")?.strip_suffix(".json")?.parse().ok()
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

#[test]
fn sigkill_then_resume_auto_matches_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    // Unequal ranks: the optimizer state is sharded 17 : 7 (proportional:
    // under the default only rank 0 would own a part) and has to be
    // gathered into each checkpoint and re-split on resume.
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[17, 7]);
    // Killed once the checkpoint at step 20 exists, with 60 steps (over
    // 6 s at 100 ms a step) still to go: this thread may get the CPU late.
    let total = 80u64;
    let base = |out: &Path, ck: &Path| {
        let mut a = base(out, ck);
        set_flag(&mut a, "--max-steps", &total.to_string());
        a.extend(path_arg("--plan-file", &plan));
        a.extend(args(&["--optimizer-sharding", "proportional"]));
        a
    };
    let (out_a, ck_a) = (dir.path().join("a"), dir.path().join("ck-a"));
    run_ok(2, &base(&out_a, &ck_a));
    let want = load_weights(&out_a.join("model.safetensors"));

    let (out_b, ck_b) = (dir.path().join("b"), dir.path().join("ck-b"));
    let mut a = base(&out_b, &ck_b);
    a.extend(args(&["--step-sleep-ms", "100"]));
    let mut children = spawn_ranks(2, &a);
    assert!(wait_until(Duration::from_secs(60), || newest_ckpt_step(
        &ck_b
    ) >= 20));
    for c in children.iter_mut() {
        c.kill().unwrap(); // SIGKILL
        let _ = c.wait();
    }
    let newest = newest_ckpt_step(&ck_b);
    assert!(
        newest < total,
        "killed before the end (newest checkpoint {newest})"
    );
    // Truncate the newest checkpoint's weights: resume must skip it.
    let w = ck_b.join(format!("ckpt-{newest:010}.model.safetensors"));
    let len = std::fs::metadata(&w).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&w)
        .unwrap()
        .set_len(len / 3)
        .unwrap();
    let log_len = steps(&log_records(&out_b, 0)).len();

    let mut r = base(&out_b, &ck_b);
    r.extend(args(&["--resume", "auto"]));
    let outs = run_ok(2, &r);
    let err0 = String::from_utf8_lossy(&outs[0].stderr);
    assert!(
        err0.contains("warning: skipping corrupt checkpoint"),
        "{err0}"
    );
    assert!(
        err0.contains(&format!("resuming from checkpoint at step {}", newest - 5)),
        "{err0}"
    );
    let records = log_records(&out_b, 0);
    let resumed = steps(&records)[log_len..].to_vec();
    assert_eq!(resumed.first().unwrap()["step"], newest - 5 + 1);
    assert_eq!(resumed.last().unwrap()["step"], total);

    let got = load_weights(&out_b.join("model.safetensors"));
    for (name, t) in &want {
        assert!(
            t.equal(&got[name]),
            "{name} differs after resume (max {})",
            max_abs_diff(&want, &got)
        );
    }
    // The resumed ranks updated unequal shards of the parameters.
    let shard = |r: usize| {
        steps(&log_records(&out_b, r)).last().unwrap()["optimizer_elements"]
            .as_u64()
            .unwrap()
    };
    assert!(
        shard(0) > 2 * shard(1) && shard(1) > 0,
        "{} {}",
        shard(0),
        shard(1)
    );
}

/// The manifest of the checkpoint at `step`.
fn manifest(dir: &Path, step: u64) -> serde_json::Value {
    let p = dir.join(format!("ckpt-{step:010}.json"));
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("manifest json")
}

/// Step records a run appended to rank 0's log after the first `skip`.
fn new_steps(out: &Path, skip: usize) -> Vec<serde_json::Value> {
    steps(&log_records(out, 0))[skip..]
        .iter()
        .map(|r| (*r).clone())
        .collect()
}

fn assert_same_weights(want: &Path, got: &Path) {
    let (want, got) = (load_weights(want), load_weights(got));
    for (name, t) in &want {
        assert!(
            t.equal(&got[name]),
            "{name} differs (max {})",
            max_abs_diff(&want, &got)
        );
    }
}

#[test]
fn changed_batch_size_skips_the_old_checkpoints_and_starts_from_step_0() {
    let dir = tempfile::tempdir().unwrap();
    let (out, ck) = (dir.path().join("o"), dir.path().join("ck"));
    let mut a = base(&out, &ck);
    a.push("--no-profile".into());
    set_flag(&mut a, "--max-steps", "20");
    run_ok(2, &a);
    assert_eq!(newest_ckpt_step(&ck), 20);
    assert_eq!(manifest(&ck, 20)["fingerprint"]["batchSize"], 24);
    let first = steps(&log_records(&out, 0)).len();

    // Same directories, B 24 → 32, resume auto, 10 steps.
    let mut b = a.clone();
    set_flag(&mut b, "--batch-size", "32");
    set_flag(&mut b, "--max-steps", "10");
    b.extend(args(&["--resume", "auto"]));
    let outs = run_ok(2, &b);
    let err0 = String::from_utf8_lossy(&outs[0].stderr);
    assert!(
        err0.contains("skipping checkpoint at step 20") && err0.contains("batch size 24 ≠ 32"),
        "{err0}"
    );
    assert!(!err0.contains("resuming from checkpoint"), "{err0}");

    // From scratch: steps 1..=10 at B = 32, and the same weights as a
    // fresh run in an empty checkpoint directory.
    let resumed = new_steps(&out, first);
    let numbers: Vec<u64> = resumed
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (1..=10).collect::<Vec<_>>());
    assert!(resumed.iter().all(|r| r["global_batch_size"] == 32));
    let (out_f, ck_f) = (dir.path().join("fresh"), dir.path().join("ck-fresh"));
    let mut f = b.clone();
    set_flag(&mut f, "--output-dir", &out_f.display().to_string());
    set_flag(&mut f, "--checkpoint-dir", &ck_f.display().to_string());
    run_ok(2, &f);
    assert_same_weights(
        &out_f.join("model.safetensors"),
        &out.join("model.safetensors"),
    );

    // The new run's checkpoints (5, 10) are kept although the old run's
    // 15 and 20 are newer; those are left alone.
    for (step, b) in [(5, 32), (10, 32), (15, 24), (20, 24)] {
        assert_eq!(
            manifest(&ck, step)["fingerprint"]["batchSize"],
            b,
            "step {step}"
        );
    }
}

#[test]
fn changed_model_width_skips_the_old_checkpoint_instead_of_failing() {
    let dir = tempfile::tempdir().unwrap();
    let (out, ck) = (dir.path().join("o"), dir.path().join("ck"));
    let mut a = base(&out, &ck);
    a.push("--no-profile".into());
    set_flag(&mut a, "--max-steps", "5");
    run_ok(1, &a);
    let first = steps(&log_records(&out, 0)).len();

    let mut b = a.clone();
    set_flag(&mut b, "--hidden", "48");
    set_flag(&mut b, "--max-steps", "8");
    b.extend(args(&["--resume", "auto"]));
    let outs = run_ok(1, &b);
    let err0 = String::from_utf8_lossy(&outs[0].stderr);
    assert!(err0.contains("hidden width 32 ≠ 48"), "{err0}");
    let numbers: Vec<u64> = new_steps(&out, first)
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (1..=8).collect::<Vec<_>>());
    let w = load_weights(&out.join("model.safetensors"));
    assert_eq!(w["fc1.weight"].size()[0], 48);
}

/// Train 20 steps on `ranks` ranks (checkpoints every 5), let `spoil`
/// change the checkpoint at step 20, then resume to step 30: the run must
/// pass over step 20 (rank 0's stderr names why: `why`), resume after step
/// 15 and end with the parameters of an uninterrupted 30-step run.
fn spoilt_newest_falls_back_to_step_15(ranks: usize, why: &str, spoil: impl FnOnce(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let (out, ck) = (dir.path().join("o"), dir.path().join("ck"));
    let mut a = base(&out, &ck);
    a.push("--no-profile".into());
    set_flag(&mut a, "--max-steps", "20");
    run_ok(ranks, &a);
    assert_eq!(newest_ckpt_step(&ck), 20);
    let first = steps(&log_records(&out, 0)).len();
    spoil(&ck);

    let mut r = a.clone();
    set_flag(&mut r, "--max-steps", "30");
    r.extend(args(&["--resume", "auto"]));
    let outs = run_ok(ranks, &r);
    let err0 = String::from_utf8_lossy(&outs[0].stderr);
    assert!(
        err0.contains("skipping checkpoint at step 20") && err0.contains(why),
        "{err0}"
    );
    let numbers: Vec<u64> = new_steps(&out, first)
        .iter()
        .map(|r| r["step"].as_u64().unwrap())
        .collect();
    assert_eq!(
        numbers,
        (16..=30).collect::<Vec<_>>(),
        "resumed after step 15"
    );

    // Same parameters as an uninterrupted 30-step run.
    let (out_u, ck_u) = (dir.path().join("u"), dir.path().join("ck-u"));
    let mut u = r.clone();
    set_flag(&mut u, "--output-dir", &out_u.display().to_string());
    set_flag(&mut u, "--checkpoint-dir", &ck_u.display().to_string());
    run_ok(ranks, &u);
    assert_same_weights(
        &out_u.join("model.safetensors"),
        &out.join("model.safetensors"),
    );
}

#[test]
fn weights_that_fail_to_load_fall_back_to_the_previous_checkpoint() {
    // Newest weights replaced by bytes that are no safetensors file, with
    // the manifest's size and checksum updated: only loading can notice.
    spoilt_newest_falls_back_to_step_15(2, "loading it failed", |ck| {
        let w = ck.join("ckpt-0000000020.model.safetensors");
        let junk = vec![0x5a_u8; 4096];
        std::fs::write(&w, &junk).unwrap();
        let sha: String = Sha256::digest(&junk)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut m = manifest(ck, 20);
        m["weights"]["bytes"] = junk.len().into();
        m["weights"]["sha256"] = sha.into();
        std::fs::write(ck.join("ckpt-0000000020.json"), m.to_string()).unwrap();
    });
}

/// A manifest whose position is past the epoch (a hand-edited one, or a
/// version-1 manifest of a run over more samples) is passed over like a
/// checkpoint that fails to load, not indexed into the epoch's order.
#[test]
fn a_position_past_the_epoch_falls_back_to_the_previous_checkpoint() {
    spoilt_newest_falls_back_to_step_15(1, "past this run's", |ck| {
        let mut m = manifest(ck, 20);
        m["position"]["step_in_epoch"] = 1_000_000_000_000_u64.into();
        std::fs::write(ck.join("ckpt-0000000020.json"), m.to_string()).unwrap();
    });
}

#[test]
fn sigterm_finishes_step_checkpoints_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let (out, ck) = (dir.path().join("o"), dir.path().join("ck"));
    let mut a = base(&out, &ck);
    set_flag(&mut a, "--checkpoint-every", "0");
    // Signalled at step 5 of 100 (over 9 s before the end at 100 ms a
    // step): the stop lands long before the run would end by itself.
    set_flag(&mut a, "--max-steps", "100");
    a.extend(args(&["--step-sleep-ms", "100"]));
    let children = spawn_ranks(2, &a);
    assert!(wait_until(Duration::from_secs(60), || last_step(&out, 1) >= 5));
    let pid = children[1].id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let outs = wait_all(children, Duration::from_secs(60));
    assert_all_ok(&outs);
    let stopped = last_step(&out, 0);
    assert!((5..100).contains(&stopped), "stopped at {stopped}");
    assert_eq!(
        last_step(&out, 1),
        stopped,
        "both ranks stop at the same step"
    );
    assert_eq!(
        newest_ckpt_step(&ck),
        stopped,
        "checkpoint of the last finished step"
    );
}

#[test]
fn weights_load_in_pytorch_with_model_names() {
    let dir = tempfile::tempdir().unwrap();
    let (out, ck) = (dir.path().join("o"), dir.path().join("ck"));
    let mut a = base(&out, &ck);
    set_flag(&mut a, "--max-steps", "3");
    run_ok(1, &a);
    let ours = load_weights(&out.join("model.safetensors"));
    let script = "import sys; from safetensors.torch import load_file; \
        d = load_file(sys.argv[1]); \
        print(' '.join(sorted(d)), d['fc2.weight'].shape[0], d['fc2.weight'][1, 2].item())";
    let o = Command::new(python())
        .args(["-c", script])
        .arg(ck.join("ckpt-0000000003.model.safetensors"))
        .output()
        .expect("python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    let parts: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(
        parts[..6],
        [
            "fc1.bias",
            "fc1.weight",
            "fc2.bias",
            "fc2.weight",
            "fc3.bias",
            "fc3.weight"
        ]
    );
    assert_eq!(parts[6], "32");
    let v: f64 = parts[7].parse().unwrap();
    assert!((v - ours["fc2.weight"].double_value(&[1, 2])).abs() < 1e-7);
}
