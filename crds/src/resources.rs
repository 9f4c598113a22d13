//! What a rank container's resources mean to HeteroTrain: a CPU quantity as
//! cores (the node simulator's quota) or as whole threads (a CPU rank's
//! default `--threads`, rounded up as the downward API rounds `limits.cpu`).

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Cores in a CPU quantity: "2" → 2, "1500m" → 1.5, "0.5" → 0.5. `None`
/// unless it is a positive plain or milli quantity.
pub fn cpu_cores(q: &str) -> Option<f64> {
    let q = q.trim();
    let cores = match q.strip_suffix('m') {
        Some(m) => m.parse::<f64>().ok()? / 1000.0,
        None => q.parse::<f64>().ok()?,
    };
    (cores.is_finite() && cores > 0.0).then_some(cores)
}

/// Whole CPUs in a CPU quantity, rounded up: "2" → 2, "1500m" → 2,
/// "0.5" → 1. `None` as [`cpu_cores`], or past `u32::MAX`.
pub fn whole_cpus(q: &str) -> Option<u32> {
    let cpus = cpu_cores(q)?.ceil();
    (cpus <= f64::from(u32::MAX)).then_some(cpus as u32)
}

/// The CPU limit of `resources`, if set.
pub fn cpu_limit(resources: Option<&ResourceRequirements>) -> Option<&Quantity> {
    resources?.limits.as_ref()?.get("cpu")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_quantities() {
        assert_eq!(whole_cpus("2"), Some(2));
        assert_eq!(whole_cpus("1500m"), Some(2));
        assert_eq!(whole_cpus("0.5"), Some(1));
        assert_eq!(whole_cpus("abc"), None);
        assert_eq!(whole_cpus("-1"), None);
        assert_eq!(whole_cpus("0"), None);
        assert_eq!(cpu_cores("500m"), Some(0.5));
        assert_eq!(cpu_cores("2"), Some(2.0));
        assert_eq!(cpu_cores("x"), None);
    }

    #[test]
    fn cpu_limit_is_the_limit_not_the_request() {
        let r: ResourceRequirements = serde_json::from_value(serde_json::json!({
            "requests": {"cpu": "1"}, "limits": {"cpu": "1500m", "memory": "1Gi"}
        }))
        .expect("resources");
        assert_eq!(cpu_limit(Some(&r)).map(|q| q.0.as_str()), Some("1500m"));
        assert_eq!(cpu_limit(None), None);
        let requests_only: ResourceRequirements =
            serde_json::from_value(serde_json::json!({"requests": {"cpu": "1"}}))
                .expect("resources");
        assert_eq!(cpu_limit(Some(&requests_only)), None);
    }
}
