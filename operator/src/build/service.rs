//! The headless Service `<job>` that gives every rank a stable DNS name
//! (`<job>-<rank>.<job>.<ns>.svc`) for rendezvous.

use heterotrain_crds::HeteroTrainingJob;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{common_labels, JobRef};
use crate::names::{self, labels};

/// Headless, publishing not-ready addresses (ranks rendezvous before ready).
pub fn service(job: &HeteroTrainingJob, r: &JobRef) -> Service {
    let port = |name: &str, p: u16| ServicePort {
        name: Some(name.into()),
        port: i32::from(p),
        target_port: Some(IntOrString::Int(i32::from(p))),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    Service {
        metadata: ObjectMeta {
            name: Some(names::service_name(&r.name)),
            namespace: Some(r.namespace.clone()),
            labels: Some(common_labels(&r.name)),
            owner_references: Some(vec![r.owner.clone()]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(
                [(labels::JOB.to_string(), r.name.clone())]
                    .into_iter()
                    .collect(),
            ),
            ports: Some(vec![
                port("rendezvous", job.spec.master_port),
                port("metrics", job.spec.metrics_port),
            ]),
            ..Default::default()
        }),
        status: None,
    }
}
