//! `/readyz` tells the truth: with the operator's connection to the real
//! API server cut (a proxy between them), its watches fail, and once they
//! have failed for longer than `watch_unready_after` `/readyz` answers 503
//! naming the watch and the error counter has risen; with the connection
//! back, the watches recover and `/readyz` is ready again (at once for a
//! watch that delivers an event, after `watch_health::QUIET` without an
//! error for one that has nothing to deliver).

mod common;

use std::time::Duration;

use common::*;
use heterotrain_e2e::proxy::CutProxy;
use heterotrain_operator::server::route;
use kube::config::{KubeConfigOptions, Kubeconfig};

async fn readyz(op: &Operator) -> (u16, String) {
    use http_body_util::BodyExt;
    let r = route("/readyz", &op.ctx);
    let status = r.status().as_u16();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_cut_for_longer_than_the_threshold_turns_readyz_unready() {
    let env = env("readyz").await;
    let proxy = CutProxy::start(cluster().ports().apiserver)
        .await
        .expect("proxy");
    let token = sa_token(&env.admin, &env.ns, "heterotrain-operator").await;
    let kc = Kubeconfig::from_yaml(&cluster().kubeconfig_yaml_via(proxy.port(), &token)).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let mut cfg = test_config(&env, "readyz-a");
    cfg.watch_unready_after = Duration::from_secs(2);
    // The Lease outlasts the cut: this replica keeps leading and watching.
    cfg.lease_duration = Duration::from_secs(600);
    let op = Operator::start_as(client, cfg);
    eventually(Duration::from_secs(60), "ready", || async {
        (readyz(&op).await.0 == 200 && op.ctx.metrics.leader.get() == 1).then_some(())
    })
    .await;

    proxy.cut().await;
    let body = eventually(Duration::from_secs(120), "unready while cut", || async {
        let (status, body) = readyz(&op).await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(body.contains("watch has been failing for"), "{body}");
    let errors = heterotrain_crds::metrics::openmetrics_to_text(&op.ctx.metrics.encode());
    assert!(
        errors.lines().any(
            |l| l.starts_with("heterotrain_operator_watch_errors_total{") && !l.ends_with(" 0")
        ),
        "{errors}"
    );

    proxy.restore();
    eventually(
        Duration::from_secs(120),
        "ready again once restored",
        || async { (readyz(&op).await.0 == 200).then_some(()) },
    )
    .await;
    op.stop().await;
}
