//! Train one job to completion on the demo cluster, drawing the live table,
//! and measure it: steady-state throughput, time to the final plan, the
//! final plan and held-out accuracy.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use heterotrain_crds::labels;
use heterotrain_crds::{BatchPlan, HeteroTrainingJob, PLAN_KEY};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::Client;

use super::scrape::scrape;
use super::table::{self, RankView, Screen};

/// What one run measured.
pub struct RunResult {
    pub steady_samples_per_second: f64,
    pub converge: Option<Duration>,
    pub final_plan: Vec<u32>,
    /// Rank 0's last held-out evaluation, and on how many samples.
    pub accuracy: Option<(f64, Option<u64>)>,
    pub nodes: BTreeMap<u32, String>,
    pub elapsed: Duration,
}

/// Cluster-wide figures as the run goes: the steady-state window (from 40 %
/// of the steps on) and when the plan last changed.
struct Measure {
    window: Option<(Instant, f64)>,
    last_total: (Instant, f64),
    last_gen: f64,
    converge: Option<Duration>,
    first_step_at: Option<Instant>,
}

impl Measure {
    fn new() -> Measure {
        Measure {
            window: None,
            last_total: (Instant::now(), 0.0),
            last_gen: 0.0,
            converge: None,
            first_step_at: None,
        }
    }

    /// Take the cluster's samples `total`, rank 0's `step` and the plan
    /// generation `gen` seen at `now`.
    fn observe(&mut self, now: Instant, total: f64, step: f64, gen: f64, max_steps: f64) {
        if step > 0.0 && self.first_step_at.is_none() {
            self.first_step_at = Some(now);
        }
        if gen > self.last_gen {
            self.last_gen = gen;
            self.converge = self.first_step_at.map(|f| now.duration_since(f));
        }
        if self.window.is_none() && max_steps > 0.0 && step >= 0.4 * max_steps {
            self.window = Some((now, total));
        }
        if total > self.last_total.1 {
            self.last_total = (now, total);
        }
    }

    /// Samples per second over the steady-state window.
    fn steady(&self) -> f64 {
        match self.window {
            Some((t1, s1)) if self.last_total.0 > t1 => {
                (self.last_total.1 - s1) / self.last_total.0.duration_since(t1).as_secs_f64()
            }
            _ => 0.0,
        }
    }
}

async fn rank_pods(client: &Client, ns: &str, job: &str) -> Result<Vec<(u32, String, String)>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&labels::job_selector(job));
    let mut out = Vec::new();
    for p in pods.list(&lp).await? {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        let rank = labels
            .get(labels::RANK)
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let ip = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .unwrap_or_default();
        out.push((rank, node, ip));
    }
    out.sort();
    Ok(out)
}

/// Rank 0's last `eval` record in its step log on the simulated node:
/// (accuracy, samples evaluated).
fn logged_accuracy(state_dir: &Path, ns: &str, job: &str) -> Option<(f64, Option<u64>)> {
    let path = crate::bench::runner::rank_log_path(state_dir, ns, job, 0)?;
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == "eval")
        .and_then(|v| Some((v["eval_accuracy"].as_f64()?, v["eval_samples"].as_u64())))
}

/// Train `job` to completion, drawing the live table; returns the measurements.
pub async fn run_job(
    client: &Client,
    state_dir: &Path,
    ns: &str,
    job: HeteroTrainingJob,
    title: &str,
) -> Result<RunResult> {
    let name = job.metadata.name.clone().unwrap_or_default();
    let api: Api<HeteroTrainingJob> = Api::namespaced(client.clone(), ns);
    if api.get_opt(&name).await?.is_some() {
        api.delete(&name, &DeleteParams::background()).await?;
        while api.get_opt(&name).await?.is_some() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let port = job.spec.metrics_port;
    let max_steps = job.spec.training.max_steps.unwrap_or(0) as f64;
    api.create(&PostParams::default(), &job)
        .await
        .context("creating the job")?;
    let t0 = Instant::now();
    let mut ranks: Vec<RankView> = Vec::new();
    let mut screen = Screen::stdout();
    let mut measure = Measure::new();
    let mut accuracy = None;
    loop {
        let j = api.get(&name).await?;
        let status = j.status.clone().unwrap_or_default();
        let phase = status.phase.clone().unwrap_or_else(|| "Pending".into());
        if ranks.len() < j.spec.world_size() as usize {
            ranks = rank_pods(client, ns, &name)
                .await?
                .into_iter()
                .map(|(rank, node, ip)| RankView::new(rank, node, ip))
                .collect();
        }
        for r in ranks.iter_mut().filter(|r| r.ip.is_empty()) {
            if let Some((_, node, ip)) = rank_pods(client, ns, &name)
                .await?
                .into_iter()
                .find(|(k, _, _)| *k == r.rank)
            {
                r.node = node;
                r.ip = ip;
            }
        }
        let now = Instant::now();
        for r in ranks.iter_mut().filter(|r| !r.ip.is_empty()) {
            if let Some(s) = scrape(&r.ip, port) {
                if let Some(a) = s.accuracy {
                    accuracy = Some((a, None));
                }
                r.observe(now, s);
            }
        }
        let total: f64 = ranks
            .iter()
            .filter_map(|r| r.last.as_ref().map(|(_, s)| s.samples))
            .sum();
        let step = ranks
            .iter()
            .filter_map(|r| r.last.as_ref().map(|(_, s)| s.step))
            .fold(0.0, f64::max);
        let gen = ranks
            .iter()
            .filter_map(|r| r.last.as_ref().map(|(_, s)| s.generation))
            .fold(0.0, f64::max);
        measure.observe(now, total, step, gen, max_steps);
        let cluster_rate: f64 = ranks.iter().map(|r| r.rate).sum();
        let headline = format!(
            "{title}  job {ns}/{name}  phase {phase}  step {step:.0}/{max_steps:.0}  plan gen {gen:.0}  balance {}  cluster {cluster_rate:.0} samples/s",
            status.balance.as_ref().map(|b| format!("{} ({:.1}%)", b.class, b.cv_percent)).unwrap_or_else(|| "-".into())
        );
        screen.show(&table::lines(headline, &ranks));
        match phase.as_str() {
            "Succeeded" => break,
            "Failed" => bail!(
                "job {ns}/{name} failed: {:?}",
                status.conditions.last().map(|c| c.message.clone())
            ),
            _ => {}
        }
        if t0.elapsed() > Duration::from_secs(1800) {
            bail!("job {ns}/{name} did not finish in 30 minutes");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let plan = cms
        .get(&format!("{name}-plan"))
        .await
        .ok()
        .and_then(|c| c.data?.get(PLAN_KEY).cloned())
        .and_then(|t| serde_json::from_str::<BatchPlan>(&t).ok());
    Ok(RunResult {
        steady_samples_per_second: measure.steady(),
        converge: measure.converge,
        final_plan: plan.map(|p| p.batch_sizes).unwrap_or_default(),
        // The log has the final evaluation; the last scrape may predate it.
        accuracy: logged_accuracy(state_dir, ns, &name).or(accuracy),
        nodes: ranks.iter().map(|r| (r.rank, r.node.clone())).collect(),
        elapsed: t0.elapsed(),
    })
}
