//! Runs benchmark jobs on the bench cluster, one at a time or several side
//! by side: creates the HeteroTrainingJobs, throttles a node mid-run when
//! asked, waits for them to finish, collects the ranks' step logs and the
//! operator's plan writes, and deletes them (with their pods) so the next
//! run has the CPUs to itself.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use heterotrain_crds::labels;
use heterotrain_crds::HeteroTrainingJob;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::Client;

use super::analysis::{self, EvalRec, StepRec};
use super::PlanChange;
use crate::nodesim::NodesFile;
use crate::system::{System, SystemOptions};
use crate::wait::eventually;

/// The bench cluster: every scenario's nodes, the operator, one namespace.
pub struct BenchCluster {
    pub system: System,
    pub client: Client,
    pub namespace: String,
    /// Cores a pod on a speed-1.0 node gets (its CPU limit).
    pub core_unit: f64,
    /// The jobs' `training.optimizerSharding`.
    pub optimizer_sharding: heterotrain_crds::OptimizerSharding,
    pub verbose: bool,
}

/// A node slowing down while a job runs.
#[derive(Clone, Debug)]
pub struct ThrottlePlan {
    pub node: String,
    pub speed: f64,
    pub normal_speed: f64,
    /// Rank 0 step at which to slow down, and to restore.
    pub at_step: u64,
    pub restore_step: u64,
}

/// What one job run left behind.
pub struct JobRun {
    /// Step records per rank, in rank order.
    pub ranks: Vec<Vec<StepRec>>,
    pub evals: Vec<EvalRec>,
    /// Node of each rank.
    pub nodes: Vec<String>,
    /// Unix times the throttle began and ended.
    pub throttle_times: Option<(f64, f64)>,
    /// (generation, Unix time) of the operator's plan writes for the job.
    pub plan_writes: Vec<(u64, f64)>,
    /// The job's `status.planHistory` at its end: the last plans the
    /// operator wrote, with their reasons.
    pub plans: Vec<PlanChange>,
    pub wall_seconds: f64,
}

impl BenchCluster {
    /// Start the control plane with `nodes`, the operator (scrape every 1 s,
    /// decide at most every `rebalance_interval` s) and a namespace for the
    /// jobs, with a claim for each of the cached `datasets`.
    pub async fn start(
        nodes: NodesFile,
        datasets: &[&str],
        core_unit: f64,
        rebalance_interval: f64,
        verbose: bool,
    ) -> Result<BenchCluster> {
        let system = System::start(SystemOptions {
            operator_args: vec![
                "--scrape-interval=1".into(),
                format!("--rebalance-interval={rebalance_interval}"),
            ],
            verbose,
            ..SystemOptions::new("bench", nodes)
        })
        .await?;
        let client = system.client().await?;
        let namespace = "bench".to_string();
        system.create_namespace(&namespace).await?;
        for d in datasets {
            crate::datasets::provide_claim(&client, system.sim.state_dir(), &namespace, d).await?;
        }
        Ok(BenchCluster {
            system,
            client,
            namespace,
            core_unit,
            optimizer_sharding: Default::default(),
            verbose,
        })
    }

    /// Train `job` to the end; `throttle` slows a node mid-run.
    pub async fn run(
        &self,
        job: HeteroTrainingJob,
        throttle: Option<&ThrottlePlan>,
        timeout: Duration,
    ) -> Result<JobRun> {
        let name = job.metadata.name.clone().unwrap_or_default();
        let ns = &self.namespace;
        let api: Api<HeteroTrainingJob> = Api::namespaced(self.client.clone(), ns);
        let world = job.spec.world_size() as usize;
        let t0 = Instant::now();
        api.create(&PostParams::default(), &job)
            .await
            .with_context(|| format!("creating job {name}"))?;
        let result = self.follow(&name, world, throttle, timeout).await;
        if let Some(t) = throttle {
            // Whatever happened, the node gets its speed back.
            let _ = self.system.sim.set_speed(&t.node, t.normal_speed);
        }
        let outcome = match result {
            Ok(times) => self.collect(&name, world, times, t0).await,
            Err(e) => Err(e.context(self.system.dump(ns).await)),
        };
        self.delete(&name).await?;
        outcome
    }

    /// Train `jobs` at the same time, each to its end (no throttle).
    pub async fn run_together(
        &self,
        jobs: Vec<HeteroTrainingJob>,
        timeout: Duration,
    ) -> Result<Vec<JobRun>> {
        let api: Api<HeteroTrainingJob> = Api::namespaced(self.client.clone(), &self.namespace);
        let t0 = Instant::now();
        let mut created = Vec::new();
        let mut failed = None;
        for job in &jobs {
            let name = job.metadata.name.clone().unwrap_or_default();
            match api.create(&PostParams::default(), job).await {
                Ok(_) => created.push((name, job.spec.world_size() as usize)),
                Err(e) => {
                    failed = Some(anyhow!(e).context(format!("creating job {name}")));
                    break;
                }
            }
        }
        let followed = match failed {
            Some(_) => Vec::new(),
            None => {
                let f = created
                    .iter()
                    .map(|(name, world)| self.follow(name, *world, None, timeout));
                futures::future::join_all(f).await
            }
        };
        let mut runs = Vec::new();
        for ((name, world), times) in created.iter().zip(followed) {
            let run = match times {
                Ok(times) => self.collect(name, *world, times, t0).await,
                Err(e) => Err(e.context(self.system.dump(&self.namespace).await)),
            };
            match run {
                Ok(r) => runs.push(r),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        for (name, _) in &created {
            self.delete(name).await?;
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(runs),
        }
    }

    async fn follow(
        &self,
        name: &str,
        world: usize,
        throttle: Option<&ThrottlePlan>,
        timeout: Duration,
    ) -> Result<Option<(f64, f64)>> {
        let ns = &self.namespace;
        let api: Api<HeteroTrainingJob> = Api::namespaced(self.client.clone(), ns);
        let deadline = Instant::now() + timeout;
        let mut throttled_at = None;
        let mut restored_at = None;
        let mut last_check = Instant::now() - Duration::from_secs(1);
        let mut last_progress = Instant::now();
        let mut last_step = 0;
        loop {
            let step = self
                .rank_log(name, 0)
                .map(|p| last_step_of(&p))
                .unwrap_or(0);
            if step > last_step {
                last_step = step;
                last_progress = Instant::now();
            }
            if let Some(t) = throttle {
                if throttled_at.is_none() && step >= t.at_step {
                    self.system.sim.set_speed(&t.node, t.speed)?;
                    throttled_at = Some(crate::bench::report::unix_now());
                    self.say(&format!(
                        "    step {step}: node {} slowed to {}",
                        t.node, t.speed
                    ));
                }
                if throttled_at.is_some() && restored_at.is_none() && step >= t.restore_step {
                    self.system.sim.set_speed(&t.node, t.normal_speed)?;
                    restored_at = Some(crate::bench::report::unix_now());
                    self.say(&format!(
                        "    step {step}: node {} back to {}",
                        t.node, t.normal_speed
                    ));
                }
            }
            if last_check.elapsed() >= Duration::from_millis(500) {
                last_check = Instant::now();
                if let Ok(j) = api.get(name).await {
                    let status = j.status.unwrap_or_default();
                    match status.phase.as_deref() {
                        Some("Succeeded") => break,
                        Some("Failed") => bail!(
                            "job {name} failed: {}",
                            status
                                .conditions
                                .last()
                                .map(|c| c.message.clone())
                                .unwrap_or_default()
                        ),
                        _ => {}
                    }
                }
                if Instant::now() > deadline {
                    bail!("job {name} did not finish in {timeout:?} (rank 0 at step {last_step})");
                }
                if last_step > 0 && last_progress.elapsed() > Duration::from_secs(180) {
                    bail!("job {name}: no step for 3 minutes (rank 0 at step {last_step})");
                }
            }
            tokio::time::sleep(Duration::from_millis(if throttle.is_some() {
                100
            } else {
                250
            }))
            .await;
        }
        if world == 0 {
            bail!("job {name} has no ranks");
        }
        Ok(match (throttled_at, restored_at) {
            (Some(a), Some(b)) => Some((a, b)),
            (Some(a), None) => Some((a, crate::bench::report::unix_now())),
            _ => None,
        })
    }

    async fn collect(
        &self,
        name: &str,
        world: usize,
        throttle_times: Option<(f64, f64)>,
        t0: Instant,
    ) -> Result<JobRun> {
        let mut ranks = Vec::new();
        let mut evals = Vec::new();
        for r in 0..world {
            let path = self
                .rank_log(name, r)
                .ok_or_else(|| anyhow!("job {name}: no step log of rank {r}"))?;
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let (steps, ev) = analysis::parse_rank_log(&text);
            if steps.is_empty() {
                bail!("job {name}: rank {r} logged no steps");
            }
            if r == 0 {
                evals = ev;
            }
            ranks.push(steps);
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let lp = ListParams::default().labels(&labels::job_selector(name));
        let mut nodes = vec![String::new(); world];
        for p in pods.list(&lp).await? {
            let rank: Option<usize> = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(labels::RANK))
                .and_then(|r| r.parse().ok());
            if let Some(r) = rank.filter(|r| *r < world) {
                nodes[r] = p.spec.and_then(|s| s.node_name).unwrap_or_default();
            }
        }
        // Read before the job is deleted; a run without it still counts.
        let jobs: Api<HeteroTrainingJob> = Api::namespaced(self.client.clone(), &self.namespace);
        let plans = jobs
            .get(name)
            .await
            .ok()
            .and_then(|j| j.status)
            .map(|s| s.plan_history.iter().map(PlanChange::from).collect())
            .unwrap_or_default();
        Ok(JobRun {
            ranks,
            evals,
            nodes,
            throttle_times,
            plan_writes: super::propagation::plan_writes(&self.system.operator_log(), name),
            plans,
            wall_seconds: t0.elapsed().as_secs_f64(),
        })
    }

    /// Delete the job and wait until its pods are gone.
    async fn delete(&self, name: &str) -> Result<()> {
        let api: Api<HeteroTrainingJob> = Api::namespaced(self.client.clone(), &self.namespace);
        let _ = api.delete(name, &DeleteParams::foreground()).await;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let lp = ListParams::default().labels(&labels::job_selector(name));
        let (pods, api, lp) = (&pods, &api, &lp);
        let what = format!("job {name} and its pods to be gone");
        eventually(
            &what,
            Duration::from_secs(120),
            Duration::from_millis(300),
            || async move {
                let left = pods.list(lp).await.map(|l| l.items.len()).unwrap_or(1);
                let job_left = api.get_opt(name).await.ok().flatten().is_some();
                Ok((left == 0 && !job_left).then_some(()))
            },
        )
        .await
    }

    /// The step log of `rank` of job `name` (newest pod incarnation).
    pub fn rank_log(&self, name: &str, rank: usize) -> Option<PathBuf> {
        rank_log_path(self.system.sim.state_dir(), &self.namespace, name, rank)
    }

    fn say(&self, msg: &str) {
        if self.verbose {
            eprintln!("{msg}");
        } else {
            println!("{msg}");
        }
    }
}

/// `<state>/pods/<ns>_<job>-<rank>_<uid>/volumes/scratch/output/rank-<rank>.jsonl`,
/// the newest if the pod was recreated.
pub fn rank_log_path(state_dir: &Path, ns: &str, job: &str, rank: usize) -> Option<PathBuf> {
    let prefix = format!("{ns}_{job}-{rank}_");
    std::fs::read_dir(state_dir.join("pods"))
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| {
            e.path()
                .join("volumes/scratch/output")
                .join(format!("rank-{rank}.jsonl"))
        })
        .filter(|p| p.exists())
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
}

/// Highest step in a step log so far (0 when none).
fn last_step_of(path: &Path) -> u64 {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return 0;
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(4096)));
    let mut buf = String::new();
    if f.read_to_string(&mut buf).is_err() {
        return 0;
    }
    analysis::parse_rank_log(&buf)
        .0
        .last()
        .map(|s| s.step)
        .unwrap_or(0)
}
