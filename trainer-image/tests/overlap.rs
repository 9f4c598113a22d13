//! Communication overlaps backward: with PyTorch's Reducer driving the
//! gradient all-reduce, gradient buckets are launched while backward still
//! has gradients to produce. An ordering check (how many gradients were
//! ready when each bucket's all-reduce started), not a timing threshold.
//! The sharded update runs inside backward too, with the same result bit
//! for bit as after it.

mod common;

use common::*;

/// Two-rank mlp runs on synthetic images, one thread per rank, no start-up
/// profile: hidden width, samples, global batch, steps, then `extra`.
fn mlp(hidden: &str, samples: &str, batch: &str, steps: &str, extra: &[&str]) -> Vec<String> {
    let mut a = args(&[
        "--model",
        "mlp",
        "--hidden",
        hidden,
        "--dataset",
        "synthetic_image",
        "--synthetic-samples",
        samples,
        "--batch-size",
        batch,
        "--max-steps",
        steps,
        "--threads",
        "1",
        "--no-profile",
    ]);
    a.extend(args(extra));
    a
}

/// Two ranks with `a` and `extra`, logging to `out`, at the plan in `plan`.
fn run_two_at_plan(
    mut a: Vec<String>,
    extra: &[&str],
    out: &std::path::Path,
    plan: &std::path::Path,
) {
    a.extend(args(extra));
    a.extend(path_arg("--output-dir", out));
    a.extend(path_arg("--plan-file", plan));
    run_ok(2, &a);
}

#[test]
fn gradient_buckets_start_before_backward_ends() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[40, 24]);
    let mut a = mlp("512", "512", "64", "6", &["--bucket-mib", "1"]);
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

/// Buckets per step on each rank of a 4-step run with `extra`.
fn buckets_per_step(extra: &[&str]) -> Vec<Vec<u64>> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[40, 24]);
    run_two_at_plan(mlp("512", "512", "64", "4", &[]), extra, &out, &plan);
    (0..2)
        .map(|r| {
            steps(&log_records(&out, r))
                .iter()
                .map(|s| s["buckets"].as_u64().expect("buckets logged"))
                .collect()
        })
        .collect()
}

#[test]
fn a_cpu_team_sends_a_small_model_in_one_bucket_unless_asked() {
    // The mlp's ~6.3 MB of gradients: under the 25 MiB default, so on CPU
    // ranks the first bucket holds them all.
    for (r, b) in buckets_per_step(&[]).iter().enumerate() {
        assert_eq!(b, &vec![1; 4], "rank {r}: buckets per step");
    }
    // DDP's small first bucket when asked: the last layers go first.
    for (r, b) in buckets_per_step(&["--first-bucket-mib", "1"])
        .iter()
        .enumerate()
    {
        assert_eq!(b.len(), 4, "rank {r}");
        assert!(
            b.iter().all(|&n| n == 2),
            "rank {r}: buckets per step {b:?}"
        );
    }
}

/// Two ranks, B 512 split equally: rank 0 owns the mlp's last layers (the
/// flat buffer holds the parameters last first), whose gradients come
/// first (the first bucket), and updates pieces of them while backward
/// still computes the first layer's large gradient (DDP's 1 MiB first
/// bucket, asked for: a CPU team's default puts this model in one bucket).
/// Counted per step by the ranks (`updated_in_backward`: pieces updated
/// before the last gradient was ready), not timed. Whether a step gets a
/// piece in early depends on the peer's first bucket arriving while rank 0
/// still computes (on a loaded machine a rank may wait for the CPU through
/// a whole backward): 20 steps, so that at least one of them shows it.
#[test]
fn the_sharded_update_runs_inside_backward() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut a = mlp("512", "1024", "512", "20", &["--first-bucket-mib", "1"]);
    a.extend(path_arg("--output-dir", &out));
    run_ok(2, &a);
    let early: Vec<Vec<u64>> = (0..2)
        .map(|r| {
            steps(&log_records(&out, r))
                .iter()
                .skip(1)
                .map(|s| {
                    s["updated_in_backward"]
                        .as_u64()
                        .unwrap_or_else(|| panic!("rank {r}: updated after backward: {s}"))
                })
                .collect()
        })
        .collect();
    assert!(
        early[0].iter().any(|&n| n >= 1),
        "rank 0 never updated a piece before backward ended: {early:?}"
    );
}

/// The update inside backward and the one after it (`--update-after-backward`)
/// give the same parameters bit for bit: SGD with momentum and weight decay,
/// and AdamW, two ranks with unequal shards (40 / 24, `proportional`: under
/// the default `fastest` rank 0 would own everything).
#[test]
fn the_update_inside_backward_equals_the_update_after_it() {
    for opt in ["sgd", "adamw"] {
        let dir = tempfile::tempdir().unwrap();
        let plan = dir.path().join("plan.json");
        write_plan(&plan, 0, &[40, 24]);
        let run = |name: &str, extra: &[&str]| {
            let out = dir.path().join(name);
            let a = mlp(
                "256",
                "512",
                "64",
                "8",
                &[
                    "--optimizer",
                    opt,
                    "--lr",
                    "0.01",
                    "--weight-decay",
                    "0.01",
                    "--deterministic",
                    "--optimizer-sharding",
                    "proportional",
                ],
            );
            run_two_at_plan(a, extra, &out, &plan);
            let inside = steps(&log_records(&out, 0))
                .last()
                .map(|s| s["updated_in_backward"].is_u64());
            (load_weights(&out.join("model.safetensors")), inside)
        };
        let (inside, was_inside) = run("inside", &[]);
        let (after, was_after) = run("after", &["--update-after-backward"]);
        assert_eq!(
            was_inside,
            Some(true),
            "{opt}: the default ran after backward"
        );
        assert_eq!(was_after, Some(false), "{opt}: the flag was ignored");
        assert_eq!(max_abs_diff(&inside, &after), 0.0, "{opt}");
    }
}

/// The next batch gathered during the step before (the default) trains the
/// same parameters, bit for bit, as each batch gathered when its step
/// starts (`--no-prefetch`), across epoch boundaries (a new permutation each
/// epoch) with unequal local batches. The prefetched run waits for each
/// batch from the helper (`--prefetch-wait`, which also runs the helper at
/// normal priority), so every step after the first trains on a prefetched
/// batch whatever else the machine runs; how often an idle-priority helper
/// is in time on a quiet machine is a benchmark figure, not asserted here.
#[test]
fn batches_gathered_ahead_train_the_same_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[40, 24]);
    let run = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        // 200 samples, 180 of them for training: 2 steps per epoch.
        let a = mlp("64", "200", "64", "9", &["--deterministic", "--lr", "0.05"]);
        run_two_at_plan(a, extra, &out, &plan);
        let prefetched: Vec<Vec<bool>> = (0..2)
            .map(|r| {
                steps(&log_records(&out, r))
                    .iter()
                    .map(|s| {
                        s["prefetched"]
                            .as_bool()
                            .expect("prefetched in the step record")
                    })
                    .collect()
            })
            .collect();
        (load_weights(&out.join("model.safetensors")), prefetched)
    };
    let (ahead, flags) = run("ahead", &["--prefetch-wait"]);
    let (at_step, flags_off) = run("at-step", &["--no-prefetch"]);
    for r in 0..2 {
        assert_eq!(flags[r].len(), 9, "rank {r}: {flags:?}");
        assert!(
            !flags[r][0],
            "rank {r}: the first batch has no step before it"
        );
        assert!(
            flags[r][1..].iter().all(|&p| p),
            "rank {r}: a batch after the first was gathered at its step: {flags:?}"
        );
        assert!(flags_off[r].iter().all(|&p| !p), "rank {r}: {flags_off:?}");
    }
    assert_eq!(max_abs_diff(&ahead, &at_step), 0.0);
}
