//! Convergence on real data (scikit-learn's bundled digits as MNIST IDX):
//! 2 ranks with unequal batches reach ≥ 95% held-out accuracy, as 1 process does.

mod common;

use common::*;

fn final_accuracy(out: &std::path::Path, rank: usize) -> f64 {
    log_records(out, rank)
        .iter()
        .rfind(|r| r["event"] == "eval")
        .expect("an eval record")["eval_accuracy"]
        .as_f64()
        .unwrap()
}

#[test]
fn digits_mlp_two_unequal_ranks_reach_95_percent() {
    let data = digits_dir();
    let dir = tempfile::tempdir().unwrap();
    let base = |out: &std::path::Path| {
        let mut a = args(&[
            "--model",
            "mlp",
            "--dataset",
            "mnist",
            "--batch-size",
            "64",
            "--epochs",
            "15",
            "--lr",
            "0.05",
            "--threads",
            "1",
            "--seed",
            "3",
        ]);
        a.extend(path_arg("--data-dir", &data));
        a.extend(path_arg("--output-dir", out));
        a
    };
    let single = dir.path().join("single");
    run_ok(1, &base(&single));
    let multi = dir.path().join("multi");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[48, 16]);
    let mut a = base(&multi);
    a.extend(path_arg("--plan-file", &plan));
    run_ok(2, &a);
    let (s, m0, m1) = (
        final_accuracy(&single, 0),
        final_accuracy(&multi, 0),
        final_accuracy(&multi, 1),
    );
    assert!(s >= 0.95, "single process accuracy {s}");
    assert!(m0 >= 0.95, "2-rank accuracy {m0}");
    assert_eq!(m0, m1, "eval is all-reduced, both ranks report the same");
    let evals = log_records(&multi, 0)
        .iter()
        .filter(|r| r["event"] == "eval")
        .count();
    assert_eq!(evals, 15, "one evaluation per epoch");
    let samples = log_records(&multi, 0)
        .iter()
        .find(|r| r["event"] == "eval")
        .unwrap()["eval_samples"]
        .as_u64();
    assert_eq!(samples, Some(300), "held-out digits");
}
