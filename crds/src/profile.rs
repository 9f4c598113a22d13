//! The hardware profile: what a trainer measures about its device and the
//! model at start-up (`heterotrain-trainer profile` prints it as JSON), and
//! what the operator reads to build a balanced first plan.

use serde::{Deserialize, Serialize};

/// Device class a rank trains on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    #[default]
    Cpu,
    Cuda,
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        })
    }
}

/// Static facts about the device.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceInfo {
    pub kind: DeviceKind,
    /// GPU name (NVML) or CPU model name.
    pub name: String,
    /// Threads used for compute (CPU ranks).
    #[serde(default)]
    pub threads: u32,
    /// Device memory (GPU) or usable RAM (CPU), bytes.
    #[serde(default)]
    pub memory_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
}

/// Forward+backward time measured at one local batch size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProfilePoint {
    pub batch_size: u32,
    pub seconds: f64,
}

/// A rank's hardware profile.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HardwareProfile {
    #[serde(default)]
    pub rank: u32,
    #[serde(default)]
    pub hostname: String,
    pub device: DeviceInfo,
    /// Dense matmul throughput, FLOP/s.
    pub matmul_flops: f64,
    /// Memory copy bandwidth, bytes/s.
    pub memory_bandwidth_bytes_per_second: f64,
    /// Model this profile was measured with (name + size knobs).
    pub model: String,
    /// Forward+backward time at each probe batch size.
    pub points: Vec<ProfilePoint>,
    /// Fitted fixed cost a of t(b) = a + c·b, seconds.
    pub fixed_seconds: f64,
    /// Fitted per-sample cost c of t(b) = a + c·b, seconds.
    pub per_sample_seconds: f64,
    /// Largest local batch that fits in memory.
    pub max_batch_size: u32,
    /// Seconds of a small all-reduce among all ranks (none alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allreduce_latency_seconds: Option<f64>,
    /// Bus bandwidth of a large all-reduce among all ranks, bytes/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allreduce_bus_bandwidth_bytes_per_second: Option<f64>,
    /// The slowest rank-to-rank link this rank measured at start-up
    /// (receiving 4 MiB from a peer), bytes/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowest_link_bytes_per_second: Option<f64>,
    /// Bytes of gradient each step exchanges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradient_bytes: Option<u64>,
    /// The dataset's files loaded (read and decoded) per second, bytes/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_read_bytes_per_second: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    #[error("profile is not valid JSON: {0}")]
    Parse(String),
    #[error("profile has no measured points")]
    NoPoints,
    #[error("profile field {field} is {value}, expected a finite number > 0")]
    NotPositive { field: &'static str, value: f64 },
    #[error("profile maxBatchSize is 0")]
    ZeroCap,
}

impl HardwareProfile {
    pub fn parse(text: &str) -> Result<HardwareProfile, ProfileError> {
        let p: HardwareProfile =
            serde_json::from_str(text).map_err(|e| ProfileError::Parse(e.to_string()))?;
        p.validate()?;
        Ok(p)
    }

    pub fn validate(&self) -> Result<(), ProfileError> {
        if self.points.is_empty() {
            return Err(ProfileError::NoPoints);
        }
        let positive = |field: &'static str, value: f64| {
            if value.is_finite() && value > 0.0 {
                Ok(())
            } else {
                Err(ProfileError::NotPositive { field, value })
            }
        };
        positive("perSampleSeconds", self.per_sample_seconds)?;
        if !(self.fixed_seconds.is_finite() && self.fixed_seconds >= 0.0) {
            return Err(ProfileError::NotPositive {
                field: "fixedSeconds",
                value: self.fixed_seconds,
            });
        }
        for p in &self.points {
            positive("points[].seconds", p.seconds)?;
        }
        if self.max_batch_size == 0 {
            return Err(ProfileError::ZeroCap);
        }
        Ok(())
    }

    /// Predicted forward+backward seconds at local batch `b`.
    pub fn predict(&self, b: u32) -> f64 {
        self.fixed_seconds + self.per_sample_seconds * f64::from(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> HardwareProfile {
        HardwareProfile {
            device: DeviceInfo {
                name: "test cpu".into(),
                threads: 2,
                ..Default::default()
            },
            matmul_flops: 1e10,
            memory_bandwidth_bytes_per_second: 1e9,
            model: "mlp".into(),
            points: vec![ProfilePoint {
                batch_size: 8,
                seconds: 0.01,
            }],
            fixed_seconds: 0.002,
            per_sample_seconds: 0.001,
            max_batch_size: 4096,
            ..Default::default()
        }
    }

    #[test]
    fn round_trips_and_predicts() {
        let p = sample();
        let text = serde_json::to_string(&p).unwrap();
        assert!(text.contains("\"perSampleSeconds\""));
        let back = HardwareProfile::parse(&text).unwrap();
        assert_eq!(back, p);
        assert!((back.predict(8) - 0.010).abs() < 1e-12);
    }

    #[test]
    fn refuses_nonsense() {
        let mut p = sample();
        p.per_sample_seconds = f64::NAN;
        assert!(matches!(
            p.validate(),
            Err(ProfileError::NotPositive { .. })
        ));
        let mut p = sample();
        p.points.clear();
        assert_eq!(p.validate(), Err(ProfileError::NoPoints));
        assert!(matches!(
            HardwareProfile::parse("{"),
            Err(ProfileError::Parse(_))
        ));
    }
}
