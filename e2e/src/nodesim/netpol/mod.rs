//! NetworkPolicy enforcement between simulated pods, as a CNI plugin would
//! do it: every pod has its own loopback IP, so policies become nftables
//! rules on those IPs (one table per simulator instance, hooked on input
//! for ingress and on output for egress, replaced atomically on every
//! change). The rules themselves are rendered in [`render`].
//!
//! What is enforced: **ingress** of TCP and UDP to a pod selected by a
//! policy whose types include `Ingress`, and **egress** from a pod selected
//! by one whose types include `Egress` — to or from peers chosen by
//! `podSelector`, `namespaceSelector` (a namespace's labels plus the
//! `kubernetes.io/metadata.name` label 1.21+ sets) or `ipBlock` (with
//! `except`), on numbered or named ports with `endPort`. Replies of allowed
//! connections pass (conntrack). Traffic between a pod and the node itself
//! (127.0.0.1: the API server, the operator and Prometheus run as host
//! processes here) is allowed both ways, as CNIs allow the kubelet's. A
//! process that does not bind its socket to its pod IP sends from
//! 127.0.0.1, so the simulator models a pod's source address, and so its
//! egress, only for processes that bind it (the trainer's Gloo does, via
//! `HT_BIND_ADDR`). A Service's ClusterIP is not translated to its pods
//! before egress rules see it (a CNI's would be): egress to a Service is
//! allowed by an `ipBlock` holding its ClusterIP.

mod render;

use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams};
use kube::Client;

pub use render::{render, selects, PodNet};

use super::entries::Entries;

/// Runs `nft` with `args`, `stdin` as its input.
fn nft(args: &[&str], stdin: &str) -> Result<()> {
    use std::io::Write;
    let mut child = std::process::Command::new("nft")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("running nft (apt-get install nftables; needs root or CAP_NET_ADMIN)")?;
    if let Some(mut i) = child.stdin.take() {
        i.write_all(stdin.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "nft {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Whether enforcement is on, off, or not yet tried.
#[derive(Clone, Debug, PartialEq)]
pub enum State {
    Pending,
    Enforcing,
    Failed(String),
}

/// One simulator instance's enforcement: its pods and its nftables table.
pub struct Enforcer {
    table: String,
    pods: Entries<PodNet>,
    applied: tokio::sync::Mutex<Option<String>>,
    state: Mutex<State>,
}

impl Enforcer {
    /// The enforcer of simulator `instance`; removes tables that crashed
    /// simulators left behind (their process is gone).
    pub fn new(instance: &str) -> Enforcer {
        remove_stale_tables();
        let table = format!(
            "heterotrain_{}",
            instance.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
        );
        Enforcer {
            table,
            pods: Entries::default(),
            applied: tokio::sync::Mutex::new(None),
            state: Mutex::new(State::Pending),
        }
    }

    /// The nftables table this instance writes.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Whether the last rules were applied.
    pub fn state(&self) -> State {
        self.state
            .lock()
            .map(|s| s.clone())
            .unwrap_or(State::Pending)
    }

    /// A pod got `net`, under its UID.
    pub fn add(&self, uid: &str, net: PodNet) {
        self.pods.insert(uid, net);
    }

    /// The pod with UID `uid` is gone; whether it was one of this
    /// instance's (a pod on a node that runs no processes never is).
    pub fn remove(&self, uid: &str) -> bool {
        self.pods.remove(uid)
    }

    /// Read the policies and namespaces and apply the rules they give, when
    /// they changed. A failure is reported once and kept in [`State`].
    pub async fn sync(&self, client: &Client) -> Result<()> {
        // One sync at a time, each rendering the pods as they are once it
        // runs: a sync that read them earlier cannot apply its older rules
        // over a newer one's (pods start on several nodes at once).
        let mut applied = self.applied.lock().await;
        // Nothing to enforce and nothing written yet (no pod of this
        // instance has had an address): no need to read every policy.
        let pods = self.pods.values().unwrap_or_default();
        if pods.is_empty() && applied.is_none() {
            return Ok(());
        }
        let policies = Api::<NetworkPolicy>::all(client.clone())
            .list(&ListParams::default())
            .await
            .context("listing NetworkPolicies")?
            .items;
        let namespaces = Api::<Namespace>::all(client.clone())
            .list(&ListParams::default())
            .await
            .context("listing Namespaces")?
            .items
            .into_iter()
            .filter_map(|n| Some((n.metadata.name?, n.metadata.labels.unwrap_or_default())))
            .collect();
        let script = render(&self.table, &pods, &policies, &namespaces);
        if applied.as_deref() == Some(script.as_str()) {
            return Ok(());
        }
        let s = script.clone();
        let result = tokio::task::spawn_blocking(move || nft(&["-f", "-"], &s))
            .await
            .context("nft task")?;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(()) => {
                *applied = Some(script);
                *state = State::Enforcing;
                Ok(())
            }
            Err(e) => {
                if !matches!(*state, State::Failed(_)) {
                    eprintln!("nodesim: warning: NetworkPolicies are not enforced: {e:#}");
                }
                *state = State::Failed(format!("{e:#}"));
                Err(e)
            }
        }
    }

    /// Remove the table (on stop).
    pub fn clear(&self) {
        if self.state() == State::Enforcing {
            let _ = nft(&["delete", "table", "inet", &self.table], "");
        }
    }
}

/// Delete `heterotrain_sim_<pid>_…` tables whose simulator process is gone.
fn remove_stale_tables() {
    let Ok(out) = std::process::Command::new("nft")
        .args(["list", "tables", "inet"])
        .output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.strip_prefix("table inet ") else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix("heterotrain_sim_")
            .and_then(|r| r.split('_').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = nft(&["delete", "table", "inet", name], "");
        }
    }
}

/// Open a TCP connection to `dst_ip:port` from `src_ip` (as a process of
/// the pod with that IP would): `Ok` when it connects, the error when it is
/// refused or times out (3 s).
pub async fn connect_from(src_ip: &str, dst_ip: &str, port: u16) -> std::io::Result<()> {
    let parse = |ip: &str| {
        ip.parse::<std::net::Ipv4Addr>().map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{ip}: {e}"))
        })
    };
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((parse(src_ip)?, 0).into())?;
    let dst = std::net::SocketAddr::from((parse(dst_ip)?, port));
    match tokio::time::timeout(std::time::Duration::from_secs(3), socket.connect(dst)).await {
        Ok(stream) => stream.map(drop),
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

#[cfg(test)]
mod tests;
