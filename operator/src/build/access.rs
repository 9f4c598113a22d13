//! The trainers' access to the API server: a Role `<job>-trainer` that
//! lets the job's ServiceAccount read and watch its own plan ConfigMap
//! `<job>-plan` (by `resourceNames`, nothing else), and the RoleBinding
//! that grants it. Only rank 0 mounts a token (see [`super::pod`]), so the
//! other ranks have no API access at all.

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::names::{self, common_labels};
use crate::validate::ValidatedJob;

/// The Role and RoleBinding that let `service_account` (in `namespace`)
/// get, list and watch the ConfigMap `<job>-plan` and nothing else. A
/// list or watch is allowed only with the field selector
/// `metadata.name=<job>-plan` (how the trainer watches it).
pub fn trainer_access(job: &str, namespace: &str, service_account: &str) -> (Role, RoleBinding) {
    let name = names::trainer_role(job);
    let meta = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(namespace.to_string()),
        labels: Some(common_labels(job)),
        ..Default::default()
    };
    let role = Role {
        metadata: meta.clone(),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(vec![names::plan_configmap(job)]),
            verbs: vec!["get".into(), "list".into(), "watch".into()],
            ..Default::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".to_string().into(),
            kind: "Role".into(),
            name,
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: service_account.to_string(),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        }]),
    };
    (role, binding)
}

/// [`trainer_access`] for the job `v`, owned by it (removed with it).
pub fn for_job(v: &ValidatedJob) -> (Role, RoleBinding) {
    let (mut role, mut binding) =
        trainer_access(&v.name, &v.namespace, &names::service_account(v.spec()));
    role.metadata.owner_references = Some(vec![v.owner.clone()]);
    binding.metadata.owner_references = Some(vec![v.owner.clone()]);
    (role, binding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_names_only_the_jobs_plan_and_binds_its_service_account() {
        let (role, binding) = trainer_access("mnist", "team-a", "runner");
        let rules = role.rules.unwrap_or_default();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&["mnist-plan".to_string()][..])
        );
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["configmaps".to_string()][..])
        );
        assert!(!rules[0]
            .verbs
            .iter()
            .any(|v| v == "create" || v == "patch" || v == "update"));
        assert_eq!(role.metadata.name.as_deref(), Some("mnist-trainer"));
        assert_eq!(binding.role_ref.name, "mnist-trainer");
        let s = binding.subjects.unwrap_or_default();
        assert_eq!(s.len(), 1);
        assert_eq!(
            (s[0].name.as_str(), s[0].namespace.as_deref()),
            ("runner", Some("team-a"))
        );
    }
}
