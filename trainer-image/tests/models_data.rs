//! Every model and dataset through the real binary: a generated CIFAR-10
//! binary batch with resnet18 and simple_cnn, the GPT language model on
//! synthetic text (loss falls), AdamW + cosine schedule.

mod common;

use common::*;

fn step_losses(out: &std::path::Path) -> Vec<f64> {
    steps(&log_records(out, 0))
        .iter()
        .map(|s| s["global_loss"].as_f64().unwrap())
        .collect()
}

#[test]
fn cifar10_binary_with_resnet18_and_simple_cnn() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cifar");
    std::fs::create_dir_all(&data).unwrap();
    write_cifar(&data, 64);
    for (model, steps_n) in [("resnet18", "2"), ("simple_cnn", "12")] {
        let out = dir.path().join(model);
        let mut a = args(&[
            "--model",
            model,
            "--dataset",
            "cifar10",
            "--batch-size",
            "16",
            "--max-steps",
            steps_n,
            "--epochs",
            "10",
            "--lr",
            "0.01",
            "--threads",
            "2",
        ]);
        a.extend(path_arg("--data-dir", &data));
        a.extend(path_arg("--output-dir", &out));
        run_ok(2, &a);
        let w = load_weights(&out.join("model.safetensors"));
        let evals: Vec<_> = log_records(&out, 0)
            .into_iter()
            .filter(|r| r["event"] == "eval")
            .collect();
        assert_eq!(
            evals.last().unwrap()["eval_samples"],
            20,
            "{model}: test_batch.bin used"
        );
        if model == "resnet18" {
            assert_eq!(w["layer1.0.conv1.weight"].size(), vec![64, 64, 3, 3]);
            assert_eq!(w["fc.weight"].size(), vec![10, 512]);
            assert!(w.contains_key("bn1.running_mean"));
        } else {
            let l = step_losses(&out);
            assert!(l[l.len() - 1] < l[0], "{model} loss {l:?}");
        }
    }
}

#[test]
fn gpt_on_synthetic_text_learns_with_adamw_cosine() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gpt");
    let mut a = args(&[
        "--model",
        "gpt",
        "--dataset",
        "synthetic_text",
        "--synthetic-samples",
        "512",
        "--context",
        "16",
        "--vocab",
        "32",
        "--width",
        "32",
        "--heads",
        "4",
        "--layers",
        "2",
        "--batch-size",
        "32",
        "--max-steps",
        "60",
        "--epochs",
        "100",
        "--optimizer",
        "adamw",
        "--lr",
        "0.003",
        "--schedule",
        "cosine",
        "--warmup-steps",
        "5",
        "--weight-decay",
        "0.01",
        "--threads",
        "1",
    ]);
    a.extend(path_arg("--output-dir", &out));
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[22, 10]);
    a.extend(path_arg("--plan-file", &plan));
    run_ok(2, &a);
    let l = step_losses(&out);
    assert_eq!(l.len(), 60);
    assert!(l[0] > 3.0, "starts near ln(32): {}", l[0]);
    assert!(l[59] < 1.5, "learned the recurrence: {}", l[59]);
    let lrs: Vec<f64> = steps(&log_records(&out, 0))
        .iter()
        .map(|s| s["lr"].as_f64().unwrap())
        .collect();
    assert!((lrs[0] - 0.0006).abs() < 1e-9 && (lrs[4] - 0.003).abs() < 1e-9);
    assert!(lrs[59] < 1e-5, "cosine ends near 0: {}", lrs[59]);
    let w = load_weights(&out.join("model.safetensors"));
    assert_eq!(w["h.1.mlp.c_fc.weight"].size(), vec![128, 32]);
}
