//! Helpers for the integration tests: launch real trainer processes (one
//! per rank) on free loopback ports, read their logs and weights.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use tch::Tensor;

pub const BIN: &str = env!("CARGO_BIN_EXE_heterotrain-trainer");

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A command for one rank of a `world`-rank job.
pub fn rank_cmd(rank: usize, world: usize, port: u16, args: &[String]) -> Command {
    let mut c = Command::new(BIN);
    c.arg("train")
        .args(args)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        // No /metrics unless a test asks (`--metrics-port`): the default,
        // 0.0.0.0:9400, would take port 9400 on every loopback address and
        // answer for the simulated nodes' trainers of tests running beside.
        .env("HT_METRICS_PORT", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Start every rank.
pub fn spawn_ranks(world: usize, args: &[String]) -> Vec<Child> {
    let port = free_port();
    (0..world)
        .map(|r| {
            rank_cmd(r, world, port, args)
                .spawn()
                .expect("spawn trainer")
        })
        .collect()
}

/// Wait for every rank (killing all after `limit`).
pub fn wait_all(children: Vec<Child>, limit: Duration) -> Vec<Output> {
    let start = Instant::now();
    let mut children: Vec<Option<Child>> = children.into_iter().map(Some).collect();
    loop {
        let done = children.iter_mut().all(|c| {
            c.as_mut()
                .map(|c| c.try_wait().ok().flatten().is_some())
                .unwrap_or(true)
        });
        if done || start.elapsed() > limit {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children
        .iter_mut()
        .map(|c| {
            let mut c = c.take().expect("child");
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
            }
            c.wait_with_output().expect("output")
        })
        .collect()
}

/// Require every rank to have exited successfully (stderr in the message).
pub fn assert_all_ok(outs: &[Output]) {
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "rank {r} failed ({:?}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// Run a job to the end and require every rank to succeed.
pub fn run_ok(world: usize, args: &[String]) -> Vec<Output> {
    let outs = wait_all(spawn_ranks(world, args), Duration::from_secs(240));
    assert_all_ok(&outs);
    outs
}

pub fn args(s: &[&str]) -> Vec<String> {
    s.iter().map(|x| x.to_string()).collect()
}

pub fn path_arg(flag: &str, p: &Path) -> Vec<String> {
    vec![flag.to_string(), p.display().to_string()]
}

/// Named tensors of a safetensors file.
pub fn load_weights(p: &Path) -> HashMap<String, Tensor> {
    Tensor::read_safetensors(p)
        .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        .into_iter()
        .collect()
}

/// Largest absolute difference over all parameters (same names required).
/// The distributed run's parameters `got` against one process's `want`:
/// after SGD every element within 1e-5. AdamW divides each update by the
/// root of that element's squared-gradient average, so an element whose
/// gradient is at the level of float rounding (one process sums over B
/// inside one GEMM, the ranks add partial sums: another order) moves by an
/// amount the rounding decides, and which elements those are depends on the
/// CPU's kernels (seen: 1 of 196,608 at 2.3e-5 on an AVX-512 machine; 1,070
/// of 201,482 at up to 5.4e-5 on an AMD EPYC machine, replicated, a rank
/// left out and brought back). So after AdamW at most 1 element in 100 may
/// be off by more than 1e-5 and none by more than 1e-4, a tenth of one step
/// at lr 1e-3: misplaced optimizer state moves elements by about lr, which
/// the bound of 1e-4 catches whatever their number.
pub fn assert_same_parameters(
    want: &HashMap<String, Tensor>,
    got: &HashMap<String, Tensor>,
    optimizer: &str,
    what: &str,
) {
    let d = max_abs_diff(want, got);
    let (mut over, mut total) = (0i64, 0i64);
    for (n, t) in want {
        over += (t - &got[n])
            .abs()
            .gt(1e-5)
            .sum(tch::Kind::Int64)
            .int64_value(&[]);
        total += t.numel() as i64;
    }
    if optimizer == "adamw" {
        assert!(
            d <= 1e-4 && over <= total / 100,
            "{what}: max |Δparam| = {d:e}, {over} of {total} elements off by more than 1e-5"
        );
    } else {
        assert!(
            d <= 1e-5,
            "{what}: max |Δparam| = {d:e} ({over} elements over 1e-5)"
        );
    }
}

pub fn max_abs_diff(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) -> f64 {
    assert_eq!(
        {
            let mut k: Vec<_> = a.keys().collect();
            k.sort();
            k
        },
        {
            let mut k: Vec<_> = b.keys().collect();
            k.sort();
            k
        }
    );
    a.iter()
        .map(|(n, t)| (t - &b[n]).abs().max().double_value(&[]))
        .fold(0.0, f64::max)
}

/// JSON records of a rank's log.
pub fn log_records(dir: &Path, rank: usize) -> Vec<serde_json::Value> {
    let p = dir.join(format!("rank-{rank}.jsonl"));
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

pub fn steps(records: &[serde_json::Value]) -> Vec<&serde_json::Value> {
    records.iter().filter(|r| r["event"] == "step").collect()
}

pub fn write_plan(path: &Path, generation: u64, sizes: &[u32]) {
    let global: u32 = sizes.iter().sum();
    let text = serde_json::json!({
        "generation": generation,
        "globalBatchSize": global,
        "batchSizes": sizes,
        "policy": "test",
        "reason": "test"
    })
    .to_string();
    write_atomically(path, &text);
}

/// Python with torch/sklearn: $HETEROTRAIN_PYTHON, else the project venv
/// (`$HETEROTRAIN_CACHE/venv`, by default `~/.cache/heterotrain/venv`).
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("HETEROTRAIN_PYTHON") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("HETEROTRAIN_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/heterotrain")
        });
    cache.join("venv/bin/python")
}

/// The digits as MNIST IDX files (made once per test process, in a temp dir).
pub fn digits_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("heterotrain-digits-{}", std::process::id()));
    if dir.join("t10k-labels-idx1-ubyte").exists() {
        return dir;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/digits_to_idx.py");
    let out = Command::new(python())
        .arg(&script)
        .arg(&dir)
        .output()
        .expect("run python (set HETEROTRAIN_PYTHON)");
    assert!(
        out.status.success(),
        "digits_to_idx.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// Poll until `f` holds or `limit` passes.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Highest step logged by a rank so far (0 if none).
pub fn last_step(dir: &Path, rank: usize) -> u64 {
    let p = dir.join(format!("rank-{rank}.jsonl"));
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["event"] == "step")
        .filter_map(|r| r["step"].as_u64())
        .max()
        .unwrap_or(0)
}

/// Replace the value of `flag` in an argument list.
pub fn set_flag(a: &mut [String], flag: &str, value: &str) {
    let i = a.iter().position(|x| x == flag).expect("flag present");
    a[i + 1] = value.to_string();
}

/// A generated CIFAR-10 binary batch of `n` images (and a test batch of
/// 20) in `dir`: label `i % 10`, pixels near `label × 20`.
pub fn write_cifar(dir: &std::path::Path, n: usize) {
    let mut bytes = Vec::new();
    let mut state = 12345u32;
    for i in 0..n {
        let label = (i % 10) as u8;
        bytes.push(label);
        for _ in 0..3072 {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            bytes.push(label * 20 + (state >> 28) as u8);
        }
    }
    std::fs::write(dir.join("data_batch_1.bin"), &bytes).unwrap();
    std::fs::write(dir.join("test_batch.bin"), &bytes[..3073 * 20]).unwrap();
}

/// Replace `path` with `text` in one step (a temporary file renamed over
/// it), as a ConfigMap volume swaps its files: a reader never sees a torn
/// or empty file.
pub fn write_atomically(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write plan");
    std::fs::rename(&tmp, path).expect("rename plan");
}
