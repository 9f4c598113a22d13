//! What the chart's RBAC and the operator's per-job trainer Roles allow, asked
//! of a real kube-apiserver with `SubjectAccessReview`s: the chart rendered by
//! the real `helm` in both modes (cluster-wide, and `watchNamespaces` =
//! team-a, team-b) and its ServiceAccounts, Roles, ClusterRoles and bindings
//! applied, plus `heterotrain_operator::build::trainer_access` for two jobs in
//! team-a with their own ServiceAccounts. One control plane for the file,
//! no nodes, no operator.
//!
//! Every case is asked only once all the allowed ones are allowed (the RBAC
//! authorizer sees new bindings through a watch), so a denial is the rules'
//! and not a lag; and an API server that denies everything fails the
//! allowed cases.

mod support;

use std::time::Duration;

use heterotrain_e2e::wait::eventually;
use heterotrain_e2e::{ClusterOptions, LocalCluster};
use heterotrain_operator::build::trainer_access;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_yaml::Value;
use support::*;

/// Namespaced mode: release `ht` in `heterotrain-system`, watching team-a and team-b.
const NS_RELEASE: (&str, &str) = ("ht", "heterotrain-system");
/// Its operator's ServiceAccount (the chart's full name).
const NS_OPERATOR: &str = "ht-heterotrain";
/// Cluster-wide mode: release `wide` in `wide-system`.
const WIDE_RELEASE: (&str, &str) = ("wide", "wide-system");
const WIDE_OPERATOR: &str = "wide-heterotrain";

const LEASE: &str = "heterotrain-operator";
const PROFILE_CACHE: &str = "heterotrain-profile-cache";

/// `helm template <release> charts/heterotrain -n <ns> <extra>`, parsed.
fn render(release: &str, ns: &str, extra: &[&str]) -> Vec<Value> {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        release,
        chart.to_str().expect("utf-8 path"),
        "--namespace",
        ns,
    ];
    args.extend_from_slice(extra);
    parse_docs(&run_helm(&args).unwrap_or_else(|e| panic!("{e}")))
}

async fn apply<K>(api: Api<K>, obj: &K)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let name = obj.meta().name.clone().expect("named object");
    api.patch(
        &name,
        &PatchParams::apply("heterotrain-rbac-matrix").force(),
        &Patch::Apply(obj),
    )
    .await
    .unwrap_or_else(|e| panic!("applying {} {name}: {e}", K::kind(&())));
}

/// Apply the chart's identities and RBAC objects; returns how many.
async fn apply_rbac(client: &Client, docs: &[Value]) -> usize {
    let mut n = 0;
    for d in docs {
        let ns = namespace(d).to_string();
        match kind(d) {
            "ServiceAccount" => {
                let o: ServiceAccount = typed(d);
                apply(Api::namespaced(client.clone(), &ns), &o).await;
            }
            "Role" => {
                let o: Role = typed(d);
                apply(Api::namespaced(client.clone(), &ns), &o).await;
            }
            "RoleBinding" => {
                let o: RoleBinding = typed(d);
                apply(Api::namespaced(client.clone(), &ns), &o).await;
            }
            "ClusterRole" => {
                let o: ClusterRole = typed(d);
                apply(Api::all(client.clone()), &o).await;
            }
            "ClusterRoleBinding" => {
                let o: ClusterRoleBinding = typed(d);
                apply(Api::all(client.clone()), &o).await;
            }
            _ => continue,
        }
        n += 1;
    }
    n
}

async fn create_namespaces(client: &Client, names: &[&str]) {
    let api: Api<Namespace> = Api::all(client.clone());
    for ns in names {
        let o: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
        api.create(&PostParams::default(), &o)
            .await
            .unwrap_or_else(|e| panic!("namespace {ns}: {e}"));
    }
}

async fn create_service_account(client: &Client, ns: &str, name: &str) {
    let o: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    apply(Api::namespaced(client.clone(), ns), &o).await;
}

/// One question: may `user` do `verb` on `group`/`resource` [`name`] in `ns`?
struct Case {
    what: String,
    sa: (String, String),
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    ns: Option<String>,
    name: Option<String>,
    allowed: bool,
}

impl Case {
    fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.sa.0, self.sa.1)
    }
}

/// Cases of one ServiceAccount, written as a table.
struct Subject<'a> {
    sa: (&'a str, &'a str),
    cases: &'a mut Vec<Case>,
}

impl Subject<'_> {
    #[allow(clippy::too_many_arguments)]
    fn case(
        &mut self,
        allowed: bool,
        what: &str,
        verb: &'static str,
        (group, resource): (&'static str, &'static str),
        ns: Option<&str>,
        name: Option<&str>,
    ) {
        self.cases.push(Case {
            what: format!("{}/{}: {what}", self.sa.0, self.sa.1),
            sa: (self.sa.0.into(), self.sa.1.into()),
            verb,
            group,
            resource,
            ns: ns.map(str::to_string),
            name: name.map(str::to_string),
            allowed,
        });
    }
    fn can(
        &mut self,
        what: &str,
        verb: &'static str,
        gr: (&'static str, &'static str),
        ns: Option<&str>,
        name: Option<&str>,
    ) {
        self.case(true, what, verb, gr, ns, name);
    }
    fn cannot(
        &mut self,
        what: &str,
        verb: &'static str,
        gr: (&'static str, &'static str),
        ns: Option<&str>,
        name: Option<&str>,
    ) {
        self.case(false, what, verb, gr, ns, name);
    }

    /// The webhook's self-signed certificate, the same in both modes: its
    /// own Secret and its own webhook configuration by name (get, update),
    /// nothing else of either kind, nothing created.
    fn webhook_fence(&mut self, sys: &str, full: &str) {
        let secret = format!("{full}-webhook-tls");
        let config = format!("{full}-{sys}");
        for verb in ["get", "update"] {
            self.can(
                "its certificate Secret",
                verb,
                SECRETS,
                Some(sys),
                Some(&secret),
            );
            self.can(
                "its webhook configuration",
                verb,
                WEBHOOKS,
                None,
                Some(&config),
            );
        }
        self.cannot(
            "read another Secret of its namespace",
            "get",
            SECRETS,
            Some(sys),
            Some("db-admin"),
        );
        self.cannot(
            "read a Secret of a watched namespace",
            "get",
            SECRETS,
            Some("team-a"),
            Some("s3-creds"),
        );
        self.cannot("list Secrets", "list", SECRETS, Some(sys), None);
        self.cannot("create Secrets", "create", SECRETS, Some(sys), None);
        self.cannot(
            "update another webhook configuration",
            "update",
            WEBHOOKS,
            None,
            Some("other-webhook"),
        );
        self.cannot(
            "create webhook configurations",
            "create",
            WEBHOOKS,
            None,
            None,
        );
        self.cannot(
            "delete its webhook configuration",
            "delete",
            WEBHOOKS,
            None,
            Some(&config),
        );
    }

    /// The operator's Lease fence, the same in both modes: its own Lease by
    /// name (get, update) and no other — none in kube-system, none created.
    fn lease_fence(&mut self, sys: &str) {
        self.can("get its own Lease", "get", LEASES, Some(sys), Some(LEASE));
        self.can(
            "update its own Lease",
            "update",
            LEASES,
            Some(sys),
            Some(LEASE),
        );
        let kube_system = "kube-system";
        for (what, verb, ns, name) in [
            (
                "get a Lease in kube-system",
                "get",
                kube_system,
                Some(LEASE),
            ),
            (
                "update a Lease in kube-system",
                "update",
                kube_system,
                Some(LEASE),
            ),
            (
                "update kube-controller-manager's Lease",
                "update",
                kube_system,
                Some("kube-controller-manager"),
            ),
            (
                "update kube-scheduler's Lease",
                "update",
                kube_system,
                Some("kube-scheduler"),
            ),
            ("create Leases in kube-system", "create", kube_system, None),
            ("create Leases in its own namespace", "create", sys, None),
            (
                "update another Lease in its own namespace",
                "update",
                sys,
                Some("other-lease"),
            ),
        ] {
            self.cannot(what, verb, LEASES, Some(ns), name);
        }
    }
}

const PODS: (&str, &str) = ("", "pods");
const SECRETS: (&str, &str) = ("", "secrets");
const WEBHOOKS: (&str, &str) = (
    "admissionregistration.k8s.io",
    "validatingwebhookconfigurations",
);
const CONFIGMAPS: (&str, &str) = ("", "configmaps");
const LEASES: (&str, &str) = ("coordination.k8s.io", "leases");
const JOBS: (&str, &str) = ("heterotrain.dev", "heterotrainingjobs");
const ROLES: (&str, &str) = ("rbac.authorization.k8s.io", "roles");
const ROLEBINDINGS: (&str, &str) = ("rbac.authorization.k8s.io", "rolebindings");
const NETPOLS: (&str, &str) = ("networking.k8s.io", "networkpolicies");
const NODES: (&str, &str) = ("", "nodes");
const CRDS: (&str, &str) = ("apiextensions.k8s.io", "customresourcedefinitions");

/// The API server's answer: allowed, and its reason.
async fn review(client: &Client, c: &Case) -> (bool, String) {
    let sar = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(c.user()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(c.verb.into()),
                group: Some(c.group.into()),
                resource: Some(c.resource.into()),
                namespace: c.ns.clone(),
                name: c.name.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    let out = api
        .create(&PostParams::default(), &sar)
        .await
        .unwrap_or_else(|e| panic!("{}: SubjectAccessReview: {e}", c.what));
    let status = out.status.unwrap_or_default();
    let why = [status.reason, status.evaluation_error]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ");
    (status.allowed, why)
}

fn describe(c: &Case) -> String {
    let resource = if c.group.is_empty() {
        c.resource.to_string()
    } else {
        format!("{}.{}", c.resource, c.group)
    };
    format!(
        "{} ({} {} {resource}{} in {})",
        c.what,
        c.user(),
        c.verb,
        c.name.as_ref().map(|n| format!(" {n}")).unwrap_or_default(),
        c.ns.as_deref().unwrap_or("the cluster")
    )
}

fn namespaced_operator_cases(cases: &mut Vec<Case>) {
    let (_, sys) = NS_RELEASE;
    let mut op = Subject {
        sa: (sys, NS_OPERATOR),
        cases,
    };
    for ns in ["team-a", "team-b"] {
        op.can(
            "create pods in a watched namespace",
            "create",
            PODS,
            Some(ns),
            None,
        );
        op.can(
            "list jobs in a watched namespace",
            "list",
            JOBS,
            Some(ns),
            None,
        );
        op.can(
            "watch jobs in a watched namespace",
            "watch",
            JOBS,
            Some(ns),
            None,
        );
        op.can(
            "create plan ConfigMaps in a watched namespace",
            "create",
            CONFIGMAPS,
            Some(ns),
            None,
        );
        op.can(
            "patch a job's trainer Role",
            "patch",
            ROLES,
            Some(ns),
            Some("job-a-trainer"),
        );
        op.can(
            "create a job's trainer RoleBinding",
            "create",
            ROLEBINDINGS,
            Some(ns),
            None,
        );
        op.can(
            "create a job's NetworkPolicy",
            "create",
            NETPOLS,
            Some(ns),
            None,
        );
    }
    op.lease_fence(sys);
    op.webhook_fence(sys, NS_OPERATOR);
    op.can(
        "get the profile cache",
        "get",
        CONFIGMAPS,
        Some(sys),
        Some(PROFILE_CACHE),
    );
    op.can(
        "patch the profile cache",
        "patch",
        CONFIGMAPS,
        Some(sys),
        Some(PROFILE_CACHE),
    );
    op.can(
        "get the CRD",
        "get",
        CRDS,
        None,
        Some("heterotrainingjobs.heterotrain.dev"),
    );
    op.can("get a node", "get", NODES, None, Some("node-1"));

    op.cannot(
        "create pods in kube-system",
        "create",
        PODS,
        Some("kube-system"),
        None,
    );
    op.cannot(
        "create pods in an unwatched namespace",
        "create",
        PODS,
        Some("team-c"),
        None,
    );
    op.cannot(
        "create pods in its own (unwatched) namespace",
        "create",
        PODS,
        Some(sys),
        None,
    );
    op.cannot("list pods of every namespace", "list", PODS, None, None);
    op.cannot("list jobs of every namespace", "list", JOBS, None, None);
    op.cannot(
        "create its own Lease by name",
        "create",
        LEASES,
        Some(sys),
        Some(LEASE),
    );
    op.cannot(
        "list Leases in its own namespace",
        "list",
        LEASES,
        Some(sys),
        None,
    );
    op.cannot(
        "delete its own Lease",
        "delete",
        LEASES,
        Some(sys),
        Some(LEASE),
    );
    op.cannot(
        "create Leases in a watched namespace",
        "create",
        LEASES,
        Some("team-a"),
        None,
    );
    op.cannot(
        "get another ConfigMap in its own namespace",
        "get",
        CONFIGMAPS,
        Some(sys),
        Some("kube-root-ca.crt"),
    );
    op.cannot(
        "list ConfigMaps in its own namespace",
        "list",
        CONFIGMAPS,
        Some(sys),
        None,
    );
    op.cannot(
        "create ConfigMaps in its own namespace",
        "create",
        CONFIGMAPS,
        Some(sys),
        None,
    );
    op.cannot(
        "create Roles in an unwatched namespace",
        "create",
        ROLES,
        Some("team-c"),
        None,
    );
    op.cannot("list nodes", "list", NODES, None, None);
    op.cannot("create CRDs", "create", CRDS, None, None);
    op.cannot(
        "create ClusterRoles",
        "create",
        ("rbac.authorization.k8s.io", "clusterroles"),
        None,
        None,
    );
}

fn cluster_wide_operator_cases(cases: &mut Vec<Case>) {
    let (_, sys) = WIDE_RELEASE;
    let mut op = Subject {
        sa: (sys, WIDE_OPERATOR),
        cases,
    };
    op.can(
        "create pods in any namespace",
        "create",
        PODS,
        Some("team-c"),
        None,
    );
    op.can("list pods of every namespace", "list", PODS, None, None);
    op.can("watch jobs of every namespace", "watch", JOBS, None, None);
    op.can(
        "create trainer Roles in any namespace",
        "create",
        ROLES,
        Some("team-c"),
        None,
    );
    op.can(
        "create NetworkPolicies in any namespace",
        "create",
        NETPOLS,
        Some("team-c"),
        None,
    );
    op.lease_fence(sys);
    op.webhook_fence(sys, WIDE_OPERATOR);
    op.can("get a node", "get", NODES, None, Some("node-1"));

    op.cannot("list Leases of every namespace", "list", LEASES, None, None);
    op.cannot("list nodes", "list", NODES, None, None);
}

/// Jobs `job-a` and `job-b` in team-a, run as `runner-a` and `runner-b`.
fn trainer_cases(cases: &mut Vec<Case>) {
    let plan_a = Some("job-a-plan");
    let plan_b = Some("job-b-plan");
    let mut a = Subject {
        sa: ("team-a", "runner-a"),
        cases: &mut *cases,
    };
    a.can(
        "get its job's plan",
        "get",
        CONFIGMAPS,
        Some("team-a"),
        plan_a,
    );
    a.can(
        "watch its job's plan",
        "watch",
        CONFIGMAPS,
        Some("team-a"),
        plan_a,
    );
    a.can(
        "list its job's plan (by name)",
        "list",
        CONFIGMAPS,
        Some("team-a"),
        plan_a,
    );
    a.cannot(
        "get another job's plan",
        "get",
        CONFIGMAPS,
        Some("team-a"),
        plan_b,
    );
    a.cannot(
        "watch another job's plan",
        "watch",
        CONFIGMAPS,
        Some("team-a"),
        plan_b,
    );
    a.cannot(
        "get kube-root-ca.crt",
        "get",
        CONFIGMAPS,
        Some("team-a"),
        Some("kube-root-ca.crt"),
    );
    a.cannot(
        "list kube-root-ca.crt",
        "list",
        CONFIGMAPS,
        Some("team-a"),
        Some("kube-root-ca.crt"),
    );
    a.cannot(
        "get the profile cache",
        "get",
        CONFIGMAPS,
        Some(NS_RELEASE.1),
        Some(PROFILE_CACHE),
    );
    a.cannot(
        "get a ConfigMap named like the profile cache in its namespace",
        "get",
        CONFIGMAPS,
        Some("team-a"),
        Some(PROFILE_CACHE),
    );
    a.cannot(
        "list ConfigMaps without a name",
        "list",
        CONFIGMAPS,
        Some("team-a"),
        None,
    );
    a.cannot(
        "watch ConfigMaps without a name",
        "watch",
        CONFIGMAPS,
        Some("team-a"),
        None,
    );
    a.cannot(
        "update its job's plan",
        "update",
        CONFIGMAPS,
        Some("team-a"),
        plan_a,
    );
    a.cannot(
        "patch its job's plan",
        "patch",
        CONFIGMAPS,
        Some("team-a"),
        plan_a,
    );
    a.cannot(
        "delete its job's plan",
        "delete",
        CONFIGMAPS,
        Some("team-a"),
        plan_a,
    );
    a.cannot(
        "create ConfigMaps",
        "create",
        CONFIGMAPS,
        Some("team-a"),
        None,
    );
    a.cannot(
        "get a plan of that name in another namespace",
        "get",
        CONFIGMAPS,
        Some("team-b"),
        plan_a,
    );
    a.cannot("list pods", "list", PODS, Some("team-a"), None);
    a.cannot(
        "get its own Role",
        "get",
        ROLES,
        Some("team-a"),
        Some("job-a-trainer"),
    );

    let mut b = Subject {
        sa: ("team-a", "runner-b"),
        cases: &mut *cases,
    };
    b.can(
        "get its job's plan",
        "get",
        CONFIGMAPS,
        Some("team-a"),
        plan_b,
    );
    b.cannot(
        "get another job's plan",
        "get",
        CONFIGMAPS,
        Some("team-a"),
        plan_a,
    );

    // The chart's trainer ServiceAccount is granted nothing by the chart.
    for ns in ["team-a", "team-b"] {
        let mut chart_sa = Subject {
            sa: (ns, "heterotrain-trainer"),
            cases: &mut *cases,
        };
        chart_sa.cannot(
            "(the chart's trainer ServiceAccount) get a job's plan",
            "get",
            CONFIGMAPS,
            Some(ns),
            plan_a,
        );
        chart_sa.cannot(
            "(the chart's trainer ServiceAccount) list ConfigMaps",
            "list",
            CONFIGMAPS,
            Some(ns),
            None,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_and_trainer_rbac_allow_exactly_what_they_should() {
    let cluster = LocalCluster::start(ClusterOptions {
        name: "rbac-matrix".into(),
        ..Default::default()
    })
    .await
    .expect("local control plane (run `make setup`)");
    let client = cluster.client().await.expect("admin client");
    create_namespaces(
        &client,
        &[NS_RELEASE.1, WIDE_RELEASE.1, "team-a", "team-b", "team-c"],
    )
    .await;

    // The chart in both modes.
    let namespaced = render(
        NS_RELEASE.0,
        NS_RELEASE.1,
        &["--set", "watchNamespaces={team-a,team-b}"],
    );
    let wide = render(
        WIDE_RELEASE.0,
        WIDE_RELEASE.1,
        &["--set", "watchAllNamespaces=true"],
    );
    for (what, docs) in [("namespaced", &namespaced), ("cluster-wide", &wide)] {
        let n = apply_rbac(&client, docs).await;
        assert!(n >= 5, "{what}: only {n} RBAC objects rendered");
    }

    // The operator's per-job trainer access: two jobs, two ServiceAccounts.
    for (job, sa) in [("job-a", "runner-a"), ("job-b", "runner-b")] {
        create_service_account(&client, "team-a", sa).await;
        let (role, binding) = trainer_access(job, "team-a", sa);
        apply(Api::namespaced(client.clone(), "team-a"), &role).await;
        apply(Api::namespaced(client.clone(), "team-a"), &binding).await;
    }

    let mut cases = Vec::new();
    namespaced_operator_cases(&mut cases);
    cluster_wide_operator_cases(&mut cases);
    trainer_cases(&mut cases);
    let allowed = cases.iter().filter(|c| c.allowed).count();
    assert!(
        allowed >= 10 && cases.len() - allowed >= 10,
        "the matrix asks both ways"
    );

    // Wait until every allowed case is allowed: the authorizer has seen
    // every binding. Past the wait, the matrix below names what is wrong
    // (an API server that denies everything fails every allowed case).
    let (client, cases) = (&client, &cases);
    let _ = eventually(
        "every allowed case to be allowed",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async move {
            for c in cases.iter().filter(|c| c.allowed) {
                if !review(client, c).await.0 {
                    return Ok(None);
                }
            }
            Ok(Some(()))
        },
    )
    .await;

    let mut wrong = Vec::new();
    for c in cases {
        let (got, why) = review(client, c).await;
        if got != c.allowed {
            wrong.push(format!(
                "{}: expected {}, got {} ({why})",
                describe(c),
                if c.allowed { "allowed" } else { "denied" },
                if got { "allowed" } else { "denied" },
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases wrong:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
    cluster.stop();
}
