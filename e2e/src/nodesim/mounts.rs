//! Pod volumes on simulated nodes: each pod's processes get a private mount
//! namespace in which every `volumeMount` is a bind mount of a host
//! directory — `emptyDir` → a directory of the pod, `persistentVolumeClaim` →
//! a directory per claim under the simulator's state (so checkpoints outlive
//! the pod, as on a real PVC), `secret`/`configMap`/`projected` → files
//! written into a directory of the pod (a projected ServiceAccount token is
//! the pod's own token). Mount points are created on the host if missing.
//! Other volume types are refused with a clear error.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::api::Api;
use kube::Client;

/// One bind mount, prepared before fork.
pub struct BindMount {
    pub source: CString,
    pub target: CString,
    pub read_only: bool,
}

/// Host directory backing a claim of namespace `ns`.
pub fn claim_dir(state_dir: &Path, ns: &str, claim: &str) -> PathBuf {
    state_dir
        .join("volumes")
        .join(ns)
        .join(format!("pvc-{claim}"))
}

fn write_files(dir: &Path, files: impl IntoIterator<Item = (String, Vec<u8>)>) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    for (k, v) in files {
        if k.contains('/') || k.starts_with('.') {
            bail!("refusing to write key {k:?}");
        }
        std::fs::write(dir.join(&k), v)?;
    }
    Ok(())
}

async fn configmap_files(client: &Client, ns: &str, name: &str) -> Result<Vec<(String, Vec<u8>)>> {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("configmap {ns}/{name} for a volume"))?;
    Ok(cm
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.into_bytes()))
        .collect())
}

async fn secret_files(client: &Client, ns: &str, name: &str) -> Result<Vec<(String, Vec<u8>)>> {
    let s = Api::<Secret>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("secret {ns}/{name} for a volume"))?;
    Ok(s.data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect())
}

/// Work out (and create) the host directories for `container`'s mounts.
/// `token` is the pod's ServiceAccount token (for projected token sources).
pub async fn plan(
    client: &Client,
    state_dir: &Path,
    pod_dir: &Path,
    pod: &Pod,
    container: &Container,
    token: &str,
) -> Result<Vec<BindMount>> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    let mut mounts = container.volume_mounts.clone().unwrap_or_default();
    // Parents before children.
    mounts.sort_by_key(|m| m.mount_path.len());
    let mut out = Vec::new();
    for m in mounts {
        let Some(v) = volumes.iter().find(|v| v.name == m.name) else {
            bail!("volumeMount {} refers to no volume", m.name);
        };
        let own = pod_dir.join("volumes").join(&v.name);
        let source = if v.empty_dir.is_some() {
            own
        } else if let Some(c) = &v.persistent_volume_claim {
            claim_dir(state_dir, &ns, &c.claim_name)
        } else if let Some(sec) = &v.secret {
            let name = sec.secret_name.clone().unwrap_or_default();
            write_files(&own, secret_files(client, &ns, &name).await?)?;
            own
        } else if let Some(cm) = &v.config_map {
            write_files(&own, configmap_files(client, &ns, &cm.name).await?)?;
            own
        } else if let Some(p) = &v.projected {
            let mut files = Vec::new();
            for src in p.sources.clone().unwrap_or_default() {
                if let Some(cm) = src.config_map {
                    files.extend(configmap_files(client, &ns, &cm.name).await?);
                }
                if let Some(sec) = src.secret {
                    files.extend(secret_files(client, &ns, &sec.name).await?);
                }
                if let Some(t) = src.service_account_token {
                    files.push((t.path, token.as_bytes().to_vec()));
                }
            }
            write_files(&own, files)?;
            own
        } else {
            bail!("volume {}: only emptyDir, persistentVolumeClaim, secret, configMap and projected volumes are supported on simulated nodes", v.name);
        };
        // A subPath: that directory of the volume, created if missing (as
        // a kubelet does); it may not climb out of the volume.
        let source = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => {
                let p = Path::new(sub);
                if p.is_absolute()
                    || p.components()
                        .any(|c| !matches!(c, std::path::Component::Normal(_)))
                {
                    bail!(
                        "volumeMount {}: subPath {sub:?} must be a relative path inside the volume",
                        m.name
                    );
                }
                source.join(p)
            }
            None => source,
        };
        std::fs::create_dir_all(&source)?;
        if !Path::new(&m.mount_path).is_absolute() {
            bail!("mountPath {:?} is not absolute", m.mount_path);
        }
        std::fs::create_dir_all(&m.mount_path)?;
        out.push(BindMount {
            source: CString::new(source.as_os_str().as_encoded_bytes())?,
            target: CString::new(m.mount_path.as_bytes())?,
            read_only: m.read_only.unwrap_or(false)
                || v.persistent_volume_claim
                    .as_ref()
                    .and_then(|c| c.read_only)
                    .unwrap_or(false),
        });
    }
    Ok(out)
}

/// The container's termination message file, as a kubelet provides it: a
/// file of the pod (`<pod_dir>/termination-log`) bind-mounted at the
/// container's `terminationMessagePath` (default `/dev/termination-log`;
/// an empty file is created at that path on the host if missing, as the
/// mount point). Returns the mount and the pod's file, read after exit.
pub fn termination_log(pod_dir: &Path, container: &Container) -> Result<(BindMount, PathBuf)> {
    let target = container
        .termination_message_path
        .clone()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/dev/termination-log".into());
    if !Path::new(&target).is_absolute() {
        bail!("terminationMessagePath {target:?} is not absolute");
    }
    let source = pod_dir.join("termination-log");
    std::fs::write(&source, b"")?;
    if !Path::new(&target).exists() {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&target)
            .with_context(|| format!("creating the mount point {target}"))?;
    }
    Ok((
        BindMount {
            source: CString::new(source.as_os_str().as_encoded_bytes())?,
            target: CString::new(target.as_bytes())?,
            read_only: false,
        },
        source,
    ))
}

/// What a container wrote to its termination message file: the first
/// 4096 bytes, as a kubelet reports them (`None` when empty).
pub fn termination_message(file: &Path) -> Option<String> {
    let bytes = std::fs::read(file).ok()?;
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(4096)])
        .trim()
        .to_string();
    (!text.is_empty()).then_some(text)
}

/// Where a kubelet mounts a pod's ServiceAccount credentials.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The pod's ServiceAccount directory (`token`, `ca.crt`, `namespace`),
/// mounted read-only at [`SERVICE_ACCOUNT_DIR`] as a kubelet does.
pub fn service_account(
    pod_dir: &Path,
    api: &super::PodApiAccess,
    token: &str,
    ns: &str,
) -> Result<BindMount> {
    let dir = pod_dir.join("serviceaccount");
    write_files(
        &dir,
        [
            ("token".to_string(), token.as_bytes().to_vec()),
            ("ca.crt".to_string(), api.ca_pem.clone()),
            ("namespace".to_string(), ns.as_bytes().to_vec()),
        ],
    )?;
    std::fs::create_dir_all(SERVICE_ACCOUNT_DIR)?;
    Ok(BindMount {
        source: CString::new(dir.as_os_str().as_encoded_bytes())?,
        target: CString::new(SERVICE_ACCOUNT_DIR)?,
        read_only: true,
    })
}

/// In the child, before exec: a private mount namespace with the bind mounts.
/// Only async-signal-safe syscalls.
pub fn apply_in_child(mounts: &[BindMount]) -> std::io::Result<()> {
    if mounts.is_empty() {
        return Ok(());
    }
    let err = || std::io::Error::last_os_error();
    // SAFETY: raw syscalls with valid C strings prepared before fork.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return Err(err());
        }
        let root = c"/";
        if libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) != 0
        {
            return Err(err());
        }
        for m in mounts {
            if libc::mount(
                m.source.as_ptr(),
                m.target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ) != 0
            {
                return Err(err());
            }
            if m.read_only
                && libc::mount(
                    std::ptr::null(),
                    m.target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                    std::ptr::null(),
                ) != 0
            {
                return Err(err());
            }
        }
    }
    Ok(())
}
