//! Communication overlaps backward: with PyTorch's Reducer driving the
//! gradient all-reduce, gradient buckets are launched while backward still
//! has gradients to produce. An ordering check (how many gradients were
//! ready when each bucket's all-reduce started), not a timing threshold.

mod common;

use common::*;

#[test]
fn gradient_buckets_start_before_backward_ends() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[40, 24]);
    let mut a = args(&[
        "--model",
        "mlp",
        "--hidden",
        "512",
        "--dataset",
        "synthetic_image",
        "--synthetic-samples",
        "512",
        "--batch-size",
        "64",
        "--max-steps",
        "6",
        "--bucket-mib",
        "1",
        "--threads",
        "1",
        "--no-profile",
    ]);
    a.extend(path_arg("--output-dir", &out));
    a.extend(path_arg("--plan-file", &plan));
    run_ok(2, &a);
    for r in 0..2 {
        let recs = log_records(&out, r);
        let st = steps(&recs);
        assert_eq!(st.len(), 6);
        for s in st {
            let buckets = s["buckets"].as_u64().expect("buckets logged");
            let early = s["overlapped_buckets"].as_u64().expect("overlap logged");
            // The mlp's ~7 MB of gradients in 1 MiB buckets (a tensor larger
            // than a bucket gets one of its own).
            assert!(
                buckets >= 2,
                "rank {r} step {}: {buckets} buckets",
                s["step"]
            );
            assert!(
                early >= 1 && early < buckets,
                "rank {r} step {}: {early} of {buckets} buckets started before backward ended",
                s["step"]
            );
        }
    }
}
