//! The trainer's error type: one enum, each variant with a stable label.

use heterotrain_crds::plan::PlanError;

/// Everything that can stop a trainer rank.
#[derive(Debug, thiserror::Error)]
pub enum TrainerError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("invalid plan: {0}")]
    Plan(#[from] PlanError),
    #[error("rendezvous failed: {0}")]
    Rendezvous(String),
    #[error("collective {op} failed: {msg}")]
    Collective { op: &'static str, msg: String },
    #[error("data: {0}")]
    Data(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error("torch: {0}")]
    Torch(#[from] tch::TchError),
    #[error("io error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl TrainerError {
    /// Stable short label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            TrainerError::Config(_) => "config",
            TrainerError::Plan(_) => "plan",
            TrainerError::Rendezvous(_) => "rendezvous",
            TrainerError::Collective { .. } => "collective",
            TrainerError::Data(_) => "data",
            TrainerError::Checkpoint(_) => "checkpoint",
            TrainerError::Torch(_) => "torch",
            TrainerError::Io { .. } => "io",
        }
    }

    /// Wrap an io error with the path it concerns.
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        TrainerError::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }
}

/// Result alias for the trainer.
pub type Result<T, E = TrainerError> = std::result::Result<T, E>;
