//! `heterotrain-demo` (what `make demo` runs) end to end, on a control
//! plane of its own and a shorter job: it trains the quick-start job
//! balanced and with the equal split on the demo's simulated nodes and
//! prints the comparison the README shows; `--down` stops the cluster.

use std::collections::BTreeMap;
use std::process::Command;

/// Stops the test's cluster however the test ends.
struct Down(String);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = Command::new(env!("CARGO_BIN_EXE_heterotrain-demo"))
            .args(["--cluster", &self.0, "--down"])
            .status();
    }
}

/// The value after `label` on the summary line that starts with it.
fn line<'a>(out: &'a str, label: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {label:?} line in:\n{out}"))
}

/// The leading number of `s` ("1874.8 samples/s" → 1874.8).
fn number(s: &str) -> f64 {
    s.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|t| !t.is_empty())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no number in {s:?}"))
}

#[test]
fn the_demo_trains_balanced_and_equal_and_prints_the_comparison() {
    let cluster = format!("demo-test-{}", std::process::id());
    let dir = tempfile::tempdir().expect("temp dir");
    // The quick start, shorter: 200 steps (about 8 epochs of the digits).
    let mut job: serde_yaml::Value =
        serde_yaml::from_str(include_str!("../../examples/quickstart.yaml"))
            .expect("quickstart parses");
    job["spec"]["training"]["maxSteps"] = 200.into();
    let path = dir.path().join("job.yaml");
    std::fs::write(&path, serde_yaml::to_string(&job).expect("yaml")).expect("write job");

    let _down = Down(cluster.clone());
    let repo = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = Command::new(env!("CARGO_BIN_EXE_heterotrain-demo"))
        .current_dir(repo)
        .args(["--cluster", &cluster, "--namespace", "demo-test", "--job"])
        .arg(&path)
        .output()
        .expect("run heterotrain-demo");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "demo failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Both runs measured a throughput, and the speed-up is their ratio.
    let balanced = number(line(&text, "balanced throughput:"));
    let equal = number(line(&text, "equal-split throughput:"));
    let speed_up = number(line(&text, "speed-up:"));
    assert!(balanced > 0.0 && equal > 0.0, "{text}");
    assert!(
        (speed_up - balanced / equal).abs() < 0.01,
        "speed-up {speed_up} vs {balanced} / {equal}"
    );
    // The balanced plan gives the rank on the faster node the larger batch
    // (the demo's nodes: fast 0.8, medium 0.4, slow 0.25 of a core).
    let speed: BTreeMap<&str, f64> = [("fast", 0.8), ("medium", 0.4), ("slow", 0.25)].into();
    let nodes: BTreeMap<u32, String> = {
        let s = line(&text, "ranks on nodes:");
        s.trim_matches(|c| c == '{' || c == '}')
            .split(", ")
            .filter_map(|kv| {
                let (k, v) = kv.split_once(": ")?;
                Some((k.parse().ok()?, v.trim_matches('"').to_string()))
            })
            .collect()
    };
    let plan: Vec<u32> = line(&text, "final balanced plan:")
        .trim_matches(|c| c == '[' || c == ']')
        .split(", ")
        .map(|b| b.parse().expect("batch"))
        .collect();
    assert_eq!(plan.iter().sum::<u32>(), 64, "{text}");
    assert_eq!(nodes.len(), 2, "{text}");
    let (r0, r1) = (&nodes[&0], &nodes[&1]);
    if speed[r0.as_str()] != speed[r1.as_str()] {
        let faster = usize::from(speed[r1.as_str()] > speed[r0.as_str()]);
        assert!(
            plan[faster] > plan[1 - faster],
            "plan {plan:?} on nodes {nodes:?}:\n{text}"
        );
    }
    // Both runs learned the digits: held-out accuracy far above chance (10%).
    let acc = line(&text, "held-out accuracy:");
    // "97.0% of 300 balanced (…), 96.3% of 300 equal split".
    let accs: Vec<f64> = acc
        .match_indices("% of")
        .map(|(i, _)| {
            let head = &acc[..i];
            let start = head
                .rfind(|c: char| !(c.is_ascii_digit() || c == '.'))
                .map_or(0, |k| k + 1);
            number(&head[start..])
        })
        .collect();
    assert_eq!(accs.len(), 2, "{acc}");
    assert!(accs.iter().all(|&a| a >= 50.0), "{acc}");
    assert!(acc.contains("of 300"), "{acc}");
    assert!(text.contains(&format!("heterotrain-demo --cluster {cluster} --down")));
}
