//! Checkpoints and resume: SIGKILL mid-run + `--resume auto` ends with the
//! same parameters as an uninterrupted run, skipping a truncated newest
//! checkpoint; SIGTERM finishes the step, checkpoints and exits 0; weights
//! load in PyTorch under the model's names.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;

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
    let (out_a, ck_a) = (dir.path().join("a"), dir.path().join("ck-a"));
    run_ok(2, &base(&out_a, &ck_a));
    let want = load_weights(&out_a.join("model.safetensors"));

    let (out_b, ck_b) = (dir.path().join("b"), dir.path().join("ck-b"));
    let mut a = base(&out_b, &ck_b);
    a.extend(args(&["--step-sleep-ms", "60"]));
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
        newest < 40,
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
    assert_eq!(resumed.last().unwrap()["step"], 40);

    let got = load_weights(&out_b.join("model.safetensors"));
    for (name, t) in &want {
        assert!(
            t.equal(&got[name]),
            "{name} differs after resume (max {})",
            max_abs_diff(&want, &got)
        );
    }
}

#[test]
fn sigterm_finishes_step_checkpoints_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let (out, ck) = (dir.path().join("o"), dir.path().join("ck"));
    let mut a = base(&out, &ck);
    set_flag(&mut a, "--checkpoint-every", "0");
    a.extend(args(&["--step-sleep-ms", "50"]));
    let children = spawn_ranks(2, &a);
    assert!(wait_until(Duration::from_secs(60), || last_step(&out, 1) >= 5));
    let pid = children[1].id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let outs = wait_all(children, Duration::from_secs(60));
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "rank {r}: {:?} {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let stopped = last_step(&out, 0);
    assert!((5..40).contains(&stopped), "stopped at {stopped}");
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
