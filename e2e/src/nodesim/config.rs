//! The simulated nodes' configuration file (`heterotrain-local up --nodes <file>`).
//!
//! ```yaml
//! nodes:
//!   - name: fast
//!     speed: 1.0            # share of a CPU core per requested core
//!     cpu: "2"
//!     memory: 4Gi
//!   - name: gpu-a
//!     speed: 0.5
//!     gpus: 1
//!     gpuProduct: NVIDIA-GeForce-RTX-3070
//!     labels: {zone: lab}
//!   - name: pinned
//!     cpus: [1]             # this machine's CPUs its pods run on (default: any)
//! ```

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use heterotrain_crds::resources::cpu_cores;
use serde::Deserialize;

/// The whole file.
#[derive(Clone, Debug, Deserialize)]
pub struct NodesFile {
    pub nodes: Vec<NodeConfig>,
}

/// One simulated node.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    /// Node name (a DNS label).
    pub name: String,
    /// Extra node labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Speed as a CPU share: a pod's processes get `speed × its CPU limit`
    /// cores of real CPU time (cgroup quota).
    #[serde(default = "one")]
    pub speed: f64,
    /// CPU capacity (a Kubernetes quantity).
    #[serde(default = "default_cpu")]
    pub cpu: String,
    /// Memory capacity (a Kubernetes quantity).
    #[serde(default = "default_memory")]
    pub memory: String,
    /// Number of (simulated) GPUs: capacity `nvidia.com/gpu`.
    #[serde(default)]
    pub gpus: u32,
    /// `nvidia.com/gpu.product` label of those GPUs.
    #[serde(default)]
    pub gpu_product: Option<String>,
    /// Pods that fit on the node.
    #[serde(default = "default_pods")]
    pub max_pods: u32,
    /// Run pods' processes (false: only report them Running, for scale tests).
    #[serde(default = "yes")]
    pub run_processes: bool,
    /// This machine's CPUs (ids as the kernel numbers them) the node's pods
    /// run on, as a separate machine's pods have CPUs of their own; empty:
    /// any CPU, shared with every other node.
    #[serde(default)]
    pub cpus: Vec<usize>,
}

fn one() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}
fn default_cpu() -> String {
    "2".into()
}
fn default_memory() -> String {
    "8Gi".into()
}
fn default_pods() -> u32 {
    110
}

impl NodesFile {
    /// Parse and validate a nodes file.
    pub fn parse(text: &str) -> Result<NodesFile> {
        let f: NodesFile = serde_yaml::from_str(text).context("parsing the nodes file")?;
        f.validate()?;
        Ok(f)
    }

    /// Read and validate a nodes file from disk.
    pub fn load(path: &std::path::Path) -> Result<NodesFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading nodes file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("in {}", path.display()))
    }

    fn validate(&self) -> Result<()> {
        let mut seen = std::collections::BTreeSet::new();
        for n in &self.nodes {
            if n.name.is_empty()
                || n.name.len() > 63
                || !n
                    .name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            {
                bail!("node name {:?} is not a DNS label", n.name);
            }
            if !seen.insert(&n.name) {
                bail!("node {} is listed twice", n.name);
            }
            if !(n.speed.is_finite() && n.speed > 0.0 && n.speed <= 64.0) {
                bail!("node {}: speed {} must be in (0, 64]", n.name, n.speed);
            }
            if cpu_cores(&n.cpu).is_none() {
                bail!("node {}: cpu {:?} is not a CPU quantity", n.name, n.cpu);
            }
            if let Some(c) = n.cpus.iter().find(|c| **c >= libc::CPU_SETSIZE as usize) {
                bail!("node {}: cpus: {c} is not a CPU id", n.name);
            }
            if !n.cpus.is_empty() {
                let usable = usable_cpus();
                if let Some(c) = n.cpus.iter().find(|c| !usable.contains(c)) {
                    bail!(
                        "node {}: cpus: CPU {c} is not one this process may run on (usable: {usable:?})",
                        n.name
                    );
                }
            }
        }
        Ok(())
    }
}

/// The CPUs this process may run on (its affinity mask), in order.
pub fn usable_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
    // writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|c| libc::CPU_ISSET(*c, &set))
            .collect()
    }
}

/// A CPU set holding `cpus` (ids below `CPU_SETSIZE`, checked by
/// [`NodesFile::parse`]), for `sched_setaffinity`.
pub fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET with ids
    // below CPU_SETSIZE stays inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in cpus.iter().filter(|c| **c < libc::CPU_SETSIZE as usize) {
            libc::CPU_SET(*c, &mut set);
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_validates() {
        let f = NodesFile::parse(
            "nodes:\n- {name: fast, speed: 1.0}\n- {name: slow, speed: 0.33, gpus: 1, gpuProduct: X}\n",
        )
        .unwrap();
        assert_eq!(f.nodes.len(), 2);
        assert_eq!(f.nodes[1].gpus, 1);
        assert!(NodesFile::parse("nodes:\n- {name: a, speed: 0}\n").is_err());
        assert!(NodesFile::parse("nodes:\n- {name: A}\n").is_err());
        assert!(NodesFile::parse("nodes:\n- {name: a}\n- {name: a}\n").is_err());
        assert!(NodesFile::parse("nodes:\n- {name: a, typo: 1}\n").is_err());
    }

    #[test]
    fn cpus_must_be_usable() {
        let usable = usable_cpus();
        assert!(!usable.is_empty());
        let f =
            NodesFile::parse(&format!("nodes:\n- {{name: a, cpus: [{}]}}\n", usable[0])).unwrap();
        assert_eq!(f.nodes[0].cpus, vec![usable[0]]);
        let e = NodesFile::parse("nodes:\n- {name: a, cpus: [100000]}\n").unwrap_err();
        assert!(format!("{e:#}").contains("not a CPU id"), "{e:#}");
        let missing = (0..1024).find(|c| !usable.contains(c)).unwrap();
        let e =
            NodesFile::parse(&format!("nodes:\n- {{name: a, cpus: [{missing}]}}\n")).unwrap_err();
        assert!(
            format!("{e:#}").contains("not one this process may run on"),
            "{e:#}"
        );
        let set = cpu_set(&[usable[0]]);
        // SAFETY: reading a valid set.
        assert!(unsafe { libc::CPU_ISSET(usable[0], &set) });
    }
}
