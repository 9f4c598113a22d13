//! The chaos suite: what a real cluster does to a training job, on the
//! local control plane with real trainers, each case an assertion on what
//! a user sees — the job `Succeeded` (or fails for the stated reason),
//! restarts counted toward `backoffLimit` only for failures, and at most one
//! checkpoint interval of steps lost per kill. Prints a table (case,
//! outcome, restarts counted, disruptions, lost steps, seconds) and writes
//! it to `$HETEROTRAIN_CACHE/results/chaos.md`.
//!
//! `make chaos` runs it with 20 kills (`HETEROTRAIN_CHAOS_KILLS`); `make
//! test` runs the same cases with 3. `HETEROTRAIN_CHAOS_ONLY=a,b` picks
//! cases. The cases that disturb only their own job run two at a time
//! (the pool holds two gangs); the control-plane and node cases run alone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use heterotrain_crds::HeteroTrainingJob;
use heterotrain_e2e::audit;
use heterotrain_e2e::nodesim::NodesFile;
use heterotrain_e2e::proxy::CutProxy;
use heterotrain_e2e::system::{replica_kubeconfig, System, SystemOptions, OPERATOR_NAMESPACE};
use heterotrain_e2e::wait::eventually;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

const NODES: &str = r#"
nodes:
  - {name: chaos-a, speed: 0.25, cpu: "1", memory: 4Gi, labels: {pool: chaos}}
  - {name: chaos-b, speed: 0.25, cpu: "1", memory: 4Gi, labels: {pool: chaos}}
  - {name: chaos-c, speed: 0.25, cpu: "1", memory: 4Gi, labels: {pool: chaos}}
  - {name: chaos-d, speed: 0.25, cpu: "1", memory: 4Gi, labels: {pool: chaos}}
  - {name: chaos-e, speed: 0.25, cpu: "1", memory: 4Gi, labels: {pool: chaos}}
  - {name: chaos-f, speed: 0.25, cpu: "1", memory: 4Gi, labels: {pool: chaos}}
"#;

/// Checkpoint interval of the jobs here (steps).
const EVERY: u64 = 10;
const METRICS_PORT: u16 = 9400;

/// A 2-rank job on the `chaos` pool with a checkpoint claim `ckpt`.
fn job(name: &str, steps: u64, run_policy: &str, pool: &str) -> String {
    paced_job(name, steps, run_policy, pool, 0)
}

/// [`job`] with a pause of `sleep_ms` after every step (`HT_STEP_SLEEP_MS`):
/// at most `1000 / sleep_ms` steps per second however fast the machine.
fn paced_job(name: &str, steps: u64, run_policy: &str, pool: &str, sleep_ms: u64) -> String {
    format!(
        r#"apiVersion: heterotrain.dev/v1alpha1
kind: HeteroTrainingJob
metadata: {{name: {name}}}
spec:
  workers:
    - name: cpu
      replicas: 2
      threads: 1
      nodeSelector: {{pool: {pool}}}
      env: [{{name: HT_STEP_SLEEP_MS, value: "{sleep_ms}"}}]
      resources: {{requests: {{cpu: "1"}}, limits: {{cpu: "1"}}}}
  model: {{name: simple_cnn}}
  dataset: {{name: synthetic_image, syntheticSamples: 4096}}
  training: {{globalBatchSize: 64, maxSteps: {steps}, learningRate: "0.02", momentum: "0.9", seed: 1}}
  loadBalancing: {{policy: static}}
  profiling: {{enabled: false}}
  checkpoint: {{everySteps: {EVERY}, claimName: ckpt}}
  metricsPort: {METRICS_PORT}
  runPolicy: {run_policy}
"#
    )
}

/// One row of the results table.
struct Row {
    case: &'static str,
    outcome: String,
    counted: u32,
    disruptions: u32,
    lost: String,
    seconds: f64,
}

fn selected(case: &str) -> bool {
    match std::env::var("HETEROTRAIN_CHAOS_ONLY") {
        Ok(list) if !list.is_empty() => list.split(',').any(|s| s.trim() == case),
        _ => true,
    }
}

/// The pause after each step of a job that must outlive a disruption:
/// such a job trains at most `1000 / PACE_MS` steps per second on any
/// machine, so its length in steps bounds its length in time from below.
const PACE_MS: u64 = 500;

/// Seconds a paced job must still train after its disruption ends (the
/// checks between the end and [`still_training`]).
const OUTLIVE_MARGIN_S: u64 = 45;

/// Steps of a paced job (see [`PACE_MS`]) that must still train when a
/// disruption of `seconds`, starting at its step 15, has ended, which
/// [`still_training`] checks, so a case cannot pass vacuously. A bound, not
/// a measurement: however fast the machine, the gang cannot take these
/// steps in less than `seconds` + [`OUTLIVE_MARGIN_S`].
fn outlive_steps(seconds: u64) -> u64 {
    15 + (seconds + OUTLIVE_MARGIN_S) * 1000 / PACE_MS
}

/// Err when job `name` has already finished: the disruption just ended
/// and the case is only meaningful if the gang was still training.
async fn still_training(system: &System, ns: &str, name: &str) -> Result<(), String> {
    let api: Api<HeteroTrainingJob> = Api::namespaced(system.client().await.map_err(err)?, ns);
    let j = api.get(name).await.map_err(err)?;
    let phase = j.status.and_then(|s| s.phase).unwrap_or_default();
    if phase == "Succeeded" || phase == "Failed" {
        return Err(format!(
            "job {name} was already {phase} when the disruption ended: give it more steps"
        ));
    }
    Ok(())
}

fn succeeded(j: &HeteroTrainingJob) -> bool {
    j.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The job's pods by rank (current gang only: not being deleted).
async fn rank_pods(system: &System, ns: &str) -> Result<BTreeMap<u32, Pod>, String> {
    let api: Api<Pod> = Api::namespaced(system.client().await.map_err(err)?, ns);
    let list = api.list(&ListParams::default()).await.map_err(err)?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let r = p
                .metadata
                .labels
                .as_ref()?
                .get("heterotrain.dev/rank")?
                .parse()
                .ok()?;
            Some((r, p))
        })
        .collect())
}

/// `heterotrain_step` read from a rank's own `/metrics` (the step now, not
/// as last scraped).
fn live_step(ip: &str) -> Option<u64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect((ip, METRICS_PORT)).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    // Read what comes until the server closes or goes quiet (a keep-alive
    // server may not close): a timeout ends the read, not the answer.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if raw.windows(18).any(|w| w == b"\nheterotrain_step ") && raw.ends_with(b"\n") {
            break;
        }
    }
    let body = String::from_utf8_lossy(&raw);
    body.lines()
        .find(|l| l.starts_with("heterotrain_step ") || l.starts_with("heterotrain_step{"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Wait until the current gang's rank 0 reports a step ≥ `min`; its IP and step.
async fn wait_step(
    system: &System,
    ns: &str,
    min: u64,
) -> Result<(BTreeMap<u32, Pod>, u64), String> {
    eventually(
        &format!("step ≥ {min} in {ns}"),
        Duration::from_secs(240),
        Duration::from_millis(300),
        || async {
            let pods = rank_pods(system, ns).await.map_err(anyhow::Error::msg)?;
            let ip = pods.get(&0).and_then(|p| p.status.as_ref()?.pod_ip.clone());
            let step = ip.as_deref().and_then(live_step);
            if std::env::var("HETEROTRAIN_CHAOS_DEBUG").is_ok() {
                eprintln!(
                    "wait_step {ns}: {} pods, rank 0 at {ip:?}, step {step:?}",
                    pods.len()
                );
            }
            Ok(step.filter(|s| *s >= min).map(|s| (pods, s)))
        },
    )
    .await
    .map_err(err)
}

/// Steps each gang of `ns` resumed from, in order (rank 0's log).
fn resumed_from(system: &System, ns: &str, job: &str) -> Vec<u64> {
    let log = std::fs::read_to_string(heterotrain_e2e::nodesim::log_path(
        system.sim.state_dir(),
        ns,
        &format!("{job}-0"),
    ))
    .unwrap_or_default();
    log.lines()
        .filter_map(|l| l.split("resuming from checkpoint at step ").nth(1))
        .filter_map(|r| r.split_whitespace().next()?.parse().ok())
        .collect()
}

/// Evict `pod` through the Eviction API (policy/v1beta1 on this 1.20 server).
async fn evict(system: &System, ns: &str, pod: &str) -> Result<(), String> {
    let client = system.client().await.map_err(err)?;
    let body = serde_json::json!({
        "apiVersion": "policy/v1beta1", "kind": "Eviction",
        "metadata": {"name": pod, "namespace": ns}
    });
    let req = http::Request::post(format!("/api/v1/namespaces/{ns}/pods/{pod}/eviction"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&body).map_err(err)?)
        .map_err(err)?;
    client.request_text(req).await.map(drop).map_err(err)
}

async fn counts(system: &System, ns: &str, name: &str) -> Result<(u32, u32), String> {
    let api: Api<HeteroTrainingJob> = Api::namespaced(system.client().await.map_err(err)?, ns);
    let st = api.get(name).await.map_err(err)?.status.unwrap_or_default();
    Ok((
        st.restarts - st.disruptions.min(st.restarts),
        st.disruptions,
    ))
}

/// K kills across a run — SIGKILL, SIGTERM and Eviction API in turn, on a
/// rank picked by a fixed sequence — each after the new gang has trained
/// past its resume point; Succeeded, evictions and SIGTERMs not counted,
/// at most one checkpoint interval lost per kill.
async fn kills(system: &System, ns: &str, k: u32) -> Result<Row, String> {
    let t0 = Instant::now();
    let steps = 40 * u64::from(k) + 200;
    let rp = format!("{{backoffLimit: {k}}}");
    system
        .create_job(ns, &job("j", steps, &rp, "chaos"))
        .await
        .map_err(err)?;
    let mut at_kill = Vec::new();
    let (mut sigkills, mut disruptive) = (0u32, 0u32);
    let mut min = 15;
    for i in 0..k {
        let (pods, step) = wait_step(system, ns, min).await?;
        let rank = (i * 7 + 3) % 2;
        let pod = pods
            .get(&rank)
            .and_then(|p| p.metadata.name.clone())
            .ok_or("no pod")?;
        match i % 3 {
            0 => {
                system.sim.signal_pod(ns, &pod, libc::SIGKILL).await;
                sigkills += 1;
            }
            1 => {
                system.sim.signal_pod(ns, &pod, libc::SIGTERM).await;
                disruptive += 1;
            }
            _ => {
                evict(system, ns, &pod).await?;
                disruptive += 1;
            }
        }
        at_kill.push(step);
        // The next kill once the new gang runs and has passed this point.
        let restarted = i + 1;
        eventually(
            "the gang recreated",
            Duration::from_secs(240),
            Duration::from_millis(300),
            || async {
                let api: Api<HeteroTrainingJob> = Api::namespaced(system.client().await?, ns);
                let st = api.get("j").await?.status.unwrap_or_default();
                Ok((st.restarts >= restarted).then_some(()))
            },
        )
        .await
        .map_err(err)?;
        min = step + 5;
    }
    let job = system
        .wait_job(ns, "j", Duration::from_secs(600), "Succeeded", succeeded)
        .await
        .map_err(err)?;
    let st = job.status.unwrap_or_default();
    let (counted, disruptions) = counts(system, ns, "j").await?;
    let resumed = resumed_from(system, ns, "j");
    if resumed.len() < at_kill.len() {
        return Err(format!(
            "{} resumes logged for {} kills: {resumed:?}",
            resumed.len(),
            at_kill.len()
        ));
    }
    // The last `k` resumes follow the kills in order.
    let tail = &resumed[resumed.len() - at_kill.len()..];
    let lost: Vec<u64> = at_kill
        .iter()
        .zip(tail)
        .map(|(k, r)| k.saturating_sub(*r))
        .collect();
    let worst = lost.iter().copied().max().unwrap_or(0);
    if st.restarts != k || counted != sigkills || disruptions != disruptive {
        return Err(format!(
            "restarts {} (counted {counted}, disruptions {disruptions}); wanted {k} ({sigkills} SIGKILL counted, {disruptive} SIGTERM/evictions not)",
            st.restarts
        ));
    }
    // A kill lands between checkpoints: at most one interval (+1 for the
    // step that may finish between reading the step and the signal).
    if worst > EVERY + 1 {
        return Err(format!(
            "lost {lost:?} steps at kills {at_kill:?} (resumed at {tail:?})"
        ));
    }
    Ok(Row {
        case: "kills",
        outcome: format!("Succeeded after {k} kills (SIGKILL, SIGTERM, eviction)"),
        counted,
        disruptions,
        lost: format!("max {worst}, total {}", lost.iter().sum::<u64>()),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// A rank SIGSTOPped: the progress watchdog restarts the gang (counted).
async fn hung_rank(system: &System, ns: &str) -> Result<Row, String> {
    // The watchdog also counts from the gang's start: a deadline that a
    // slow start on a loaded machine can pass would restart a healthy gang
    // and count a second restart. 90 s is far past any start here, and
    // far under the ranks' own collectiveTimeoutSeconds (900), so the one
    // restart is the watchdog's, for the stopped rank.
    const DEADLINE_S: u64 = 90;
    let t0 = Instant::now();
    system
        .create_job(
            ns,
            &job(
                "j",
                150,
                &format!(
                    "{{backoffLimit: 2, progressDeadlineSeconds: {DEADLINE_S}, collectiveTimeoutSeconds: 900}}"
                ),
                "chaos",
            ),
        )
        .await
        .map_err(err)?;
    let (pods, step) = wait_step(system, ns, 20).await?;
    let pod = pods
        .get(&1)
        .and_then(|p| p.metadata.name.clone())
        .ok_or("no rank 1")?;
    system.sim.signal_pod(ns, &pod, libc::SIGSTOP).await;
    let stopped = Instant::now();
    let job = system
        .wait_job(ns, "j", Duration::from_secs(600), "Succeeded", succeeded)
        .await
        .map_err(err)?;
    let (counted, disruptions) = counts(system, ns, "j").await?;
    let st = job.status.unwrap_or_default();
    if st.restarts != 1 || counted != 1 {
        return Err(format!(
            "restarts {} counted {counted}: wanted one counted restart",
            st.restarts
        ));
    }
    let resumed = resumed_from(system, ns, "j");
    let lost = resumed.last().map_or(step, |r| step.saturating_sub(*r));
    Ok(Row {
        case: "hung rank (SIGSTOP)",
        outcome: format!(
            "watchdog restart (progressDeadlineSeconds {DEADLINE_S}), Succeeded {:.0}s after the stop",
            stopped.elapsed().as_secs_f64()
        ),
        counted,
        disruptions,
        lost: lost.to_string(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Gangs that cannot start — a selector no node matches, an image that
/// cannot be pulled, a checkpoint claim that does not exist — each named
/// in the `Running` condition within `NAMED_WITHIN` (the scheduler's or
/// the kubelet's words), each job `Failed` (`PodsNotReady`) after
/// `podsReadyTimeoutSeconds` (`PODS_READY_S`: no sooner than the naming
/// window ends, so a job cannot fail before the check sees its reason).
async fn not_ready(system: &System, ns: &str) -> Result<Row, String> {
    const NAMED_WITHIN: Duration = Duration::from_secs(60);
    const PODS_READY_S: u64 = 60;
    let t0 = Instant::now();
    let base = job(
        "sel",
        50,
        &format!("{{podsReadyTimeoutSeconds: {PODS_READY_S}}}"),
        "nowhere",
    );
    let cases = [
        ("sel", base.clone(), "Unschedulable", "Unschedulable"),
        (
            "img",
            base.replace("name: sel}", "name: img}").replace(
                "nodeSelector: {pool: nowhere}",
                "nodeSelector: {pool: chaos}\n      image: registry.invalid/heterotrain-trainer:0",
            ),
            "ImagePullBackOff",
            "registry.invalid/heterotrain-trainer:0",
        ),
        (
            "pvc",
            base.replace("name: sel}", "name: pvc}")
                .replace(
                    "nodeSelector: {pool: nowhere}",
                    "nodeSelector: {pool: chaos}",
                )
                .replace("claimName: ckpt", "claimName: missing"),
            "Unschedulable",
            "\"missing\"",
        ),
    ];
    for (_, yaml, _, _) in &cases {
        system.create_job(ns, yaml).await.map_err(err)?;
    }
    let mut named = Vec::new();
    for (name, _, reason, detail) in &cases {
        let found = system
            .wait_job(
                ns,
                name,
                NAMED_WITHIN
                    .saturating_sub(t0.elapsed())
                    .max(Duration::from_secs(1)),
                &format!("Running=False {reason}"),
                |j| {
                    j.status.as_ref().is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == "Running" && c.reason == *reason)
                    })
                },
            )
            .await
            .map_err(err)?;
        let msg = found
            .status
            .unwrap_or_default()
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Running")
            .map(|c| c.message)
            .unwrap_or_default();
        let rank0 = format!("rank 0 (pod {name}-0): {reason}");
        if !msg.contains(&rank0) || !msg.contains(detail) {
            return Err(format!(
                "{name}: Running condition {msg:?} lacks {rank0:?} or {detail:?}"
            ));
        }
        named.push(format!(
            "{name} {reason} after {:.0}s",
            t0.elapsed().as_secs_f64()
        ));
    }
    let failed = |j: &HeteroTrainingJob| {
        j.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Failed" && c.status == "True" && c.reason == "PodsNotReady")
        })
    };
    for (name, _, _, _) in &cases {
        system
            .wait_job(
                ns,
                name,
                Duration::from_secs(150),
                "Failed PodsNotReady",
                failed,
            )
            .await
            .map_err(err)?;
    }
    Ok(Row {
        case: "gang cannot start: selector, image, claim",
        outcome: format!(
            "named: {}; all Failed (PodsNotReady, timeout {PODS_READY_S} s) after {:.0}s",
            named.join(", "),
            t0.elapsed().as_secs_f64()
        ),
        counted: 0,
        disruptions: 0,
        lost: "-".into(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// The plan ConfigMap deleted, then garbage written into it, mid-run.
async fn plan_damaged(system: &System, ns: &str) -> Result<Row, String> {
    let t0 = Instant::now();
    // Paced, so that it still trains after both restorations (each within
    // a few seconds of the damage) on any machine.
    system
        .create_job(
            ns,
            &paced_job("j", outlive_steps(30), "{}", "chaos", PACE_MS),
        )
        .await
        .map_err(err)?;
    wait_step(system, ns, 15).await?;
    let cms: Api<ConfigMap> = Api::namespaced(system.client().await.map_err(err)?, ns);
    cms.delete("j-plan", &DeleteParams::default())
        .await
        .map_err(err)?;
    let back = |want_valid: bool| {
        let cms = cms.clone();
        async move {
            eventually(
                "the plan restored",
                Duration::from_secs(60),
                Duration::from_millis(300),
                || async {
                    let cm = cms.get_opt("j-plan").await?;
                    let text = cm
                        .and_then(|c| c.data)
                        .and_then(|d| d.get(heterotrain_crds::PLAN_KEY).cloned());
                    let ok = text
                        .as_deref()
                        .is_some_and(|t| heterotrain_crds::BatchPlan::parse(t, 2).is_ok());
                    Ok((ok == want_valid).then_some(()))
                },
            )
            .await
            .map_err(err)
        }
    };
    back(true).await?;
    cms.patch(
        "j-plan",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"data": {heterotrain_crds::PLAN_KEY: "{not json"}})),
    )
    .await
    .map_err(err)?;
    back(true).await?;
    still_training(system, ns, "j").await?;
    system
        .wait_job(ns, "j", Duration::from_secs(600), "Succeeded", succeeded)
        .await
        .map_err(err)?;
    let (counted, disruptions) = counts(system, ns, "j").await?;
    if counted + disruptions != 0 {
        return Err(format!("the gang restarted: {counted} + {disruptions}"));
    }
    Ok(Row {
        case: "plan deleted, then garbage",
        outcome: "restored both times; Succeeded without a restart".into(),
        counted,
        disruptions,
        lost: "0".into(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// What of the control plane a case stops.
#[derive(Clone, Copy)]
enum Outage {
    /// The API server, 30 s.
    ApiServer,
    /// etcd, 15 s (the API server stays up and fails every request).
    Etcd,
}

/// The API server down for 30 s, or etcd for 15 s, mid-run: the job
/// Succeeds with no restart and exactly its two pods.
async fn control_plane_down(system: &System, ns: &str, what: Outage) -> Result<Row, String> {
    let steps = outlive_steps(match what {
        Outage::ApiServer => 30,
        Outage::Etcd => 15,
    });
    let t0 = Instant::now();
    system
        .create_job(ns, &paced_job("j", steps, "{}", "chaos", PACE_MS))
        .await
        .map_err(err)?;
    wait_step(system, ns, 15).await?;
    let cluster = &system.cluster;
    let (case, restarted) = match what {
        Outage::ApiServer => (
            "API server down 30 s",
            cluster.restart_apiserver(Duration::from_secs(30)).await,
        ),
        Outage::Etcd => (
            "etcd down 15 s",
            cluster.restart_etcd(Duration::from_secs(15)).await,
        ),
    };
    restarted.map_err(err)?;
    still_training(system, ns, "j").await?;
    system
        .wait_job(ns, "j", Duration::from_secs(600), "Succeeded", succeeded)
        .await
        .map_err(err)?;
    let (counted, disruptions) = counts(system, ns, "j").await?;
    let pods: Api<Pod> = Api::namespaced(system.client().await.map_err(err)?, ns);
    let n = pods
        .list(&ListParams::default())
        .await
        .map_err(err)?
        .items
        .len();
    if counted + disruptions != 0 || n != 2 {
        return Err(format!(
            "restarts {counted}+{disruptions}, {n} pods (want 0 and 2)"
        ));
    }
    Ok(Row {
        case,
        outcome: "Succeeded, no restart, exactly 2 pods".into(),
        counted,
        disruptions,
        lost: "0".into(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// The job deleted with `--cascade=orphan` mid-run and created again under
/// the same name: the old pods are deleted, never adopted; the new job
/// trains from step 0 (not from the old job's checkpoints) to Succeeded.
async fn orphaned(system: &System, ns: &str) -> Result<Row, String> {
    let t0 = Instant::now();
    let spec = job("j", 150, "{}", "chaos");
    system.create_job(ns, &spec).await.map_err(err)?;
    wait_step(system, ns, 15).await?;
    let client = system.client().await.map_err(err)?;
    let jobs: Api<HeteroTrainingJob> = Api::namespaced(client.clone(), ns);
    let old_uid = jobs.get("j").await.map_err(err)?.metadata.uid;
    let orphan = DeleteParams {
        propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
        ..Default::default()
    };
    jobs.delete("j", &orphan).await.map_err(err)?;
    eventually(
        "the job gone",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async { Ok(jobs.get_opt("j").await?.is_none().then_some(())) },
    )
    .await
    .map_err(err)?;
    let before = resumed_from(system, ns, "j").len();
    let recreated_at = k8s_openapi::jiff::Timestamp::now();
    let new = system.create_job(ns, &spec).await.map_err(err)?;
    let new_uid = new.metadata.uid.clone().ok_or("no uid")?;
    if Some(&new_uid) == old_uid.as_ref() {
        return Err("the recreated job kept its UID".into());
    }
    let done = system
        .wait_job(ns, "j", Duration::from_secs(600), "Succeeded", succeeded)
        .await
        .map_err(err)?;
    let pods: Api<Pod> = Api::namespaced(client, ns);
    let left = pods.list(&ListParams::default()).await.map_err(err)?.items;
    for p in &left {
        let owner = p
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .map(|o| o.uid.clone());
        let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0);
        if owner.as_deref() != Some(new_uid.as_str()) || created.is_none_or(|c| c < recreated_at) {
            return Err(format!(
                "pod {:?} (owner {owner:?}, created {created:?}) is not the new job's",
                p.metadata.name
            ));
        }
    }
    if left.len() != 2 {
        return Err(format!(
            "{} pods after the run, want the new job's 2",
            left.len()
        ));
    }
    let resumed = resumed_from(system, ns, "j");
    if resumed.len() != before {
        return Err(format!(
            "the new job resumed an old job's checkpoint: {resumed:?}"
        ));
    }
    let st = done.status.unwrap_or_default();
    Ok(Row {
        case: "deleted with orphans, recreated",
        outcome: format!(
            "old pods deleted, not adopted; new job trained from step 0; Succeeded at step {}",
            st.step
        ),
        counted: st.restarts - st.disruptions.min(st.restarts),
        disruptions: st.disruptions,
        lost: "-".into(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// The operator's `heterotrain_operator_scrape_failures_total` (its own
/// `/metrics`; the operator may have been restarted by an earlier case).
fn scrape_failures(system: &System) -> Option<f64> {
    let port = system.operator_http_port()?;
    let (_, body) = heterotrain_e2e::prometheus::http_get(port, "/metrics").ok()?;
    body.lines()
        .find(|l| l.starts_with("heterotrain_operator_scrape_failures_total "))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Resident memory of process `pid` in MiB (`VmRSS`).
fn rss_mib(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// Both ranks of a job serve a 1 GiB `/metrics` (a script of their own,
/// `e2e/scripts/huge_metrics.py`) while another job trains: the operator's
/// memory stays under 150 MiB and the other job Succeeds.
async fn huge_metrics(system: &System, ns: &str) -> Result<Row, String> {
    let t0 = Instant::now();
    let python = std::env::var("HETEROTRAIN_PYTHON").map_err(|_| {
        "HETEROTRAIN_PYTHON is not set: run through `make test` (it sources the set-up's env.sh)"
            .to_string()
    })?;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/huge_metrics.py");
    let big = format!(
        r#"apiVersion: heterotrain.dev/v1alpha1
kind: HeteroTrainingJob
metadata: {{name: big}}
spec:
  command: ["{python}", "{script}", "45"]
  workers:
    - name: cpu
      replicas: 2
      nodeSelector: {{pool: chaos}}
      resources: {{requests: {{cpu: "100m"}}, limits: {{cpu: "1"}}}}
  model: {{name: simple_cnn}}
  dataset: {{name: synthetic_image}}
  training: {{globalBatchSize: 32, maxSteps: 100}}
  profiling: {{enabled: false}}
  checkpoint: {{everySteps: 0}}
  metricsPort: {METRICS_PORT}
"#,
        script = script.display()
    );
    let failures_before = scrape_failures(system);
    system.create_job(ns, &big).await.map_err(err)?;
    system
        .create_job(ns, &job("ok", 400, "{}", "chaos"))
        .await
        .map_err(err)?;
    let mut peak: f64 = 0.0;
    // 400 unpaced steps on 0.25-core nodes beside the 1 GiB endpoints (and
    // other cases' gangs): generous, as a loaded machine takes longer.
    let deadline = Instant::now() + Duration::from_secs(600);
    let api: Api<HeteroTrainingJob> = Api::namespaced(system.client().await.map_err(err)?, ns);
    loop {
        if let Some(m) = system.operator_pid().and_then(rss_mib) {
            peak = peak.max(m);
        }
        let phase =
            |j: Option<HeteroTrainingJob>| j.and_then(|j| j.status?.phase).unwrap_or_default();
        let ok = phase(api.get_opt("ok").await.ok().flatten());
        let big_phase = phase(api.get_opt("big").await.ok().flatten());
        if ok == "Succeeded" && big_phase == "Succeeded" {
            break;
        }
        if ok == "Failed" || Instant::now() > deadline {
            return Err(format!(
                "jobs: ok {ok:?}, big {big_phase:?} after {:.0} s (operator peak {peak:.0} MiB)",
                t0.elapsed().as_secs_f64()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if peak >= 150.0 || peak == 0.0 {
        return Err(format!("operator resident memory peaked at {peak:.0} MiB"));
    }
    // The huge endpoints were read (and cut off), not skipped.
    let cut = scrape_failures(system)
        .zip(failures_before)
        .map(|(a, b)| a - b);
    if cut.is_none_or(|n| n < 2.0) {
        return Err(format!(
            "scrape failures during the case: {cut:?} (want ≥ 2)"
        ));
    }
    Ok(Row {
        case: "ranks serving a 1 GiB /metrics",
        outcome: format!(
            "operator RSS peaked at {peak:.0} MiB; {} oversized scrapes cut off; the other job Succeeded",
            cut.unwrap_or_default()
        ),
        counted: 0,
        disruptions: 0,
        lost: "-".into(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// A node lost mid-run (its pod stays Terminating): force-deleted, the new
/// gang runs on the other nodes.
async fn lost_node(system: &System, ns: &str) -> Result<Row, String> {
    let t0 = Instant::now();
    system
        .create_job(ns, &job("j", 200, "{backoffLimit: 3}", "chaos"))
        .await
        .map_err(err)?;
    let (pods, step) = wait_step(system, ns, 20).await?;
    let node = pods
        .get(&1)
        .and_then(|p| p.spec.as_ref()?.node_name.clone())
        .ok_or("rank 1 has no node")?;
    system.sim.lose_node(&node).await.map_err(err)?;
    let job = system
        .wait_job(ns, "j", Duration::from_secs(600), "Succeeded", succeeded)
        .await
        .map_err(err)?;
    let client = system.client().await.map_err(err)?;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client, ns);
    let forced = events
        .list(&ListParams::default())
        .await
        .map_err(err)?
        .items
        .into_iter()
        .any(|e| e.reason.as_deref() == Some("ForceDeleted"));
    if !forced {
        return Err("no ForceDeleted event".into());
    }
    let now_on: Vec<String> = rank_pods(system, ns)
        .await?
        .values()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    if now_on.contains(&node) {
        return Err(format!(
            "a rank of the new gang is on the lost node {node}: {now_on:?}"
        ));
    }
    let (counted, disruptions) = counts(system, ns, "j").await?;
    let st = job.status.unwrap_or_default();
    let resumed = resumed_from(system, ns, "j");
    let lost = resumed.last().map_or(step, |r| step.saturating_sub(*r));
    Ok(Row {
        case: "node lost",
        outcome: format!(
            "pod on {node} force-deleted; new gang on {now_on:?}; Succeeded ({} restart(s))",
            st.restarts
        ),
        counted,
        disruptions,
        lost: lost.to_string(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// How long [`leader_cut`] cuts the leader off at least, and at most (when
/// the standby is slow to take over).
const CUT_MIN: Duration = Duration::from_secs(30);
const CUT_MAX_S: u64 = 60;

/// Who holds the operator's Lease now.
async fn lease_holder(system: &System) -> Option<String> {
    let client = system.client().await.ok()?;
    let api: Api<Lease> = Api::namespaced(client, OPERATOR_NAMESPACE);
    api.get_opt("heterotrain-operator")
        .await
        .ok()??
        .spec?
        .holder_identity
}

/// Two operator replicas, A leading, and A's access to the API server cut
/// for 30 s (a proxy in front of it closes its connections; longer, up to
/// [`CUT_MAX_S`], until B is seen holding the Lease): B takes the Lease
/// over during the cut, A stops writing (it exits on the loss and comes back as a
/// standby, as its Deployment would restart it), the job Succeeds with its
/// two pods and no restart. The API server's audit log must show one writer
/// at a time: no write of A accepted after B's first (besides the Lease,
/// whose writes are guarded), and B writing nothing before the cut.
async fn leader_cut(system: &System, ns: &str) -> Result<Row, String> {
    // The job must outlive the longest cut.
    let steps = outlive_steps(CUT_MAX_S);
    let t0 = Instant::now();
    let from = Timestamp::now();
    let dir = system.cluster.state_dir().to_path_buf();
    let proxy = CutProxy::start(system.cluster.ports().apiserver)
        .await
        .map_err(err)?;
    let (ka, kb) = (
        dir.join("replica-a.kubeconfig"),
        dir.join("replica-b.kubeconfig"),
    );
    replica_kubeconfig(
        &system.cluster,
        "operator-replica-a",
        Some(proxy.port()),
        &ka,
    )
    .await
    .map_err(err)?;
    replica_kubeconfig(&system.cluster, "operator-replica-b", None, &kb)
        .await
        .map_err(err)?;
    // The suite's own operator steps aside (and releases the Lease).
    system.stop_operator(false);
    let mut a = system.start_replica("replica-a", &ka).map_err(err)?;
    eventually(
        "replica-a to hold the Lease",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async { Ok((lease_holder(system).await.as_deref() == Some("replica-a")).then_some(())) },
    )
    .await
    .map_err(err)?;
    let mut b = system.start_replica("replica-b", &kb).map_err(err)?;
    let outcome = async {
        system
            .create_job(ns, &paced_job("j", steps, "{}", "chaos", PACE_MS))
            .await
            .map_err(err)?;
        wait_step(system, ns, 15).await?;
        let cut_at = Timestamp::now();
        proxy.cut().await;
        let cut_started = Instant::now();
        // B may take over once A's Lease (15 s) has expired, at its next
        // try (every 5 s): about 20 s into the cut on an idle machine. The
        // cut lasts its 30 s, and on a loaded machine, where B's tries come
        // late, on until B is seen holding the Lease (at most CUT_MAX_S), so
        // the takeover it shows still happened while A was cut off.
        let mut taken_over = false;
        loop {
            a.revive(system);
            b.revive(system);
            taken_over |= lease_holder(system).await.as_deref() == Some("replica-b");
            let cut_for = cut_started.elapsed();
            if (taken_over && cut_for >= CUT_MIN) || cut_for >= Duration::from_secs(CUT_MAX_S) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        proxy.restore();
        let cut_s = cut_started.elapsed().as_secs_f64();
        if !taken_over {
            return Err(format!(
                "replica-b did not take the Lease over during a {cut_s:.0} s cut"
            ));
        }
        still_training(system, ns, "j").await?;
        let api: Api<HeteroTrainingJob> = Api::namespaced(system.client().await.map_err(err)?, ns);
        let api = &api;
        let (a, b) = (&mut a, &mut b);
        let deadline = Instant::now() + Duration::from_secs(600);
        let job = loop {
            a.revive(system);
            b.revive(system);
            if let Ok(Some(j)) = api.get_opt("j").await {
                if succeeded(&j) {
                    break j;
                }
            }
            if Instant::now() > deadline {
                return Err("the job did not Succeed within 600 s".into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        Ok::<_, String>((cut_at, cut_s, job, a.exits))
    }
    .await;
    a.stop();
    b.stop();
    system.start_operator().map_err(err)?;
    let (cut_at, cut_s, job, a_exits) = outcome?;

    // One writer at a time, from the API server's own record.
    let user = |r: &str| format!("system:serviceaccount:{OPERATOR_NAMESPACE}:operator-replica-{r}");
    let writes: Vec<_> = audit::read(&system.cluster.audit_log_path())
        .into_iter()
        .filter(|w| w.received >= from && w.accepted())
        .collect();
    let of = |r: &str| {
        let u = user(r);
        writes.iter().filter(move |w| w.user == u)
    };
    let b_first = of("b")
        .filter(|w| w.resource != "leases")
        .map(|w| w.received)
        .min()
        .ok_or("the audit log shows no write by replica-b")?;
    if b_first < cut_at {
        return Err(format!(
            "replica-b wrote at {b_first} before the cut at {cut_at}"
        ));
    }
    let late: Vec<String> = of("a")
        .filter(|w| w.received >= b_first)
        .map(|w| format!("{} {} {:?} at {}", w.verb, w.resource, w.name, w.received))
        .collect();
    if !late.is_empty() {
        return Err(format!(
            "replica-a wrote {} times after replica-b's first write ({b_first}), first: {}",
            late.len(),
            late[..late.len().min(5)].join("; ")
        ));
    }
    let a_writes = of("a").filter(|w| w.resource != "leases").count();
    if a_writes == 0 {
        return Err("the audit log shows no write by replica-a (was it leading?)".into());
    }
    let (counted, disruptions) = counts(system, ns, "j").await?;
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(system.client().await.map_err(err)?, ns);
    let listed = pods.list(&ListParams::default()).await.map_err(err)?.items;
    let owned = listed
        .iter()
        .filter(|p| {
            p.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.controller == Some(true) && o.uid == uid)
        })
        .count();
    if counted + disruptions != 0 || listed.len() != 2 || owned != 2 {
        return Err(format!(
            "restarts {counted}+{disruptions}, {} pods of which {owned} the job's (want 0, 2 and 2)",
            listed.len()
        ));
    }
    Ok(Row {
        case: "leader's API access cut ≥ 30 s (2 replicas)",
        outcome: format!(
            "Succeeded; the standby took over during the {cut_s:.0} s cut; the old leader exited {a_exits}× and wrote nothing after the takeover ({a_writes} writes before); exactly 2 pods"
        ),
        counted,
        disruptions,
        lost: "0".into(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Run one case in its own namespace: its row, or what failed with a dump.
async fn run_case(system: &System, case: &'static str, kills_n: u32) -> Result<Row, String> {
    let ns = format!("chaos-{case}");
    let setup = async {
        system.create_namespace(&ns).await.map_err(err)?;
        let client = system.client().await.map_err(err)?;
        heterotrain_e2e::volumes::create_claim(&client, system.sim.state_dir(), &ns, "ckpt")
            .await
            .map_err(err)
    };
    setup.await?;
    let r = match case {
        "kills" => kills(system, &ns, kills_n).await,
        "hung-rank" => hung_rank(system, &ns).await,
        "not-ready" => not_ready(system, &ns).await,
        "plan" => plan_damaged(system, &ns).await,
        "apiserver" => control_plane_down(system, &ns, Outage::ApiServer).await,
        "etcd" => control_plane_down(system, &ns, Outage::Etcd).await,
        "orphaned" => orphaned(system, &ns).await,
        "huge-metrics" => huge_metrics(system, &ns).await,
        "leader-cut" => leader_cut(system, &ns).await,
        _ => lost_node(system, &ns).await,
    };
    match r {
        Ok(row) => {
            eprintln!("chaos {case}: passed in {:.0}s", row.seconds);
            Ok(row)
        }
        Err(e) => {
            let dump = system.dump(&ns).await;
            eprintln!("chaos {case}: FAILED: {e}\n--- dump ---\n{dump}");
            Err(format!("{case}: {e}"))
        }
    }
}

/// Run the selected cases of a lane one after the other.
async fn run_lane(
    system: &System,
    lane: &[&'static str],
    kills_n: u32,
) -> Vec<Result<Row, String>> {
    let mut out = Vec::new();
    for &case in lane {
        if !selected(case) {
            eprintln!("chaos {case}: skipped (HETEROTRAIN_CHAOS_ONLY)");
            continue;
        }
        out.push(run_case(system, case, kills_n).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos() {
    let kills_n: u32 = std::env::var("HETEROTRAIN_CHAOS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut system = System::start(SystemOptions {
        operator_args: vec![
            "--scrape-interval=1".into(),
            "--rebalance-interval=3".into(),
        ],
        verbose: true,
        ..SystemOptions::new("chaos", NodesFile::parse(NODES).expect("nodes"))
    })
    .await
    .expect("start the system");
    // Cases that disturb only their own job run in two lanes at once (the
    // pool holds two gangs); those that disturb the whole control plane or
    // a node run alone after them, the lost node (it stays lost) last.
    let (a, b) = tokio::join!(
        run_lane(&system, &["kills", "plan", "orphaned"], kills_n),
        run_lane(
            &system,
            &["hung-rank", "not-ready", "huge-metrics"],
            kills_n
        ),
    );
    let alone = run_lane(
        &system,
        &["apiserver", "etcd", "leader-cut", "lost-node"],
        kills_n,
    )
    .await;
    let (mut rows, mut failures) = (Vec::new(), Vec::new());
    for r in a.into_iter().chain(b).chain(alone) {
        match r {
            Ok(row) => rows.push(row),
            Err(e) => failures.push(e),
        }
    }
    let mut table = String::from(
        "| case | outcome | restarts counted | disruptions (not counted) | lost steps | seconds |\n|---|---|---|---|---|---|\n",
    );
    for r in &rows {
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {:.0} |\n",
            r.case, r.outcome, r.counted, r.disruptions, r.lost, r.seconds
        ));
    }
    eprintln!("\nchaos results ({kills_n} kills):\n{table}");
    let out = heterotrain_e2e::paths::cache_dir().join("results");
    if std::fs::create_dir_all(&out).is_ok() {
        let _ = std::fs::write(out.join("chaos.md"), &table);
    }
    system.stop().await;
    assert!(
        failures.is_empty(),
        "chaos cases failed:\n{}",
        failures.join("\n")
    );
}
