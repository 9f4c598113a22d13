//! Read everything the plugin shows about one job from the API server (and,
//! for `profile`, from the ranks' `/metrics` through the API server's pod
//! proxy).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result};
use heterotrain_crds::labels;
use heterotrain_crds::metrics as m;
use heterotrain_crds::{BatchPlan, HeteroTrainingJob, PLAN_KEY};
use heterotrain_operator::names;
use heterotrain_operator::profile_cache::{self, CachedProfile};
use heterotrain_operator::scrape::parse_exposition;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

/// The job `name` in `ns`.
pub async fn job(client: &Client, ns: &str, name: &str) -> Result<HeteroTrainingJob> {
    let jobs: Api<HeteroTrainingJob> = Api::namespaced(client.clone(), ns);
    jobs.get_opt(name)
        .await
        .with_context(|| format!("reading heterotrainingjob {ns}/{name}"))?
        .with_context(|| format!("heterotrainingjob {name:?} not found in namespace {ns:?}"))
}

/// The jobs of `ns` (every namespace: `None`), by namespace and name.
pub async fn jobs(client: &Client, ns: Option<&str>) -> Result<Vec<HeteroTrainingJob>> {
    let api: Api<HeteroTrainingJob> = match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let mut items = api
        .list(&ListParams::default())
        .await
        .with_context(|| match ns {
            Some(ns) => format!("listing heterotrainingjobs in namespace {ns:?}"),
            None => "listing heterotrainingjobs in every namespace".to_string(),
        })?
        .items;
    items.sort_by_key(|j| (j.namespace(), j.name_any()));
    Ok(items)
}

/// One `Rebalanced` Event of a job: a plan decision.
#[derive(Clone, Debug, PartialEq)]
pub struct RebalanceEvent {
    /// When it was (last) observed.
    pub time: Option<Timestamp>,
    /// The plan generation written.
    pub generation: Option<u64>,
    /// The local batches of that plan.
    pub batches: Option<Vec<u32>>,
    /// Predicted step-time gain, percent.
    pub gain_percent: Option<f64>,
    /// Predicted step (compute) and communication on top, seconds (from
    /// `status.planHistory`; Events do not carry them).
    pub predicted_step_seconds: Option<f64>,
    pub predicted_communication_seconds: Option<f64>,
    /// Why the balancer chose it.
    pub reason: String,
    /// The Event's note as written.
    pub note: String,
}

impl RebalanceEvent {
    /// A decision from `status.planHistory`.
    pub fn from_status(r: &heterotrain_crds::RebalanceStatus) -> RebalanceEvent {
        let note = format!(
            "plan generation {}: batches {:?}; predicted gain {}%; {}",
            r.generation, r.batch_sizes, r.predicted_gain_percent, r.reason
        );
        RebalanceEvent {
            time: r.time.as_ref().map(|t| t.0),
            generation: Some(r.generation),
            batches: Some(r.batch_sizes.clone()),
            gain_percent: Some(r.predicted_gain_percent),
            predicted_step_seconds: r.predicted_step_seconds,
            predicted_communication_seconds: r.predicted_communication_seconds,
            reason: r.reason.clone(),
            note,
        }
    }

    /// Parse the operator's note: `plan generation N: batches [..]; predicted gain X%; reason`.
    pub fn parse(note: &str, time: Option<Timestamp>) -> RebalanceEvent {
        let mut ev = RebalanceEvent {
            time,
            generation: None,
            batches: None,
            gain_percent: None,
            predicted_step_seconds: None,
            predicted_communication_seconds: None,
            reason: note.to_string(),
            note: note.to_string(),
        };
        let Some(rest) = note.strip_prefix("plan generation ") else {
            return ev;
        };
        let Some((gen, rest)) = rest.split_once(": ") else {
            return ev;
        };
        ev.generation = gen.trim().parse().ok();
        let mut parts = rest.splitn(3, "; ");
        if let Some(b) = parts.next().and_then(|b| b.strip_prefix("batches ")) {
            ev.batches = serde_json::from_str(b.trim()).ok();
        }
        if let Some(g) = parts.next().and_then(|g| g.strip_prefix("predicted gain ")) {
            ev.gain_percent = g.trim().trim_end_matches('%').parse().ok();
        }
        if let Some(r) = parts.next() {
            ev.reason = r.to_string();
        }
        ev
    }
}

/// A job and what belongs to it.
#[derive(Clone, Debug)]
pub struct JobView {
    pub job: HeteroTrainingJob,
    /// Rank pods of the current and earlier gangs.
    pub pods: Vec<Pod>,
    /// The plan in `<job>-plan`.
    pub plan: Option<BatchPlan>,
    /// Why `<job>-plan` could not be read, when it could not.
    pub plan_error: Option<String>,
    /// Plan decisions, oldest first.
    pub rebalances: Vec<RebalanceEvent>,
    /// Node name → the node's labels (when nodes are readable).
    pub node_labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl JobView {
    /// Job name.
    pub fn name(&self) -> String {
        self.job.name_any()
    }

    /// The pod of `rank` in the newest gang.
    pub fn pod_of(&self, rank: u32) -> Option<&Pod> {
        let name = names::pod_name(&self.name(), rank);
        self.pods
            .iter()
            .filter(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            .max_by_key(|p| p.metadata.creation_timestamp.clone().map(|t| t.0))
    }
}

fn event_time(e: &Event) -> Option<Timestamp> {
    e.series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| e.event_time.as_ref().map(|t| t.0))
        .or_else(|| e.deprecated_last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Read the job `ns/name`, its pods, plan and `Rebalanced` Events.
pub async fn job_view(client: &Client, ns: &str, name: &str) -> Result<JobView> {
    let job = job(client, ns, name).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pods = pods
        .list(&ListParams::default().labels(&labels::job_selector(name)))
        .await
        .context("listing the job's pods")?
        .items;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let (plan, plan_error) = match cms.get_opt(&names::plan_configmap(name)).await {
        Ok(Some(cm)) => match cm.data.as_ref().and_then(|d| d.get(PLAN_KEY)) {
            Some(text) => match BatchPlan::parse(text, job.spec.world_size() as usize) {
                Ok(p) => (Some(p), None),
                Err(e) => (None, Some(e.to_string())),
            },
            None => (None, Some(format!("no {PLAN_KEY} key"))),
        },
        Ok(None) => (None, Some("not created yet".to_string())),
        Err(e) => (None, Some(e.to_string())),
    };
    let history = job
        .status
        .as_ref()
        .map(|s| s.plan_history.clone())
        .unwrap_or_default();
    let rebalances = if history.is_empty() {
        rebalance_events(client, ns, name, job.metadata.uid.clone()).await
    } else {
        history.iter().map(RebalanceEvent::from_status).collect()
    };
    let mut node_labels = BTreeMap::new();
    let nodes: Api<Node> = Api::all(client.clone());
    for node in pods
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect::<std::collections::BTreeSet<_>>()
    {
        // Reading nodes may be forbidden to the user: then the hardware
        // column falls back to the groups' nodeSelectors.
        if let Ok(Some(n)) = nodes.get_opt(&node).await {
            node_labels.insert(node, n.labels().clone());
        }
    }
    Ok(JobView {
        job,
        pods,
        plan,
        plan_error,
        rebalances,
        node_labels,
    })
}

/// The operator's `Rebalanced` Events about job `name` (an operator that
/// keeps no `status.planHistory`), oldest generation first.
async fn rebalance_events(
    client: &Client,
    ns: &str,
    name: &str,
    uid: Option<String>,
) -> Vec<RebalanceEvent> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    // Without leave to list Events the history is empty, said once.
    let items = match events.list(&ListParams::default()).await {
        Ok(l) => l.items,
        Err(e) => {
            eprintln!("warning: no plan history: listing the Events of namespace {ns}: {e}");
            Vec::new()
        }
    };
    let mut rebalances: Vec<RebalanceEvent> = items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(heterotrain_operator::conditions::reasons::REBALANCED)
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("HeteroTrainingJob")
                        && r.name.as_deref() == Some(name)
                        && (uid.is_none() || r.uid.is_none() || r.uid == uid)
                })
        })
        .map(|e| RebalanceEvent::parse(e.note.as_deref().unwrap_or(""), event_time(&e)))
        .collect();
    rebalances.sort_by_key(|e| (e.generation, e.time));
    rebalances
}

/// The operator's profile cache (empty when it does not exist).
pub async fn profile_cache(
    client: &Client,
    operator_ns: &str,
) -> Result<BTreeMap<String, CachedProfile>> {
    profile_cache::load(client, operator_ns).await.map_err(|e| {
        anyhow::anyhow!(
            "reading {operator_ns}/{}: {e}",
            profile_cache::CACHE_CONFIGMAP
        )
    })
}

/// Profile gauges a rank exports (`heterotrain_profile_*`), when its
/// `/metrics` is reachable from here.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveProfile {
    pub matmul_flops: Option<f64>,
    pub memory_bandwidth: Option<f64>,
    pub fixed_seconds: Option<f64>,
    pub per_sample_seconds: Option<f64>,
    pub max_batch: Option<f64>,
    pub device: Option<String>,
}

impl LiveProfile {
    /// Pick the profile gauges out of a text exposition (parsed as the
    /// operator parses the ranks' scrapes).
    pub fn parse(exposition: &str) -> LiveProfile {
        let mut p = LiveProfile::default();
        for s in parse_exposition(exposition).unwrap_or_default() {
            let v = Some(s.value).filter(|v| v.is_finite());
            match s.name.as_str() {
                m::PROFILE_MATMUL_FLOPS => p.matmul_flops = v,
                m::PROFILE_MEMORY_BANDWIDTH => p.memory_bandwidth = v,
                m::PROFILE_FIXED_SECONDS => p.fixed_seconds = v,
                m::PROFILE_PER_SAMPLE_SECONDS => p.per_sample_seconds = v,
                m::PROFILE_MAX_BATCH_SIZE => p.max_batch = v,
                m::DEVICE_INFO => p.device = s.labels.get("name").cloned(),
                _ => {}
            }
        }
        p
    }
}

/// How long `profile` waits for one rank's live gauges by default.
pub const LIVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Rank pod `pod`'s `/metrics` on `port`, read through the API server's
/// pod proxy (`pods/proxy`), so it works wherever the kubeconfig does —
/// from a laptop outside the cluster's pod network too. `None` when the
/// pod cannot be reached or does not answer within `timeout`
/// ([`LIVE_TIMEOUT`] unless `--live-timeout` says otherwise).
pub async fn live_profile(
    client: &Client,
    ns: &str,
    pod: &str,
    port: u16,
    timeout: Duration,
) -> Option<LiveProfile> {
    let path = format!("/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy/metrics");
    let request = http::Request::get(path).body(Vec::new()).ok()?;
    let text = tokio::time::timeout(timeout, client.request_text(request))
        .await
        .ok()?
        .ok()?;
    Some(LiveProfile::parse(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_operators_rebalance_note() {
        let e = RebalanceEvent::parse(
            "plan generation 3: batches [40, 24]; predicted gain 12.5%; dynamic: rank 1 slower",
            None,
        );
        assert_eq!(e.generation, Some(3));
        assert_eq!(e.batches, Some(vec![40, 24]));
        assert_eq!(e.gain_percent, Some(12.5));
        assert_eq!(e.reason, "dynamic: rank 1 slower");
        let odd = RebalanceEvent::parse("something else", None);
        assert_eq!(odd.generation, None);
        assert_eq!(odd.reason, "something else");
    }

    #[test]
    fn parses_profile_gauges() {
        let p = LiveProfile::parse(
            "# TYPE heterotrain_profile_matmul_flops gauge\nheterotrain_profile_matmul_flops 2.5e10\n\
             heterotrain_profile_per_sample_seconds 0.002\nheterotrain_device_info{kind=\"cpu\",name=\"Xeon\"} 1\n",
        );
        assert_eq!(p.matmul_flops, Some(2.5e10));
        assert_eq!(p.per_sample_seconds, Some(0.002));
        assert_eq!(p.device.as_deref(), Some("Xeon"));
    }
}
