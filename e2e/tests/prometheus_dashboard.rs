//! The dashboards on real data: a real Prometheus (Debian's package)
//! scrapes the simulated pods through file-based discovery kept by the node
//! simulator, with the target labels the chart's PodMonitor relabelling
//! gives (namespace, pod, node, job_name, rank, group). The chart is
//! installed with `operator.metricsSource=prometheus`, so the operator (run
//! by the simulator under the chart's RBAC) balances a job of real trainers
//! from Prometheus' HTTP API. While the job trains, every dashboard panel's
//! PromQL — with $namespace, $job and $__rate_interval as Grafana would
//! substitute them — must return data (GPU / evaluation panels only when
//! the run has such series), and a trainer's exposition passes
//! `promtool check metrics`.
//!
//! Needs `target/<profile>/heterotrain-operator` and `heterotrain-trainer`.

mod support;

use std::time::{Duration, Instant};

use heterotrain_e2e::prometheus::Prometheus;
use heterotrain_e2e::system::SystemOptions;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use support::*;

const SYSTEM_NS: &str = "heterotrain-system";
const NS: &str = "dash";
const JOB: &str = "dash";
/// Prometheus scrapes every second; Grafana's $__rate_interval is then
/// max(4 × scrape interval, step + scrape interval): a few seconds. Use
/// a window that holds enough samples for rate().
const RATE_INTERVAL: &str = "15s";

/// `query` at the server's now, through its HTTP API.
fn query(prom: &Prometheus, expr: &str) -> Result<Vec<serde_json::Value>, String> {
    prom.query(expr).map_err(|e| format!("{e:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_panel_has_data_while_a_job_balances_from_prometheus() {
    let mut bed = test_bed(SystemOptions {
        prometheus: true,
        ..SystemOptions::bare(
        "prometheus-dashboard",
        nodes("nodes:\n- {name: ops, cpu: '2'}\n- {name: fast, speed: 1.0, cpu: '1'}\n- {name: slow, speed: 0.35, cpu: '1'}\n"),
    )})
    .await;
    let client = bed.client().await.unwrap();
    let (cluster, sim) = (&bed.cluster, &bed.sim);
    let prom = bed.prometheus.as_ref().expect("the bed's prometheus");
    create_namespace(&client, NS).await;

    let chart = chart_dir();
    let kubeconfig = cluster.kubeconfig_path();
    let prom_url = prom.url();
    run_helm(&[
        "install",
        "ht",
        chart.to_str().unwrap(),
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        SYSTEM_NS,
        "--create-namespace",
        "--set",
        &format!("watchNamespaces={{{NS}}}"),
        "--set",
        "operator.nodeSelector.kubernetes\\.io/hostname=ops",
        "--set",
        "operator.listenAddress=$(POD_IP)",
        "--set",
        "operator.metricsSource=prometheus",
        // The test bed's Prometheus finds the operator pod by its port
        // and scrapes without a ServiceAccount token.
        "--set",
        "operator.metricsAuth=false",
        "--set",
        &format!("operator.prometheusUrl={prom_url}"),
        "--set",
        "operator.scrapeIntervalSeconds=2",
        "--set",
        "operator.rebalanceIntervalSeconds=4",
        "--wait",
        "--timeout",
        "180s",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    wait_for_webhook(&client, NS).await;

    // Two ranks on nodes of different speed; the operator reads their
    // metrics from Prometheus only.
    let job = pair_job(
        JOB,
        json!({"policy": "dynamic", "metricsSource": "prometheus", "rebalanceIntervalSteps": 5,
               "prometheusUrl": prom_url}),
        true,
    );
    let jobs = jobs_api(&client, NS);
    jobs.create(
        &PostParams::default(),
        &serde_json::from_value(job).unwrap(),
    )
    .await
    .expect("create job");

    // The operator rebalances from Prometheus data.
    let read = tokio::time::timeout(Duration::from_secs(240), async {
        loop {
            if let Ok(Some(j)) = jobs.get_opt(JOB).await {
                let st = &j.data["status"];
                // Throughput and balance in the status come from the metrics
                // source, which --metrics-source=prometheus makes Prometheus.
                if st["phase"] == "Running"
                    && st["clusterSamplesPerSecond"].as_f64().unwrap_or(0.0) > 0.0
                    && st["balance"]["class"].is_string()
                    && st["groups"].as_array().is_some_and(|g| {
                        g.iter()
                            .all(|g| g["samplesPerSecond"].as_f64().unwrap_or(0.0) > 0.0)
                    })
                {
                    return st.clone();
                }
                assert!(
                    st["phase"] != "Failed" && st["phase"] != "Succeeded",
                    "job ended before the operator read it from Prometheus: {st}\n{}",
                    dump_namespaces(&client, sim, &[SYSTEM_NS, NS]).await
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    let status = match read {
        Ok(s) => s,
        Err(_) => panic!(
            "no metrics from Prometheus in the job status after 240 s: {:?}\n{}",
            jobs.get_opt(JOB)
                .await
                .ok()
                .flatten()
                .map(|j| j.data["status"].clone()),
            dump_namespaces(&client, sim, &[SYSTEM_NS, NS]).await
        ),
    };
    // Any plan it wrote is valid.
    let batches: Vec<u64> = status["lastRebalance"]["batchSizes"]
        .as_array()
        .map(|a| a.iter().filter_map(|b| b.as_u64()).collect())
        .unwrap_or_default();
    assert!(
        batches.is_empty() || batches.iter().sum::<u64>() == 64,
        "{status}"
    );

    // Enough scrapes for the rate windows: at least 20 s, then until every
    // variable and panel has data (later on a loaded machine, where scrapes
    // and rule evaluations come late).
    tokio::time::sleep(Duration::from_secs(20)).await;
    let d = dashboard();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let (empty, checked) = dashboard_gaps(prom, &d);
        if empty.is_empty() && checked >= 20 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "dashboard queries without data ({checked} with data):\n{}",
            empty.join("\n")
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    // A trainer's and the operator's exposition pass promtool.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let rank0 = pods.get(&format!("{JOB}-0")).await.unwrap();
    let ip = rank0.status.and_then(|s| s.pod_ip).expect("rank 0 IP");
    let text = http_get(&format!("{ip}:9400"), "/metrics").expect("trainer /metrics");
    promtool_check_metrics(&text);

    delete_and_wait(&jobs, &pods, JOB).await;
    straggler_alert_fires(&client, prom, sim, &jobs).await;
    run_helm(&[
        "uninstall",
        "ht",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--namespace",
        SYSTEM_NS,
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let deadline = Instant::now() + Duration::from_secs(30);
    let ops: Api<Pod> = Api::namespaced(client.clone(), SYSTEM_NS);
    while !ops
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty()
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    bed.stop().await;
}

/// The chart's alert rules, evaluated by the live Prometheus (their `for:`
/// shortened to 5 s and their 2-minute averages to the dashboard's rate
/// interval, or the test would wait ten minutes), in the throttle
/// scenario: a `static` job starts on two nodes of equal speed, and once
/// it trains and the alert is quiet the `slow` node is throttled to
/// [`THROTTLE`]. Equal batches then make rank 1 a straggler: the straggler
/// alert fires for it and not for the fast rank, and it went pending only
/// after the throttle; the fast rank's own gauge says it is bound by
/// communication (it waits); the dashboard's straggler count says 1.
async fn straggler_alert_fires(
    client: &kube::Client,
    prom: &Prometheus,
    sim: &heterotrain_e2e::nodesim::NodeSimulator,
    jobs: &Api<kube::api::DynamicObject>,
) {
    let rules =
        std::fs::read_to_string(chart_dir().join("files/alerts.yaml")).expect("alerts.yaml");
    let shortened: String = rules
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 5s", &l[..l.len() - l.trim_start().len()]),
            None => l.replace("[2m]", &format!("[{RATE_INTERVAL}]")),
        })
        .collect::<Vec<_>>()
        .join("\n");
    prom.load_rules(&shortened).expect("load the alert rules");
    sim.set_speed("slow", 1.0)
        .expect("unthrottle the slow node");
    let name = "straggle";
    let job = pair_job(name, json!({"policy": "static"}), false);
    jobs.create(
        &PostParams::default(),
        &serde_json::from_value(job).unwrap(),
    )
    .await
    .expect("create the static job");
    let sel = format!("namespace=\"{NS}\",job_name=\"{name}\"");
    // Train at equal speeds until the rules have evaluated both ranks for
    // twice the alert's `for:` (a straggler would be pending by then), and
    // only then throttle.
    let evaluated = format!("count(heterotrain:rank_step_compute_seconds:training{{{sel}}}) == 2");
    wait_for(
        "the rules to see both ranks",
        Duration::from_secs(180),
        || {
            let r = query(prom, &evaluated).unwrap_or_default();
            async move { (!r.is_empty()).then_some(()) }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // A rank starved of CPU by other work can pass 1.5× for a while even
    // at equal speeds and go pending: wait until the alert is quiet (a
    // rule that fires at equal speeds never is), and throttle right after.
    // The episode that fires must have begun after this moment.
    let any_state = format!("ALERTS{{alertname=\"HeteroTrainRankStraggler\",{sel}}}");
    let quiet_at = wait_for(
        "the straggler alert quiet at equal speeds",
        Duration::from_secs(180),
        || {
            let at = unix_now();
            let r = query(prom, &any_state);
            async move { r.ok()?.is_empty().then_some(at) }
        },
    )
    .await;
    sim.set_speed("slow", THROTTLE)
        .expect("throttle the slow node");
    let firing =
        format!("ALERTS{{alertname=\"HeteroTrainRankStraggler\",alertstate=\"firing\",{sel}}}");
    let found = wait_for(
        "the straggler alert to fire",
        Duration::from_secs(180),
        || {
            let r = query(prom, &firing).unwrap_or_default();
            async move { (!r.is_empty()).then_some(r) }
        },
    )
    .await;
    let ranks: Vec<&str> = found
        .iter()
        .filter_map(|s| s["metric"]["rank"].as_str())
        .collect();
    assert_eq!(ranks, ["1"], "only the slow rank straggles: {found:?}");
    // ALERTS_FOR_STATE's value is when the alert went pending: after the
    // throttle, not while both nodes ran at one speed.
    let since = query(
        prom,
        &format!("ALERTS_FOR_STATE{{alertname=\"HeteroTrainRankStraggler\",{sel},rank=\"1\"}}"),
    )
    .unwrap_or_default();
    let active_at: f64 = since
        .first()
        .and_then(|s| s["value"][1].as_str())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no ALERTS_FOR_STATE: {since:?}"));
    assert!(
        active_at >= quiet_at,
        "the straggler alert was pending at {active_at}, before the throttle (quiet at {quiet_at})"
    );
    let waiting = format!("heterotrain_bottleneck{{{sel},rank=\"0\",kind=\"communication\"}} == 1");
    wait_for(
        "the fast rank to be bound by communication",
        Duration::from_secs(120),
        || {
            let r = query(prom, &waiting).unwrap_or_default();
            async move { (!r.is_empty()).then_some(()) }
        },
    )
    .await;
    let d: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("dashboards/heterotrain.json")).unwrap(),
    )
    .unwrap();
    let panel = dashboard_panels(&d)
        .into_iter()
        .find(|p| p.title == "Straggling ranks")
        .expect("the straggler panel");
    let expr = substitute(&panel.exprs[0], NS, name, RATE_INTERVAL);
    wait_for(
        "the straggler panel to count 1",
        Duration::from_secs(120),
        || {
            let count = query(prom, &expr).unwrap_or_default();
            async move { (count.first()?["value"][1] == "1").then_some(()) }
        },
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    delete_and_wait(jobs, &pods, name).await;
}

/// What of dashboard `d` has no data for this job now: the variables that
/// do not resolve to it and the panel queries that return nothing (GPU and
/// evaluation panels only when the run has such series); and how many
/// queries returned data.
fn dashboard_gaps(prom: &Prometheus, d: &serde_json::Value) -> (Vec<String>, usize) {
    let mut empty = Vec::new();
    // Dashboard variables resolve to this job.
    for v in d["templating"]["list"].as_array().unwrap() {
        let Some(q) = v["query"]["query"].as_str() else {
            continue;
        };
        let (expr, label) = label_values_query(q).expect("label_values");
        let expr = substitute(&expr, NS, JOB, RATE_INTERVAL);
        let want = if label == "namespace" { NS } else { JOB };
        let got: Vec<String> = query(prom, &expr)
            .unwrap_or_default()
            .iter()
            .filter_map(|s| s["metric"][&label].as_str().map(str::to_string))
            .collect();
        if !got.iter().any(|g| g == want) {
            empty.push(format!("variable {}: {got:?}", v["name"]));
        }
    }
    // Every panel's every query returns data.
    let has = |pattern: &str| {
        !query(
            prom,
            &format!("count({{__name__=~\"{pattern}\",namespace=\"{NS}\",job_name=\"{JOB}\"}})"),
        )
        .unwrap_or_default()
        .is_empty()
    };
    let run_has_gpu = has("heterotrain_gpu_.+");
    let run_has_eval = has("heterotrain_eval_.+");
    let mut checked = 0;
    for p in dashboard_panels(d) {
        match p.requires.as_deref() {
            Some("gpu") if !run_has_gpu => continue,
            Some("evaluation") if !run_has_eval => continue,
            _ => {}
        }
        for e in &p.exprs {
            let expr = substitute(e, NS, JOB, RATE_INTERVAL);
            match query(prom, &expr) {
                Ok(r) if !r.is_empty() => checked += 1,
                Ok(_) => empty.push(format!("{}: {expr}", p.title)),
                Err(err) => empty.push(format!("{}: {expr}: {err}", p.title)),
            }
        }
    }
    (empty, checked)
}

/// The `slow` node's speed in the straggler scenario: 5× under the fast
/// node's, so rank 1's compute stays over 1.5× rank 0's even when other
/// work takes CPU from rank 0.
const THROTTLE: f64 = 0.2;

/// Seconds since the Unix epoch (Prometheus' timestamps).
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A long two-rank job `name` with one rank on `fast` and one on `slow`,
/// balanced as `load_balancing` says.
fn pair_job(name: &str, load_balancing: serde_json::Value, profiling: bool) -> serde_json::Value {
    json!({
        "apiVersion": "heterotrain.dev/v1alpha1",
        "kind": "HeteroTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "workers": [
                {"name": "fast", "replicas": 1, "threads": 1, "nodeSelector": {"kubernetes.io/hostname": "fast"},
                 "resources": {"limits": {"cpu": "1"}}},
                {"name": "slow", "replicas": 1, "threads": 1, "nodeSelector": {"kubernetes.io/hostname": "slow"},
                 "resources": {"limits": {"cpu": "1"}}}
            ],
            "model": {"name": "mlp"},
            "dataset": {"name": "synthetic_image", "syntheticSamples": 4096},
            "training": {"globalBatchSize": 64, "epochs": 100000, "maxSteps": 1000000, "learningRate": "0.05"},
            "loadBalancing": load_balancing,
            "profiling": {"enabled": profiling}
        }
    })
}

/// Delete job `name` and wait until its pods are gone.
async fn delete_and_wait(jobs: &Api<kube::api::DynamicObject>, pods: &Api<Pod>, name: &str) {
    jobs.delete(name, &DeleteParams::default()).await.unwrap();
    wait_for("the job's pods to go", Duration::from_secs(120), || {
        let pods = pods.clone();
        async move {
            pods.list(&ListParams::default().labels(&format!("heterotrain.dev/job={name}")))
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        }
    })
    .await;
}
