//! NVML through nvml-wrapper, loaded at run time: no NVIDIA library, no
//! driver or no GPU simply means `Gpu::open` returns None.

use std::sync::Arc;

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::Nvml;

/// One NVML device.
#[derive(Clone)]
pub struct Gpu {
    nvml: Arc<Nvml>,
    index: u32,
}

/// Static facts about the device.
#[derive(Clone, Debug, Default)]
pub struct GpuInfo {
    pub name: Option<String>,
    pub memory_total: Option<u64>,
    pub compute_capability: Option<String>,
    pub driver_version: Option<String>,
}

/// One reading of the live gauges (each absent when NVML cannot say).
#[derive(Clone, Debug, Default)]
pub struct GpuSample {
    pub utilization_ratio: Option<f64>,
    pub memory_used_total: Option<(u64, u64)>,
    pub temperature_celsius: Option<f64>,
    pub power_watts: Option<f64>,
    pub sm_clock_hertz: Option<f64>,
    /// PCIe link now: (generation, lanes).
    pub pcie_link: Option<(u32, u32)>,
    /// The most the GPU and its slot support: (generation, lanes).
    pub pcie_max_link: Option<(u32, u32)>,
}

/// NVML index of CUDA device `cuda_index`, honouring a numeric
/// `CUDA_VISIBLE_DEVICES` list.
fn nvml_index(cuda_index: usize) -> u32 {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
    let ids: Vec<u32> = visible
        .split(',')
        .filter_map(|s| s.trim().parse::<u32>().ok())
        .collect();
    ids.get(cuda_index).copied().unwrap_or(cuda_index as u32)
}

impl Gpu {
    /// The NVML device behind CUDA device `cuda_index`, if NVML works.
    pub fn open(cuda_index: usize) -> Option<Gpu> {
        let nvml = Nvml::init().ok()?;
        let index = nvml_index(cuda_index);
        nvml.device_by_index(index).ok()?;
        Some(Gpu {
            nvml: Arc::new(nvml),
            index,
        })
    }

    pub fn info(&self) -> GpuInfo {
        let Ok(d) = self.nvml.device_by_index(self.index) else {
            return GpuInfo::default();
        };
        GpuInfo {
            name: d.name().ok(),
            memory_total: d.memory_info().ok().map(|m| m.total),
            compute_capability: d
                .cuda_compute_capability()
                .ok()
                .map(|c| format!("{}.{}", c.major, c.minor)),
            driver_version: self.nvml.sys_driver_version().ok(),
        }
    }

    /// Memory used on the device now, bytes.
    pub fn memory_used(&self) -> Option<u64> {
        let d = self.nvml.device_by_index(self.index).ok()?;
        d.memory_info().ok().map(|m| m.used)
    }

    pub fn sample(&self) -> GpuSample {
        let Ok(d) = self.nvml.device_by_index(self.index) else {
            return GpuSample::default();
        };
        GpuSample {
            utilization_ratio: d.utilization_rates().ok().map(|u| f64::from(u.gpu) / 100.0),
            memory_used_total: d.memory_info().ok().map(|m| (m.used, m.total)),
            temperature_celsius: d.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
            power_watts: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            sm_clock_hertz: d.clock_info(Clock::SM).ok().map(|mhz| f64::from(mhz) * 1e6),
            pcie_link: d
                .current_pcie_link_gen()
                .ok()
                .zip(d.current_pcie_link_width().ok()),
            pcie_max_link: d.max_pcie_link_gen().ok().zip(d.max_pcie_link_width().ok()),
        }
    }
}
