//! What a container runs on a simulated node.
//!
//! Image mapping: a container runs `command + args` on this machine. The
//! executable `argv[0]` is looked up by its file name: `heterotrain-*`
//! binaries come from `$HETEROTRAIN_BIN_DIR` (colon-separated), then the
//! directory of the running `heterotrain-local`, then `$PATH`; other names
//! from `$PATH`. A container without `command` runs its image's entrypoint,
//! known for HeteroTrain's images only (`…/heterotrain-trainer:*` →
//! `heterotrain-trainer`, `…/heterotrain-operator:*` → `heterotrain-operator`).
//!
//! Image pulls: nothing is pulled, but an image whose registry host ends in
//! `.invalid` (a name that can never resolve, RFC 2606) fails to pull as a
//! kubelet's would: the pod stays Pending with its container waiting in
//! `ImagePullBackOff` ([`unpullable`]).
//!
//! Simulated GPUs are CPU shares: a container that requests `nvidia.com/gpu`
//! has `--device cuda` rewritten to `--device cpu` and `--backend nccl` to
//! `--backend gloo` in its arguments, and gets `HETEROTRAIN_SIMULATED_GPU`
//! set to the node's GPU product.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use heterotrain_crds::resources;
use k8s_openapi::api::core::v1::Container;

/// The executable for `argv[0]` (see the module docs).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let p = Path::new(name);
    if p.is_absolute() && p.exists() {
        return Some(p.to_path_buf());
    }
    let base = p.file_name()?.to_str()?;
    let mut dirs: Vec<PathBuf> = Vec::new();
    if base.starts_with("heterotrain-") {
        if let Some(v) = std::env::var_os("HETEROTRAIN_BIN_DIR") {
            dirs.extend(std::env::split_paths(&v));
        }
        if let Some(d) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
        {
            dirs.push(d.clone());
            // Test binaries live in target/<profile>/deps; binaries one level up.
            if let Some(up) = d.parent() {
                dirs.push(up.to_path_buf());
            }
        }
    }
    if let Some(v) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&v));
    }
    dirs.into_iter().map(|d| d.join(base)).find(|c| c.is_file())
}

/// `argv` of a container (command + args, or the image's known entrypoint).
pub fn argv(container: &Container) -> Result<Vec<String>> {
    let mut argv = container.command.clone().unwrap_or_default();
    if argv.is_empty() {
        let image = container.image.clone().unwrap_or_default();
        let repo = image
            .rsplit('/')
            .next()
            .unwrap_or("")
            .split([':', '@'])
            .next()
            .unwrap_or("");
        match repo {
            "heterotrain-trainer" | "heterotrain-operator" => argv.push(repo.to_string()),
            _ => bail!("image {image:?} has no known entrypoint on simulated nodes; give the container a command"),
        }
    }
    argv.extend(container.args.clone().unwrap_or_default());
    Ok(argv)
}

/// The container's image when it cannot be pulled (see the module docs).
pub fn unpullable(container: &Container) -> Option<String> {
    let image = container.image.clone()?;
    let (host, _) = image.split_once('/')?;
    let host = host.split(':').next().unwrap_or(host);
    host.ends_with(".invalid").then_some(image)
}

/// Whether the container asks for a GPU.
pub fn wants_gpu(container: &Container) -> bool {
    let r = container.resources.as_ref();
    [
        r.and_then(|r| r.limits.as_ref()),
        r.and_then(|r| r.requests.as_ref()),
    ]
    .into_iter()
    .flatten()
    .any(|m| m.get("nvidia.com/gpu").is_some_and(|q| q.0 != "0"))
}

/// Rewrite GPU-only arguments for a simulated GPU (see the module docs).
pub fn simulate_gpu_args(argv: &mut [String]) {
    for i in 1..argv.len() {
        let prev = argv[i - 1].clone();
        let v = &mut argv[i];
        if prev == "--device" && v == "cuda" {
            *v = "cpu".into();
        } else if prev == "--backend" && v == "nccl" {
            *v = "gloo".into();
        } else if v == "--device=cuda" {
            *v = "--device=cpu".into();
        } else if v == "--backend=nccl" {
            *v = "--backend=gloo".into();
        }
    }
}

/// CPU cores the container may use before the node's speed is applied.
pub fn cpu_limit(container: &Container, node_cpu: f64) -> f64 {
    resources::cpu_limit(container.resources.as_ref())
        .and_then(|q| resources::cpu_cores(&q.0))
        .unwrap_or(node_cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_args_become_cpu_args() {
        let mut a: Vec<String> = [
            "t",
            "--device",
            "cuda",
            "--backend",
            "nccl",
            "--device=cuda",
            "--lr",
            "cuda",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        simulate_gpu_args(&mut a);
        assert_eq!(
            a,
            [
                "t",
                "--device",
                "cpu",
                "--backend",
                "gloo",
                "--device=cpu",
                "--lr",
                "cuda"
            ]
        );
    }
}

#[cfg(test)]
mod image_tests {
    use super::*;

    fn with_image(image: &str) -> Container {
        Container {
            name: "trainer".into(),
            image: Some(image.into()),
            ..Container::default()
        }
    }

    #[test]
    fn only_images_of_an_invalid_registry_fail_to_pull() {
        assert_eq!(
            unpullable(&with_image("registry.invalid/nope:1")).as_deref(),
            Some("registry.invalid/nope:1")
        );
        assert!(unpullable(&with_image("registry.invalid:5000/nope")).is_some());
        assert!(unpullable(&with_image("ghcr.io/heterotrain/heterotrain-trainer:0.1")).is_none());
        assert!(unpullable(&with_image("heterotrain-trainer")).is_none());
        assert!(
            unpullable(&with_image("library/x.invalid")).is_none(),
            "a path, not a host"
        );
    }
}
