//! Deserialise guard: the controller watches jobs as untyped objects and
//! turns each into a typed `HeteroTrainingJob` here, so one object that does
//! not match the Rust types (an old version, a hand-edited status) is
//! reported on its own instead of breaking the watch for every job.

use heterotrain_crds::HeteroTrainingJob;
use kube::api::{ApiResource, DynamicObject};
use kube::core::GroupVersionKind;

use crate::error::{Error, Result};

/// The API resource of `HeteroTrainingJob`.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("heterotrain.dev", "v1alpha1", "HeteroTrainingJob"),
        "heterotrainingjobs",
    )
}

/// Typed view of a watched object, or why it is not one.
pub fn typed(obj: &DynamicObject) -> Result<HeteroTrainingJob> {
    let mut value = serde_json::to_value(obj).map_err(|e| Error::Malformed(e.to_string()))?;
    if let Some(map) = value.as_object_mut() {
        map.insert("apiVersion".into(), "heterotrain.dev/v1alpha1".into());
        map.insert("kind".into(), "HeteroTrainingJob".into());
    }
    serde_json::from_value(value).map_err(|e| Error::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_and_bad_objects() {
        let good: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "heterotrain.dev/v1alpha1", "kind": "HeteroTrainingJob",
            "metadata": {"name": "a", "namespace": "n"},
            "spec": {"workers": [{"name": "g", "replicas": 2}], "model": {"name": "mlp"},
                     "dataset": {"name": "synthetic_image"}, "training": {"globalBatchSize": 8, "maxSteps": 3}}
        }))
        .expect("dynamic");
        let job = typed(&good).expect("typed");
        assert_eq!(job.spec.world_size(), 2);
        let bad: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "heterotrain.dev/v1alpha1", "kind": "HeteroTrainingJob",
            "metadata": {"name": "b", "namespace": "n"},
            "spec": {"workers": "two please", "model": {"name": "alexnet"}}
        }))
        .expect("dynamic");
        let err = typed(&bad).expect_err("malformed");
        assert_eq!(err.metric_label(), "malformed");
    }
}
