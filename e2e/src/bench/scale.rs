//! Operator scale: N jobs × 8 ranks on simulated nodes that report pods
//! Running without starting processes. Grows to each N in turn, waits until
//! every pod runs, holds for a while, and reads the operator's reconcile
//! histogram (`/metrics`) and its RSS (`/proc/<pid>/status`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use futures::{stream, StreamExt};
use heterotrain_crds::HeteroTrainingJob;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use serde_json::json;

use super::ScalePoint;
use crate::nodesim::{NodeConfig, NodesFile};
use crate::system::{System, SystemOptions};

/// Ranks per job.
pub const RANKS: u32 = 8;

/// Nodes with room for `pods` pods that don't run processes.
pub fn nodes_for(pods: u32) -> NodesFile {
    let per_node = 250;
    let n = pods.div_ceil(per_node).max(1);
    NodesFile {
        nodes: (0..n)
            .map(|i| NodeConfig {
                name: format!("scale-{i:02}"),
                labels: BTreeMap::new(),
                speed: 1.0,
                cpu: "256".into(),
                memory: "1Ti".into(),
                gpus: 0,
                gpu_product: None,
                max_pods: per_node,
                run_processes: false,
                cpus: Vec::new(),
            })
            .collect(),
    }
}

fn scale_job(name: &str) -> Result<HeteroTrainingJob> {
    serde_json::from_value(json!({
        "apiVersion": "heterotrain.dev/v1alpha1",
        "kind": "HeteroTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "workers": [{
                "name": "cpu", "replicas": RANKS, "device": "cpu", "threads": 1,
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
            }],
            "model": {"name": "simple_cnn"},
            "dataset": {"name": "synthetic_image"},
            "training": {"globalBatchSize": 256, "maxSteps": 1000000, "learningRate": "0.01"},
            "loadBalancing": {"policy": "dynamic"}
        }
    }))
    .context("building a scale job")
}

/// Cumulative histogram buckets (upper bound → count) of every series whose
/// name contains `name` and ends in `_bucket`, summed over label sets.
pub fn histogram(text: &str, name: &str) -> BTreeMap<u64, f64> {
    histogram_where(text, name, "")
}

/// [`histogram`] of the series whose line also contains `label` (e.g.
/// `stage="apply"`).
pub fn histogram_where(text: &str, name: &str, label: &str) -> BTreeMap<u64, f64> {
    let mut out: BTreeMap<u64, f64> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains(label))
    {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let metric = key.split('{').next().unwrap_or("");
        if !metric.contains(name) || !metric.ends_with("_bucket") {
            continue;
        }
        let Some(le) = key.split("le=\"").nth(1).and_then(|r| r.split('"').next()) else {
            continue;
        };
        let (Some(le), Ok(v)) = (bucket_bound(le), value.trim().parse::<f64>()) else {
            continue;
        };
        *out.entry(le.to_bits()).or_default() += v;
    }
    out
}

/// A bucket's upper bound (`le`), `+Inf` included.
fn bucket_bound(le: &str) -> Option<f64> {
    if le == "+Inf" {
        Some(f64::INFINITY)
    } else {
        le.parse().ok()
    }
}

/// `b - a` per bucket.
pub fn delta(a: &BTreeMap<u64, f64>, b: &BTreeMap<u64, f64>) -> BTreeMap<u64, f64> {
    b.iter()
        .map(|(k, v)| (*k, v - a.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// The q-quantile of a cumulative histogram, linearly interpolated inside
/// the bucket (as PromQL's `histogram_quantile`); None without observations.
pub fn histogram_quantile(buckets: &BTreeMap<u64, f64>, q: f64) -> Option<f64> {
    let mut b: Vec<(f64, f64)> = buckets
        .iter()
        .map(|(k, v)| (f64::from_bits(*k), *v))
        .collect();
    b.sort_by(|x, y| x.0.total_cmp(&y.0));
    let total = b.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let mut prev = (0.0, 0.0);
    for &(le, c) in &b {
        if c >= rank {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let in_bucket = c - prev.1;
            let frac = if in_bucket > 0.0 {
                (rank - prev.1) / in_bucket
            } else {
                1.0
            };
            return Some(prev.0 + (le - prev.0) * frac);
        }
        prev = (le, c);
    }
    Some(prev.0)
}

/// Observations in a cumulative histogram.
pub fn histogram_count(buckets: &BTreeMap<u64, f64>) -> f64 {
    buckets
        .iter()
        .map(|(k, v)| (f64::from_bits(*k), *v))
        .filter(|(le, _)| le.is_infinite())
        .map(|(_, v)| v)
        .next()
        .unwrap_or(0.0)
}

/// Resident set size of `pid`, MiB.
pub fn rss_mib(pid: u32) -> Option<f64> {
    proc_mib(&format!("/proc/{pid}/status"), "VmRSS:")
}

/// `MemAvailable` of this machine, MiB.
fn mem_available_mib() -> Option<f64> {
    proc_mib("/proc/meminfo", "MemAvailable:")
}

/// The `<field> <n> kB` line of a /proc file, in MiB.
fn proc_mib(path: &str, field: &str) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    let kb: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// The reconcile stages the operator times apart.
const STAGES: [&str; 4] = ["fetch", "apply", "balance", "status"];

fn operator_metrics(system: &System) -> Result<String> {
    let port = system
        .operator_http_port()
        .ok_or_else(|| anyhow!("the operator is not running"))?;
    let (code, body) = crate::prometheus::http_get(port, "/metrics")?;
    if code != 200 {
        bail!("operator /metrics answered {code}");
    }
    Ok(body)
}

fn operator_histogram(system: &System) -> Result<BTreeMap<u64, f64>> {
    Ok(histogram(&operator_metrics(system)?, "reconcile_duration_"))
}

/// Each stage's histogram.
fn stage_histograms(system: &System) -> Result<Vec<BTreeMap<u64, f64>>> {
    let text = operator_metrics(system)?;
    Ok(STAGES
        .iter()
        .map(|s| histogram_where(&text, "reconcile_stage_duration", &format!("stage=\"{s}\"")))
        .collect())
}

/// The API server's request-duration histograms, per `VERB resource[/sub]`.
pub fn api_histograms(text: &str) -> BTreeMap<String, BTreeMap<u64, f64>> {
    let mut out: BTreeMap<String, BTreeMap<u64, f64>> = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_duration_seconds_bucket{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
        };
        // The server writes labels sorted, none first of these four.
        let (verb, resource, sub, le) = (
            label(",verb").to_string(),
            label(",resource").to_string(),
            label(",subresource").to_string(),
            label(",le"),
        );
        let (Some(le), Ok(v)) = (bucket_bound(le), value.trim().parse::<f64>()) else {
            continue;
        };
        if matches!(verb.as_str(), "WATCH" | "CONNECT") || resource.is_empty() {
            continue;
        }
        let key = if sub.is_empty() {
            format!("{verb} {resource}")
        } else {
            format!("{verb} {resource}/{sub}")
        };
        *out.entry(key).or_default().entry(le.to_bits()).or_default() += v;
    }
    out
}

async fn api_metrics(client: &kube::Client) -> Result<BTreeMap<String, BTreeMap<u64, f64>>> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .context("building a /metrics request")?;
    let text = client
        .request_text(req)
        .await
        .context("reading the API server's /metrics")?;
    Ok(api_histograms(&text))
}

/// Request kinds with at least 50 requests between `a` and `b`: (count,
/// p99 seconds).
fn api_p99(
    a: &BTreeMap<String, BTreeMap<u64, f64>>,
    b: &BTreeMap<String, BTreeMap<u64, f64>>,
) -> BTreeMap<String, (u64, f64)> {
    let empty = BTreeMap::new();
    b.iter()
        .filter_map(|(k, hb)| {
            let d = delta(a.get(k).unwrap_or(&empty), hb);
            let n = histogram_count(&d);
            (n >= 50.0).then(|| Some((k.clone(), (n as u64, histogram_quantile(&d, 0.99)?))))?
        })
        .collect()
}

/// Pods Running in a watched store.
fn running_pods(store: &Store<Pod>) -> usize {
    store
        .state()
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

/// Jobs the operator reports Running, in a watched store.
fn running_jobs(store: &Store<HeteroTrainingJob>) -> usize {
    store
        .state()
        .iter()
        .filter(|j| j.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

/// A store of `api`'s objects kept current by a watch, so waiting costs
/// the API server one watch stream instead of a list of thousands of pods
/// every poll (which would itself load the server being measured).
fn watched<K>(api: Api<K>) -> (Store<K>, tokio::task::JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher::watcher(api, watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
    });
    (reader, task)
}

/// Grow to each of `counts` jobs in turn and measure. `hold`: time spent
/// at each size after every pod runs; `operator_args`: extra flags for the
/// operator. `say` prints progress.
pub async fn run(
    counts: &[u32],
    hold: Duration,
    operator_args: &[String],
    say: &(dyn Fn(&str) + Sync),
) -> Result<Vec<ScalePoint>> {
    let max = counts.iter().copied().max().unwrap_or(0);
    say(&format!(
        "==> operator scale: starting a control plane with nodes for {} pods",
        max * RANKS
    ));
    let opts = SystemOptions {
        operator_args: operator_args.to_vec(),
        ..SystemOptions::new("bench-scale", nodes_for(max * RANKS))
    };
    let mut system = System::start(opts).await?;
    let out = grow(&system, counts, hold, say).await;
    system.stop().await;
    out
}

async fn grow(
    system: &System,
    counts: &[u32],
    hold: Duration,
    say: &(dyn Fn(&str) + Sync),
) -> Result<Vec<ScalePoint>> {
    let ns = "scale";
    system.create_namespace(ns).await?;
    let client = system.client().await?;
    let jobs: Api<HeteroTrainingJob> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let (pod_store, pod_watch) = watched(pods);
    let (job_store, job_watch) = watched(jobs.clone());
    let out = grow_in(
        system, &client, &jobs, &pod_store, &job_store, counts, hold, say,
    )
    .await;
    pod_watch.abort();
    job_watch.abort();
    out
}

#[allow(clippy::too_many_arguments)]
async fn grow_in(
    system: &System,
    client: &kube::Client,
    jobs: &Api<HeteroTrainingJob>,
    pod_store: &Store<Pod>,
    job_store: &Store<HeteroTrainingJob>,
    counts: &[u32],
    hold: Duration,
    say: &(dyn Fn(&str) + Sync),
) -> Result<Vec<ScalePoint>> {
    // Let the operator come up.
    let t = Instant::now();
    while system.operator_http_port().is_none() || operator_histogram(system).is_err() {
        if t.elapsed() > Duration::from_secs(60) {
            bail!("the operator's /metrics did not answer in 60 s");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut have = 0u32;
    let mut points = Vec::new();
    let mut sorted = counts.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    for &n in &sorted {
        let before = operator_histogram(system)?;
        let stages_before = stage_histograms(system)?;
        let api_before = api_metrics(client).await?;
        let t0 = Instant::now();
        say(&format!(
            "    creating jobs {}..{} ({} pods in all)",
            have,
            n,
            n * RANKS
        ));
        let names: Vec<String> = (have..n).map(|i| format!("scale-{i:04}")).collect();
        let results: Vec<Result<()>> = stream::iter(names)
            .map(|name| {
                let jobs = jobs.clone();
                async move {
                    let j = scale_job(&name)?;
                    jobs.create(&PostParams::default(), &j)
                        .await
                        .with_context(|| format!("creating {name}"))?;
                    Ok(())
                }
            })
            .buffer_unordered(4)
            .collect()
            .await;
        for r in results {
            r?;
        }
        have = n;
        let want = (n * RANKS) as usize;
        let mut last_report = Instant::now();
        loop {
            let running = running_pods(pod_store);
            if running >= want {
                break;
            }
            if last_report.elapsed() > Duration::from_secs(15) {
                say(&format!(
                    "    {running}/{want} pods Running after {:.0} s",
                    t0.elapsed().as_secs_f64()
                ));
                last_report = Instant::now();
            }
            if let Some(free) = mem_available_mib() {
                if free < 2048.0 {
                    bail!("stopped at {n} jobs: the machine has {free:.0} MiB of memory left ({running}/{want} pods Running)");
                }
            }
            if t0.elapsed() > Duration::from_secs(900) {
                bail!("only {running} of {want} pods Running after 15 minutes");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // Then until the operator reports every job Running (it has seen all
        // the pods and written the status), and a moment to settle.
        loop {
            let running = running_jobs(job_store);
            if running >= n as usize {
                break;
            }
            if t0.elapsed() > Duration::from_secs(900) {
                bail!("only {running} of {n} jobs Running after 15 minutes");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let to_running = t0.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(3)).await;
        say(&format!(
            "    {n} jobs: all {want} pods Running after {to_running:.0} s; holding {:.0} s",
            hold.as_secs_f64()
        ));
        let running = operator_histogram(system)?;
        let stages_running = stage_histograms(system)?;
        let api_running = api_metrics(client).await?;
        tokio::time::sleep(hold).await;
        let after = operator_histogram(system)?;
        let burst = delta(&before, &running);
        let steady = delta(&running, &after);
        let p = ScalePoint {
            jobs: n,
            pods: n * RANKS,
            reconciles: histogram_count(&steady) as u64,
            reconcile_p50_seconds: histogram_quantile(&steady, 0.5),
            reconcile_p99_seconds: histogram_quantile(&steady, 0.99),
            burst_reconciles: histogram_count(&burst) as u64,
            burst_p50_seconds: histogram_quantile(&burst, 0.5),
            burst_p99_seconds: histogram_quantile(&burst, 0.99),
            rss_mib: system.operator_pid().and_then(rss_mib),
            burst_stage_p99_seconds: STAGES
                .iter()
                .zip(stages_before.iter().zip(&stages_running))
                .filter_map(|(s, (a, b))| {
                    Some((s.to_string(), histogram_quantile(&delta(a, b), 0.99)?))
                })
                .collect(),
            seconds_to_running: to_running,
            burst_api_p99_seconds: api_p99(&api_before, &api_running),
        };
        let [p50, p99, burst_p50, burst_p99] = p.latencies_ms().map(|v| v.unwrap_or(f64::NAN));
        say(&format!(
            "    {n} jobs: steady {} reconciles, p50 {p50:.1} ms, p99 {p99:.1} ms; while creating {} reconciles, p50 {burst_p50:.1} ms, p99 {burst_p99:.1} ms; RSS {:.1} MiB",
            p.reconciles,
            p.burst_reconciles,
            p.rss_mib.unwrap_or(f64::NAN)
        ));
        let stage_p99: Vec<String> = p
            .burst_stage_p99_seconds
            .iter()
            .map(|(s, v)| format!("{s} {:.1} ms", v * 1000.0))
            .collect();
        say(&format!(
            "    {n} jobs: p99 per reconcile stage while creating: {}",
            stage_p99.join(", ")
        ));
        let api: Vec<String> = p
            .slowest_api(8)
            .into_iter()
            .map(|(k, (n, v))| format!("{k} {:.0} ms ({n})", v * 1000.0))
            .collect();
        say(&format!(
            "    {n} jobs: API server p99 while creating (requests): {}",
            api.join(", ")
        ));
        points.push(p);
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP x\n\
heterotrain_operator_reconcile_duration_seconds_bucket{le=\"0.005\"} 50\n\
heterotrain_operator_reconcile_duration_seconds_bucket{le=\"0.01\"} 90\n\
heterotrain_operator_reconcile_duration_seconds_bucket{le=\"0.02\"} 100\n\
heterotrain_operator_reconcile_duration_seconds_bucket{le=\"+Inf\"} 100\n\
heterotrain_operator_reconcile_duration_seconds_sum 0.7\n\
heterotrain_operator_reconcile_duration_seconds_count 100\n\
heterotrain_operator_other_bucket{le=\"0.005\"} 7\n";

    #[test]
    fn api_server_histograms_are_keyed_by_verb_and_resource() {
        let line = |verb: &str, res: &str, sub: &str, le: &str, v: u32| {
            format!("apiserver_request_duration_seconds_bucket{{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"{res}\",scope=\"resource\",subresource=\"{sub}\",verb=\"{verb}\",version=\"v1\",le=\"{le}\"}} {v}\n")
        };
        let a = line("APPLY", "pods", "", "0.1", 0)
            + &line("APPLY", "pods", "", "1", 0)
            + &line("APPLY", "pods", "", "+Inf", 0);
        let b = line("APPLY", "pods", "", "0.1", 90)
            + &line("APPLY", "pods", "", "1", 100)
            + &line("APPLY", "pods", "", "+Inf", 100)
            + &line("PATCH", "pods", "status", "+Inf", 60)
            + &line("WATCH", "pods", "", "+Inf", 500)
            + &line("POST", "events", "", "+Inf", 10)
            + "apiserver_request_total{verb=\"GET\"} 3\n";
        let (ha, hb) = (api_histograms(&a), api_histograms(&b));
        assert_eq!(
            hb.keys().collect::<Vec<_>>(),
            ["APPLY pods", "PATCH pods/status", "POST events"]
        );
        let p = api_p99(&ha, &hb);
        // Watches are not requests that end; kinds under 50 requests are left out.
        assert_eq!(
            p.keys().collect::<Vec<_>>(),
            ["APPLY pods", "PATCH pods/status"]
        );
        let (n, p99) = p["APPLY pods"];
        assert_eq!(n, 100);
        // The 99th of 100 lies 9/10 into (0.1, 1].
        assert!((p99 - 0.91).abs() < 1e-9, "{p99}");
    }

    #[test]
    fn histogram_quantiles_interpolate_inside_buckets() {
        let h = histogram(TEXT, "reconcile_duration");
        assert_eq!(h.len(), 4);
        assert_eq!(histogram_count(&h), 100.0);
        // p50: 50th of 100 → end of the first bucket.
        assert!((histogram_quantile(&h, 0.5).unwrap() - 0.005).abs() < 1e-12);
        // p99: 99th → 9/10 into (0.01, 0.02].
        assert!((histogram_quantile(&h, 0.99).unwrap() - 0.019).abs() < 1e-12);
        // A delta against an earlier scrape only counts what happened since.
        let earlier = histogram(&TEXT.replace(" 100\n", " 95\n"), "reconcile_duration");
        let d = delta(&earlier, &h);
        assert_eq!(histogram_count(&d), 5.0);
        assert!(histogram_quantile(&d, 0.5).unwrap() > 0.01);
        assert_eq!(histogram_quantile(&BTreeMap::new(), 0.5), None);
    }

    #[test]
    fn nodes_hold_every_pod() {
        let f = nodes_for(4000);
        let room: u32 = f.nodes.iter().map(|n| n.max_pods).sum();
        assert!(room >= 4000);
        assert!(f.nodes.iter().all(|n| !n.run_processes));
    }

    #[test]
    fn rss_of_this_process() {
        let m = rss_mib(std::process::id()).unwrap();
        assert!(m > 1.0 && m < 100_000.0, "{m}");
    }
}
