//! The Helm chart `charts/heterotrain`, checked with the real `helm` binary
//! and without a cluster: `helm lint --strict` and `helm template` over
//! several value sets; the chart's CRD is the generated one; its Roles and
//! ClusterRole have exactly the operator's rules (`operator/src/rbac.rs`,
//! `operator/rbac.yaml`) split by scope, cluster-wide or per watched
//! namespace; the operator pod is "restricted"-compliant; the trainers'
//! ServiceAccount is granted nothing by the chart; the monitors,
//! NetworkPolicies and dashboard render as documented. What the RBAC
//! allows on a real API server: `tests/rbac_matrix.rs`.

mod support;

use std::collections::BTreeSet;

use heterotrain_crds::labels;
use heterotrain_operator::rbac;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use serde_yaml::Value;
use support::*;

fn lint_args(extra: &[&'static str]) -> Vec<&'static str> {
    // `helm lint` takes --set but not --api-versions.
    let mut out = Vec::new();
    let mut it = extra.iter();
    while let Some(a) = it.next() {
        if *a == "--api-versions" {
            it.next();
        } else {
            out.push(*a);
        }
    }
    out
}

#[test]
fn lints_strictly_with_every_value_set() {
    let chart = chart_dir();
    for (what, extra) in value_sets() {
        let mut args = vec!["lint", "--strict", chart.to_str().unwrap()];
        args.extend(lint_args(&extra));
        let out = run_helm(&args).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(out.contains("0 chart(s) failed"), "{what}: {out}");
    }
}

#[test]
fn schema_rejects_invalid_values() {
    let chart = chart_dir();
    for bad in [
        "operator.metricsSource=sometimes",
        "operator.prometheusUrl=prometheus:9090",
        "operator.port=0",
        "operator.nosuchkey=1",
        "watchNamespaces={Not_A_Namespace}",
        "monitoring.podMonitor.interval=often",
    ] {
        let err = run_helm(&["template", "x", chart.to_str().unwrap(), "--set", bad])
            .expect_err(&format!("--set {bad} was accepted"));
        assert!(
            err.contains("values don't meet the specifications of the schema")
                || err.contains("at '/"),
            "--set {bad}: unexpected error: {err}"
        );
    }
}

#[test]
fn chart_crd_is_the_generated_crd() {
    let root = repo_root();
    let generated = std::fs::read(root.join("crds/heterotrainingjob.yaml")).expect("generated CRD");
    let chart = std::fs::read(chart_dir().join("crds/heterotrainingjob.yaml")).expect("chart CRD");
    assert!(
        generated == chart,
        "charts/heterotrain/crds/heterotrainingjob.yaml differs from crds/heterotrainingjob.yaml: \
         run `cp crds/heterotrainingjob.yaml charts/heterotrain/crds/`"
    );
}

fn normalized(rules: Vec<PolicyRule>) -> Vec<PolicyRule> {
    let mut rules: Vec<PolicyRule> = rules
        .into_iter()
        .map(|mut r| {
            for v in [&mut r.api_groups, &mut r.resources, &mut r.resource_names]
                .into_iter()
                .flatten()
            {
                v.sort();
            }
            r.verbs.sort();
            r
        })
        .collect();
    rules.sort_by_key(|r| format!("{:?}{:?}", r.api_groups, r.resources));
    rules
}

/// The rules of the `kind` named `name` (in `ns`, for Roles), normalized.
fn rules_of(docs: &[Value], kind_: &str, ns: Option<&str>, name_: &str) -> Vec<PolicyRule> {
    let found: Vec<&Value> = all(docs, kind_)
        .into_iter()
        .filter(|o| name(o) == name_ && ns.is_none_or(|ns| namespace(o) == ns))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {kind_} {ns:?}/{name_}, got {}",
        found.len()
    );
    let rules = if kind_ == "ClusterRole" {
        typed::<ClusterRole>(found[0]).rules
    } else {
        typed::<Role>(found[0]).rules
    };
    normalized(rules.unwrap_or_default())
}

/// The binding `kind` `ns`/`name_` binds the operator pod's ServiceAccount to `role`.
fn assert_binds_operator(
    docs: &[Value],
    what: &str,
    kind_: &str,
    ns: Option<&str>,
    name_: &str,
    role: &str,
) {
    let found: Vec<&Value> = all(docs, kind_)
        .into_iter()
        .filter(|o| name(o) == name_ && ns.is_none_or(|ns| namespace(o) == ns))
        .collect();
    assert_eq!(found.len(), 1, "{what}: one {kind_} {ns:?}/{name_}");
    let binding = found[0];
    assert_eq!(
        binding["roleRef"]["name"],
        Value::from(role),
        "{what}: {kind_} {name_}"
    );
    let subjects = binding["subjects"].as_sequence().expect("subjects");
    assert_eq!(
        subjects.len(),
        1,
        "{what}: {kind_} {name_} binds one subject"
    );
    let subject = &subjects[0];
    let pod = operator_pod(docs);
    assert_eq!(subject["kind"], Value::from("ServiceAccount"));
    assert_eq!(subject["namespace"], Value::from(NAMESPACE));
    assert_eq!(
        subject["name"].as_str(),
        pod.service_account_name.as_deref(),
        "{what}: {kind_} {name_}: the subject is the operator pod's ServiceAccount"
    );
    assert!(
        all(docs, "ServiceAccount")
            .iter()
            .any(|sa| subject["name"].as_str() == Some(name(sa)) && namespace(sa) == NAMESPACE),
        "{what}: the chart creates the operator's ServiceAccount"
    );
}

const OPERATOR_ROLE: &str = "ht-heterotrain-operator";
const STATE_ROLE: &str = "ht-heterotrain-operator-state";

#[test]
fn operator_rbac_is_exactly_the_operators_rules_split_by_scope() {
    let generated: ClusterRole = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("operator/rbac.yaml"))
            .expect("operator/rbac.yaml"),
    )
    .expect("operator/rbac.yaml parses");
    for (what, extra) in value_sets() {
        let docs = template(&extra);
        let watched: Vec<String> = extra
            .iter()
            .find_map(|a| a.strip_prefix("watchNamespaces="))
            .map(|l| {
                l.trim_matches(|c| c == '{' || c == '}')
                    .split(',')
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_else(|| vec![NAMESPACE.to_string()]);
        let cluster_wide = extra.contains(&"watchAllNamespaces=true");
        let profile_cache = !extra.contains(&"operator.profileCache=false");
        let cluster_rules = rules_of(&docs, "ClusterRole", None, OPERATOR_ROLE);
        let state_rules = rules_of(&docs, "Role", Some(NAMESPACE), STATE_ROLE);
        assert_binds_operator(
            &docs,
            what,
            "ClusterRoleBinding",
            None,
            OPERATOR_ROLE,
            OPERATOR_ROLE,
        );
        assert_binds_operator(
            &docs,
            what,
            "RoleBinding",
            Some(NAMESPACE),
            STATE_ROLE,
            STATE_ROLE,
        );
        if cluster_wide {
            // Cluster-wide: the ClusterRole has the namespaced and
            // cluster-scoped rules; the Lease is a Role of its own.
            assert_eq!(
                cluster_rules,
                normalized(rbac::cluster_wide_rules()),
                "{what}: the chart's ClusterRole differs from operator/src/rbac.rs"
            );
            assert_eq!(
                state_rules,
                normalized(vec![rbac::policy_rule(&rbac::LEASE_RULE)]),
                "{what}: the release namespace's Role grants the Lease by name only"
            );
            // ... which together are operator/rbac.yaml but for Lease create.
            let mut chart = cluster_rules.clone();
            chart.extend(state_rules.clone());
            chart.push(rbac::policy_rule(&rbac::LEASE_CREATE_RULE));
            assert_eq!(
                normalized(chart),
                normalized(generated.rules.clone().unwrap_or_default()),
                "{what}: the chart's operator rules differ from operator/rbac.yaml (`heterotrain-operator rbac`)"
            );
            assert!(
                !all(&docs, "Role").iter().any(|r| name(r) == OPERATOR_ROLE),
                "{what}: no namespaced operator Role cluster-wide"
            );
        } else {
            // Namespaced: cluster-scoped reads only, a Role per watched namespace.
            assert_eq!(
                cluster_rules,
                normalized(rbac::cluster_scoped_rules()),
                "{what}: the ClusterRole holds only the cluster-scoped reads"
            );
            for ns in &watched {
                assert_eq!(
                    rules_of(&docs, "Role", Some(ns), OPERATOR_ROLE),
                    normalized(rbac::namespaced_rules()),
                    "{what}: the operator's Role in {ns}"
                );
                assert_binds_operator(
                    &docs,
                    what,
                    "RoleBinding",
                    Some(ns),
                    OPERATOR_ROLE,
                    OPERATOR_ROLE,
                );
            }
            let operator_roles: BTreeSet<&str> = all(&docs, "Role")
                .into_iter()
                .filter(|r| name(r) == OPERATOR_ROLE)
                .map(namespace)
                .collect();
            assert_eq!(
                operator_roles,
                watched.iter().map(String::as_str).collect(),
                "{what}: operator Roles exactly in the watched namespaces"
            );
            let mut state = vec![rbac::policy_rule(&rbac::LEASE_RULE)];
            if profile_cache {
                state.push(rbac::policy_rule(&rbac::PROFILE_CACHE_RULE));
            }
            assert_eq!(
                state_rules,
                normalized(state),
                "{what}: the release namespace's Role grants the Lease and profile cache by name"
            );
        }
        for r in &state_rules {
            assert!(
                r.resource_names.as_ref().is_some_and(|n| !n.is_empty()),
                "{what}: every rule of the state Role names its objects: {r:?}"
            );
            assert!(
                !r.verbs.iter().any(|v| v == "create"),
                "{what}: no create: {r:?}"
            );
        }
    }
}

/// The chart grants the trainers nothing: no Role or RoleBinding names or
/// binds `heterotrain-trainer`, and no role reads every ConfigMap for them.
fn assert_no_trainer_grant(docs: &[Value], what: &str) {
    for k in ["Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"] {
        for o in all(docs, k) {
            assert_ne!(name(o), "heterotrain-trainer", "{what}: {k} {}", name(o));
            let subjects = o["subjects"].as_sequence().cloned().unwrap_or_default();
            assert!(
                !subjects.iter().any(|s| s["name"] == "heterotrain-trainer"),
                "{what}: {k} {} binds the trainers",
                name(o)
            );
        }
    }
}

fn operator_pod(docs: &[Value]) -> PodSpec {
    let deploy: Deployment = typed(one(docs, "Deployment"));
    deploy.spec.template.spec.expect("pod spec")
}

#[test]
fn operator_pod_is_restricted() {
    // Kubernetes 1.20 has no PodSecurity admission: check the "restricted"
    // profile's rules (every upstream check, `pod_security`) on what the
    // chart renders instead, and what the chart adds beyond them.
    for (what, extra) in value_sets() {
        let docs = template(&extra);
        let deploy: Deployment = typed(one(&docs, "Deployment"));
        let as_pod = k8s_openapi::api::core::v1::Pod {
            metadata: deploy.spec.template.metadata.clone().unwrap_or_default(),
            spec: deploy.spec.template.spec.clone(),
            status: None,
        };
        let violations = heterotrain_e2e::pod_security::restricted(&as_pod);
        assert!(violations.is_empty(), "{what}: {violations:?}");
        let pod = operator_pod(&docs);
        let psc = pod.security_context.clone().expect("pod securityContext");
        assert_eq!(psc.run_as_non_root, Some(true), "{what}");
        assert!(psc.run_as_user.is_some_and(|u| u != 0), "{what}: runAsUser");
        assert_eq!(
            psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault"),
            "{what}"
        );
        assert!(pod.host_network.is_none() && pod.host_pid.is_none() && pod.host_ipc.is_none());
        for c in &pod.containers {
            let sc = c
                .security_context
                .clone()
                .expect("container securityContext");
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{what}");
            assert_ne!(sc.privileged, Some(true), "{what}");
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{what}");
            assert_eq!(sc.run_as_non_root, Some(true), "{what}");
            let caps = sc.capabilities.expect("capabilities");
            assert_eq!(caps.drop, Some(vec!["ALL".to_string()]), "{what}");
            assert!(caps.add.unwrap_or_default().is_empty(), "{what}");
            let res = c.resources.clone().expect("resources");
            assert!(
                res.requests.is_some() && res.limits.is_some(),
                "{what}: resources"
            );
            assert!(
                c.liveness_probe.is_some() && c.readiness_probe.is_some(),
                "{what}: probes"
            );
        }
        for v in pod.volumes.unwrap_or_default() {
            assert!(v.host_path.is_none(), "{what}: hostPath volume");
        }
    }
}

fn args_of(pod: &PodSpec) -> Vec<String> {
    pod.containers[0].args.clone().unwrap_or_default()
}

#[test]
fn defaults_render_operator_trainer_identity_and_dashboard() {
    let docs = template(&[]);
    let version = app_version();
    let pod = operator_pod(&docs);
    let c = &pod.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some(format!("ghcr.io/heterotrain/heterotrain-operator:{version}").as_str()),
        "operator image tag defaults to appVersion"
    );
    let args = args_of(&pod);
    for want in [
        format!("--trainer-image=ghcr.io/heterotrain/heterotrain-trainer:{version}"),
        "--metrics-source=job".into(),
        format!("--namespace={NAMESPACE}"),
    ] {
        assert!(args.contains(&want), "missing {want} in {args:?}");
    }
    let env: Vec<String> = c
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| e.name)
        .collect();
    for want in ["POD_NAME", "POD_NAMESPACE", "HETEROTRAIN_HTTP_ADDR"] {
        assert!(env.iter().any(|e| e == want), "missing env {want}: {env:?}");
    }
    // No Prometheus Operator API: no monitors.
    assert!(all(&docs, "PodMonitor").is_empty() && all(&docs, "ServiceMonitor").is_empty());
    assert!(all(&docs, "NetworkPolicy").is_empty());
    // The trainers' ServiceAccount in the release namespace, granted nothing
    // by the chart: the operator grants each job's ServiceAccount its own plan.
    let sas: Vec<_> = all(&docs, "ServiceAccount")
        .into_iter()
        .filter(|s| name(s) == "heterotrain-trainer")
        .collect();
    assert_eq!(sas.len(), 1);
    assert_eq!(namespace(sas[0]), NAMESPACE);
    assert_no_trainer_grant(&docs, "defaults");
    // The dashboard ConfigMap for Grafana's sidecar holds the chart's dashboard.
    let cm = all(&docs, "ConfigMap")
        .into_iter()
        .find(|c| c["metadata"]["labels"]["grafana_dashboard"] == "1")
        .expect("dashboard ConfigMap labelled grafana_dashboard: \"1\"");
    let on_disk = std::fs::read_to_string(chart_dir().join("dashboards/heterotrain.json")).unwrap();
    let rendered = cm["data"]["heterotrain.json"]
        .as_str()
        .expect("dashboard data");
    let a: serde_json::Value = serde_json::from_str(rendered).expect("rendered dashboard is JSON");
    let b: serde_json::Value = serde_json::from_str(&on_disk).unwrap();
    assert_eq!(a, b);
    // Operator state objects are the chart's, so `helm uninstall` removes them.
    assert!(all(&docs, "Lease")
        .iter()
        .any(|l| name(l) == "heterotrain-operator"));
    assert!(all(&docs, "ConfigMap")
        .iter()
        .any(|c| name(c) == "heterotrain-profile-cache"));
    // The metrics Service selects the operator pod's `metrics` port.
    let svc = metrics_service(&docs);
    assert_eq!(
        svc["spec"]["ports"][0]["targetPort"],
        Value::from("metrics")
    );
    let ports = c.ports.clone().unwrap_or_default();
    assert!(ports.iter().any(|p| p.name.as_deref() == Some("metrics")));
}

/// `__meta_kubernetes_pod_label_<name>` for a pod label.
fn meta_label(label: &str) -> String {
    let s: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("__meta_kubernetes_pod_label_{s}")
}

#[test]
fn monitors_render_only_when_enabled_and_the_api_exists() {
    let docs = template(&[
        "--api-versions",
        "monitoring.coreos.com/v1",
        "--set",
        "monitoring.additionalLabels.release=kps",
    ]);
    let pm = one(&docs, "PodMonitor");
    let sm = one(&docs, "ServiceMonitor");
    for m in [pm, sm] {
        assert_eq!(
            m["metadata"]["labels"]["release"],
            Value::from("kps"),
            "{}",
            name(m)
        );
    }
    // Relabelling turns the operator's pod labels into the target labels the
    // dashboard, the operator's Prometheus source and the e2e Prometheus use.
    let ep = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!(ep["port"], Value::from("metrics"));
    let rl: Vec<(String, String)> = ep["relabelings"]
        .as_sequence()
        .expect("relabelings")
        .iter()
        .map(|r| {
            (
                r["sourceLabels"][0].as_str().unwrap_or("").to_string(),
                r["targetLabel"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    for (src, target) in [
        (meta_label(labels::JOB), "job_name"),
        (meta_label(labels::RANK), "rank"),
        (meta_label(labels::GROUP), "group"),
        ("__meta_kubernetes_pod_node_name".into(), "node"),
        ("__meta_kubernetes_namespace".into(), "namespace"),
        ("__meta_kubernetes_pod_name".into(), "pod"),
    ] {
        assert!(
            rl.contains(&(src.clone(), target.into())),
            "no relabelling {src} -> {target}: {rl:?}"
        );
    }
    assert_eq!(
        pm["spec"]["selector"]["matchLabels"][labels::MANAGED_BY],
        Value::from(labels::MANAGER)
    );
    assert_eq!(
        pm["spec"]["namespaceSelector"]["matchNames"][0],
        Value::from(NAMESPACE)
    );
    assert_eq!(
        sm["spec"]["endpoints"][0]["port"],
        Value::from("http-metrics")
    );
    let svc = metrics_service(&docs);
    assert_eq!(svc["spec"]["ports"][0]["name"], Value::from("http-metrics"));

    // Disabled: not rendered even with the API.
    let docs = template(&[
        "--api-versions",
        "monitoring.coreos.com/v1",
        "--set",
        "monitoring.podMonitor.enabled=false",
        "--set",
        "monitoring.serviceMonitor.enabled=false",
    ]);
    assert!(all(&docs, "PodMonitor").is_empty() && all(&docs, "ServiceMonitor").is_empty());
}

#[test]
fn several_watched_namespaces_each_get_the_trainer_identity() {
    let docs = template(&[
        "--set",
        "watchNamespaces={team-a,team-b}",
        "--set",
        "networkPolicy.enabled=true",
        "--api-versions",
        "monitoring.coreos.com/v1",
    ]);
    let nss: BTreeSet<&str> = all(&docs, "ServiceAccount")
        .into_iter()
        .filter(|o| name(o) == "heterotrain-trainer")
        .map(namespace)
        .collect();
    assert_eq!(nss, BTreeSet::from(["team-a", "team-b"]));
    assert_no_trainer_grant(&docs, "team-a, team-b");
    // More than one namespace: the operator watches exactly these.
    let args = args_of(&operator_pod(&docs));
    assert!(
        args.contains(&"--namespace=team-a,team-b".to_string()),
        "{args:?}"
    );
    // Every namespace: no --namespace.
    let args = args_of(&operator_pod(&template(&[
        "--set",
        "watchAllNamespaces=true",
    ])));
    assert!(
        !args.iter().any(|a| a.starts_with("--namespace")),
        "{args:?}"
    );
    let pm = one(&docs, "PodMonitor");
    assert_eq!(
        pm["spec"]["namespaceSelector"]["matchNames"],
        serde_yaml::from_str::<Value>("[team-a, team-b]").unwrap()
    );
    // NetworkPolicies: the operator's only. None selects trainer pods:
    // policies add up, and one admitting every trainer pod of a namespace
    // would undo each job's own c10d isolation.
    let nps = all(&docs, "NetworkPolicy");
    let trainer_nps: Vec<&str> = nps
        .iter()
        .filter(|n| n["spec"]["podSelector"]["matchLabels"][labels::MANAGED_BY] == labels::MANAGER)
        .map(|n| name(n))
        .collect();
    assert!(
        trainer_nps.is_empty(),
        "chart policies select trainer pods: {trainer_nps:?}"
    );
    assert_eq!(nps.len(), 1, "one policy, the operator's");
    let op_np = nps
        .iter()
        .find(|n| namespace(n) == NAMESPACE)
        .expect("operator NetworkPolicy");
    assert_eq!(
        op_np["spec"]["ingress"][0]["ports"][0]["port"],
        Value::from("metrics")
    );
}

fn y(v: serde_json::Value) -> Value {
    serde_yaml::to_value(v).unwrap()
}

/// The operator's metrics Service (the webhook has a Service of its own).
fn metrics_service(docs: &[Value]) -> &Value {
    let found: Vec<_> = all(docs, "Service")
        .into_iter()
        .filter(|s| name(s).ends_with("-operator-metrics"))
        .collect();
    assert_eq!(found.len(), 1, "one metrics Service");
    found[0]
}

/// The webhook: by default self-signed (the operator told where its
/// Service, Secret and configuration are; the Secret and configuration
/// granted by name, without create), with cert-manager a Certificate and
/// CA injection instead, and nothing when disabled.
#[test]
fn webhook_renders_self_signed_cert_manager_or_nothing() {
    let docs = template(&[]);
    let cfg = one(&docs, "ValidatingWebhookConfiguration");
    let cfg_name = name(cfg).to_string();
    let hook = &cfg["webhooks"][0];
    assert_eq!(hook["failurePolicy"], "Fail");
    assert_eq!(hook["sideEffects"], "None");
    assert_eq!(
        hook["rules"][0]["resources"],
        y(serde_json::json!(["heterotrainingjobs"]))
    );
    assert_eq!(
        hook["rules"][0]["operations"],
        y(serde_json::json!(["CREATE", "UPDATE"]))
    );
    let svc_name = hook["clientConfig"]["service"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    let svc = all(&docs, "Service")
        .into_iter()
        .find(|s| name(s) == svc_name)
        .expect("the webhook's Service");
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "webhook");
    let pod = operator_pod(&docs);
    let c = &pod.containers[0];
    assert!(c
        .ports
        .iter()
        .flatten()
        .any(|p| p.name.as_deref() == Some("webhook") && p.container_port == 9443));
    let env: std::collections::BTreeMap<String, String> = c
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.clone(), e.value.clone()?)))
        .collect();
    assert_eq!(env.get("HETEROTRAIN_WEBHOOK_SERVICE"), Some(&svc_name));
    assert_eq!(
        env.get("HETEROTRAIN_WEBHOOK_CONFIGURATION"),
        Some(&cfg_name)
    );
    let secret = env
        .get("HETEROTRAIN_WEBHOOK_SECRET")
        .expect("the Secret's name");
    assert!(all(&docs, "Secret").iter().any(|s| name(s) == secret));
    let by_name = |kind_: &str, verbs: &[&str], resource: &str, object: &str| {
        all(&docs, kind_).iter().any(|r| {
            r["rules"].as_sequence().into_iter().flatten().any(|rule| {
                rule["resources"] == y(serde_json::json!([resource]))
                    && rule["resourceNames"] == y(serde_json::json!([object]))
                    && rule["verbs"] == y(serde_json::json!(verbs))
            })
        })
    };
    assert!(by_name("Role", &["get", "update"], "secrets", secret));
    assert!(by_name(
        "ClusterRole",
        &["get", "update"],
        "validatingwebhookconfigurations",
        &cfg_name
    ));

    let docs = template(&[
        "--set",
        "webhook.certManager.enabled=true",
        "--set",
        "webhook.failurePolicy=Ignore",
    ]);
    let cfg = one(&docs, "ValidatingWebhookConfiguration");
    assert_eq!(cfg["webhooks"][0]["failurePolicy"], "Ignore");
    let cert = one(&docs, "Certificate");
    assert_eq!(
        cfg["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        Value::from(format!("{NAMESPACE}/{}", name(cert)))
    );
    assert!(
        all(&docs, "Secret").is_empty(),
        "cert-manager makes the Secret"
    );
    assert!(!all(&docs, "ClusterRole")
        .iter()
        .any(|r| serde_yaml::to_string(r)
            .unwrap()
            .contains("validatingwebhookconfigurations")));
    let pod = operator_pod(&docs);
    assert!(pod.containers[0]
        .env
        .iter()
        .flatten()
        .any(|e| e.name == "HETEROTRAIN_WEBHOOK_CERT_DIR"));

    let docs = template(&["--set", "webhook.enabled=false"]);
    assert!(all(&docs, "ValidatingWebhookConfiguration").is_empty());
    assert!(!operator_pod(&docs).containers[0]
        .env
        .iter()
        .flatten()
        .any(|e| e.name.starts_with("HETEROTRAIN_WEBHOOK")));
}

#[test]
fn value_sets_render_what_they_ask_for() {
    let docs = template(&value_sets()[3].1);
    let pod = operator_pod(&docs);
    let args = args_of(&pod);
    assert!(
        args.contains(&"--metrics-source=prometheus".to_string()),
        "{args:?}"
    );
    assert!(args.contains(&"--prometheus-url=http://prometheus.monitoring:9090".to_string()));
    assert!(
        args.contains(&"--metrics-from-namespace=monitoring,observability".to_string()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--allow-prometheus-url=https://thanos.monitoring:10902".to_string()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--allow-image=ghcr.io/heterotrain/".to_string()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--allow-secret=s3-creds,wandb".to_string()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--no-custom-command".to_string()),
        "{args:?}"
    );
    assert!(
        !args_of(&operator_pod(&template(&[])))
            .iter()
            .any(|a| a.starts_with("--allow-secret") || a == "--no-custom-command"),
        "by default: any Secret, commands allowed"
    );
    assert!(
        args.contains(&"--allow-service-account=heterotrain-trainer".to_string()),
        "{args:?}"
    );
    // An https Prometheus: the Secret mounted read-only, its CA and token
    // files passed as flags.
    for flag in [
        "--prometheus-ca-file=/etc/heterotrain/prometheus/ca.crt",
        "--prometheus-bearer-token-file=/etc/heterotrain/prometheus/token",
    ] {
        assert!(args.contains(&flag.to_string()), "{args:?}");
    }
    let secret = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "prometheus-auth")
        .and_then(|v| v.secret.clone())
        .expect("the prometheus-auth Secret volume");
    assert_eq!(secret.secret_name.as_deref(), Some("prometheus-client"));
    let mount = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "prometheus-auth")
        .expect("mounted");
    assert_eq!(mount.read_only, Some(true));
    let defaults = args_of(&operator_pod(&template(&[])));
    assert!(
        !defaults
            .iter()
            .any(|a| a.starts_with("--prometheus-ca-file")
                || a.starts_with("--prometheus-bearer-token-file")),
        "{defaults:?}"
    );
    assert!(
        !defaults
            .iter()
            .any(|a| a.starts_with("--metrics-from-namespace")),
        "{defaults:?}"
    );
    assert!(
        args.contains(&"--trainer-image=ghcr.io/heterotrain/heterotrain-trainer:9.9.9".to_string())
    );
    assert!(args.contains(&"--no-profile-cache".to_string()));
    assert_eq!(
        pod.containers[0].image.as_deref(),
        Some("ghcr.io/heterotrain/heterotrain-operator:9.9.9")
    );
    let deploy: Deployment = typed(one(&docs, "Deployment"));
    assert_eq!(deploy.spec.replicas, Some(2));
    assert!(!all(&docs, "Service")
        .iter()
        .any(|s| name(s).ends_with("-operator-metrics")));
    assert!(!all(&docs, "ConfigMap")
        .iter()
        .any(|c| name(c).ends_with("-dashboard")));
    assert!(!all(&docs, "ConfigMap")
        .iter()
        .any(|c| name(c) == "heterotrain-profile-cache"));
    // Every rendered object parses as the Kubernetes type it claims to be.
    for d in template(&value_sets()[2].1) {
        assert!(!kind(&d).is_empty() && !name(&d).is_empty(), "{d:?}");
    }
}

#[test]
fn notes_tell_the_next_step() {
    let chart = chart_dir();
    let out = run_helm(&[
        "template",
        "ht",
        chart.to_str().unwrap(),
        "-n",
        "ml",
        "--show-only",
        "templates/NOTES.txt",
    ]);
    // NOTES.txt is not rendered by `helm template`; render it through install --dry-run.
    let _ = out;
    let out = run_helm(&[
        "install",
        "ht",
        chart.to_str().unwrap(),
        "-n",
        "ml",
        "--dry-run=client",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    let notes = out.split("NOTES:").nth(1).expect("NOTES in install output");
    assert!(notes.contains("kubectl -n ml apply -f"), "{notes}");
    assert!(
        notes.contains("kubectl heterotrain -n ml status"),
        "{notes}"
    );
    assert!(
        notes.contains("rollout status deployment/ht-heterotrain-operator"),
        "{notes}"
    );
}

/// The chart's alerts: `promtool check rules` and `promtool test rules`
/// (each alert firing and quiet on synthetic series) pass; the chart wraps
/// exactly those groups in a PrometheusRule only when the API exists and
/// it is enabled; every metric the rules read is one the trainer or the
/// operator exports; every alert has a runbook line in the chart README.
#[test]
fn alert_rules_pass_promtool_and_render_as_a_prometheus_rule() {
    let files = chart_dir().join("files");
    let promtool = heterotrain_e2e::paths::find_binary("promtool")
        .expect("promtool not found; run `make setup`");
    for args in [
        vec!["check", "rules", "alerts.yaml"],
        vec!["test", "rules", "alerts_test.yaml"],
    ] {
        let out = std::process::Command::new(&promtool)
            .args(&args)
            .current_dir(&files)
            .output()
            .expect("running promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = std::fs::read_to_string(files.join("alerts.yaml")).expect("alerts.yaml");
    let file: Value = serde_yaml::from_str(&text).expect("alerts.yaml parses");

    let docs = template(&[
        "--api-versions",
        "monitoring.coreos.com/v1",
        "--set",
        "monitoring.additionalLabels.release=kps",
    ]);
    let rule = one(&docs, "PrometheusRule");
    assert_eq!(rule["spec"]["groups"], file["groups"]);
    assert_eq!(rule["metadata"]["labels"]["release"], Value::from("kps"));
    assert!(all(&template(&[]), "PrometheusRule").is_empty(), "no API");
    let off = template(&[
        "--api-versions",
        "monitoring.coreos.com/v1",
        "--set",
        "monitoring.prometheusRule.enabled=false",
    ]);
    assert!(all(&off, "PrometheusRule").is_empty(), "disabled");

    // Metric names: the operator's from its registry, the trainer's from
    // the shared contract.
    // (a labelled family shows in the exposition once it has a series).
    let registry = heterotrain_operator::metrics::Metrics::new();
    registry.entered("ns", "Failed");
    registry.restarted("ns", 1);
    registry.error("kube");
    registry
        .watch_errors
        .get_or_create(&heterotrain_operator::metrics::ResourceLabel { resource: "pods" })
        .inc();
    let operator = registry.encode();
    let trainer = [
        heterotrain_crds::metrics::COMPUTE_SECONDS_TOTAL,
        heterotrain_crds::metrics::STEPS_TOTAL,
        heterotrain_crds::metrics::LOCAL_BATCH_SIZE,
        heterotrain_crds::metrics::PLAN_REJECTED_TOTAL,
    ];
    let names: BTreeSet<&str> = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("heterotrain_"))
        .collect();
    assert!(names.len() >= 7, "{names:?}");
    for n in names {
        let known = if n.starts_with("heterotrain_operator_") {
            let family = n.strip_suffix("_total").unwrap_or(n);
            operator.contains(&format!("# TYPE {family} "))
        } else {
            trainer.contains(&n)
        };
        assert!(known, "the rules read {n}, which nothing exports");
    }
    let readme = std::fs::read_to_string(chart_dir().join("README.md")).expect("README");
    let alerts: Vec<&str> = file["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().into_iter().flatten())
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert_eq!(alerts.len(), 8, "{alerts:?}");
    for a in alerts {
        assert!(readme.contains(&format!("| `{a}` |")), "no runbook for {a}");
    }
}
