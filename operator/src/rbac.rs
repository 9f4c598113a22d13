//! The RBAC rules the operator needs — and nothing more — in one place,
//! split by where they apply:
//!
//! * [`NAMESPACED_RULES`]: in every namespace whose jobs it reconciles
//!   (jobs and their children);
//! * [`CLUSTER_RULES`]: cluster-scoped reads (the CRD, nodes);
//! * [`LEASE_RULE`]: its own leader-election Lease, by name, in its own
//!   namespace — get and update only: the Helm chart pre-creates the Lease;
//! * [`PROFILE_CACHE_RULE`]: the profile-cache ConfigMap, by name, in its
//!   own namespace (needed on its own when that namespace is not watched;
//!   the chart pre-creates the ConfigMap).
//!
//! The Helm chart grants them as Roles and ClusterRoles (cluster-wide or
//! per watched namespace; the chart tests compare them with these rules).
//! `heterotrain-operator rbac` prints [`cluster_role`]: one ClusterRole that
//! is enough on its own (the file `operator/rbac.yaml`, kept fresh by a
//! test; the test beds bind it) — the namespaced and cluster-scoped rules,
//! the Lease rule and [`LEASE_CREATE_RULE`], since without the chart nothing
//! pre-creates the Lease.

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Name of the ClusterRole.
pub const CLUSTER_ROLE: &str = "heterotrain-operator";

/// Name of the leader-election Lease (the default of
/// `OperatorConfig::lease_name`, which the chart pre-creates).
pub const LEASE: &str = "heterotrain-operator";

/// Name of the profile-cache ConfigMap.
pub const PROFILE_CACHE: &str = crate::profile_cache::CACHE_CONFIGMAP;

/// One rule with why it is needed.
pub struct Rule {
    pub api_group: &'static str,
    pub resources: &'static [&'static str],
    /// Objects the rule is restricted to (empty: every object).
    pub resource_names: &'static [&'static str],
    pub verbs: &'static [&'static str],
    pub why: &'static str,
}

/// Rules in each namespace whose jobs the operator reconciles.
pub const NAMESPACED_RULES: &[Rule] = &[
    Rule {
        api_group: "heterotrain.dev",
        resources: &["heterotrainingjobs"],
        resource_names: &[],
        verbs: &["get", "list", "watch", "delete"],
        why: "watch jobs; delete finished jobs after ttlSecondsAfterFinished",
    },
    Rule {
        api_group: "heterotrain.dev",
        resources: &["heterotrainingjobs/status"],
        resource_names: &[],
        verbs: &["patch"],
        why: "report conditions, plan generation, balance and restarts",
    },
    Rule {
        api_group: "heterotrain.dev",
        resources: &["heterotrainingjobs/finalizers"],
        resource_names: &[],
        verbs: &["update"],
        why: "set blockOwnerDeletion owner references on children (OwnerReferencesPermissionEnforcement)",
    },
    Rule {
        api_group: "",
        resources: &["pods"],
        resource_names: &[],
        verbs: &["get", "list", "watch", "create", "patch", "delete"],
        why: "create rank pods (server-side apply), watch their phase, delete a gang to restart or suspend it",
    },
    Rule {
        api_group: "",
        resources: &["services"],
        resource_names: &[],
        verbs: &["get", "list", "watch", "create", "patch"],
        why: "the headless rendezvous Service of each job",
    },
    Rule {
        api_group: "",
        resources: &["configmaps"],
        resource_names: &[],
        verbs: &["get", "list", "watch", "create", "patch"],
        why: "plan ConfigMaps of jobs (and, cluster-wide, the profile cache)",
    },
    Rule {
        api_group: "events.k8s.io",
        resources: &["events"],
        resource_names: &[],
        verbs: &["create", "patch"],
        why: "Events on jobs (Rebalanced, GangRestarting, Invalid, ...)",
    },
    Rule {
        api_group: "rbac.authorization.k8s.io",
        resources: &["roles", "rolebindings"],
        resource_names: &[],
        verbs: &["create", "patch"],
        why: "each job's trainer Role and RoleBinding `<job>-trainer`: read its own plan ConfigMap only (server-side apply; never read, listed or deleted: they go with the job)",
    },
    Rule {
        api_group: "networking.k8s.io",
        resources: &["networkpolicies"],
        resource_names: &[],
        verbs: &["create", "patch", "delete"],
        why: "each job's NetworkPolicies (server-side apply; deleted when the job turns isolation off)",
    },
    Rule {
        api_group: "scheduling.volcano.sh",
        resources: &["podgroups"],
        resource_names: &[],
        verbs: &["get", "create", "patch"],
        why: "the PodGroup of a job with runPolicy.schedulingPolicy where Volcano is installed (server-side apply)",
    },
    Rule {
        api_group: "scheduling.x-k8s.io",
        resources: &["podgroups"],
        resource_names: &[],
        verbs: &["get", "create", "patch"],
        why: "the PodGroup of a job with runPolicy.schedulingPolicy where scheduler-plugins is installed (server-side apply)",
    },
];

/// Cluster-scoped rules: reads, and the two reviews of `/metrics` tokens.
pub const CLUSTER_RULES: &[Rule] = &[
    Rule {
        api_group: "apiextensions.k8s.io",
        resources: &["customresourcedefinitions"],
        resource_names: &[],
        verbs: &["get"],
        why: "wait at start until the HeteroTrainingJob CRD is established",
    },
    Rule {
        api_group: "",
        resources: &["nodes"],
        resource_names: &[],
        verbs: &["get"],
        why: "the accelerator label of the node a rank ran on (profile-cache key)",
    },
    Rule {
        api_group: "authentication.k8s.io",
        resources: &["tokenreviews"],
        resource_names: &[],
        verbs: &["create"],
        why: "check the bearer token of a /metrics request (--metrics-auth)",
    },
    Rule {
        api_group: "authorization.k8s.io",
        resources: &["subjectaccessreviews"],
        resource_names: &[],
        verbs: &["create"],
        why: "check that the token's user may get /metrics (--metrics-auth)",
    },
];

/// The operator's own Lease, in its namespace: read and renew, never create.
pub const LEASE_RULE: Rule = Rule {
    api_group: "coordination.k8s.io",
    resources: &["leases"],
    resource_names: &[LEASE],
    verbs: &["get", "update"],
    why: "leader election between replicas, on the operator's own Lease",
};

/// Create the Lease: only where nothing pre-created it (`operator/rbac.yaml`
/// used on its own). The chart pre-creates the Lease and grants no create.
/// `create` cannot be limited by resourceNames.
pub const LEASE_CREATE_RULE: Rule = Rule {
    api_group: "coordination.k8s.io",
    resources: &["leases"],
    resource_names: &[],
    verbs: &["create"],
    why: "create the Lease where nothing pre-created it (without the Helm chart)",
};

/// The profile cache in the operator's namespace (pre-created by the chart).
pub const PROFILE_CACHE_RULE: Rule = Rule {
    api_group: "",
    resources: &["configmaps"],
    resource_names: &[PROFILE_CACHE],
    verbs: &["get", "patch", "update"],
    why: "the hardware-profile cache in the operator's namespace",
};

/// One rule as a Kubernetes `PolicyRule`.
pub fn policy_rule(r: &Rule) -> PolicyRule {
    let strings = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(vec![r.api_group.to_string()]),
        resources: Some(strings(r.resources)),
        resource_names: (!r.resource_names.is_empty()).then(|| strings(r.resource_names)),
        verbs: strings(r.verbs),
        ..Default::default()
    }
}

/// [`NAMESPACED_RULES`] as `PolicyRule`s.
pub fn namespaced_rules() -> Vec<PolicyRule> {
    NAMESPACED_RULES.iter().map(policy_rule).collect()
}

/// [`CLUSTER_RULES`] as `PolicyRule`s.
pub fn cluster_scoped_rules() -> Vec<PolicyRule> {
    CLUSTER_RULES.iter().map(policy_rule).collect()
}

/// The chart's ClusterRole in cluster-wide mode: namespaced and
/// cluster-scoped rules (the Lease rule is a Role in the operator's namespace).
pub fn cluster_wide_rules() -> Vec<PolicyRule> {
    NAMESPACED_RULES
        .iter()
        .chain(CLUSTER_RULES)
        .map(policy_rule)
        .collect()
}

/// Every rule of [`cluster_role`], in order.
fn standalone_rules() -> impl Iterator<Item = &'static Rule> {
    NAMESPACED_RULES
        .iter()
        .chain(CLUSTER_RULES)
        .chain([&LEASE_RULE, &LEASE_CREATE_RULE])
}

/// The rules of [`cluster_role`] as `PolicyRule`s.
pub fn policy_rules() -> Vec<PolicyRule> {
    standalone_rules().map(policy_rule).collect()
}

/// The ClusterRole that is enough on its own (bound cluster-wide, nothing
/// pre-created): what `heterotrain-operator rbac` prints.
pub fn cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(CLUSTER_ROLE.into()),
            ..Default::default()
        },
        rules: Some(policy_rules()),
        aggregation_rule: None,
    }
}

/// `operator/rbac.yaml`: [`cluster_role`] with each rule's reason as a comment.
pub fn cluster_role_yaml() -> String {
    let mut out = String::from(
        "# Generated by `heterotrain-operator rbac` from operator/src/rbac.rs; do not edit by hand.\n\
         # Every rule the operator needs, and nothing more, as one ClusterRole bound\n\
         # cluster-wide. The Helm chart grants the same rules split by scope: the\n\
         # namespaced ones per watched namespace (or cluster-wide), the Lease and the\n\
         # profile cache by name in the operator's namespace, and never Lease create\n\
         # (it pre-creates the Lease).\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: heterotrain-operator\nrules:\n",
    );
    let list = |xs: &[&str]| {
        xs.iter()
            .map(|x| format!("\"{x}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    for r in standalone_rules() {
        out.push_str(&format!(
            "# {}\n- apiGroups: [\"{}\"]\n  resources: [{}]\n",
            r.why,
            r.api_group,
            list(r.resources)
        ));
        if !r.resource_names.is_empty() {
            out.push_str(&format!("  resourceNames: [{}]\n", list(r.resource_names)));
        }
        out.push_str(&format!("  verbs: [{}]\n", list(r.verbs)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_matches_rules() {
        let role: ClusterRole = serde_yaml::from_str(&cluster_role_yaml()).expect("yaml");
        assert_eq!(role.rules, cluster_role().rules);
    }

    #[test]
    fn rbac_yaml_is_fresh() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/rbac.yaml");
        let on_disk = std::fs::read_to_string(path).unwrap_or_default();
        assert_eq!(
            on_disk,
            cluster_role_yaml(),
            "operator/rbac.yaml is stale: run `cargo run -p heterotrain-operator -- rbac > operator/rbac.yaml`"
        );
    }

    #[test]
    fn the_lease_rule_names_the_operators_lease_and_never_creates() {
        assert_eq!(
            crate::OperatorConfig::default().lease_name,
            LEASE,
            "the Lease the chart pre-creates and the Role names"
        );
        let r = policy_rule(&LEASE_RULE);
        assert_eq!(r.resource_names, Some(vec![LEASE.to_string()]));
        assert!(!r.verbs.iter().any(|v| v == "create"));
        let r = policy_rule(&PROFILE_CACHE_RULE);
        assert_eq!(r.resource_names, Some(vec![PROFILE_CACHE.to_string()]));
        assert!(!r.verbs.iter().any(|v| v == "create" || v == "list"));
    }

    #[test]
    fn rules_are_split_by_scope() {
        let namespaced: Vec<&str> = NAMESPACED_RULES
            .iter()
            .flat_map(|r| r.resources.iter().copied())
            .collect();
        for cluster_scoped in ["nodes", "customresourcedefinitions", "leases"] {
            assert!(!namespaced.contains(&cluster_scoped), "{cluster_scoped}");
        }
        for r in CLUSTER_RULES {
            // Reads, and the reviews of /metrics tokens: objects the API
            // server answers and never stores.
            let review = r.resources == ["tokenreviews"] || r.resources == ["subjectaccessreviews"];
            let want: &[&str] = if review { &["create"] } else { &["get"] };
            assert_eq!(
                r.verbs, want,
                "cluster-scoped rules only read: {:?}",
                r.resources
            );
        }
        assert_eq!(
            cluster_wide_rules().len() + 2,
            policy_rules().len(),
            "the standalone ClusterRole adds the Lease rules only"
        );
    }
}
