//! Per-step timings and the per-rank JSON-lines log (`rank-<r>.jsonl`).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde::Serialize;

use crate::error::{Result, TrainerError};

/// Seconds spent in each phase of one step.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct StepTimings {
    pub data_seconds: f64,
    pub forward_seconds: f64,
    pub backward_seconds: f64,
    pub allreduce_seconds: f64,
    /// The update of this rank's shard; when it runs inside backward, the
    /// time the comm hook's threads spent on it (overlapped with backward).
    pub optimizer_seconds: f64,
}

impl StepTimings {
    /// Local work: data + forward + backward + optimizer (no all-reduce wait).
    pub fn compute_seconds(&self) -> f64 {
        self.data_seconds + self.forward_seconds + self.backward_seconds + self.optimizer_seconds
    }

    pub fn total_seconds(&self) -> f64 {
        self.compute_seconds() + self.allreduce_seconds
    }
}

/// One training step as logged.
#[derive(Clone, Debug, Serialize)]
pub struct StepRecord {
    pub event: &'static str,
    pub rank: usize,
    pub step: u64,
    pub epoch: u64,
    pub generation: u64,
    pub batch_size: u32,
    pub global_batch_size: u32,
    pub loss: f64,
    pub global_loss: f64,
    pub lr: f64,
    #[serde(flatten)]
    pub timings: StepTimings,
    pub compute_seconds: f64,
    pub step_seconds: f64,
    /// Global samples per second of wall time for this step.
    pub samples_per_second: f64,
    pub invalid_plans: u64,
    /// Gradient buckets all-reduced this step (with a process group).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub buckets: Option<usize>,
    /// Of those, buckets whose all-reduce started before backward had
    /// produced every gradient (communication overlapped with compute).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlapped_buckets: Option<usize>,
    /// With the update inside backward: pieces of this rank's shard updated
    /// (and sent) before backward had produced every gradient.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_in_backward: Option<i64>,
    /// Parameter elements this rank's optimizer updated (its shard).
    pub optimizer_elements: i64,
    /// This step started a control word (plan, stop, loss): every k-th
    /// step (`--control-interval-ms`).
    pub control_word: bool,
    /// This step's batch was gathered during the step before it, on the
    /// prefetch thread (`--no-prefetch` turns that off).
    pub prefetched: bool,
    /// Wall-clock time the step ended (Unix seconds).
    pub unix_seconds: f64,
}

/// Seconds since the Unix epoch, now.
pub fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// End-of-epoch evaluation as logged.
#[derive(Clone, Debug, Serialize)]
pub struct EvalRecord {
    pub event: &'static str,
    pub rank: usize,
    pub step: u64,
    pub epoch: u64,
    pub eval_loss: f64,
    pub eval_accuracy: f64,
    pub eval_samples: u64,
}

/// Appends JSON lines, flushing each.
pub struct JsonlLog {
    out: BufWriter<File>,
}

impl JsonlLog {
    pub fn open(dir: &Path, rank: usize) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| TrainerError::io(dir, e))?;
        let path = dir.join(format!("rank-{rank}.jsonl"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| TrainerError::io(&path, e))?;
        Ok(JsonlLog {
            out: BufWriter::new(f),
        })
    }

    pub fn write<T: Serialize>(&mut self, rec: &T) {
        if let Ok(line) = serde_json::to_string(rec) {
            let _ = writeln!(self.out, "{line}");
            let _ = self.out.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_excludes_allreduce() {
        let t = StepTimings {
            data_seconds: 1.0,
            forward_seconds: 2.0,
            backward_seconds: 3.0,
            allreduce_seconds: 10.0,
            optimizer_seconds: 0.5,
        };
        assert_eq!(t.compute_seconds(), 6.5);
        assert_eq!(t.total_seconds(), 16.5);
    }
}
