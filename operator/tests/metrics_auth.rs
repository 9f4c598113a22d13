//! The operator's `/metrics` with `--metrics-auth`, against a real API
//! server: no token is refused (401), a valid token of a user not allowed
//! `get /metrics` is refused (403), one allowed through a ClusterRole is
//! served; `/healthz` needs nothing.

mod common;

use std::time::Duration;

use common::*;
use heterotrain_operator::metrics::Metrics;
use heterotrain_operator::{server, Context};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Status code and body of `GET path` on `addr`, with `token` if any.
async fn get(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: op\r\n{auth}Connection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).await.expect("read");
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_need_a_token_allowed_to_get_them() {
    let env = env("metrics-auth").await;
    let sas: Api<ServiceAccount> = Api::namespaced(env.admin.clone(), &env.ns);
    for name in ["reader", "stranger"] {
        let sa: ServiceAccount =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
        sas.create(&PostParams::default(), &sa).await.expect("sa");
    }
    let role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "metrics-auth-reader"},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    }))
    .unwrap();
    Api::<ClusterRole>::all(env.admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "metrics-auth-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metrics-auth-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": env.ns}]
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(env.admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    let reader = sa_token(&env.admin, &env.ns, "reader").await;
    let stranger = sa_token(&env.admin, &env.ns, "stranger").await;

    // The operator checks tokens as itself (its ClusterRole's reviews).
    let mut config = test_config(&env, "metrics-auth");
    config.metrics_auth = true;
    let ctx = Context::new(env.operator.clone(), config, Metrics::new()).expect("context");
    ctx.metrics.error("kube");
    let (listener, addr) = server::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server::serve(listener, ctx, async {
        let _ = stopped.await;
    }));

    let (code, body) = get(addr, "/metrics", None).await;
    assert_eq!(code, 401, "{body}");
    assert!(!body.contains("heterotrain_operator_"), "{body}");
    assert_eq!(get(addr, "/metrics", Some("not-a-token")).await.0, 401);
    let (code, body) = get(addr, "/metrics", Some(&stranger)).await;
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("system:serviceaccount:metrics-auth:stranger"),
        "{body}"
    );
    assert_eq!(get(addr, "/healthz", None).await.0, 200);
    // The binding reaches the authorizer soon after it is written.
    let body = eventually(Duration::from_secs(30), "the reader served", || async {
        let (code, body) = get(addr, "/metrics", Some(&reader)).await;
        (code == 200).then_some(body)
    })
    .await;
    assert!(
        body.contains("heterotrain_operator_reconcile_errors_total{reason=\"kube\"} 1"),
        "{body}"
    );
}
