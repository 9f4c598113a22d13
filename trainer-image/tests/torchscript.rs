//! Your own model: a module defined in Python and scripted with
//! `torch.jit.script`, on a `tensors` dataset, trained by 3 ranks with
//! unequal local batches (real processes, real c10d on loopback), ends with
//! the parameters of one PyTorch process with the whole global batch
//! (`torch.optim.SGD`); the exported `model.pt` loads back in PyTorch with
//! the trained weights; a run stopped and resumed from its checkpoint ends
//! the same. The PyTorch side is `scripts/torchscript_reference.py`, run
//! with the project venv's python.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/scripts/torchscript_reference.py"
);
const STEPS: u64 = 30;
const LR: &str = "0.05";
const MOMENTUM: &str = "0.9";
const WEIGHT_DECAY: &str = "0.001";

/// The venv's python, or a clear failure.
fn venv_python() -> PathBuf {
    let p = python();
    assert!(
        p.exists(),
        "no python at {}: these tests need the project venv with torch 2.11 \
         (`make setup` makes it under $HETEROTRAIN_CACHE, default ~/.cache/heterotrain), \
         or set HETEROTRAIN_PYTHON",
        p.display()
    );
    p
}

/// Run a python program and return its stdout (failing with its stderr).
fn py(args: &[String]) -> String {
    let out = Command::new(venv_python())
        .args(args)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "python {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn script(args: &[&str], paths: &[&Path]) -> String {
    let mut a = vec![SCRIPT.to_string()];
    a.extend(args.iter().map(|s| s.to_string()));
    a.extend(paths.iter().map(|p| p.display().to_string()));
    py(&a)
}

/// The scripted model and the data, in `dir`.
fn make(dir: &Path) {
    script(&["make"], &[dir]);
}

/// PyTorch's parameters after `steps` steps (0: the initial weights).
fn reference(dir: &Path, steps: u64) -> HashMap<String, tch::Tensor> {
    let out = dir.join(format!("reference-{steps}.safetensors"));
    let mut a = vec![
        SCRIPT.to_string(),
        "train".into(),
        dir.display().to_string(),
        out.display().to_string(),
    ];
    a.extend(args(&[
        "--steps",
        &steps.to_string(),
        "--batch-size",
        "32",
        "--lr",
        LR,
        "--momentum",
        MOMENTUM,
        "--weight-decay",
        WEIGHT_DECAY,
    ]));
    py(&a);
    load_weights(&out)
}

fn trainer_args(data: &Path, out: &Path, steps: u64) -> Vec<String> {
    let mut a = args(&[
        "--model",
        "torchscript",
        "--dataset",
        "tensors",
        "--batch-size",
        "32",
        "--max-steps",
        &steps.to_string(),
        "--lr",
        LR,
        "--momentum",
        MOMENTUM,
        "--weight-decay",
        WEIGHT_DECAY,
        "--no-shuffle",
        "--threads",
        "1",
        "--metrics-port",
        "0",
        "--profile-seconds",
        "0.3",
    ]);
    a.extend(path_arg("--model-file", &data.join("model.pt")));
    a.extend(path_arg("--data-dir", data));
    a.extend(path_arg("--output-dir", out));
    a
}

#[test]
fn three_unequal_ranks_match_pytorch_and_export_torchscript() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    make(&data);
    let want = reference(&data, STEPS);
    let init = reference(&data, 0);
    assert!(max_abs_diff(&init, &want) > 1e-3, "training moved nothing");

    let out = dir.path().join("out");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[20, 9, 3]);
    let mut a = trainer_args(&data, &out, STEPS);
    a.extend(path_arg("--plan-file", &plan));
    run_ok(3, &a);
    let got = load_weights(&out.join("model.safetensors"));
    let d = max_abs_diff(&want, &got);
    eprintln!("torchscript, 3 ranks (20, 9, 3) vs PyTorch: max |Δparam| = {d:e}");
    assert!(d <= 1e-5, "max |Δparam| = {d:e}");
    for (r, b) in [(0, 20), (1, 9), (2, 3)] {
        let s: Vec<u64> = steps(&log_records(&out, r))
            .iter()
            .map(|x| x["batch_size"].as_u64().unwrap())
            .collect();
        assert_eq!(s, vec![b; STEPS as usize], "rank {r} batch sizes");
    }
    // 400 samples, B 32: 12 steps an epoch, so the run crossed two epochs.
    let last = steps(&log_records(&out, 0))
        .last()
        .map(|r| r["epoch"].as_u64().unwrap());
    assert_eq!(last, Some(2));

    // The exported module: PyTorch loads it, its parameters are the
    // safetensors ones, and it runs forward.
    let report = script(
        &["check"],
        &[&out.join("model.pt"), &out.join("model.safetensors"), &data],
    );
    let v: serde_json::Value = serde_json::from_str(report.trim()).expect("check's JSON");
    assert_eq!(v["params"], 10, "{v}");
    assert_eq!(v["max_diff"].as_f64(), Some(0.0), "{v}");
}

#[test]
fn a_resumed_run_matches_pytorch() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    make(&data);
    let want = reference(&data, STEPS);
    let out = dir.path().join("out");
    let ckpt = dir.path().join("ckpt");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[11, 21]);
    let mut a = trainer_args(&data, &out, 14);
    a.extend(path_arg("--plan-file", &plan));
    a.extend(path_arg("--checkpoint-dir", &ckpt));
    a.extend(args(&["--checkpoint-every", "7", "--resume", "auto"]));
    run_ok(2, &a);
    set_flag(&mut a, "--max-steps", &STEPS.to_string());
    let outs = run_ok(2, &a);
    let err = String::from_utf8_lossy(&outs[0].stderr);
    assert!(err.contains("resuming from checkpoint at step 14"), "{err}");
    // The log (appended to by both runs) holds every step once: the second
    // run went on from step 14 instead of training from the start again,
    // which would end on the same parameters.
    let logged: Vec<u64> = steps(&log_records(&out, 0))
        .iter()
        .filter_map(|r| r["step"].as_u64())
        .collect();
    assert_eq!(logged.len() as u64, STEPS, "{logged:?}");
    assert!(logged.windows(2).all(|w| w[0] < w[1]), "{logged:?}");
    let got = load_weights(&out.join("model.safetensors"));
    let d = max_abs_diff(&want, &got);
    eprintln!("torchscript, resumed at step 14 vs PyTorch: max |Δparam| = {d:e}");
    assert!(d <= 1e-5, "max |Δparam| = {d:e}");

    // Another module (the same architecture, other initial weights) never
    // resumes these checkpoints: its file's digest is in the fingerprint.
    let other = dir.path().join("other.pt");
    let scripts = Path::new(SCRIPT).parent().expect("scripts dir");
    py(&[
        "-c".into(),
        format!(
            "import sys, torch; sys.path.insert(0, {:?}); import torchscript_reference as r; \
             torch.manual_seed(8); torch.jit.script(r.Net()).save({:?})",
            scripts.display().to_string(),
            other.display().to_string()
        ),
    ]);
    let out2 = dir.path().join("out-other");
    let mut b = trainer_args(&data, &out2, 3);
    set_flag(&mut b, "--model-file", &other.display().to_string());
    b.extend(path_arg("--plan-file", &plan));
    b.extend(path_arg("--checkpoint-dir", &ckpt));
    b.extend(args(&["--resume", "auto"]));
    let outs = run_ok(2, &b);
    let err = String::from_utf8_lossy(&outs[0].stderr);
    assert!(
        err.contains("skipping checkpoint at step") && err.contains("model file"),
        "{err}"
    );
    let first: Vec<u64> = steps(&log_records(&out2, 0))
        .iter()
        .filter_map(|r| r["step"].as_u64())
        .collect();
    assert_eq!(first.len(), 3, "trained from the start: {first:?}");
}

/// Run one rank and return (exit code, stderr).
fn fails(a: &[String]) -> (Option<i32>, String) {
    let o = wait_all(
        vec![rank_cmd(0, 1, free_port(), a).spawn().unwrap()],
        Duration::from_secs(60),
    );
    (
        o[0].status.code(),
        String::from_utf8_lossy(&o[0].stderr).into_owned(),
    )
}

#[test]
fn unusable_model_files_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    make(&data);
    let out = dir.path().join("out");
    let base = trainer_args(&data, &out, 2);
    let with_model = |file: &Path| {
        let mut a = base.clone();
        set_flag(&mut a, "--model-file", &file.display().to_string());
        a
    };
    let expect = |a: &[String], phrase: &str| {
        let (code, err) = fails(a);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains(phrase), "expected {phrase:?} in {err}");
        assert!(!err.contains("panicked"), "{err}");
    };

    expect(
        &with_model(&dir.path().join("absent.pt")),
        "absent.pt: cannot read it: No such file",
    );
    let garbage = dir.path().join("garbage.pt");
    std::fs::write(&garbage, b"not a module").unwrap();
    expect(&with_model(&garbage), "not a TorchScript module");

    // A module that cannot take the samples, and one with too few logits.
    let narrow = dir.path().join("narrow.pt");
    let few = dir.path().join("few.pt");
    py(&[
        "-c".into(),
        format!(
            "import torch\n\
             torch.jit.script(torch.nn.Linear(5, 4)).save({:?})\n\
             torch.jit.script(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(72, 3))).save({:?})",
            narrow.display().to_string(),
            few.display().to_string()
        ),
    ]);
    expect(&with_model(&narrow), "forward failed");
    expect(&with_model(&few), "at least 4 classes");

    let mut a = base.clone();
    let i = a.iter().position(|x| x == "--model-file").unwrap();
    a.drain(i..i + 2);
    expect(&a, "--model torchscript needs --model-file");
    let mut a = base.clone();
    set_flag(&mut a, "--model", "mlp");
    expect(&a, "--model-file is only for --model torchscript");
}

#[test]
fn the_own_model_example_exports_and_trains() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("own-model");
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/own-model/export.py"
    );
    py(&[example.into(), "--out".into(), data.display().to_string()]);
    let out = dir.path().join("out");
    let mut a = trainer_args(&data, &out, 44);
    set_flag(&mut a, "--batch-size", "64");
    a.retain(|x| x != "--no-shuffle");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[40, 24]);
    a.extend(path_arg("--plan-file", &plan));
    run_ok(2, &a);
    let acc = log_records(&out, 0)
        .iter()
        .filter(|r| r["event"] == "eval")
        .filter_map(|r| r["eval_accuracy"].as_f64())
        .next_back()
        .expect("an evaluation");
    assert!(acc >= 0.85, "eval accuracy {acc} after 2 epochs");
    assert!(out.join("model.pt").is_file());
}

/// The module trains in `train` mode and is evaluated in `eval` mode: a
/// module whose logits change sign outside training (argmax becomes argmin)
/// evaluates far below chance, while the same module trained and evaluated
/// without the flip does well.
#[test]
fn the_module_trains_in_train_mode_and_evaluates_in_eval_mode() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    make(&data);
    let scripts = Path::new(SCRIPT).parent().expect("scripts dir");
    let accuracy = |flip: bool| -> f64 {
        let file = dir.path().join(format!("wrapped-{flip}.pt"));
        // A file, not `-c`: TorchScript reads the class's source.
        let maker = dir.path().join(format!("wrapped-{flip}.py"));
        std::fs::write(
            &maker,
            format!(
                "import sys, torch; sys.path.insert(0, {:?}); import torchscript_reference as r\n\
                 class Wrapped(torch.nn.Module):\n\
                 \x20   def __init__(self):\n\
                 \x20       super().__init__()\n\
                 \x20       self.net = r.Net()\n\
                 \x20   def forward(self, x: torch.Tensor) -> torch.Tensor:\n\
                 \x20       y = self.net(x)\n\
                 \x20       if self.training or not {}:\n\
                 \x20           return y\n\
                 \x20       return -y\n\
                 torch.manual_seed(7)\n\
                 torch.jit.script(Wrapped()).save({:?})\n",
                scripts.display().to_string(),
                if flip { "True" } else { "False" },
                file.display().to_string()
            ),
        )
        .expect("write the module's maker");
        py(&[maker.display().to_string()]);
        let out = dir.path().join(format!("out-{flip}"));
        let mut a = trainer_args(&data, &out, 36);
        set_flag(&mut a, "--model-file", &file.display().to_string());
        run_ok(1, &a);
        log_records(&out, 0)
            .iter()
            .filter(|r| r["event"] == "eval")
            .filter_map(|r| r["eval_accuracy"].as_f64())
            .next_back()
            .expect("an evaluation")
    };
    let (plain, flipped) = (accuracy(false), accuracy(true));
    eprintln!("eval accuracy: plain {plain}, logits flipped outside training {flipped}");
    assert!(plain > 0.5, "the plain module did not learn: {plain}");
    assert!(
        flipped < 0.2,
        "evaluated in train mode? {flipped} (plain {plain})"
    );
}
