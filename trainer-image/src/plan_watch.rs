//! The plan ConfigMap as a `PlanSource`: a background thread with its own
//! tokio runtime watches `<job>-plan` (kube client from in-cluster config or
//! KUBECONFIG) and hands every new `plan.json` text to the training loop,
//! which stays synchronous. Client and watch failures (API server down) are
//! retried with backoff and never stop training.

use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use futures::StreamExt;
use heterotrain_crds::plan::PLAN_KEY;
use heterotrain_crds::{BatchPlan, PlanError};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};

use crate::plan_source::PlanSource;

/// Proposals from the plan ConfigMap.
pub struct ConfigMapPlanSource {
    rx: Receiver<String>,
    world_size: usize,
    last_text: Option<String>,
}

/// Print a warning at most every `every` (watch errors can repeat fast).
struct Throttled {
    last: Option<Instant>,
    every: Duration,
    suppressed: u64,
}

impl Throttled {
    fn warn(&mut self, msg: &str) {
        if self.last.is_some_and(|t| t.elapsed() < self.every) {
            self.suppressed += 1;
            return;
        }
        let more = if self.suppressed > 0 {
            format!(" ({} similar suppressed)", self.suppressed)
        } else {
            String::new()
        };
        eprintln!("warning: plan watch: {msg}{more}; retrying");
        self.last = Some(Instant::now());
        self.suppressed = 0;
    }
}

async fn client_with_retry(warn: &mut Throttled) -> Client {
    let mut delay = Duration::from_millis(500);
    loop {
        match Client::try_default().await {
            Ok(c) => return c,
            Err(e) => warn.warn(&format!("no kube client: {e}")),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

async fn watch(name: String, namespace: Option<String>, tx: Sender<String>) {
    let mut warn = Throttled {
        last: None,
        every: Duration::from_secs(10),
        suppressed: 0,
    };
    let client = client_with_retry(&mut warn).await;
    let ns = namespace.unwrap_or_else(|| client.default_namespace().to_string());
    let api: Api<ConfigMap> = Api::namespaced(client, &ns);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    // The watcher re-lists / re-watches after errors; the backoff spaces
    // the retries while the API server is away.
    let mut stream = watcher(api, cfg)
        .default_backoff()
        .applied_objects()
        .boxed();
    loop {
        match stream.next().await {
            Some(Ok(cm)) => {
                let text = cm.data.as_ref().and_then(|d| d.get(PLAN_KEY)).cloned();
                match text {
                    Some(t) => {
                        if tx.send(t).is_err() {
                            return; // training finished
                        }
                    }
                    None => warn.warn(&format!("ConfigMap {ns}/{name} has no {PLAN_KEY}")),
                }
            }
            Some(Err(e)) => warn.warn(&format!("ConfigMap {ns}/{name}: {e}")),
            None => return,
        }
    }
}

impl ConfigMapPlanSource {
    /// Start watching ConfigMap `name` (namespace: given, else the client's).
    pub fn start(
        name: String,
        namespace: Option<String>,
        world_size: usize,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("plan-watch".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        eprintln!(
                            "warning: plan watch: cannot start a runtime: {e}; plans stay fixed"
                        );
                        return;
                    }
                };
                rt.block_on(watch(name, namespace, tx));
            })?;
        Ok(ConfigMapPlanSource {
            rx,
            world_size,
            last_text: None,
        })
    }

    /// Wait up to `limit` for the first plan text (used at start so the
    /// first step already trains with the ConfigMap's plan).
    pub fn wait_first(&mut self, limit: Duration) -> Option<Result<BatchPlan, PlanError>> {
        let text = self.rx.recv_timeout(limit).ok()?;
        self.take(text)
    }

    fn take(&mut self, text: String) -> Option<Result<BatchPlan, PlanError>> {
        if self.last_text.as_deref() == Some(text.as_str()) {
            return None;
        }
        let out = BatchPlan::parse(&text, self.world_size);
        self.last_text = Some(text);
        Some(out)
    }
}

impl PlanSource for ConfigMapPlanSource {
    fn poll(&mut self) -> Option<Result<BatchPlan, PlanError>> {
        // Only the newest text counts.
        let mut newest = None;
        while let Ok(t) = self.rx.try_recv() {
            newest = Some(t);
        }
        self.take(newest?)
    }
}
