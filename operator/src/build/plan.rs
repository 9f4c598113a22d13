//! The plan ConfigMap `<job>-plan` (key `plan.json`, docs/design.md "Contracts").

use std::collections::BTreeMap;

use heterotrain_crds::{BatchPlan, PLAN_KEY};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{common_labels, JobRef};
use crate::names;

/// The ConfigMap holding `plan`.
pub fn plan_configmap(r: &JobRef, plan: &BatchPlan) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(names::plan_configmap(&r.name)),
            namespace: Some(r.namespace.clone()),
            labels: Some(common_labels(&r.name)),
            owner_references: Some(vec![r.owner.clone()]),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(PLAN_KEY.to_string(), plan.to_json())])),
        ..Default::default()
    }
}

/// The plan stored in `cm`, if it is there and valid for `world_size` ranks
/// and global batch `global`.
pub fn read_plan(cm: &ConfigMap, world_size: usize, global: u32) -> Option<BatchPlan> {
    let text = cm.data.as_ref()?.get(PLAN_KEY)?;
    let plan = BatchPlan::parse(text, world_size).ok()?;
    plan.validate_for(world_size, global).ok()?;
    Some(plan)
}
