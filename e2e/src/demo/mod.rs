//! `heterotrain-demo` (`make demo`): the whole system on this machine. Brings
//! up the local control plane with simulated nodes of different speed and the
//! operator, applies a job (by default `examples/quickstart.yaml`, a CNN on
//! scikit-learn's digits, which `make setup` builds into the cache and the
//! demo offers as the claim the job names), shows a live per-rank table
//! ([`table`]), then runs the equal split on the same nodes and prints the
//! comparison ([`summary`]), with the held-out accuracy of both runs.
//! The cluster stays up afterwards for exploring with kubectl.

pub mod job;
pub mod local;
pub mod run;
pub mod scrape;
pub mod summary;
pub mod table;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use heterotrain_crds::HeteroTrainingJob;
use kube::Client;

/// What to run.
pub struct Options {
    /// Nodes file for the simulated nodes.
    pub nodes: PathBuf,
    /// The job to run.
    pub job: PathBuf,
    /// Namespace for the demo's jobs.
    pub namespace: String,
    /// Also run the equal-split comparison.
    pub baseline: bool,
    /// Name of the local control plane (`demo`).
    pub cluster: String,
}

/// Stop the demo cluster `cluster`.
pub fn down(cluster: &str) -> Result<()> {
    local::local(cluster, &["down"]).map(|_| ())
}

/// Start (or reuse) the demo cluster, train the job balanced and (unless
/// told not to) with the equal split, and print the comparison.
pub async fn run(opts: &Options) -> Result<()> {
    let t0 = Instant::now();
    println!(
        "==> starting the local control plane `{}` with simulated nodes and the operator",
        opts.cluster
    );
    let env = local::local(
        &opts.cluster,
        &[
            "up",
            "--nodes",
            &opts.nodes.display().to_string(),
            "--operator",
            "--operator-arg=--scrape-interval=1",
            "--operator-arg=--rebalance-interval=4",
        ],
    )?;
    let kubeconfig = env
        .lines()
        .find_map(|l| l.strip_prefix("export KUBECONFIG="))
        .ok_or_else(|| anyhow!("heterotrain-local printed no KUBECONFIG"))?
        .to_string();
    std::env::set_var("KUBECONFIG", &kubeconfig);
    let client = Client::try_default().await?;
    println!(
        "==> control plane up in {:.0?}; preparing namespace {}",
        t0.elapsed(),
        opts.namespace
    );
    crate::system::prepare_namespace(&client, &opts.namespace).await?;
    let text = std::fs::read_to_string(&opts.job)
        .with_context(|| format!("reading {}", opts.job.display()))?;
    let job: HeteroTrainingJob = serde_yaml::from_str(&text)?;
    // The simulated nodes keep their state (claims, pod logs) beside the kubeconfig.
    let state_dir = Path::new(&kubeconfig)
        .parent()
        .ok_or_else(|| anyhow!("kubeconfig {kubeconfig} has no directory"))?
        .to_path_buf();
    if let Some(claim) = job
        .spec
        .dataset
        .as_ref()
        .and_then(|d| d.claim_name.as_ref())
    {
        job::provide_dataset(&client, &state_dir, &opts.namespace, claim)
            .await
            .with_context(|| format!("providing the dataset claim {claim}"))?;
    }
    println!(
        "==> training {} with {} balancing",
        opts.job.display(),
        job.spec.load_balancing.policy.as_str()
    );
    let ns = &opts.namespace;
    let balanced = run::run_job(&client, &state_dir, ns, job.clone(), "balanced").await?;
    let mut equal = None;
    if opts.baseline {
        println!("\n==> the same job with the equal split, on the same nodes (baseline)");
        let twin = job::equal_split_twin(&job, &balanced.nodes)?;
        equal = Some(run::run_job(&client, &state_dir, ns, twin, "equal split").await?);
    }
    summary::print(&job, &balanced, equal.as_ref(), t0);
    let stop = if opts.cluster == "demo" {
        "make demo-down".to_string()
    } else {
        format!("heterotrain-demo --cluster {} --down", opts.cluster)
    };
    println!("\nThe cluster is still up. Explore it with:\n  export KUBECONFIG={kubeconfig}\n  kubectl get htj,pods -n {ns} -o wide\nStop it with: {stop}");
    Ok(())
}
