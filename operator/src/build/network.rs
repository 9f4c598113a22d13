//! The job's NetworkPolicies. PyTorch's c10d (the TCPStore and Gloo) takes
//! any connection without authentication, so a job's ranks accept traffic
//! only from the same job's pods, selected by the job-UID label the
//! operator sets (a recreated job of the same name is another job), and
//! `/metrics` only from the namespaces allowed to scrape (the operator's
//! and Prometheus's). Egress: the job's own pods and DNS, the destinations
//! the job lists in `spec.isolation.egress`; rank 0 also the API server (it
//! watches the plan ConfigMap).

use std::collections::BTreeMap;

use heterotrain_crds::labels;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::names::{self, common_labels};
use crate::validate::ValidatedJob;

/// Ports of the API server a rank 0 may reach: the `kubernetes` Service's
/// port and the usual port behind it (policies may see either, by CNI).
pub const API_SERVER_PORTS: [u16; 2] = [443, 6443];

/// The job's pods: the job-UID label.
fn job_pods(uid: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(
            labels::JOB_UID.to_string(),
            uid.to_string(),
        )])),
        ..Default::default()
    }
}

fn port(p: u16, protocol: &str) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(i32::from(p))),
        protocol: Some(protocol.into()),
        ..Default::default()
    }
}

fn meta(v: &ValidatedJob, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(v.namespace.clone()),
        labels: Some(common_labels(&v.name)),
        owner_references: Some(vec![v.owner.clone()]),
        ..Default::default()
    }
}

/// The policies of job `v`: `<job>` isolates every rank, `<job>-api` lets
/// rank 0 reach the API server. `metrics_from` names the namespaces whose
/// pods may read `/metrics` (matched on the well-known
/// `kubernetes.io/metadata.name` namespace label, set by Kubernetes 1.21+).
pub fn policies(v: &ValidatedJob, metrics_from: &[String]) -> [NetworkPolicy; 2] {
    let uid = v.owner.uid.as_str();
    let spec = v.spec();
    let same_job = NetworkPolicyPeer {
        pod_selector: Some(job_pods(uid)),
        ..Default::default()
    };
    let scrapers = metrics_from
        .iter()
        .map(|ns| NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    labels::NAMESPACE_NAME.to_string(),
                    ns.clone(),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect::<Vec<_>>();
    let mut ingress = vec![NetworkPolicyIngressRule {
        from: Some(vec![same_job.clone()]),
        ports: None,
    }];
    if !scrapers.is_empty() {
        ingress.push(NetworkPolicyIngressRule {
            from: Some(scrapers),
            ports: Some(vec![port(spec.metrics_port, "TCP")]),
        });
    }
    let isolate = NetworkPolicy {
        metadata: meta(v, names::network_policy(&v.name)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(job_pods(uid)),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(ingress),
            egress: Some(
                [
                    NetworkPolicyEgressRule {
                        to: Some(vec![same_job]),
                        ports: None,
                    },
                    NetworkPolicyEgressRule {
                        to: None,
                        ports: Some(vec![port(53, "UDP"), port(53, "TCP")]),
                    },
                ]
                .into_iter()
                .chain(spec.isolation.egress.iter().cloned())
                .collect(),
            ),
        }),
    };
    let mut rank0 = job_pods(uid);
    if let Some(m) = rank0.match_labels.as_mut() {
        m.insert(labels::RANK.to_string(), "0".into());
    }
    let api = NetworkPolicy {
        metadata: meta(v, names::api_network_policy(&v.name)),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(rank0),
            policy_types: Some(vec!["Egress".into()]),
            ingress: None,
            egress: Some(vec![NetworkPolicyEgressRule {
                to: None,
                ports: Some(API_SERVER_PORTS.iter().map(|&p| port(p, "TCP")).collect()),
            }]),
        }),
    };
    [isolate, api]
}
