//! Failure behaviour a user sees: a rank that never arrives, invalid plan
//! files at start (refused) and mid-run (ignored, old plan kept), bad flags.

mod common;

use std::time::{Duration, Instant};

use common::*;

fn small(out: &std::path::Path) -> Vec<String> {
    let mut a = args(&[
        "--model",
        "mlp",
        "--synthetic-samples",
        "256",
        "--hidden",
        "16",
        "--batch-size",
        "32",
        "--threads",
        "1",
        "--max-steps",
        "3",
    ]);
    a.extend(path_arg("--output-dir", out));
    a
}

/// How long a rank may take, start-up included, to give up on a rendezvous
/// given a timeout of a few seconds: generous for a loaded machine, and
/// still far below the default `--rendezvous-timeout-secs` (300 s), so a
/// flag that were ignored fails the test (the ranks are killed at twice
/// this, and then report no exit code).
const GIVE_UP_WITHIN: Duration = Duration::from_secs(60);

#[test]
fn missing_rank_fails_others_within_rendezvous_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = small(dir.path());
    a.extend(args(&["--rendezvous-timeout-secs", "3"]));
    let port = free_port();
    let start = Instant::now();
    // WORLD_SIZE 3, rank 2 never starts.
    let children: Vec<_> = (0..2)
        .map(|r| rank_cmd(r, 3, port, &a).spawn().unwrap())
        .collect();
    let outs = wait_all(children, 2 * GIVE_UP_WITHIN);
    let took = start.elapsed();
    assert!(took < GIVE_UP_WITHIN, "took {took:?}");
    for (r, o) in outs.iter().enumerate() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "rank {r}: {err}");
        assert!(
            err.contains(&format!(
                "error: rank {r}: rendezvous failed: rank 2 did not join"
            )),
            "rank {r}: {err}"
        );
    }
}

#[test]
fn worker_without_master_fails_within_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = small(dir.path());
    a.extend(args(&["--rendezvous-timeout-secs", "2"]));
    let start = Instant::now();
    let o = wait_all(
        vec![rank_cmd(1, 2, free_port(), &a).spawn().unwrap()],
        2 * GIVE_UP_WITHIN,
    );
    assert!(
        start.elapsed() < GIVE_UP_WITHIN,
        "took {:?}",
        start.elapsed()
    );
    let err = String::from_utf8_lossy(&o[0].stderr);
    assert_eq!(o[0].status.code(), Some(1), "{err}");
    assert!(
        err.contains("error: rank 1: rendezvous failed: rendezvous with rank 0 at 127.0.0.1:"),
        "{err}"
    );
}

#[test]
fn invalid_plan_files_are_refused_at_start() {
    let cases = [
        (
            r#"{"generation":0,"globalBatchSize":32,"batchSizes":[32]}"#,
            "has 1 batch sizes but WORLD_SIZE is 2",
        ),
        (
            r#"{"generation":0,"globalBatchSize":32,"batchSizes":[0,32]}"#,
            "rank 0 a local batch of 0",
        ),
        (
            r#"{"generation":0,"globalBatchSize":32,"batchSizes":[20,9]}"#,
            "sum to 29 but globalBatchSize is 32",
        ),
        ("not json at all", "not valid JSON"),
        (
            r#"{"generation":0,"globalBatchSize":64,"batchSizes":[32,32]}"#,
            "globalBatchSize is 64 but this job trains with 32",
        ),
    ];
    for (text, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let plan = dir.path().join("plan.json");
        std::fs::write(&plan, text).unwrap();
        let mut a = small(dir.path());
        a.extend(path_arg("--plan-file", &plan));
        a.extend(args(&["--rendezvous-timeout-secs", "5"]));
        let o = wait_all(
            vec![rank_cmd(0, 2, free_port(), &a).spawn().unwrap()],
            Duration::from_secs(30),
        );
        let err = String::from_utf8_lossy(&o[0].stderr);
        assert_eq!(o[0].status.code(), Some(1), "{text}: {err}");
        assert!(
            err.starts_with("error: rank 0: invalid configuration: plan file"),
            "{err}"
        );
        assert!(err.contains(want), "{text}: wanted {want:?} in {err}");
        assert_eq!(err.lines().count(), 1, "one-line error: {err}");
    }
}

#[test]
fn invalid_plan_mid_run_is_ignored_and_later_valid_plan_applies() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let plan = dir.path().join("plan.json");
    write_plan(&plan, 0, &[24, 8]);
    let mut a = small(&out);
    // The valid plan is written after about 12 steps (4, then 2 per bad
    // plan) and lands a few steps after the write (at the next control
    // word): 60 steps leave room for this thread to get the CPU late.
    set_flag(&mut a, "--max-steps", "60");
    a.extend(path_arg("--plan-file", &plan));
    a.extend(args(&["--step-sleep-ms", "60", "--epochs", "100"]));
    let children = spawn_ranks(2, &a);
    assert!(wait_until(Duration::from_secs(60), || last_step(&out, 0) >= 4));
    for bad in [
        "garbage".to_string(),
        r#"{"generation":1,"globalBatchSize":32,"batchSizes":[0,32]}"#.to_string(),
        r#"{"generation":1,"globalBatchSize":32,"batchSizes":[30,1,1]}"#.to_string(),
        r#"{"generation":1,"globalBatchSize":32,"batchSizes":[20,9]}"#.to_string(),
    ] {
        // Two steps past the one logged once the file is written: the
        // second of them started after the write, so rank 0 read this plan
        // before the next one replaces it.
        write_atomically(&plan, &bad);
        let after = last_step(&out, 0);
        assert!(wait_until(Duration::from_secs(60), || last_step(&out, 0) >= after + 2));
    }
    let before_valid = last_step(&out, 0);
    write_plan(&plan, 1, &[4, 28]);
    let outs = wait_all(children, Duration::from_secs(120));
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "rank {r}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let err0 = String::from_utf8_lossy(&outs[0].stderr);
    assert_eq!(
        err0.matches("warning: ignoring proposed plan").count(),
        4,
        "{err0}"
    );
    let r0 = steps(&log_records(&out, 0))
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    let r1 = log_records(&out, 1);
    let r1 = steps(&r1);
    assert_eq!(r0.len(), 60);
    assert_eq!(r0.last().unwrap()["invalid_plans"], 4);
    for (s0, s1) in r0.iter().zip(r1.iter()) {
        let g = s0["generation"].as_u64().unwrap();
        assert_eq!(
            g,
            s1["generation"].as_u64().unwrap(),
            "ranks agree at step {}",
            s0["step"]
        );
        let want = if g == 0 { (24, 8) } else { (4, 28) };
        assert_eq!(
            (
                s0["batch_size"].as_u64().unwrap(),
                s1["batch_size"].as_u64().unwrap()
            ),
            want
        );
        if s0["step"].as_u64().unwrap() <= before_valid {
            assert_eq!(g, 0, "invalid plans never applied");
        }
    }
    assert_eq!(
        r0.last().unwrap()["generation"],
        1,
        "valid plan applied after invalid ones"
    );
}

#[test]
fn bad_flags_give_a_clear_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = small(dir.path());
    set_flag(&mut a, "--batch-size", "1");
    let o = wait_all(
        vec![rank_cmd(0, 2, free_port(), &a).spawn().unwrap()],
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&o[0].stderr);
    assert_eq!(o[0].status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "error: rank 0: invalid configuration: --batch-size 1 is smaller than WORLD_SIZE 2"
        ),
        "{err}"
    );
    let mut a = small(dir.path());
    a.extend(args(&["--dataset", "mnist"]));
    let o = wait_all(
        vec![rank_cmd(0, 1, free_port(), &a).spawn().unwrap()],
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&o[0].stderr);
    assert!(err.contains("--data-dir is required"), "{err}");
    assert_eq!(o[0].status.code(), Some(1));
}

/// A flag the trainer does not know, or a value that does not parse, is a
/// usage error: exit 2 (one of `permanentExitCodes`' defaults, so the
/// operator does not restart a gang that can never start).
#[test]
fn usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, value, phrase) in [
        (
            "--no-such-flag",
            "1",
            "unexpected argument '--no-such-flag'",
        ),
        (
            "--max-steps",
            "many",
            "invalid value 'many' for '--max-steps",
        ),
        (
            "--rendezvous-timeout-secs",
            "18446744073709551615",
            "invalid value '18446744073709551615' for '--rendezvous-timeout-secs",
        ),
    ] {
        let mut a = small(dir.path());
        if a.iter().any(|x| x == flag) {
            set_flag(&mut a, flag, value);
        } else {
            a.extend(args(&[flag, value]));
        }
        let o = wait_all(
            vec![rank_cmd(0, 1, free_port(), &a).spawn().unwrap()],
            Duration::from_secs(30),
        );
        let err = String::from_utf8_lossy(&o[0].stderr);
        assert_eq!(o[0].status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains(phrase), "{flag}: {err}");
    }
}

/// A panic inside libtorch's bindings (here an allocation of petabytes
/// for the model's first layer) is one `error: rank r:` line and exit 1,
/// like every other error — not a Rust backtrace and exit 101.
#[test]
fn a_panic_is_one_error_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = small(dir.path());
    set_flag(&mut a, "--hidden", "1099511627776");
    let o = wait_all(
        vec![rank_cmd(0, 1, free_port(), &a).spawn().unwrap()],
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&o[0].stderr);
    assert_eq!(o[0].status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("error: ") || l.contains("panicked"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("error: rank 0: "), "{err}");
    // libtorch's message without its C++ stack.
    assert!(lines[0].contains("can't allocate memory"), "{err}");
    assert!(!lines[0].contains("frame #"), "{}", lines[0]);
    assert!(!err.contains("RUST_BACKTRACE"), "{err}");
}
