//! The headless Service `<job>` that gives every rank a stable DNS name
//! (`<job>-<rank>.<job>.<ns>.svc`) for rendezvous.

use heterotrain_crds::labels;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::names::{self, common_labels};
use crate::validate::ValidatedJob;

/// Headless, publishing not-ready addresses (ranks rendezvous before ready).
pub fn service(v: &ValidatedJob) -> Service {
    let port = |name: &str, p: u16| ServicePort {
        name: Some(name.into()),
        port: i32::from(p),
        target_port: Some(IntOrString::Int(i32::from(p))),
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    Service {
        metadata: ObjectMeta {
            name: Some(names::service_name(&v.name)),
            namespace: Some(v.namespace.clone()),
            labels: Some(common_labels(&v.name)),
            owner_references: Some(vec![v.owner.clone()]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(
                [(labels::JOB.to_string(), v.name.clone())]
                    .into_iter()
                    .collect(),
            ),
            ports: Some(vec![
                port("rendezvous", v.spec().master_port),
                port("metrics", v.spec().metrics_port),
            ]),
            ..Default::default()
        }),
        status: None,
    }
}
