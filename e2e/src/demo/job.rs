//! The demo's jobs: the dataset claim a job names, and the equal-split twin
//! of a job for the baseline run.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use heterotrain_crds::{labels, HeteroTrainingJob};
use kube::Client;

use crate::datasets;

/// The same job with the equal split, each rank pinned to the node it ran on.
pub fn equal_split_twin(
    job: &HeteroTrainingJob,
    nodes: &BTreeMap<u32, String>,
) -> Result<HeteroTrainingJob> {
    let mut twin = job.clone();
    twin.metadata.name = Some(format!(
        "{}-equal",
        job.metadata.name.clone().unwrap_or_default()
    ));
    twin.spec.load_balancing.policy = heterotrain_crds::BalancePolicy::Static;
    let template = job
        .spec
        .workers
        .first()
        .cloned()
        .ok_or_else(|| anyhow!("job has no workers"))?;
    twin.spec.workers = nodes
        .iter()
        .map(|(rank, node)| {
            let mut g = template.clone();
            g.name = format!("rank{rank}");
            g.replicas = 1;
            g.node_selector = [(labels::HOSTNAME.to_string(), node.clone())].into();
            g
        })
        .collect();
    Ok(twin)
}

/// Offer the cached dataset `claim` (`make setup` builds them into
/// `$HETEROTRAIN_CACHE/data`) to the demo's jobs as a claim of that name.
pub async fn provide_dataset(
    client: &Client,
    state_dir: &Path,
    ns: &str,
    claim: &str,
) -> Result<()> {
    if !datasets::ALL.contains(&claim) {
        bail!(
            "the demo fills claims named after the datasets of `make setup` ({}); the job asks for {claim:?}",
            datasets::ALL.join(", ")
        );
    }
    println!(
        "==> dataset: claim {ns}/{claim} with {}",
        datasets::dir(claim)?.display()
    );
    datasets::provide_claim(client, state_dir, ns, claim).await
}

/// Where the job's files come from, for the summary.
pub fn dataset_label(job: &HeteroTrainingJob) -> String {
    let Some(d) = &job.spec.dataset else {
        return "the job's own data (no dataset in the spec)".to_string();
    };
    match &d.claim_name {
        Some(c) => format!("{} files from claim {c}", d.name.as_str()),
        None => format!(
            "{} files in {}",
            d.name.as_str(),
            d.path.as_deref().unwrap_or("?")
        ),
    }
}
