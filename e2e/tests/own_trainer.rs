//! End to end with the user's own trainer: a job whose `command` runs
//! `examples/own-model/train.py` — a plain PyTorch DDP script plus the
//! `heterotrain` Python library — as real processes on simulated nodes of
//! speed 1.0 and 0.33, under the real operator. The script reads the plan
//! ConfigMap through the ServiceAccount the simulator mounts (as a kubelet
//! does), serves `/metrics`, and is balanced like the built-in trainer.
//! The same job under `static` gives the speed-up the user guide quotes
//! (printed, not asserted: timings on a shared machine are no test). Then
//! a rank of the script is SIGKILLed mid-run: the gang is recreated and
//! resumes from the script's own checkpoint on the job's claim, not step 0.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use heterotrain_crds::{BatchPlan, HeteroTrainingJob, PLAN_KEY};
use heterotrain_e2e::nodesim::NodesFile;
use heterotrain_e2e::system::{System, SystemOptions};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;

const NODES: &str = r#"
nodes:
  - {name: fast, speed: 1.0, cpu: "1", memory: 4Gi}
  - {name: slow, speed: 0.33, cpu: "1", memory: 4Gi}
"#;

const STEPS: u32 = 800;
/// The static run only shows the equal split kept (its rate is printed for
/// a rough comparison; `make bench` measures the speed-up).
const STATIC_STEPS: u32 = 200;
const B: u32 = 128;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The project's Python with torch (`make setup`'s venv).
fn python() -> String {
    std::env::var("HETEROTRAIN_PYTHON").unwrap_or_else(|_| {
        panic!("HETEROTRAIN_PYTHON is not set: run through `make test` (it sources the set-up's env.sh)")
    })
}

/// Rank 0 on `fast`, rank 1 on `slow`, running the example script.
///
/// The simulated nodes share this machine's network namespace, and
/// PyTorch's TCPStore (rank 0's rendezvous) listens on every address: on
/// the default port it would collide with any other trainer of a cluster
/// running beside this one. A port claimed for this process avoids that
/// (in a real cluster each pod has its own network namespace).
fn job(name: &str, policy: &str, steps: u32) -> String {
    job_with(name, policy, steps, "{everySteps: 0}")
}

/// [`job`] with the given `checkpoint` section (YAML flow mapping).
fn job_with(name: &str, policy: &str, steps: u32, checkpoint: &str) -> String {
    let script = repo().join("examples/own-model/train.py");
    let script = script.canonicalize().unwrap_or(script);
    let master_port = heterotrain_e2e::ports::free_ports(1).expect("a free port")[0];
    format!(
        r#"apiVersion: heterotrain.dev/v1alpha1
kind: HeteroTrainingJob
metadata: {{name: {name}}}
spec:
  masterPort: {master_port}
  command: ["{python}", "{script}"]
  args: ["--steps", "{steps}", "--width", "4", "--threads", "1", "--log-every", "100"]
  workers:
    - name: fast
      replicas: 1
      nodeSelector: {{kubernetes.io/hostname: fast}}
      resources: {{requests: {{cpu: "1"}}, limits: {{cpu: "1"}}}}
    - name: slow
      replicas: 1
      nodeSelector: {{kubernetes.io/hostname: slow}}
      resources: {{requests: {{cpu: "1"}}, limits: {{cpu: "1"}}}}
  training: {{globalBatchSize: {B}, maxSteps: {steps}}}
  loadBalancing: {{policy: {policy}, rebalanceIntervalSteps: 5, minGainPercent: 5}}
  profiling: {{enabled: false}}
  checkpoint: {checkpoint}
"#,
        python = python(),
        script = script.display(),
    )
}

async fn plan_of(system: &System, ns: &str, job: &str) -> BatchPlan {
    let cms: Api<ConfigMap> = Api::namespaced(system.client().await.expect("client"), ns);
    let cm = cms.get(&format!("{job}-plan")).await.expect("plan");
    let text = cm.data.unwrap_or_default().get(PLAN_KEY).cloned();
    serde_json::from_str(&text.unwrap_or_default()).expect("plan json")
}

fn phase(j: &HeteroTrainingJob) -> &str {
    j.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// `kubectl heterotrain top <job> --once`, with only a kubeconfig.
fn top(system: &System, ns: &str, job: &str) -> String {
    let exe = std::env::current_exe().expect("test binary");
    let bin = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join("kubectl-heterotrain"))
        .find(|p| p.is_file())
        .expect("kubectl-heterotrain built beside the tests (cargo test --workspace)");
    let out = Command::new(bin)
        .args(["-n", ns, "top", job, "--once", "--interval", "1"])
        .env("KUBECONFIG", system.cluster.kubeconfig_path())
        .output()
        .expect("run kubectl-heterotrain");
    assert!(
        out.status.success(),
        "kubectl heterotrain top failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// Run the job under `policy` to Succeeded; its samples/s in the second
/// half of the run, and its final plan.
async fn run(
    system: &System,
    ns: &str,
    policy: &str,
    steps: u32,
) -> Result<(f64, BatchPlan), String> {
    system
        .create_namespace(ns)
        .await
        .map_err(|e| e.to_string())?;
    system
        .create_job(ns, &job("own", policy, steps))
        .await
        .map_err(|e| e.to_string())?;
    let wait = Duration::from_secs(300);
    let half = system
        .wait_job(ns, "own", wait, "past half-way with a throughput", |j| {
            j.status.as_ref().is_some_and(|s| {
                s.step >= u64::from(steps / 2) && s.cluster_samples_per_second.is_some()
            })
        })
        .await
        .map_err(|e| e.to_string())?;
    let rate = half
        .status
        .as_ref()
        .and_then(|s| s.cluster_samples_per_second)
        .unwrap_or(0.0);
    if policy == "dynamic" {
        // While it runs: the plugin shows both ranks with their batches.
        let view = top(system, ns, "own");
        for pod in ["own-0", "own-1"] {
            if !view.contains(pod) {
                return Err(format!("top does not show {pod}:\n{view}"));
            }
        }
    }
    let done = system
        .wait_job(ns, "own", wait, "Succeeded", |j| phase(j) == "Succeeded")
        .await
        .map_err(|e| e.to_string())?;
    let st = done.status.clone().unwrap_or_default();
    if st.step != u64::from(steps) || st.groups.len() != 2 {
        return Err(format!(
            "finished at step {} with groups {:?}",
            st.step, st.groups
        ));
    }
    Ok((rate, plan_of(system, ns, "own").await))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_trainer_script_is_balanced_like_the_builtin() {
    let nodes = NodesFile::parse(NODES).expect("nodes");
    let mut system = System::start(SystemOptions {
        operator_args: vec![
            "--scrape-interval=1".into(),
            "--rebalance-interval=1".into(),
        ],
        verbose: true,
        ..SystemOptions::new("own", nodes)
    })
    .await
    .expect("start the system");

    let dynamic = run(&system, "own-dynamic", "dynamic", STEPS).await;
    let (dyn_rate, plan) = match dynamic {
        Ok(r) => r,
        Err(e) => panic!(
            "dynamic: {e}\n--- dump ---\n{}",
            system.dump("own-dynamic").await
        ),
    };
    let (fast, slow) = (plan.batch_sizes[0], plan.batch_sizes[1]);
    eprintln!(
        "own trainer, dynamic: final plan gen {} {:?}, {dyn_rate:.0} samples/s past half-way ({})",
        plan.generation, plan.batch_sizes, plan.reason
    );
    assert!(plan.generation >= 1, "never rebalanced: {plan:?}");
    // The nodes run 1.0 and 0.33 of a core: about 3 to 1 on a quiet
    // machine, less when the fast node's core is shared with other work.
    // The direction holds on any machine; the ratio is a benchmark figure.
    assert!(
        fast > slow,
        "fast rank {fast} not above slow rank {slow}: {plan:?}"
    );

    let (static_rate, plan) = match run(&system, "own-static", "static", STATIC_STEPS).await {
        Ok(r) => r,
        Err(e) => panic!(
            "static: {e}\n--- dump ---\n{}",
            system.dump("own-static").await
        ),
    };
    assert_eq!(
        plan.batch_sizes,
        [B / 2, B / 2],
        "static keeps the equal split"
    );
    eprintln!(
        "own trainer: dynamic {dyn_rate:.0} samples/s vs static {static_rate:.0} samples/s: {:.2}× (one run, shared machine)",
        dyn_rate / static_rate.max(f64::MIN_POSITIVE)
    );
    if let Err(e) = killed_and_resumed(&system).await {
        panic!(
            "killed and resumed: {e}\n--- dump ---\n{}",
            system.dump("own-killed").await
        );
    }
    system.stop().await;
}

/// Rank 1 of the script SIGKILLed at step 60 or later: one restart, and rank 0 of
/// the new gang resumes after a step the first gang checkpointed (every
/// 20 steps on the claim `ckpt`), then the job ends `Succeeded`.
async fn killed_and_resumed(system: &System) -> Result<(), String> {
    let ns = "own-killed";
    system
        .create_namespace(ns)
        .await
        .map_err(|e| e.to_string())?;
    let client = system.client().await.map_err(|e| e.to_string())?;
    heterotrain_e2e::volumes::create_claim(&client, system.sim.state_dir(), ns, "ckpt")
        .await
        .map_err(|e| e.to_string())?;
    let spec = job_with(
        "own",
        "dynamic",
        STATIC_STEPS,
        "{everySteps: 20, claimName: ckpt}",
    );
    system
        .create_job(ns, &spec)
        .await
        .map_err(|e| e.to_string())?;
    let wait = Duration::from_secs(300);
    system
        .wait_job(ns, "own", wait, "step ≥ 60", |j| {
            j.status.as_ref().is_some_and(|s| s.step >= 60)
        })
        .await
        .map_err(|e| e.to_string())?;
    let log_path = heterotrain_e2e::nodesim::log_path(system.sim.state_dir(), ns, "own-0");
    let before = std::fs::read_to_string(&log_path).unwrap_or_default().len();
    if !system.sim.signal_pod(ns, "own-1", libc::SIGKILL).await {
        return Err("rank 1's process not found".into());
    }
    let done = system
        .wait_job(ns, "own", wait, "Succeeded", |j| phase(j) == "Succeeded")
        .await
        .map_err(|e| e.to_string())?;
    let st = done.status.clone().unwrap_or_default();
    if st.restarts != 1 || st.step != u64::from(STATIC_STEPS) {
        return Err(format!(
            "restarts {} (want 1), finished at step {}",
            st.restarts, st.step
        ));
    }
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let resumed: Vec<u64> = log
        .get(before.min(log.len())..)
        .unwrap_or(&log)
        .lines()
        .filter(|l| l.contains("resumed from"))
        .filter_map(|l| l.split("after step ").nth(1))
        .filter_map(|r| r.split_whitespace().next()?.parse().ok())
        .collect();
    eprintln!(
        "own trainer: rank 1 killed after step 60, the new gang resumed after step {resumed:?}"
    );
    if resumed.len() != 1 || resumed[0] < 40 || !resumed[0].is_multiple_of(20) {
        return Err(format!(
            "rank 0 of the new gang did not resume from a checkpoint of the first (resumed after {resumed:?}):\n{log}"
        ));
    }
    Ok(())
}
