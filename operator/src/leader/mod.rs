//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas are
//! safe: only the holder reconciles and writes. A Lease not renewed for
//! `lease_duration` may be taken over; every write is guarded by the
//! Lease's resourceVersion, so two contenders cannot both win.
//!
//! Each acquire/renew call has a deadline ([`health::renew_deadline`]). A
//! leader that is refused, or whose renewals keep failing until the Lease
//! may have expired ([`health::verdict`]), has lost: it stops the
//! controller and the process exits, so the Deployment restarts it as a
//! standby. [`health::LeaseHealth`] lets `/healthz` fail when renewals have
//! failed for longer than the lease duration.

pub mod health;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::Client;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::config::OperatorConfig;
use health::{renew_deadline, verdict, LeaseHealth, Verdict};

/// How a term as leader ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseEnd {
    /// `stop` was set (clean shutdown).
    Stopped,
    /// The Lease was lost; why.
    Lost(String),
}

/// Contender for one Lease.
#[derive(Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    renew: Duration,
}

fn micro_now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl LeaderElector {
    /// Contender for the configured Lease in the operator's namespace.
    pub fn new(client: &Client, c: &OperatorConfig) -> LeaderElector {
        LeaderElector {
            api: Api::namespaced(client.clone(), &c.operator_namespace),
            name: c.lease_name.clone(),
            identity: c.identity.clone(),
            duration: c.lease_duration,
            renew: c.lease_renew_interval,
        }
    }

    fn spec(&self, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs().max(1) as i32),
            acquire_time: Some(acquired.unwrap_or_else(micro_now)),
            renew_time: Some(micro_now()),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// Acquire or renew once. `Ok(true)`: this replica holds the Lease.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let Some(lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(None, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let ours = holder.as_deref() == Some(self.identity.as_str());
        let duration = spec
            .lease_duration_seconds
            .map_or(self.duration, |s| Duration::from_secs(s.max(0) as u64));
        let expired = spec.renew_time.as_ref().is_none_or(|t| {
            let age_ms = Timestamp::now().as_millisecond() - t.0.as_millisecond();
            age_ms > duration.as_millis() as i64
        });
        if !(ours || holder.is_none() || expired) {
            return Ok(false);
        }
        let transitions = spec
            .lease_transitions
            .unwrap_or(0)
            .saturating_add(i32::from(!ours));
        let next = Lease {
            metadata: lease.metadata.clone(),
            spec: Some(self.spec(if ours { spec.acquire_time } else { None }, transitions)),
        };
        match self
            .api
            .replace(&self.name, &PostParams::default(), &next)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Try every renew interval until leading (`true`) or stopped (`false`).
    pub async fn wait_until_leader(&self, mut stop: watch::Receiver<bool>) -> bool {
        loop {
            if *stop.borrow() {
                return false;
            }
            match self.attempt().await {
                Ok(true) => return true,
                Ok(false) => debug!(identity = %self.identity, "standing by"),
                Err(e) => warn!(error = %e, "leader election"),
            }
            tokio::select! {
                _ = tokio::time::sleep(self.renew) => {}
                _ = stop.wait_for(|v| *v) => return false,
            }
        }
    }

    /// One acquire/renew call, given up after [`renew_deadline`].
    async fn attempt(&self) -> Result<bool, String> {
        let deadline = renew_deadline(self.renew, self.duration);
        match tokio::time::timeout(deadline, self.try_acquire_or_renew()).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err(format!("no answer within {deadline:?}")),
        }
    }

    /// Renew every renew interval until the Lease is lost (refused, or not
    /// renewed for so long that it may have expired) or `stop` is set; then
    /// sets `lost` (which stops the controller) and says how it ended.
    /// Each renewal is recorded in `health`.
    pub async fn keep_leading(
        &self,
        mut stop: watch::Receiver<bool>,
        lost: watch::Sender<bool>,
        health: &LeaseHealth,
    ) -> LeaseEnd {
        let mut last_ok = tokio::time::Instant::now();
        health.renewed(std::time::Instant::now());
        let end = loop {
            tokio::select! {
                _ = tokio::time::sleep(self.renew) => {}
                _ = stop.wait_for(|v| *v) => break LeaseEnd::Stopped,
            }
            match self.attempt().await {
                Ok(true) => {
                    last_ok = tokio::time::Instant::now();
                    health.renewed(std::time::Instant::now());
                }
                Ok(false) => break LeaseEnd::Lost("another replica holds the Lease".into()),
                Err(e) => {
                    warn!(error = %e, "renewing the Lease failed");
                    // Stop before another replica may take over.
                    if verdict(last_ok.elapsed(), self.renew, self.duration) == Verdict::Lost {
                        break LeaseEnd::Lost(format!(
                            "not renewed for {:?} (last error: {e})",
                            last_ok.elapsed()
                        ));
                    }
                }
            }
        };
        let _ = lost.send(true);
        end
    }

    /// Give the Lease up (on clean shutdown) so a standby takes over at once.
    pub async fn release(&self) {
        if let Ok(Some(lease)) = self.api.get_opt(&self.name).await {
            let spec = lease.spec.clone().unwrap_or_default();
            if spec.holder_identity.as_deref() == Some(self.identity.as_str()) {
                let next = Lease {
                    metadata: lease.metadata.clone(),
                    spec: Some(LeaseSpec {
                        holder_identity: None,
                        renew_time: None,
                        ..spec
                    }),
                };
                let _ = self
                    .api
                    .replace(&self.name, &PostParams::default(), &next)
                    .await;
            }
        }
    }
}

#[cfg(test)]
mod tests;
