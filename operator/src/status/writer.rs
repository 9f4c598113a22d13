//! Patching a job's status: server-side apply, and only on change.

use heterotrain_crds::{HeteroTrainingJob, HeteroTrainingJobStatus};
use kube::api::{Api, Patch};
use kube::{Client, ResourceExt};

use crate::apply::ssa;
use crate::error::Result;

/// Patches a job's status, each time only when it differs from the last
/// status known to be on the server.
pub struct Writer<'a> {
    client: &'a Client,
    namespace: &'a str,
    name: String,
    current: Option<HeteroTrainingJobStatus>,
}

impl<'a> Writer<'a> {
    /// A writer for `job` in `namespace`, starting from its status as watched.
    pub fn new(client: &'a Client, job: &HeteroTrainingJob, namespace: &'a str) -> Writer<'a> {
        Writer {
            client,
            namespace,
            name: job.name_any(),
            current: job.status.clone(),
        }
    }

    /// The status last known to be on the server.
    pub fn current(&self) -> Option<&HeteroTrainingJobStatus> {
        self.current.as_ref()
    }

    /// Patch `status` unless it is already there; whether it patched.
    pub async fn write(&mut self, status: HeteroTrainingJobStatus) -> Result<bool> {
        if self.current.as_ref() == Some(&status) {
            return Ok(false);
        }
        let api: Api<HeteroTrainingJob> = Api::namespaced(self.client.clone(), self.namespace);
        let body = serde_json::json!({
            "apiVersion": "heterotrain.dev/v1alpha1",
            "kind": "HeteroTrainingJob",
            "status": status,
        });
        api.patch_status(&self.name, &ssa(), &Patch::Apply(body))
            .await?;
        self.current = Some(status);
        Ok(true)
    }
}
