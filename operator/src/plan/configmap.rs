//! The plan ConfigMap `<job>-plan` (key `plan.json`, docs/design.md
//! "Contracts"): its shape, and the one place it is written.

use std::collections::BTreeMap;

use heterotrain_crds::{BatchPlan, PLAN_KEY};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;

use crate::apply;
use crate::error::Result;
use crate::names;
use crate::validate::ValidatedJob;

/// The ConfigMap holding `plan`, owned by the job.
pub fn configmap(v: &ValidatedJob, plan: &BatchPlan) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(names::plan_configmap(&v.name)),
            namespace: Some(v.namespace.clone()),
            labels: Some(names::common_labels(&v.name)),
            owner_references: Some(vec![v.owner.clone()]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(PLAN_KEY.to_string(), plan.to_json())])),
        ..Default::default()
    }
}

/// Write `plan` as the job's current plan (server-side apply).
pub async fn write(client: &Client, v: &ValidatedJob<'_>, plan: &BatchPlan) -> Result<()> {
    apply::configmap(client, &v.namespace, &configmap(v, plan)).await
}
