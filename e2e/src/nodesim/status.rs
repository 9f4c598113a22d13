//! The pod status a kubelet would report for a simulated pod, and patching
//! it onto the API server.

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};

use super::Ctx;

/// Patch the pod's status like a kubelet: retried (the API server may be
/// restarting) until it lands, the pod is gone, or 5 minutes passed.
pub async fn patch(ctx: &Ctx, pod: &Pod, status: Value) -> Result<()> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let body = json!({ "status": status });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&body))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(e) if tokio::time::Instant::now() < deadline => {
                eprintln!("nodesim: updating status of pod {ns}/{name} (retrying): {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("updating status of pod {ns}/{name}")),
        }
    }
}

fn conditions(ready: bool, at: &str) -> Value {
    let s = if ready { "True" } else { "False" };
    json!([
        {"type": "Initialized", "status": "True", "lastTransitionTime": at},
        {"type": "Ready", "status": s, "lastTransitionTime": at},
        {"type": "ContainersReady", "status": s, "lastTransitionTime": at},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": at},
    ])
}

/// Running since `at` at `ip`; `pid` names the process when one runs.
pub fn running(ip: &str, at: &str, container: &Container, pid: Option<u32>) -> Value {
    let mut cs = json!({"name": container.name, "ready": true, "restartCount": 0,
        "image": container.image.clone().unwrap_or_default(), "imageID": "", "started": true,
        "state": {"running": {"startedAt": at}}});
    if let Some(pid) = pid {
        cs["containerID"] = json!(container_id(pid));
    }
    json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1",
           "startTime": at, "conditions": conditions(true, at), "containerStatuses": [cs]})
}

/// The process `pid` started at `started` exited with `code` at
/// `finished`, leaving `message` in its termination message file.
pub fn terminated(
    container: &Container,
    pid: u32,
    code: i32,
    started: &str,
    finished: &str,
    message: Option<String>,
) -> Value {
    let (phase, reason) = if code == 0 {
        ("Succeeded", "Completed")
    } else {
        ("Failed", "Error")
    };
    json!({"phase": phase, "conditions": conditions(false, finished),
           "containerStatuses": [{"name": container.name, "ready": false, "restartCount": 0,
             "image": container.image.clone().unwrap_or_default(), "imageID": "",
             "containerID": container_id(pid), "started": false,
             "state": {"terminated": {"exitCode": code, "reason": reason, "message": message,
               "startedAt": started, "finishedAt": finished}}}]})
}

/// Pending since `at`, its container's image not pullable.
pub fn image_pull_backoff(container: &Container, at: &str) -> Value {
    let image = container.image.clone().unwrap_or_default();
    json!({"phase": "Pending", "hostIP": "127.0.0.1", "startTime": at,
           "conditions": conditions(false, at),
           "containerStatuses": [{"name": container.name, "ready": false, "restartCount": 0,
             "image": image, "imageID": "", "started": false,
             "state": {"waiting": {"reason": "ImagePullBackOff",
               "message": format!("Back-off pulling image \"{image}\"")}}}]})
}

/// Failed at `at` before its process started, with `message`.
pub fn start_error(message: &str, at: &str) -> Value {
    json!({"phase": "Failed", "reason": "StartError", "message": message,
           "conditions": conditions(false, at)})
}

fn container_id(pid: u32) -> String {
    format!("heterotrain-local://{pid}")
}
