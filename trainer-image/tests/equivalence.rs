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

/// What a multi-rank test starts from: one process's parameters for the
/// arguments `with` gives (the reference, run in `dir/single`), then the
/// multi-rank run's output folder, its plan file (generation 0: `first`)
/// and its arguments (`with` plus the plan file).
struct Setup {
    want: std::collections::HashMap<String, tch::Tensor>,
    out: std::path::PathBuf,
    plan: std::path::PathBuf,
    args: Vec<String>,
}

fn reference_then_plan(dir: &Path, with: impl Fn(&Path) -> Vec<String>, first: &[u32]) -> Setup {
    let single = dir.join("single");
    run_ok(1, &with(&single));
    let want = load_weights(&single.join("model.safetensors"));
    let out = dir.join("multi");
    let plan = dir.join("plan.json");
    write_plan(&plan, 0, first);
    let mut args = with(&out);
    args.extend(path_arg("--plan-file", &plan));
    Setup {
        want,
        out,
        plan,
        args,
    }
}

/// Per rank, the step records' (step, generation, `field`), `field` read
/// by `get`.
fn step_log<T>(
    out: &Path,
    ranks: usize,
    get: impl Fn(&serde_json::Value) -> T,
) -> Vec<Vec<(u64, u64, T)>> {
    (0..ranks)
        .map(|r| {
            steps(&log_records(out, r))
                .iter()
                .map(|s| {
                    (
                        s["step"].as_u64().unwrap(),
                        s["generation"].as_u64().unwrap(),
                        get(s),
                    )
                })
                .collect()
        })
        .collect()
}

/// The step at which every rank first ran generation 1 (the same on all).
fn switch_step<T>(logs: &[Vec<(u64, u64, T)>]) -> u64 {
    let switch: Vec<u64> = logs
        .iter()
        .map(|l| l.iter().find(|x| x.1 == 1).expect("switched").0)
        .collect();
    assert!(
        switch.iter().all(|&s| s == switch[0]),
        "switch steps {switch:?}"
    );
    switch[0]
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
        // Written early (15 steps before the end: the switch lands however
        // late this thread gets the CPU), and bracketed by the steps rank 0
        // had logged just before and just after the write.
        assert!(
            wait_until(Duration::from_secs(60), || last_step(&out, 0) >= 5),
            "rank 0 never reached step 5"
        );
        let logged_before = last_step(&out, 0);
        write_plan(&plan, 1, &[28, 3, 1]);
        let logged_after = last_step(&out, 0);
        let outs = wait_all(children, Duration::from_secs(120));
        assert_all_ok(&outs);
        let got = load_weights(&out.join("model.safetensors"));
        let d = max_abs_diff(&want, &got);
        assert!(d <= 1e-5, "{model}: max |Δparam| = {d:e}");
        // All ranks switched at the same step, from (16,8,8) to (28,3,1),
        // promptly: with a word every step (a step takes over 150 ms, the
        // word interval 200 ms), rank 0 reads the file when the step after
        // the last one it logged starts (or the one after that, if that
        // one had begun), and the ranks agree on it by that step's end and
        // switch at the next: at most 3 steps after `logged_after`, one
        // more of slack.
        let logs = step_log(&out, 3, |s| s["batch_size"].as_u64().unwrap());
        let switch = switch_step(&logs);
        assert!(
            switch > logged_before + 1 && switch <= logged_after + 4,
            "switched at step {switch}, plan written between steps {logged_before} and {logged_after}"
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

/// Control words only every k steps (`--control-interval-ms` 600 at 25 ms
/// of sleep a step plus the step itself: k = floor(600 ms / step time),
/// from 22 on an idle machine down to 3 while steps take up to 200 ms on a
/// loaded one): a plan written mid-run still switches every rank at the
/// same step, right after a step that carried a word, the ranks start
/// words at the same steps and skip the others, and the run ends with one
/// process's parameters. Rank 0 starts a word at each of the first few
/// steps (before it knows its step time), then every k steps; the plan is
/// written after those, and 60 steps leave room for two more words even
/// at k = 22, so it lands before the end whenever this thread writes it.
#[test]
fn sparse_control_words_switch_every_rank_at_the_same_step() {
    let dir = tempfile::tempdir().unwrap();
    // Words about 1 s apart: spaced ≥ 3 steps apart for any step under
    // 333 ms, so a loaded machine (slower steps, fewer steps per word)
    // still shows sparse words; 200 steps leave room for the switch.
    let total = 200u64;
    let with = |out: &Path| {
        let mut a = base("mlp", out);
        set_flag(&mut a, "--max-steps", &total.to_string());
        a
    };
    let Setup {
        want,
        out,
        plan,
        args: mut a,
    } = reference_then_plan(dir.path(), with, &[16, 8, 8]);
    a.extend(args(&[
        "--step-sleep-ms",
        "25",
        "--control-interval-ms",
        "1000",
    ]));
    let children = spawn_ranks(3, &a);
    assert!(
        wait_until(Duration::from_secs(60), || last_step(&out, 0) >= 5),
        "rank 0 never reached step 5"
    );
    write_plan(&plan, 1, &[28, 3, 1]);
    assert_all_ok(&wait_all(children, Duration::from_secs(120)));
    let d = max_abs_diff(&want, &load_weights(&out.join("model.safetensors")));
    assert!(d <= 1e-5, "max |Δparam| = {d:e}");
    let logs = step_log(&out, 3, |s| s["control_word"].as_bool().unwrap());
    let words: Vec<Vec<u64>> = logs
        .iter()
        .map(|l| l.iter().filter(|x| x.2).map(|x| x.0).collect())
        .collect();
    assert!(
        words.iter().all(|w| *w == words[0]),
        "word steps differ: {words:?}"
    );
    assert!(
        (words[0].len() as u64) <= total / 2,
        "a word at most every other step: {:?}",
        words[0]
    );
    assert!(
        words[0].windows(2).any(|w| w[1] - w[0] >= 3),
        "words spaced out: {:?}",
        words[0]
    );
    let switch = switch_step(&logs);
    assert!(
        words[0].contains(&(switch - 1)),
        "switched at step {switch} without a word at the step before: {:?}",
        words[0]
    );
}

/// Real text as byte tokens (this crate's own sources) in nanoGPT's layout.
fn token_corpus(dir: &Path) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut names: Vec<_> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    names.sort();
    let mut bytes = Vec::new();
    for n in names {
        for b in std::fs::read(n).unwrap() {
            bytes.extend_from_slice(&u16::from(b).to_le_bytes());
        }
    }
    let out = dir.join("tokens");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("train.bin"), &bytes).unwrap();
    out
}

#[test]
fn equivalence_gpt_on_text_adamw_two_unequal_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = token_corpus(dir.path());
    let run = |out: &Path, plan: Option<&Path>, world: usize| {
        let mut a = args(&[
            "--model",
            "gpt",
            "--dataset",
            "tokens",
            "--context",
            "32",
            "--vocab",
            "256",
            "--hidden",
            "32",
            "--layers",
            "2",
            "--heads",
            "4",
            "--batch-size",
            "24",
            "--max-steps",
            "20",
            "--optimizer",
            "adamw",
            "--lr",
            "0.001",
            "--weight-decay",
            "0.01",
            "--seed",
            "3",
            "--threads",
            "1",
            "--no-profile",
        ]);
        a.extend(path_arg("--data-dir", &corpus));
        a.extend(path_arg("--output-dir", out));
        if let Some(p) = plan {
            a.extend(path_arg("--plan-file", p));
        }
        run_ok(world, &a);
        load_weights(&out.join("model.safetensors"))
    };
    let want = run(&dir.path().join("single"), None, 1);
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[17, 7]);
    let out = dir.path().join("multi");
    let got = run(&out, Some(&plan), 2);
    // The key projection's bias has an identically zero gradient (softmax
    // is invariant to adding q·b_k to every logit of a query), so what
    // reaches it is rounding noise, which Adam normalises into steps of up
    // to ±lr in any implementation. Those 32 entries (the middle third of
    // `c_attn.bias`) are held to that bound; everything else to 1e-5.
    let width = 32;
    let mut d = 0.0f64;
    for (name, w) in &want {
        let g = &got[name];
        if name.ends_with("attn.c_attn.bias") {
            // Same start; each run moved it at most 20 steps × lr.
            let k = (w.narrow(0, width, width) - g.narrow(0, width, width))
                .abs()
                .max()
                .double_value(&[]);
            assert!(k <= 2.0 * 20.0 * 0.001 * 1.01, "{name} key bias Δ {k}");
            let q = w.narrow(0, 0, width) - g.narrow(0, 0, width);
            let v = w.narrow(0, 2 * width, width) - g.narrow(0, 2 * width, width);
            d = d.max(q.abs().max().double_value(&[]));
            d = d.max(v.abs().max().double_value(&[]));
        } else {
            d = d.max((w - g).abs().max().double_value(&[]));
        }
    }
    assert!(d <= 1e-5, "gpt: max |Δparam| = {d:e}");
    let b1: Vec<u64> = steps(&log_records(&out, 1))
        .iter()
        .map(|s| s["batch_size"].as_u64().unwrap())
        .collect();
    assert_eq!(b1, vec![7; 20]);
    // Sanity: it learned something from the text.
    let losses: Vec<f64> = steps(&log_records(&dir.path().join("single"), 0))
        .iter()
        .map(|s| s["global_loss"].as_f64().unwrap())
        .collect();
    assert!(
        losses[19] < losses[0] - 0.5,
        "loss {} -> {}",
        losses[0],
        losses[19]
    );
}

/// The sharded optimizer update (the default, `fastest`): 3 ranks
/// (16, 15, 1) then (20, 9, 3) from a mid-run re-split, across an epoch
/// boundary, for SGD with momentum and weight decay and for AdamW, end with
/// the parameters of one process with B = 32; the shards really were
/// unequal (two owners and a rank with samples that owns nothing, then one
/// owner) and moved with the plan.
#[test]
fn equivalence_sharded_update_resplit_across_epochs_sgd_and_adamw() {
    for (opt, lr) in [("sgd", "0.005"), ("adamw", "0.001")] {
        let dir = tempfile::tempdir().unwrap();
        let with = |out: &Path| {
            let mut a = base("mlp", out);
            // 320 samples, 10% held out: 9 steps per epoch of B = 32.
            set_flag(&mut a, "--synthetic-samples", "320");
            set_flag(&mut a, "--lr", lr);
            a.extend(args(&["--optimizer", opt]));
            a
        };
        let Setup {
            want,
            out,
            plan,
            args: mut a,
        } = reference_then_plan(dir.path(), with, &[16, 15, 1]);
        a.extend(args(&["--step-sleep-ms", "150"]));
        let children = spawn_ranks(3, &a);
        // Written early: the re-split lands 2 or 3 steps after the step
        // rank 0 last logged, so it is in force before step 20 unless this
        // thread waits 15 steps (over 2 s) for the CPU.
        assert!(
            wait_until(Duration::from_secs(60), || last_step(&out, 0) >= 2),
            "rank 0 never reached step 2"
        );
        write_plan(&plan, 1, &[20, 9, 3]);
        assert_all_ok(&wait_all(children, Duration::from_secs(120)));
        let got = load_weights(&out.join("model.safetensors"));
        assert_same_parameters(&want, &got, opt, opt);

        let logs: Vec<Vec<serde_json::Value>> = (0..3)
            .map(|r| steps(&log_records(&out, r)).into_iter().cloned().collect())
            .collect();
        let field = |r: usize, i: usize, k: &str| logs[r][i][k].as_u64().unwrap();
        // The update ran inside backward (the default) at every step of
        // every rank once the first plan was agreed, re-split included.
        for (r, log) in logs.iter().enumerate() {
            for s in &log[1..] {
                assert!(
                    s["updated_in_backward"].is_u64(),
                    "{opt}: rank {r} step {} updated after backward",
                    s["step"]
                );
            }
        }
        // Crossed an epoch boundary and switched plans before the end.
        assert!(
            logs[0].iter().any(|s| s["epoch"] == 1),
            "{opt}: one epoch only"
        );
        let last = logs[0].len() - 1;
        assert_eq!(field(0, last, "generation"), 1, "{opt}: never re-split");
        // Shards: the ranks within 10% of the largest batch own parts in
        // proportion to their batches, tiling every parameter.
        let shards =
            |i: usize| -> Vec<u64> { (0..3).map(|r| field(r, i, "optimizer_elements")).collect() };
        let (first, end) = (shards(0), shards(last));
        let total: u64 = first.iter().sum();
        assert_eq!(end.iter().sum::<u64>(), total, "{opt}: {first:?} {end:?}");
        assert!(
            first[0] > first[1] && first[2] == 0,
            "{opt}: (16, 15, 1) shards {first:?}"
        );
        assert!(
            (first[1] as f64 / total as f64 - 15.0 / 31.0).abs() < 1e-3,
            "{opt}: rank 1 updates {} of {total}",
            first[1]
        );
        assert_eq!(end, vec![total, 0, 0], "{opt}: (20, 9, 3) shards");
    }
}

/// A plan may leave a rank out (local batch 0): it sits out the gradient
/// exchange on a sub-group of the others and comes back later. 3 ranks:
/// (16, 8, 8), then (24, 0, 8) across an epoch boundary (evaluation while
/// rank 1 is out), then (20, 9, 3) — the same parameters as one process
/// with B = 32, with the update sharded and replicated. Each plan is
/// written as soon as the log says it is due (the first once training
/// runs, the second once rank 1 sat out a step of epoch 1), and each then
/// has 8 or more steps of room to land in (at 150 ms or more a step)
/// before the step it must land by, however late this thread gets the
/// CPU within that.
#[test]
fn equivalence_with_a_rank_left_out_and_brought_back() {
    for (opt, lr, sharding) in [
        ("sgd", "0.005", "proportional"),
        ("sgd", "0.005", "replicated"),
        ("adamw", "0.001", "proportional"),
        ("adamw", "0.001", "replicated"),
    ] {
        let what = format!("{opt}/{sharding}");
        let dir = tempfile::tempdir().unwrap();
        let with = |out: &Path| {
            let mut a = base("mlp", out);
            // 480 samples, 10% held out: 13 steps per epoch of B = 32.
            set_flag(&mut a, "--synthetic-samples", "480");
            // While rank 1 is out, plan changes land --control-lag-steps
            // (4) steps after rank 0 reads them: room for the last one.
            set_flag(&mut a, "--max-steps", "36");
            set_flag(&mut a, "--lr", lr);
            a.extend(args(&[
                "--optimizer",
                opt,
                "--optimizer-sharding",
                sharding,
            ]));
            a
        };
        let Setup {
            want,
            out,
            plan,
            args: mut a,
        } = reference_then_plan(dir.path(), with, &[16, 8, 8]);
        a.extend(args(&["--step-sleep-ms", "150"]));
        let children = spawn_ranks(3, &a);
        // Generation 1 lands 2 or 3 steps after the step rank 0 last
        // logged: by step 13 (the end of epoch 0) if written by step 10.
        assert!(
            wait_until(Duration::from_secs(60), || last_step(&out, 0) >= 2),
            "{what}: rank 0 never reached step 2"
        );
        write_plan(&plan, 1, &[24, 0, 8]);
        // Generation 2 once rank 1 has sat out a step of epoch 1 (from step
        // 14); it lands about 6 steps after it is written (the lag), so by
        // step 36 if written by step 30.
        let out_in_epoch_1 = || {
            std::fs::read_to_string(out.join("rank-1.jsonl"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .any(|s| s["event"] == "step" && s["generation"] == 1 && s["epoch"] == 1)
        };
        assert!(
            wait_until(Duration::from_secs(60), out_in_epoch_1),
            "{what}: rank 1 never sat out a step of epoch 1"
        );
        write_plan(&plan, 2, &[20, 9, 3]);
        assert_all_ok(&wait_all(children, Duration::from_secs(120)));
        let got = load_weights(&out.join("model.safetensors"));
        assert_same_parameters(&want, &got, opt, &what);

        let logs: Vec<Vec<serde_json::Value>> = (0..3)
            .map(|r| steps(&log_records(&out, r)).into_iter().cloned().collect())
            .collect();
        // Rank 1 sat out steps of generation 1 (no samples, no update share)
        // across the epoch boundary, and trained again under generation 2.
        let out_steps: Vec<&serde_json::Value> =
            logs[1].iter().filter(|s| s["generation"] == 1).collect();
        assert!(!out_steps.is_empty(), "{what}: generation 1 never ran");
        assert!(
            out_steps
                .iter()
                .all(|s| s["batch_size"] == 0 && s["optimizer_elements"] == 0),
            "{what}: rank 1 trained while left out: {out_steps:?}"
        );
        assert!(
            out_steps.iter().any(|s| s["epoch"] == 0) && out_steps.iter().any(|s| s["epoch"] == 1),
            "{what}: rank 1 was not out across the epoch boundary"
        );
        let last = &logs[1][logs[1].len() - 1];
        assert_eq!(last["generation"], 2, "{what}: never brought back");
        assert_eq!(last["batch_size"], 9, "{what}: {last}");
        if sharding == "proportional" {
            // Every rank with samples owns a part in proportion to its batch.
            let end: Vec<u64> = logs
                .iter()
                .map(|l| l[l.len() - 1]["optimizer_elements"].as_u64().unwrap())
                .collect();
            let total: u64 = end.iter().sum();
            assert!(
                end[0] > end[1] && end[1] > end[2] && end[2] > 0,
                "{what}: (20, 9, 3) shards {end:?}"
            );
            assert!(
                (end[2] as f64 / total as f64 - 3.0 / 32.0).abs() < 1e-3,
                "{what}: rank 2 updates {} of {total}",
                end[2]
            );
        }
        // Each rank evaluates a share of the held-out set in proportion to
        // its batch (rank 1 none while left out, with stale parameters):
        // the losses are still one process's.
        let evals = |dir: &Path| -> Vec<f64> {
            log_records(dir, 0)
                .iter()
                .filter(|e| e["event"] == "eval")
                .map(|e| e["eval_loss"].as_f64().unwrap())
                .collect()
        };
        let (one, three) = (evals(&dir.path().join("single")), evals(&out));
        assert!(
            one.len() >= 2 && one.len() == three.len(),
            "{what}: {one:?} {three:?}"
        );
        for (a, b) in one.iter().zip(&three) {
            assert!(
                (a - b).abs() <= 1e-5,
                "{what}: eval loss {b} vs one process {a}"
            );
        }
    }
}

/// Rank 0 alone trains (the other rank left out from the start): no
/// exchange at all, the same parameters as one process.
#[test]
fn rank_zero_alone_matches_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let want = single("mlp", dir.path());
    let out = dir.path().join("multi");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[32, 0]);
    let mut a = base("mlp", &out);
    a.extend(path_arg("--plan-file", &plan));
    run_ok(2, &a);
    let got = load_weights(&out.join("model.safetensors"));
    let d = max_abs_diff(&want, &got);
    assert!(d <= 1e-5, "max |Δparam| = {d:e}");
    let b1: Vec<u64> = steps(&log_records(&out, 1))
        .iter()
        .map(|x| x["batch_size"].as_u64().unwrap())
        .collect();
    assert_eq!(b1, vec![0; 20], "rank 1 batch sizes");
}

/// A left-out rank that stops answering (SIGSTOP: a CPU quota that stalls
/// it for a whole period, taken to the extreme) does not hold up the rank
/// that trains for `--control-lag-steps` steps: rank 0 gets 3 steps past
/// the stopped rank's last step, which it cannot without the lag (each
/// step would wait for the stopped rank's control word of that step, and
/// the stopped rank started at most one more). After SIGCONT the run ends
/// with one process's parameters.
#[test]
fn a_stalled_left_out_rank_does_not_hold_up_the_training_rank() {
    let dir = tempfile::tempdir().unwrap();
    let with = |out: &Path| {
        let mut a = base("mlp", out);
        // No epoch boundary (its evaluation is a collective of all ranks).
        set_flag(&mut a, "--synthetic-samples", "4096");
        set_flag(&mut a, "--max-steps", "40");
        a
    };
    let Setup {
        want,
        out,
        args: mut a,
        ..
    } = reference_then_plan(dir.path(), with, &[32, 0]);
    a.extend(args(&[
        "--step-sleep-ms",
        "100",
        "--control-lag-steps",
        "4",
    ]));
    let children = spawn_ranks(2, &a);
    let pid1 = children[1].id() as i32;
    assert!(
        wait_until(Duration::from_secs(60), || last_step(&out, 0) >= 5
            && last_step(&out, 1) >= 5),
        "the ranks never reached step 5"
    );
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(pid1, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_millis(300));
    let s1 = last_step(&out, 1);
    let ran_on = wait_until(Duration::from_secs(20), || last_step(&out, 0) >= s1 + 3);
    let (s0, s1_after) = (last_step(&out, 0), last_step(&out, 1));
    // SAFETY: as above.
    unsafe { libc::kill(pid1, libc::SIGCONT) };
    assert_all_ok(&wait_all(children, Duration::from_secs(120)));
    assert_eq!(s1, s1_after, "rank 1 was not stopped");
    assert!(
        ran_on,
        "rank 0 stayed at step {s0} while the left-out rank was stopped at {s1}"
    );
    let got = load_weights(&out.join("model.safetensors"));
    let d = max_abs_diff(&want, &got);
    assert!(d <= 1e-5, "max |Δparam| = {d:e}");
}
