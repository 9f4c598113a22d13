//! Against a real local API server: a rank evicted by the kubelet (pod
//! `Failed`, reason `Evicted`) recreates the gang without counting toward
//! `backoffLimit`; a failure afterwards still does.

mod common;

use std::time::Duration;

use common::*;

#[tokio::test]
async fn an_evicted_rank_restarts_the_gang_uncounted() {
    let env = env("evict").await;
    let op = Operator::start(&env, test_config(&env, "op-a"));
    let yaml = r#"
apiVersion: heterotrain.dev/v1alpha1
kind: HeteroTrainingJob
metadata: {name: evictee}
spec:
  workers: [{name: cpu, replicas: 2}]
  model: {name: mlp}
  dataset: {name: synthetic_image}
  training: {globalBatchSize: 32, maxSteps: 1000}
  profiling: {enabled: false}
  runPolicy: {backoffLimit: 0}
"#;
    create_job(&env, &job_from_yaml(&env.ns, yaml)).await;
    run_gang(&env, "evictee", 2, 0).await;
    set_pod_status(
        &env,
        "evictee-1",
        serde_json::json!({
            "phase": "Failed",
            "reason": "Evicted",
            "message": "The node was low on resource: memory.",
        }),
    )
    .await;
    // backoffLimit 0, yet the gang comes back.
    run_gang(&env, "evictee", 2, 1).await;
    let st = get_job(&env, "evictee")
        .await
        .and_then(|j| j.status)
        .expect("status");
    assert_eq!((st.restarts, st.disruptions), (1, 1));
    let ev = events(&env).await;
    assert!(
        ev.iter().any(|e| e
            .note
            .as_deref()
            .is_some_and(|n| n.starts_with("disruption (evicted) of rank 1: not counted"))),
        "{ev:?}"
    );

    // A real failure counts: with backoffLimit 0 the job fails.
    finish_pod(&env, "evictee-0", 1, "Error").await;
    let (_, reason, _) = eventually(Duration::from_secs(60), "Failed", || async {
        condition(&env, "evictee", "Failed")
            .await
            .filter(|c| c.0 == "True")
    })
    .await;
    assert_eq!(reason, "BackoffLimitExceeded");
    op.stop().await;
}
