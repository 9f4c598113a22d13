//! Resolve a container's environment like a kubelet: literal values,
//! downward-API `fieldRef`s, `resourceFieldRef`s and ConfigMap/Secret keys.

use std::collections::BTreeMap;

use anyhow::{anyhow, Result};
use heterotrain_crds::resources::whole_cpus;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::api::Api;
use kube::Client;

/// Value of a downward-API field path for `pod` (with the simulator's `pod_ip`).
pub fn field_ref(pod: &Pod, path: &str, pod_ip: &str) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    if let Some(key) = path
        .strip_prefix("metadata.labels['")
        .and_then(|s| s.strip_suffix("']"))
    {
        return meta.labels.as_ref()?.get(key).cloned();
    }
    if let Some(key) = path
        .strip_prefix("metadata.annotations['")
        .and_then(|s| s.strip_suffix("']"))
    {
        return meta.annotations.as_ref()?.get(key).cloned();
    }
    Some(match path {
        "metadata.name" => meta.name.clone()?,
        "metadata.namespace" => meta.namespace.clone()?,
        "metadata.uid" => meta.uid.clone()?,
        "spec.nodeName" => spec?.node_name.clone()?,
        "spec.serviceAccountName" => spec?.service_account_name.clone()?,
        "status.podIP" | "status.podIPs" => pod_ip.to_string(),
        "status.hostIP" => "127.0.0.1".to_string(),
        _ => return None,
    })
}

/// Resolve every env var of `container`.
pub async fn resolve(
    client: &Client,
    pod: &Pod,
    container: &Container,
    pod_ip: &str,
) -> Result<BTreeMap<String, String>> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let mut out = BTreeMap::new();
    for var in container.env.clone().unwrap_or_default() {
        let value = if let Some(v) = var.value {
            Some(expand(&v, &out))
        } else if let Some(from) = var.value_from {
            if let Some(f) = from.field_ref {
                field_ref(pod, &f.field_path, pod_ip)
            } else if let Some(r) = from.resource_field_ref {
                resource_field(container, &r.resource)
            } else if let Some(c) = from.config_map_key_ref {
                let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
                let cm = api.get_opt(&c.name).await?;
                let v = cm.and_then(|cm| cm.data?.get(&c.key).cloned());
                key_ref(v, c.optional, || {
                    format!(
                        "env {}: configmap {ns}/{} key {} missing",
                        var.name, c.name, c.key
                    )
                })?
            } else if let Some(s) = from.secret_key_ref {
                let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
                let sec = api.get_opt(&s.name).await?;
                let v = sec
                    .and_then(|s2| s2.data?.get(&s.key).cloned())
                    .map(|b| String::from_utf8_lossy(&b.0).to_string());
                key_ref(v, s.optional, || {
                    format!(
                        "env {}: secret {ns}/{} key {} missing",
                        var.name, s.name, s.key
                    )
                })?
            } else {
                None
            }
        } else {
            Some(String::new())
        };
        if let Some(v) = value {
            out.insert(var.name, v);
        }
    }
    Ok(out)
}

/// The value of a ConfigMap or Secret key reference: `value`, or an error
/// saying `missing()` when it is absent and the reference is not optional.
fn key_ref(
    value: Option<String>,
    optional: Option<bool>,
    missing: impl FnOnce() -> String,
) -> Result<Option<String>> {
    if value.is_none() && !optional.unwrap_or(false) {
        return Err(anyhow!(missing()));
    }
    Ok(value)
}

/// `$(VAR)` expansion of earlier variables, as Kubernetes does.
pub(super) fn expand(v: &str, env: &BTreeMap<String, String>) -> String {
    let mut s = v.to_string();
    for (k, val) in env {
        s = s.replace(&format!("$({k})"), val);
    }
    s
}

fn resource_field(c: &Container, resource: &str) -> Option<String> {
    let res = c.resources.as_ref()?;
    let (map, key) = match resource.split_once('.') {
        Some(("limits", k)) => (res.limits.as_ref()?, k),
        Some(("requests", k)) => (res.requests.as_ref()?, k),
        _ => return None,
    };
    let q = map.get(key)?.0.clone();
    if key == "cpu" {
        // Rounded up to whole cores, as the downward API does with divisor 1.
        return whole_cpus(&q).map(|c| c.to_string());
    }
    Some(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downward_api_paths() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "j-0", "namespace": "ns", "labels": {"a": "b"}},
            "spec": {"nodeName": "n1", "containers": []}
        }))
        .unwrap();
        for (path, pod_ip, want) in [
            ("metadata.name", "127.1.0.2", Some("j-0")),
            ("metadata.namespace", "", Some("ns")),
            ("status.podIP", "127.1.0.2", Some("127.1.0.2")),
            ("metadata.labels['a']", "", Some("b")),
            ("spec.nodeName", "", Some("n1")),
            ("bogus", "", None),
        ] {
            assert_eq!(field_ref(&pod, path, pod_ip).as_deref(), want, "{path}");
        }
        let mut env = BTreeMap::new();
        env.insert("X".to_string(), "1".to_string());
        assert_eq!(expand("a$(X)b", &env), "a1b");
    }
}
