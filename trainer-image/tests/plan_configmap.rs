//! Live plan switching through a real ConfigMap on the local API server:
//! two ranks watch `<job>-plan`; a patch mid-run moves every rank to the new
//! generation at the same step; an invalid plan is ignored and counted; an
//! API-server outage does not stop training and a later patch still lands.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use heterotrain_e2e::{ClusterOptions, LocalCluster};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};

fn plan_json(generation: u64, sizes: &[u32], global: u32) -> String {
    serde_json::json!({
        "generation": generation,
        "globalBatchSize": global,
        "batchSizes": sizes,
        "policy": "test",
        "reason": "test"
    })
    .to_string()
}

async fn set_plan(api: &Api<ConfigMap>, name: &str, text: &str) {
    let patch = serde_json::json!({ "data": { "plan.json": text } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch plan ConfigMap");
}

/// The step records a rank has logged so far (read while it runs: a line
/// still being written is left out).
fn step_records(dir: &std::path::Path, rank: usize) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join(format!("rank-{rank}.jsonl")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["event"] == "step")
        .collect()
}

/// Steps of a rank's log as (step, generation, batch, unix time).
fn step_rows(dir: &std::path::Path, rank: usize) -> Vec<(u64, u64, u64, f64)> {
    step_records(dir, rank)
        .iter()
        .map(|s| {
            (
                s["step"].as_u64().unwrap_or(0),
                s["generation"].as_u64().unwrap_or(0),
                s["batch_size"].as_u64().unwrap_or(0),
                s["unix_seconds"].as_f64().unwrap_or(0.0),
            )
        })
        .collect()
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// First step at which `rank` trained with `generation`.
fn first_step_of(dir: &std::path::Path, rank: usize, generation: u64) -> Option<(u64, f64)> {
    step_rows(dir, rank)
        .into_iter()
        .find(|r| r.1 == generation)
        .map(|r| (r.0, r.3))
}

#[test]
fn configmap_plan_switches_all_ranks_at_the_same_step() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let cluster = rt
        .block_on(LocalCluster::start(ClusterOptions {
            name: "trainer-plan".into(),
            ..Default::default()
        }))
        .expect("start local control plane");
    let client = rt.block_on(cluster.client()).expect("client");
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let name = "job-plan";
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "plan.json".to_string(),
            plan_json(0, &[20, 12], 32),
        )])),
        ..Default::default()
    };
    rt.block_on(api.create(&PostParams::default(), &cm))
        .expect("create plan ConfigMap");

    let dir = tempfile::tempdir().unwrap();
    let master = free_port();
    let a = args(&[
        "--model",
        "mlp",
        "--threads",
        "1",
        "--batch-size",
        "32",
        "--synthetic-samples",
        "40000",
        "--max-steps",
        "100000",
        "--step-sleep-ms",
        "40",
        "--no-profile",
        "--metrics-port",
        "0",
        "--status-every",
        "0",
        // Step 1 trains with the ConfigMap's plan however long the watch
        // takes to deliver it on a loaded machine (by default rank 0 waits
        // 5 s, then starts on an equal split).
        "--first-plan-wait-secs",
        "60",
        "--output-dir",
        &dir.path().display().to_string(),
    ]);
    let children: Vec<_> = (0..2)
        .map(|r| {
            let mut c = rank_cmd(r, 2, master, &a);
            c.env("KUBECONFIG", cluster.kubeconfig_path())
                .env("HETEROTRAIN_PLAN_CONFIGMAP", name)
                .env("HETEROTRAIN_NAMESPACE", "default");
            c.spawn().expect("spawn")
        })
        .collect();
    let pids: Vec<i32> = children.iter().map(|c| c.id() as i32).collect();
    let d = dir.path();

    // Generation 0 from the ConfigMap is in use from step 1.
    assert!(
        wait_until(Duration::from_secs(120), || last_step(d, 1) >= 10),
        "no progress"
    );
    for r in 0..2 {
        let rows = step_rows(d, r);
        assert_eq!(
            (rows[0].1, rows[0].2),
            (0, [20, 12][r]),
            "rank {r} start: {:?}",
            rows[0]
        );
    }

    // Patch mid-run: both ranks move at the same step.
    let t_patch = now();
    rt.block_on(set_plan(&api, name, &plan_json(1, &[8, 24], 32)));
    assert!(
        wait_until(Duration::from_secs(90), || (0..2)
            .all(|r| first_step_of(d, r, 1).is_some())),
        "generation 1 never arrived"
    );
    let (s0, t0) = first_step_of(d, 0, 1).expect("rank 0 gen 1");
    let (s1, _) = first_step_of(d, 1, 1).expect("rank 1 gen 1");
    assert_eq!(s0, s1, "ranks switched at different steps");
    eprintln!(
        "patch -> first step on generation 1 (step {s0}): {:.3} s",
        t0 - t_patch
    );
    // Seconds on an idle machine; a minute bounds it on a loaded one (the
    // watch, the API server and both ranks share the CPU with other work).
    assert!(t0 - t_patch < 60.0, "{:.3} s", t0 - t_patch);

    // An invalid plan (wrong sum) is ignored: generation stays 1. Wait
    // until rank 0 has counted it (however long the watch takes), then 10
    // more steps, in which a second count or a switch would show.
    rt.block_on(set_plan(&api, name, &plan_json(2, &[30, 30], 32)));
    let counted = |r: &serde_json::Value| r["invalid_plans"].as_u64().unwrap_or(0) >= 1;
    assert!(
        wait_until(Duration::from_secs(60), || step_records(d, 0)
            .last()
            .is_some_and(counted)),
        "the invalid plan was never counted"
    );
    let before = last_step(d, 0);
    assert!(wait_until(Duration::from_secs(60), || last_step(d, 0) >= before + 10));
    let recs = step_records(d, 0).pop().expect("steps");
    assert_eq!(recs["generation"], 1);
    assert_eq!(recs["invalid_plans"], 1, "the bad plan is counted once");

    // The API server goes away for a while: training goes on; afterwards a
    // new plan still arrives.
    let before = last_step(d, 0);
    rt.block_on(cluster.restart_apiserver(Duration::from_secs(3)))
        .expect("restart apiserver");
    assert!(
        last_step(d, 0) > before + 10,
        "training stalled while the API server was down"
    );
    let t_patch = now();
    rt.block_on(set_plan(&api, name, &plan_json(3, &[16, 16], 32)));
    assert!(
        wait_until(Duration::from_secs(90), || (0..2)
            .all(|r| first_step_of(d, r, 3).is_some())),
        "generation 3 never arrived after the API server restart"
    );
    let (s0, t0) = first_step_of(d, 0, 3).expect("gen 3");
    assert_eq!(Some(s0), first_step_of(d, 1, 3).map(|x| x.0));
    eprintln!(
        "after an API server restart: patch -> generation 3 at step {s0}: {:.3} s",
        t0 - t_patch
    );

    // Stop both (SIGTERM: finish the step, checkpoint-free exit 0).
    for pid in &pids {
        // SAFETY: plain kill(2) on our own children.
        unsafe { libc::kill(*pid, libc::SIGTERM) };
    }
    let outs = wait_all(children, Duration::from_secs(60));
    assert_all_ok(&outs);
    // Every step: same generation on both ranks, batches as that generation says.
    let (r0, r1) = (step_rows(d, 0), step_rows(d, 1));
    let n = r0.len().min(r1.len());
    assert!(n > 30);
    let sizes = |g: u64| match g {
        0 => [20, 12],
        1 => [8, 24],
        3 => [16, 16],
        _ => panic!("unexpected generation {g}"),
    };
    for i in 0..n {
        assert_eq!(r0[i].0, r1[i].0);
        assert_eq!(r0[i].1, r1[i].1, "step {}: generations differ", r0[i].0);
        let want = sizes(r0[i].1);
        assert_eq!((r0[i].2, r1[i].2), (want[0], want[1]), "step {}", r0[i].0);
    }
}
