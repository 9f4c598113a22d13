//! Device speed profiles for the simulator.
//!
//! Relative speeds are the vendors' peak FP32 (non-tensor) throughput from
//! their spec sheets, so they are **approximations**: real training speed
//! also depends on tensor cores and mixed precision, memory bandwidth,
//! kernel maturity and the model. In particular consumer Ampere cards
//! (RTX 30xx) double-issue FP32 and look faster on paper than they train;
//! the ratios are still in the right range for "several GPU generations
//! plus CPU nodes", which is what the balancer must cope with.
//!
//! | device | FP32 TFLOPS | memory | source |
//! | --- | ---: | ---: | --- |
//! | NVIDIA H100 SXM5 | 67 | 80 GB | NVIDIA H100 Tensor Core GPU datasheet |
//! | NVIDIA A100 SXM4 | 19.5 | 40 GB | NVIDIA A100 Tensor Core GPU datasheet |
//! | NVIDIA V100 SXM2 | 15.7 | 32 GB | NVIDIA Tesla V100 datasheet |
//! | NVIDIA RTX 3090 | 35.6 | 24 GB | NVIDIA Ampere GA102 architecture whitepaper |
//! | NVIDIA RTX 3070 | 20.3 | 8 GB | NVIDIA Ampere GA102 whitepaper (GA104 table) |
//! | NVIDIA T4 | 8.1 | 16 GB | NVIDIA T4 Tensor Core GPU datasheet |
//! | NVIDIA RTX 2060 | 6.5 | 6 GB | NVIDIA GeForce RTX 2060 specifications (Turing) |
//! | NVIDIA GTX 1660 | 5.0 | 6 GB | NVIDIA GeForce GTX 1660 specifications (Turing) |
//! | CPU node, 2× 32-core AVX-512 | ~1.5 sustained | 64 GB budget | vendor peak ≈ 4 TFLOPS; ~⅓ sustained in DL training |
//!
//! Per-sample time is [`SECONDS_PER_SAMPLE_AT_1_TFLOPS`] divided by the
//! TFLOPS figure (≈ a ResNet-50 training step: ~12 GFLOP per sample at
//! ~50% of peak); memory caps assume [`SAMPLES_PER_GB`] samples per GB.

use serde::Serialize;

/// Per-sample training time on a 1-TFLOPS device, in seconds.
pub const SECONDS_PER_SAMPLE_AT_1_TFLOPS: f64 = 0.024;
/// Samples of activations that fit in one GB of device memory.
pub const SAMPLES_PER_GB: f64 = 8.0;

/// One kind of device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DeviceType {
    /// Short name.
    pub name: &'static str,
    /// Peak FP32 TFLOPS from the vendor spec sheet (see the module docs).
    pub fp32_tflops: f64,
    /// Memory available for training, GB.
    pub memory_gb: f64,
    /// Fixed cost per step (launches, optimizer), seconds.
    pub fixed_seconds: f64,
}

impl DeviceType {
    /// Per-sample time `c`, seconds.
    pub fn per_sample_seconds(&self) -> f64 {
        SECONDS_PER_SAMPLE_AT_1_TFLOPS / self.fp32_tflops
    }

    /// Largest local batch that fits.
    pub fn max_batch(&self) -> u32 {
        (self.memory_gb * SAMPLES_PER_GB).floor().max(1.0) as u32
    }
}

const fn gpu(name: &'static str, fp32_tflops: f64, memory_gb: f64) -> DeviceType {
    DeviceType {
        name,
        fp32_tflops,
        memory_gb,
        fixed_seconds: 0.005,
    }
}

/// NVIDIA H100 SXM5.
pub const H100: DeviceType = gpu("H100", 67.0, 80.0);
/// NVIDIA A100 SXM4 40 GB.
pub const A100: DeviceType = gpu("A100", 19.5, 40.0);
/// NVIDIA V100 SXM2 32 GB.
pub const V100: DeviceType = gpu("V100", 15.7, 32.0);
/// NVIDIA GeForce RTX 3090.
pub const RTX_3090: DeviceType = gpu("RTX3090", 35.6, 24.0);
/// NVIDIA GeForce RTX 3070.
pub const RTX_3070: DeviceType = gpu("RTX3070", 20.3, 8.0);
/// NVIDIA T4.
pub const T4: DeviceType = gpu("T4", 8.1, 16.0);
/// NVIDIA GeForce RTX 2060.
pub const RTX_2060: DeviceType = gpu("RTX2060", 6.5, 6.0);
/// NVIDIA GeForce GTX 1660.
pub const GTX_1660: DeviceType = gpu("GTX1660", 5.0, 6.0);
/// A two-socket CPU node (see the module docs).
pub const CPU_NODE: DeviceType = DeviceType {
    name: "CPU",
    fp32_tflops: 1.5,
    memory_gb: 64.0,
    fixed_seconds: 0.010,
};

/// Every device in the table.
pub const ALL_DEVICES: [DeviceType; 9] = [
    H100, A100, V100, RTX_3090, RTX_3070, T4, RTX_2060, GTX_1660, CPU_NODE,
];

/// The eight device types of the `big` scenario.
pub const BIG_MIX: [DeviceType; 8] = [H100, A100, V100, RTX_3090, T4, RTX_2060, GTX_1660, CPU_NODE];
