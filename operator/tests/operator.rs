//! Integration tests against a real local API server (etcd, kube-apiserver,
//! scheduler, controller-manager). The operator runs in-process under a
//! ServiceAccount token bound only to `rbac.rs`'s rules; tests play the
//! pods (status subresource) and serve real exposition text on loopback.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use heterotrain_crds::HeteroTrainingJob;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{Api, DeleteParams, PostParams};

const PORT: u16 = 19400;
/// Fake ranks take one step per scrape (0.5 s in tests), so 2 steps are
/// under the tests' 1.5 s --rebalance-interval, which then sets the pace.
const FAST_DECISIONS: &str = "  loadBalancing: {rebalanceIntervalSteps: 2}";

fn job_yaml(name: &str, replicas: u32, extra: &str) -> String {
    format!(
        r#"
apiVersion: heterotrain.dev/v1alpha1
kind: HeteroTrainingJob
metadata: {{name: {name}}}
spec:
  workers: [{{name: cpu, replicas: {replicas}}}]
  model: {{name: mlp}}
  dataset: {{name: synthetic_image}}
  training: {{globalBatchSize: 32, maxSteps: 1000}}
  profiling: {{enabled: false}}
  metricsPort: {PORT}
{extra}"#
    )
}

#[tokio::test]
async fn creates_owned_children_and_garbage_collects_them() {
    let env = env("create").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    let job = create_job(&env, &job_from_yaml(&env.ns, &job_yaml("train", 3, ""))).await;
    let uid = job.metadata.uid.clone().expect("uid");
    let ps = eventually(Duration::from_secs(60), "3 pods", || async {
        let ps = pods(&env, "train").await;
        (ps.len() == 3).then_some(ps)
    })
    .await;
    for (r, p) in ps.iter().enumerate() {
        assert_eq!(
            p.metadata.name.as_deref(),
            Some(format!("train-{r}").as_str())
        );
        let l = labels(p);
        assert_eq!(l["heterotrain.dev/rank"], r.to_string());
        assert_eq!(l["heterotrain.dev/group"], "cpu");
        let owner = &p.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            (uid.as_str(), Some(true))
        );
        let spec = p.spec.as_ref().expect("spec");
        assert_eq!(
            spec.hostname.as_deref(),
            Some(format!("train-{r}").as_str())
        );
        assert_eq!(spec.subdomain.as_deref(), Some("train"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("test/trainer:1"));
        let env_val = |n: &str| {
            c.env
                .as_ref()
                .and_then(|e| e.iter().find(|v| v.name == n))
                .and_then(|v| v.value.clone())
        };
        assert_eq!(
            env_val("MASTER_ADDR").as_deref(),
            Some("train-0.train.create.svc")
        );
        assert_eq!(env_val("WORLD_SIZE").as_deref(), Some("3"));
        assert_eq!(env_val("RANK"), Some(r.to_string()));
        let managers: Vec<String> = p
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.manager.clone())
            .collect();
        assert!(
            managers.contains(&"heterotrain-operator".to_string()),
            "{managers:?}"
        );
    }
    let svcs: Api<Service> = Api::namespaced(env.admin.clone(), &env.ns);
    let svc = svcs.get("train").await.expect("service");
    assert_eq!(
        svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()),
        Some("None")
    );
    let p = plan(&env, "train").await.expect("plan");
    assert_eq!((p.generation, p.batch_sizes.clone()), (0, vec![11, 11, 10]));
    let created = eventually(Duration::from_secs(60), "Created condition", || async {
        condition(&env, "train", "Created")
            .await
            .filter(|c| c.0 == "True")
    })
    .await;
    assert_eq!(created.1, "GangCreated");
    let job_now = get_job(&env, "train").await.expect("job");
    assert_eq!(job_now.status.as_ref().map(|s| s.ranks), Some(3));

    // Deleting the job garbage-collects every child.
    let jobs: Api<HeteroTrainingJob> = Api::namespaced(env.admin.clone(), &env.ns);
    jobs.delete("train", &DeleteParams::foreground())
        .await
        .expect("delete");
    let cms: Api<ConfigMap> = Api::namespaced(env.admin.clone(), &env.ns);
    eventually(
        Duration::from_secs(60),
        "children garbage-collected",
        || async {
            let gone = pods(&env, "train").await.is_empty()
                && svcs.get_opt("train").await.ok().flatten().is_none()
                && cms.get_opt("train-plan").await.ok().flatten().is_none();
            gone.then_some(())
        },
    )
    .await;
    op.stop().await;
}

#[tokio::test]
async fn invalid_jobs_get_a_condition_and_no_pods() {
    let env = env("invalid").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/invalid.yaml");
    let cases: Vec<serde_json::Value> =
        serde_yaml::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("yaml");
    assert!(cases.len() >= 10);
    let base: serde_json::Value = serde_yaml::from_str(
        "apiVersion: heterotrain.dev/v1alpha1\nkind: HeteroTrainingJob\nmetadata: {}\nspec:\n  workers: [{name: cpu, replicas: 4}]\n  model: {name: mlp}\n  dataset: {name: synthetic_image}\n  training: {globalBatchSize: 64, maxSteps: 5}\n",
    )
    .expect("base");
    let mut names = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let mut v = base.clone();
        v["metadata"]["name"] = format!("bad-{i}").into();
        v["metadata"]["namespace"] = env.ns.clone().into();
        merge(&mut v["spec"], &case["patch"]);
        let job: HeteroTrainingJob = serde_json::from_value(v).expect("job");
        create_job(&env, &job).await;
        names.push((
            format!("bad-{i}"),
            case["expect"].as_str().expect("expect").to_string(),
        ));
    }
    for (name, expect) in &names {
        let (status, reason, message) = eventually(Duration::from_secs(60), name, || async {
            condition(&env, name, "Failed").await
        })
        .await;
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "Invalid"),
            "{name}"
        );
        assert!(
            message.contains(expect.as_str()),
            "{name}: {expect:?} not in {message:?}"
        );
        let job = get_job(&env, name).await.expect("job");
        assert_eq!(job.status.and_then(|s| s.phase).as_deref(), Some("Failed"));
    }
    let all_pods: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    assert!(all_pods
        .list(&Default::default())
        .await
        .expect("pods")
        .items
        .is_empty());
    let ev = events(&env).await;
    let invalid_events = ev
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Invalid"))
        .count();
    assert!(
        invalid_events >= names.len(),
        "{invalid_events} Invalid events"
    );
    op.stop().await;
}

fn merge(base: &mut serde_json::Value, patch: &serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(k);
                } else {
                    merge(b.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

async fn start_fake_ranks(env: &Env, speeds: &[f64], batch: u32) -> Vec<Arc<Mutex<FakeRank>>> {
    let mut out = Vec::new();
    for (r, s) in speeds.iter().enumerate() {
        let f = Arc::new(Mutex::new(FakeRank::new(*s, batch)));
        serve_rank(&rank_ip(env, r as u32), PORT, f.clone()).await;
        out.push(f);
    }
    out
}

#[tokio::test]
async fn three_to_one_speed_gets_a_three_to_one_plan() {
    let env = env("speed").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    let _ranks = start_fake_ranks(&env, &[0.01, 0.03], 16).await;
    create_job(
        &env,
        &job_from_yaml(&env.ns, &job_yaml("fast-slow", 2, FAST_DECISIONS)),
    )
    .await;
    run_gang(&env, "fast-slow", 2, 0).await;
    let ratio_of =
        |p: &heterotrain_crds::BatchPlan| f64::from(p.batch_sizes[0]) / f64::from(p.batch_sizes[1]);
    // A generous wait: how soon the plan comes depends on CPU time, not on
    // the operator. That it comes quickly in decisions is what counts: the
    // first or second decision is already 3:1.
    let p = eventually(Duration::from_secs(60), "a roughly 3:1 plan", || async {
        plan(&env, "fast-slow")
            .await
            .filter(|p| p.generation >= 1 && (2.4..=3.6).contains(&ratio_of(p)))
    })
    .await;
    assert!(p.generation <= 2, "{p:?}");
    assert_eq!(p.batch_sizes.iter().sum::<u32>(), 32);
    assert_eq!(p.batch_sizes, [24, 8]);
    let job = eventually(
        Duration::from_secs(60),
        "status records the rebalance",
        || async {
            get_job(&env, "fast-slow").await.filter(|j| {
                j.status
                    .as_ref()
                    .and_then(|s| s.last_rebalance.as_ref())
                    .is_some_and(|r| r.generation >= 1)
            })
        },
    )
    .await;
    let st = job.status.expect("status");
    assert!(st.plan_generation >= 1);
    let lr = st.last_rebalance.expect("last rebalance");
    assert!(lr.predicted_gain_percent > 5.0, "{lr:?}");
    // The same decision is the newest in the plan history, once.
    assert_eq!(st.plan_history.last(), Some(&lr), "{:?}", st.plan_history);
    let gens: Vec<u64> = st.plan_history.iter().map(|r| r.generation).collect();
    assert!(gens.windows(2).all(|w| w[0] < w[1]), "{gens:?}");
    assert!(st.balance.is_some());
    assert!(st
        .conditions
        .iter()
        .any(|c| c.type_ == "Rebalanced" && c.status == "True"));
    let ev = events(&env).await;
    let rebalanced: Vec<_> = ev
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Rebalanced"))
        .collect();
    assert!(!rebalanced.is_empty());
    assert!(rebalanced[0]
        .note
        .as_deref()
        .unwrap_or_default()
        .contains("predicted gain"));
    op.stop().await;
}

#[tokio::test]
async fn decisions_wait_for_rebalance_interval_steps() {
    let env = env("steps").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    // One step per scrape (0.5 s): 12 steps take 6 s, far past the 1.5 s
    // floor, so only the step count can hold the 3:1 plan back that long.
    let ranks = start_fake_ranks(&env, &[0.01, 0.03], 16).await;
    let yaml = job_yaml(
        "patient",
        2,
        "  loadBalancing: {rebalanceIntervalSteps: 12}",
    );
    create_job(&env, &job_from_yaml(&env.ns, &yaml)).await;
    run_gang(&env, "patient", 2, 0).await;
    let p = eventually(Duration::from_secs(60), "a plan after 12 steps", || async {
        plan(&env, "patient").await.filter(|p| p.generation >= 1)
    })
    .await;
    // Read after the plan was seen, so at least the step it was decided at.
    // The operator's first read (step 1) is the baseline: no plan before 13.
    let steps = ranks[0].lock().expect("rank").steps();
    assert!(steps >= 13, "plan {p:?} already written at step {steps}");
    assert_eq!(p.batch_sizes, [24, 8]);
    op.stop().await;
}

#[tokio::test]
async fn equal_speeds_keep_the_plan() {
    let env = env("equal").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    let _ranks = start_fake_ranks(&env, &[0.02, 0.02], 16).await;
    create_job(
        &env,
        &job_from_yaml(&env.ns, &job_yaml("even", 2, FAST_DECISIONS)),
    )
    .await;
    run_gang(&env, "even", 2, 0).await;
    // Wait until the operator has read metrics several times.
    eventually(
        Duration::from_secs(60),
        "measured throughput in status",
        || async {
            get_job(&env, "even").await.filter(|j| {
                j.status
                    .as_ref()
                    .is_some_and(|s| s.cluster_samples_per_second.is_some() && s.step > 0)
            })
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let p = plan(&env, "even").await.expect("plan");
    assert_eq!((p.generation, p.batch_sizes), (0, vec![16, 16]));
    let st = get_job(&env, "even")
        .await
        .and_then(|j| j.status)
        .expect("status");
    assert!(st.last_rebalance.is_none());
    assert_eq!(st.balance.map(|b| b.class).as_deref(), Some("Excellent"));
    op.stop().await;
}

#[tokio::test]
async fn failed_rank_recreates_the_gang_until_backoff_limit() {
    let env = env("restart").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    create_job(
        &env,
        &job_from_yaml(
            &env.ns,
            &job_yaml("flaky", 2, "  runPolicy: {backoffLimit: 1}"),
        ),
    )
    .await;
    let first = run_gang(&env, "flaky", 2, 0).await;
    let first_uids: Vec<_> = first.iter().map(|p| p.metadata.uid.clone()).collect();
    finish_pod(&env, "flaky-1", 3, "Error").await;
    let second = run_gang(&env, "flaky", 2, 1).await;
    assert!(second.iter().all(|p| !first_uids.contains(&p.metadata.uid)));
    let env_restart = second[0].spec.as_ref().expect("spec").containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "HETEROTRAIN_RESTART_COUNT")
        .and_then(|e| e.value.clone());
    assert_eq!(env_restart.as_deref(), Some("1"));
    let job = get_job(&env, "flaky").await.expect("job");
    assert_eq!(job.status.as_ref().map(|s| s.restarts), Some(1));
    // The plan survives the restart.
    assert!(plan(&env, "flaky").await.is_some());

    finish_pod(&env, "flaky-0", 137, "OOMKilled").await;
    let (status, reason, message) = eventually(Duration::from_secs(60), "Failed", || async {
        condition(&env, "flaky", "Failed")
            .await
            .filter(|c| c.0 == "True")
    })
    .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "BackoffLimitExceeded")
    );
    assert!(
        message.contains("rank 0") && message.contains("137") && message.contains("OOMKilled"),
        "{message}"
    );
    let job = get_job(&env, "flaky").await.expect("job");
    let st = job.status.expect("status");
    assert_eq!((st.restarts, st.phase.as_deref()), (1, Some("Failed")));
    assert!(st.completion_time.is_some());
    // The remaining running rank is stopped.
    eventually(Duration::from_secs(60), "running pods deleted", || async {
        pods(&env, "flaky")
            .await
            .iter()
            .all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running"))
            .then_some(())
    })
    .await;
    let ev = events(&env).await;
    assert!(ev
        .iter()
        .any(|e| e.reason.as_deref() == Some("GangRestarting")));
    op.stop().await;
}

#[tokio::test]
async fn suspend_stops_pods_and_resume_recreates_them() {
    let env = env("suspend").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    create_job(&env, &job_from_yaml(&env.ns, &job_yaml("pausable", 2, ""))).await;
    run_gang(&env, "pausable", 2, 0).await;
    let before = plan(&env, "pausable").await.expect("plan");
    patch_job_spec(
        &env,
        "pausable",
        serde_json::json!({"runPolicy": {"suspend": true}}),
    )
    .await;
    eventually(
        Duration::from_secs(60),
        "pods gone and Suspended",
        || async {
            let c = condition(&env, "pausable", "Suspended").await?;
            (c.0 == "True" && pods(&env, "pausable").await.is_empty()).then_some(())
        },
    )
    .await;
    let job = get_job(&env, "pausable").await.expect("job");
    assert_eq!(
        job.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Suspended")
    );
    assert_eq!(plan(&env, "pausable").await, Some(before));
    patch_job_spec(
        &env,
        "pausable",
        serde_json::json!({"runPolicy": {"suspend": false}}),
    )
    .await;
    run_gang(&env, "pausable", 2, 0).await;
    let c = eventually(Duration::from_secs(60), "Suspended=False", || async {
        condition(&env, "pausable", "Suspended")
            .await
            .filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(c.1, "Resumed");
    eventually(Duration::from_secs(60), "Running", || async {
        condition(&env, "pausable", "Running")
            .await
            .filter(|c| c.0 == "True")
    })
    .await;
    op.stop().await;
}

#[tokio::test]
async fn active_deadline_fails_the_job() {
    let env = env("deadline").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    create_job(
        &env,
        &job_from_yaml(
            &env.ns,
            &job_yaml("slowpoke", 1, "  runPolicy: {activeDeadlineSeconds: 3}"),
        ),
    )
    .await;
    run_gang(&env, "slowpoke", 1, 0).await;
    let (_, reason, message) =
        eventually(Duration::from_secs(60), "Failed by deadline", || async {
            condition(&env, "slowpoke", "Failed")
                .await
                .filter(|c| c.0 == "True")
        })
        .await;
    assert_eq!(reason, "DeadlineExceeded");
    assert!(message.contains("activeDeadlineSeconds 3"));
    // The lifecycle counter the chart's HeteroTrainJobFailed alert reads.
    assert!(
        entered(&op, &env.ns, "Failed") >= 1.0,
        "{}",
        op.ctx.metrics.encode()
    );
    eventually(Duration::from_secs(60), "pods deleted", || async {
        pods(&env, "slowpoke").await.is_empty().then_some(())
    })
    .await;
    op.stop().await;
}

/// `heterotrain_operator_job_phase_transitions_total` for `ns` and `phase`
/// (0 without a series).
fn entered(op: &Operator, ns: &str, phase: &str) -> f64 {
    value(
        op,
        &format!("heterotrain_operator_job_phase_transitions_total{{namespace=\"{ns}\",phase=\"{phase}\"}}"),
    )
}

/// The operator's value of `series` (name and labels; 0 without it).
fn value(op: &Operator, series: &str) -> f64 {
    let prefix = format!("{series} ");
    op.ctx
        .metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn succeeded_job_is_deleted_after_its_ttl() {
    let env = env("ttl").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    create_job(
        &env,
        &job_from_yaml(
            &env.ns,
            &job_yaml("done", 2, "  runPolicy: {ttlSecondsAfterFinished: 3}"),
        ),
    )
    .await;
    run_gang(&env, "done", 2, 0).await;
    finish_pod(&env, "done-0", 0, "Completed").await;
    finish_pod(&env, "done-1", 0, "Completed").await;
    let job = eventually(Duration::from_secs(60), "Succeeded", || async {
        get_job(&env, "done").await.filter(|j| {
            j.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Succeeded" && c.status == "True")
            })
        })
    })
    .await;
    let st = job.status.expect("status");
    assert_eq!(st.phase.as_deref(), Some("Succeeded"));
    assert!(entered(&op, &env.ns, "Succeeded") >= 1.0);
    assert_eq!(entered(&op, &env.ns, "Failed"), 0.0);
    let completed = st.completion_time.expect("completion time").0;
    eventually(Duration::from_secs(60), "job deleted by TTL", || async {
        get_job(&env, "done").await.is_none().then_some(())
    })
    .await;
    // Measured from the recorded completion (second resolution), not from
    // when this test happened to see Succeeded: under load that can be late.
    let after = k8s_openapi::jiff::Timestamp::now().duration_since(completed);
    assert!(
        after >= k8s_openapi::jiff::SignedDuration::from_secs(2),
        "deleted {after:?} after completion, before its 3 s TTL"
    );
    op.stop().await;
}

#[tokio::test]
async fn only_the_leader_writes() {
    let env = env("leader").await;
    let a = Operator::start(&env, test_config(&env, "replica-a"));
    // replica-a leads before replica-b exists (however long its start
    // takes on a loaded machine), so b can only stand by.
    eventually(Duration::from_secs(60), "replica-a leading", || async {
        (a.ctx.metrics.leader.get() == 1).then_some(())
    })
    .await;
    let b = Operator::start(&env, test_config(&env, "replica-b"));
    // Give replica-b time to try for the Lease (it must be refused).
    tokio::time::sleep(Duration::from_secs(2)).await;
    create_job(&env, &job_from_yaml(&env.ns, &job_yaml("led", 2, ""))).await;
    run_gang(&env, "led", 2, 0).await;
    eventually(Duration::from_secs(60), "Running", || async {
        condition(&env, "led", "Running")
            .await
            .filter(|c| c.0 == "True")
    })
    .await;
    let ours = |e: &&k8s_openapi::api::events::v1::Event| {
        e.reporting_controller.as_deref() == Some("heterotrain-operator")
    };
    let reporters: Vec<String> = events(&env)
        .await
        .iter()
        .filter(ours)
        .filter_map(|e| e.reporting_instance.clone())
        .collect();
    assert!(!reporters.is_empty());
    assert!(reporters.iter().all(|r| r == "replica-a"), "{reporters:?}");
    assert_eq!(a.ctx.metrics.leader.get(), 1);
    assert_eq!(b.ctx.metrics.leader.get(), 0);
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(env.admin.clone(), &env.ns);
    let lease = leases.get("heterotrain-operator").await.expect("lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("replica-a")
    );

    // The leader stops; the standby takes over and reconciles.
    a.stop().await;
    create_job(&env, &job_from_yaml(&env.ns, &job_yaml("led-later", 1, ""))).await;
    eventually(
        Duration::from_secs(60),
        "the standby creates pods",
        || async { (pods(&env, "led-later").await.len() == 1).then_some(()) },
    )
    .await;
    let reporters: Vec<String> = events(&env)
        .await
        .iter()
        .filter(ours)
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("led-later"))
        .filter_map(|e| e.reporting_instance.clone())
        .collect();
    assert!(
        reporters.iter().all(|r| r == "replica-b") && !reporters.is_empty(),
        "{reporters:?}"
    );
    b.stop().await;
}

#[tokio::test]
async fn immutable_change_is_reported_not_applied() {
    let env = env("immutable").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    create_job(&env, &job_from_yaml(&env.ns, &job_yaml("fixed", 2, ""))).await;
    let before = run_gang(&env, "fixed", 2, 0).await;
    patch_job_spec(&env, "fixed", serde_json::json!({"model": {"hidden": 256}})).await;
    let (_, reason, message) =
        eventually(Duration::from_secs(60), "SpecChangeRejected", || async {
            condition(&env, "fixed", "SpecChangeRejected")
                .await
                .filter(|c| c.0 == "True")
        })
        .await;
    assert_eq!(reason, "ImmutableFieldChanged");
    assert!(message.contains("spec.model"), "{message}");
    let after = pods(&env, "fixed").await;
    let uids = |ps: &[Pod]| {
        ps.iter()
            .map(|p| p.metadata.uid.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(uids(&before), uids(&after));
    op.stop().await;
}

#[tokio::test]
async fn operator_serves_its_metrics() {
    let env = env("metrics").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    create_job(&env, &job_from_yaml(&env.ns, &job_yaml("m", 1, ""))).await;
    eventually(Duration::from_secs(60), "a pod", || async {
        (pods(&env, "m").await.len() == 1).then_some(())
    })
    .await;
    let (listener, addr) = heterotrain_operator::server::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let ctx = op.ctx.clone();
    tokio::spawn(heterotrain_operator::server::serve(
        listener,
        ctx,
        std::future::pending(),
    ));
    let scraper =
        heterotrain_operator::scrape::Scraper::new(Duration::from_secs(10)).expect("client");
    let text = scraper
        .get_text(&format!("http://{addr}/metrics"))
        .await
        .expect("metrics");
    assert!(
        text.contains("heterotrain_operator_reconciles_total"),
        "{text}"
    );
    assert!(text.contains("heterotrain_operator_reconcile_duration_seconds_bucket"));
    assert!(text.contains("heterotrain_operator_leader 1"));
    assert_eq!(
        scraper
            .get_text(&format!("http://{addr}/healthz"))
            .await
            .expect("healthz"),
        "ok\n"
    );
    assert_eq!(
        scraper
            .get_text(&format!("http://{addr}/readyz"))
            .await
            .expect("readyz"),
        "ok\n"
    );
    let _ = PostParams::default();
    op.stop().await;
}

const PROFILED_JOB: &str = r#"
  workers:
    - {name: fast, replicas: 1, nodeSelector: {heterotrain.dev/node-type: fast-cpu}}
    - {name: slow, replicas: 1, nodeSelector: {heterotrain.dev/node-type: slow-cpu}}
  model: {name: mlp, hidden: 32}
  dataset: {name: synthetic_image}
  training: {globalBatchSize: 32, maxSteps: 1000}
  loadBalancing: {rebalanceIntervalSteps: 2}
  metricsPort: 19400
"#;

#[tokio::test]
async fn profiles_give_the_first_plan_and_seed_the_next_job() {
    let env = env("profiles").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    let ranks = start_fake_ranks(&env, &[0.01, 0.03], 16).await;
    for (r, f) in ranks.iter().enumerate() {
        let c = if r == 0 { 0.01 } else { 0.03 };
        f.lock().expect("rank").profile = Some(vec![
            (8, 0.002 + 8.0 * c),
            (16, 0.002 + 16.0 * c),
            (32, 0.002 + 32.0 * c),
        ]);
    }
    let yaml = format!("apiVersion: heterotrain.dev/v1alpha1\nkind: HeteroTrainingJob\nmetadata: {{name: first}}\nspec:{PROFILED_JOB}");
    create_job(&env, &job_from_yaml(&env.ns, &yaml)).await;
    run_gang(&env, "first", 2, 0).await;
    let p = eventually(Duration::from_secs(60), "a profile plan", || async {
        plan(&env, "first").await.filter(|p| p.generation >= 1)
    })
    .await;
    assert_eq!(p.policy, "proportional", "{p:?}");
    assert!(p.reason.contains("profiles"), "{p:?}");
    assert_eq!(p.batch_sizes, [24, 8]);
    let c = eventually(Duration::from_secs(60), "Profiled", || async {
        condition(&env, "first", "Profiled")
            .await
            .filter(|c| c.0 == "True")
    })
    .await;
    assert_eq!(c.1, "ProfilesReported");
    // The cache in the operator's namespace holds both profiles.
    let cms: Api<ConfigMap> = Api::namespaced(env.admin.clone(), &env.ns);
    let cache = eventually(Duration::from_secs(60), "profile cache", || async {
        cms.get_opt("heterotrain-profile-cache")
            .await
            .ok()
            .flatten()
            .and_then(|c| c.data)
            .filter(|d| d.len() == 2)
    })
    .await;
    assert!(
        cache.keys().any(
            |k| k.starts_with(&format!("{}.type-fast-cpu_cpu_t", env.ns))
                && k.ends_with("_mlp.h32")
        ),
        "{cache:?}"
    );
    // A second job on the same hardware starts balanced at generation 0.
    let yaml = format!("apiVersion: heterotrain.dev/v1alpha1\nkind: HeteroTrainingJob\nmetadata: {{name: second}}\nspec:{PROFILED_JOB}");
    create_job(&env, &job_from_yaml(&env.ns, &yaml)).await;
    let p = eventually(Duration::from_secs(60), "second job's plan", || async {
        plan(&env, "second").await
    })
    .await;
    assert_eq!(
        (p.generation, p.batch_sizes.clone()),
        (0, vec![24, 8]),
        "{p:?}"
    );
    assert!(p.reason.contains("cached profiles"));
    op.stop().await;
}

/// `heterotrain_operator_reconcile_errors_total` for `reason` (0 without
/// a series).
fn errors(op: &Operator, reason: &str) -> f64 {
    value(
        op,
        &format!("heterotrain_operator_reconcile_errors_total{{reason=\"{reason}\"}}"),
    )
}

#[tokio::test]
async fn a_balancer_that_cannot_decide_is_a_condition_and_one_warning() {
    let env = env("nodecide").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    let ranks = start_fake_ranks(&env, &[0.01, 0.03], 16).await;
    // Each rank's memory holds 10 samples: 20 in all, for a global batch
    // of 32.
    for f in &ranks {
        let mut f = f.lock().expect("rank");
        f.max_batch = 10;
        f.profile = Some(vec![(2, 0.022), (4, 0.042), (8, 0.082)]);
    }
    let yaml = format!("apiVersion: heterotrain.dev/v1alpha1\nkind: HeteroTrainingJob\nmetadata: {{name: capped}}\nspec:{PROFILED_JOB}");
    create_job(&env, &job_from_yaml(&env.ns, &yaml)).await;
    run_gang(&env, "capped", 2, 0).await;
    let c = eventually(Duration::from_secs(60), "Rebalanced False", || async {
        condition(&env, "capped", "Rebalanced")
            .await
            .filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(c.1, "BalancerError", "{c:?}");
    assert!(
        c.2.contains("exceeds the sum of per-rank caps 20") && c.2.contains("generation 0"),
        "{c:?}"
    );
    // Decisions keep failing; the Warning is not repeated.
    eventually(
        Duration::from_secs(60),
        "three failed decisions",
        || async { (errors(&op, "balancer") >= 3.0).then_some(()) },
    )
    .await;
    let warnings: Vec<_> = events(&env)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("BalancerError"))
        .collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].type_.as_deref(), Some("Warning"));
    // The recorder folds a repeated Event into a series.
    assert!(warnings[0].series.is_none(), "{warnings:?}");
    let p = plan(&env, "capped").await.expect("plan");
    assert_eq!((p.generation, p.batch_sizes), (0, vec![16, 16]));
    op.stop().await;
}

#[tokio::test]
async fn a_deleted_or_damaged_plan_comes_back_at_its_generation() {
    use kube::api::{Patch, PatchParams};
    let env = env("restore").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    let _ranks = start_fake_ranks(&env, &[0.02, 0.02], 16).await;
    create_job(
        &env,
        &job_from_yaml(&env.ns, &job_yaml("kept", 2, FAST_DECISIONS)),
    )
    .await;
    run_gang(&env, "kept", 2, 0).await;
    // The status records the plan the gang runs.
    eventually(Duration::from_secs(60), "batches in status", || async {
        get_job(&env, "kept").await.filter(|j| {
            j.status
                .as_ref()
                .is_some_and(|s| s.groups.iter().any(|g| g.batch_sizes == [16, 16]))
        })
    })
    .await;
    let before = plan(&env, "kept").await.expect("plan");
    let cms: Api<ConfigMap> = Api::namespaced(env.admin.clone(), &env.ns);
    cms.delete("kept-plan", &DeleteParams::default())
        .await
        .expect("delete the plan");
    let back = eventually(Duration::from_secs(60), "the plan restored", || async {
        plan(&env, "kept").await
    })
    .await;
    assert_eq!(
        (back.generation, &back.batch_sizes),
        (before.generation, &before.batch_sizes)
    );
    assert!(back.reason.contains("restored"), "{back:?}");
    // Garbage in the ConfigMap is replaced the same way.
    let garbage = serde_json::json!({"data": {heterotrain_crds::PLAN_KEY: "{not a plan"}});
    cms.patch(
        "kept-plan",
        &PatchParams::default(),
        &Patch::Merge(&garbage),
    )
    .await
    .expect("damage the plan");
    let again = eventually(Duration::from_secs(60), "the plan repaired", || async {
        plan(&env, "kept").await
    })
    .await;
    assert_eq!(again.generation, before.generation);
    let restored: Vec<_> = events(&env)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("PlanRestored"))
        .collect();
    assert!(!restored.is_empty(), "no PlanRestored event");
    op.stop().await;
}

#[tokio::test]
async fn pods_the_job_did_not_create_are_deleted_not_adopted() {
    let env = env("foreign").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    // A pod with the job's labels and a rank's name but no owner: what an
    // earlier job of the same name deleted with --cascade=orphan leaves.
    let stray: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "again-0",
            "labels": {"heterotrain.dev/job": "again", "heterotrain.dev/rank": "0",
                       "app.kubernetes.io/managed-by": "heterotrain-operator"},
        },
        "spec": {"automountServiceAccountToken": false,
                 "containers": [{"name": "trainer", "image": "example.org/old:1"}]},
    }))
    .expect("pod");
    let api: Api<Pod> = Api::namespaced(env.admin.clone(), &env.ns);
    // A new namespace's default ServiceAccount may not exist yet: retry.
    eventually(Duration::from_secs(60), "the stray pod created", || async {
        api.create(&PostParams::default(), &stray).await.ok()
    })
    .await;
    let job = create_job(&env, &job_from_yaml(&env.ns, &job_yaml("again", 2, ""))).await;
    let uid = job.metadata.uid.expect("uid");
    // The stray pod goes, and the job creates its own rank 0 in its place.
    eventually(Duration::from_secs(60), "the job's own 2 pods", || async {
        let p = pods(&env, "again").await;
        let owned = p
            .iter()
            .filter(|p| {
                p.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.uid == uid && o.controller == Some(true))
            })
            .count();
        (owned == 2 && p.len() == 2).then_some(())
    })
    .await;
    let rank0 = api.get("again-0").await.expect("rank 0");
    let image = rank0.spec.expect("spec").containers[0].image.clone();
    assert_ne!(
        image.as_deref(),
        Some("example.org/old:1"),
        "adopted the stray pod"
    );
    let foreign: Vec<_> = events(&env)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ForeignPods"))
        .collect();
    assert!(!foreign.is_empty(), "no ForeignPods event");
    op.stop().await;
}

#[tokio::test]
async fn watches_exactly_its_namespaces_with_roles_only_there() {
    let home = env("scoped-home").await;
    let watched = [env("scoped-b").await, env("scoped-c").await];
    let other = env("scoped-d").await;
    let client = scoped_operator(&home, "scoped-operator", &["scoped-b", "scoped-c"]).await;
    let mut config = test_config(&home, "scoped");
    config.watch_namespaces = vec!["scoped-b".into(), "scoped-c".into()];
    config.profile_cache = false;
    // The unwatched namespace's job first: an operator that watched it
    // would handle it no later than the others.
    create_job(&other, &job_from_yaml(&other.ns, &job_yaml("train", 2, ""))).await;
    for e in &watched {
        create_job(e, &job_from_yaml(&e.ns, &job_yaml("train", 2, ""))).await;
    }
    let op = Operator::start_as(client, config);
    for e in &watched {
        eventually(
            Duration::from_secs(60),
            &format!("2 pods in {}", e.ns),
            || async { (pods(e, "train").await.len() == 2).then_some(()) },
        )
        .await;
        let roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(e.admin.clone(), &e.ns);
        let role = roles.get("train-trainer").await.expect("trainer Role");
        assert_eq!(
            role.rules.expect("rules")[0].resource_names,
            Some(vec!["train-plan".to_string()])
        );
        let nps: Api<k8s_openapi::api::networking::v1::NetworkPolicy> =
            Api::namespaced(e.admin.clone(), &e.ns);
        assert!(nps.get_opt("train").await.expect("get").is_some());
    }
    // Give an all-namespaces watch time to show itself, then look.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(pods(&other, "train").await.is_empty());
    assert!(plan(&other, "train").await.is_none());
    let job = get_job(&other, "train").await.expect("job");
    assert!(job.status.is_none(), "{:?}", job.status);
    op.stop().await;
}

#[tokio::test]
async fn a_refused_pod_create_is_a_condition_not_a_hot_retry() {
    let env = env("quota").await;
    // A quota of no pods: the API server refuses every pod create (403).
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> =
        Api::namespaced(env.admin.clone(), &env.ns);
    let quota = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}
    }))
    .expect("quota");
    quotas
        .create(&PostParams::default(), &quota)
        .await
        .expect("create quota");
    // The quota controller fills in the status before admission enforces it.
    eventually(Duration::from_secs(60), "the quota's status", || async {
        quotas
            .get("no-pods")
            .await
            .ok()
            .and_then(|q| q.status)
            .and_then(|s| s.hard)
    })
    .await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    create_job(&env, &job_from_yaml(&env.ns, &job_yaml("quota", 2, ""))).await;
    let (status, _, message) = eventually(Duration::from_secs(60), "Created=False", || async {
        condition(&env, "quota", "Created")
            .await
            .filter(|c| c.1 == "CreateRefused")
    })
    .await;
    assert_eq!(status, "False");
    assert!(
        message.contains("HTTP 403") && message.contains("quota"),
        "{message}"
    );
    assert!(message.contains("ResourceQuota"), "{message}");
    assert!(pods(&env, "quota").await.is_empty());
    let warned = events(&env).await.into_iter().any(|e| {
        e.reason.as_deref() == Some("CreateRefused") && e.type_.as_deref() == Some("Warning")
    });
    assert!(warned, "no CreateRefused warning Event");
    // No hot retry: the job is not Failed, and the refusal is one Event
    // however many reconciles ran in the meantime.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let refusals: Vec<_> = events(&env)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("CreateRefused"))
        .collect();
    assert_eq!(refusals.len(), 1);
    // (The recorder folds repeats into a series: there is none.)
    assert!(refusals[0].series.is_none(), "{:?}", refusals[0].series);
    assert_ne!(
        condition(&env, "quota", "Failed").await.map(|c| c.0),
        Some("True".into())
    );
    op.stop().await;
}

/// Kueue is found at each API version it has served LocalQueues at (the
/// operator's `gang::KUEUE_VERSIONS`), asked of the real API server's
/// discovery with the operator's own RBAC, and not found once gone. No
/// other test here sets `runPolicy.queue`, so none is wired to it meanwhile.
#[tokio::test]
async fn kueue_is_detected_at_each_version_it_serves() {
    use heterotrain_e2e::crd;
    use heterotrain_operator::gang::{Discovery, KUEUE_VERSIONS};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let env = env("kueue").await;
    let crds: Api<CustomResourceDefinition> = Api::all(env.admin.clone());
    let served = |client: kube::Client| async move {
        // A new Discovery each time: its answers are cached for a while.
        Discovery::default()
            .served(&client)
            .await
            .expect("discovery")
            .kueue
    };
    assert!(
        !served(env.operator.clone()).await,
        "no Kueue installed yet"
    );
    for version in KUEUE_VERSIONS {
        let c = crd::schemaless_crd("kueue.x-k8s.io", version, "LocalQueue", "localqueues")
            .expect("crd");
        crd::install(&env.admin, &c).await.expect("install");
        eventually(
            Duration::from_secs(30),
            &format!("Kueue {version} found"),
            || {
                let client = env.operator.clone();
                async move { served(client).await.then_some(()) }
            },
        )
        .await;
        crds.delete("localqueues.kueue.x-k8s.io", &DeleteParams::default())
            .await
            .expect("delete");
        eventually(
            Duration::from_secs(60),
            &format!("Kueue {version} gone"),
            || {
                let client = env.operator.clone();
                async move { (!served(client).await).then_some(()) }
            },
        )
        .await;
    }
}
