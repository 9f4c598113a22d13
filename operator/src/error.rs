//! The operator's one error type. Every variant has a stable
//! [`Error::metric_label`], used as the `reason` label of the error counter
//! and in Event reasons.

/// Everything a reconcile can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The watched object could not be read as a `HeteroTrainingJob`.
    #[error("object is not a valid HeteroTrainingJob: {0}")]
    Malformed(String),
    /// The spec is semantically invalid (waits for a spec change).
    #[error("invalid spec: {0}")]
    Invalid(String),
    /// A child object could not be serialised.
    #[error("serialising {what}: {source}")]
    Serialize {
        /// What was being serialised.
        what: &'static str,
        /// The serde error.
        source: serde_json::Error,
    },
    /// The object lacks a field the API server always sets (name, uid, namespace).
    #[error("object is missing {0}")]
    MissingField(&'static str),
    /// The balancer refused its input.
    #[error("balancer: {0}")]
    Balancer(#[from] heterotrain_balancer::BalancerError),
    /// Reading a rank's metrics failed.
    #[error("metrics of {target}: {message}")]
    Scrape {
        /// URL or query that failed.
        target: String,
        /// What went wrong.
        message: String,
    },
    /// A rank's metrics answer was larger than the operator reads.
    #[error("metrics of {target}: body larger than {limit} bytes")]
    ScrapeTooLarge {
        /// URL that answered too much.
        target: String,
        /// The limit in bytes.
        limit: usize,
    },
    /// This replica lost the leader Lease (the process exits to be restarted).
    #[error("lost the leader Lease: {0}")]
    LeaseLost(String),
    /// The controller ended while this replica still led (a panic in a
    /// reconcile, say): the process exits to be restarted, and the Lease
    /// is released so that another replica takes over at once.
    #[error("the controller stopped while leading: {0}")]
    ControllerStopped(String),
    /// The watch caches of the jobs' pods and ConfigMaps have not finished
    /// their first list (retried).
    #[error("the watch caches of pods and ConfigMaps are not filled yet ({0})")]
    CacheNotReady(&'static str),
    /// The HeteroTrainingJob CRD is not installed.
    #[error("CustomResourceDefinition heterotrainingjobs.heterotrain.dev is not installed; apply crds/heterotrainingjob.yaml (or the Helm chart) first")]
    CrdMissing,
}

/// Result with the operator's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Stable, lower-snake-case label for metrics and Event reasons.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Error::Kube(kube::Error::Api(s)) if s.code == 403 => "forbidden",
            Error::Kube(_) => "kube",
            Error::Malformed(_) => "malformed",
            Error::Invalid(_) => "invalid",
            Error::Serialize { .. } => "serialize",
            Error::MissingField(_) => "missing_field",
            Error::Balancer(_) => "balancer",
            Error::Scrape { .. } => "scrape",
            Error::ScrapeTooLarge { .. } => "scrape_too_large",
            Error::LeaseLost(_) => "lease_lost",
            Error::ControllerStopped(_) => "controller_stopped",
            Error::CacheNotReady(_) => "cache_not_ready",
            Error::CrdMissing => "crd_missing",
        }
    }

    /// Whether retrying without a spec change can help.
    pub fn is_transient(&self) -> bool {
        !matches!(self, Error::Malformed(_) | Error::Invalid(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_stable() {
        assert_eq!(Error::Invalid("x".into()).metric_label(), "invalid");
        assert_eq!(Error::CrdMissing.metric_label(), "crd_missing");
        assert!(Error::CrdMissing
            .to_string()
            .contains("crds/heterotrainingjob.yaml"));
        assert!(!Error::Malformed("x".into()).is_transient());
        assert!(Error::MissingField("uid").is_transient());
    }
}
