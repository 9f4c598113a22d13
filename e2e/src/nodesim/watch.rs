//! Follow the pods bound to this simulator's nodes: start a process for a
//! new one, stop it (after the grace period) when the pod is deleted, and
//! finish the delete as a kubelet does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};

use super::{pod, Ctx};

/// Watch every pod until the task is aborted.
pub async fn watch_pods(ctx: Arc<Ctx>) {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Apply(p)) | Ok(Event::InitApply(p)) => on_pod(&ctx, p),
            Ok(Event::Delete(p)) => on_pod_gone(&ctx, &p),
            Ok(_) => {}
            Err(e) => {
                eprintln!("nodesim: pod watch error (retrying): {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

fn on_pod(ctx: &Arc<Ctx>, p: Pod) {
    let node = p
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    if !ctx.nodes.contains_key(&node) || ctx.is_lost(&node) {
        return;
    }
    let uid = p.metadata.uid.clone().unwrap_or_default();
    let existing = ctx.running.lock().ok().and_then(|m| m.get(&uid).cloned());
    let deleting = p.metadata.deletion_timestamp.is_some();
    match existing {
        Some(running) => {
            if deleting {
                let grace = p
                    .metadata
                    .deletion_grace_period_seconds
                    .or_else(|| {
                        p.spec
                            .as_ref()
                            .and_then(|s| s.termination_grace_period_seconds)
                    })
                    .unwrap_or(30)
                    .max(0) as u64;
                tokio::spawn(pod::terminate(running, Duration::from_secs(grace)));
            }
        }
        None => {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let started = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|c| !c.is_empty());
            if deleting {
                let ctx = ctx.clone();
                tokio::spawn(async move { pod::finalize_delete(&ctx, &p).await });
                return;
            }
            if phase == "Succeeded" || phase == "Failed" || started {
                return;
            }
            let running = Arc::new(pod::RunningPod {
                pid: Mutex::new(None),
                terminating: AtomicBool::new(false),
                node: node.clone(),
                cgroup: Mutex::new(None),
            });
            if let Ok(mut m) = ctx.running.lock() {
                m.insert(uid, running.clone());
            }
            tokio::spawn(pod::run(ctx.clone(), p, running));
        }
    }
}

fn on_pod_gone(ctx: &Arc<Ctx>, p: &Pod) {
    let uid = p.metadata.uid.clone().unwrap_or_default();
    if let Some(running) = ctx.running.lock().ok().and_then(|m| m.get(&uid).cloned()) {
        running.terminating.store(true, Ordering::SeqCst);
        if let Some(pid) = running.pid.lock().ok().and_then(|g| *g) {
            crate::keeper::signal_group(pid, libc::SIGKILL);
        }
    }
}
