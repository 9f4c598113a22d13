//! NetworkPolicy enforcement between simulated pods, as a CNI plugin would
//! do it: every pod has its own loopback IP, so ingress rules become
//! nftables rules on those IPs (one table per simulator instance, hooked on
//! input, replaced atomically on every change).
//!
//! What is enforced: **ingress** of TCP and UDP to a pod selected by a
//! policy whose types include `Ingress` — from peers chosen by
//! `podSelector`, `namespaceSelector` (a namespace's labels plus the
//! `kubernetes.io/metadata.name` label 1.21+ sets) or `ipBlock`, on numbered
//! or named ports with `endPort`. Replies of allowed connections pass
//! (conntrack). Traffic from the node itself (127.0.0.1: the operator and
//! Prometheus run as host processes here) is allowed, as CNIs allow the
//! kubelet's. A process that does not bind its socket to its pod IP sends
//! from 127.0.0.1, so the simulator models a pod's source address only for
//! processes that bind it (the trainer's Gloo does, via `HT_BIND_ADDR`).
//! Egress rules are not enforced.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use kube::Client;

use super::entries::Entries;

/// The namespace label Kubernetes 1.21+ sets to the namespace's name.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// The node's own address: always allowed.
const NODE_IP: &str = "127.0.0.1";

/// What policies need to know of a running pod.
#[derive(Clone, Debug, PartialEq)]
pub struct PodNet {
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub ip: String,
    /// Named container ports: (name, port, protocol).
    pub named_ports: Vec<(String, i32, String)>,
}

impl PodNet {
    /// The network identity of `pod` at `ip`.
    pub fn of(pod: &Pod, ip: &str) -> PodNet {
        let named_ports = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                Some((
                    p.name.clone()?,
                    p.container_port,
                    p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                ))
            })
            .collect();
        PodNet {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            ip: ip.to_string(),
            named_ports,
        }
    }
}

/// Whether `labels` satisfy `sel` (an empty selector selects everything;
/// an unknown operator selects nothing, as the API server would refuse it).
pub fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_exprs = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        let have = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => have.is_some_and(|v| values.contains(v)),
            "NotIn" => have.is_none_or(|v| !values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => false,
        }
    });
    by_labels && by_exprs
}

/// Labels of namespace `ns` as selectors see them.
fn namespace_labels(
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
    ns: &str,
) -> BTreeMap<String, String> {
    let mut l = namespaces.get(ns).cloned().unwrap_or_default();
    l.insert(NAMESPACE_NAME_LABEL.into(), ns.into());
    l
}

/// The nftables source match of one peer of a policy in namespace `ns`:
/// a set of pod IPs or an address block (`None`: no source can match).
fn peer_sources(
    peer: &NetworkPolicyPeer,
    ns: &str,
    pods: &[PodNet],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> Option<String> {
    if let Some(block) = &peer.ip_block {
        let mut m = format!("ip saddr {}", block.cidr);
        let except = block.except.clone().unwrap_or_default();
        if !except.is_empty() {
            let _ = write!(m, " ip saddr != {{ {} }}", except.join(", "));
        }
        return Some(m);
    }
    let ips: Vec<&str> = pods
        .iter()
        .filter(|p| match &peer.namespace_selector {
            Some(nsel) => selects(nsel, &namespace_labels(namespaces, &p.namespace)),
            None => p.namespace == ns,
        })
        .filter(|p| {
            peer.pod_selector
                .as_ref()
                .is_none_or(|s| selects(s, &p.labels))
        })
        .map(|p| p.ip.as_str())
        .collect();
    (!ips.is_empty()).then(|| format!("ip saddr {{ {} }}", ips.join(", ")))
}

/// The `tcp dport …` / `udp dport …` matches of `ports` on `target`
/// (named ports resolved on the target's containers; an empty list: any
/// port, as `[""]`). `None`: no port of the list exists on the target.
fn port_matches(ports: &[NetworkPolicyPort], target: &PodNet) -> Option<Vec<String>> {
    if ports.is_empty() {
        return Some(vec![String::new()]);
    }
    let mut by_proto: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in ports {
        let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        let number = match &p.port {
            None => None,
            Some(IntOrString::Int(n)) => Some(*n),
            Some(IntOrString::String(name)) => target
                .named_ports
                .iter()
                .find(|(n, _, pr)| n == name && *pr == proto)
                .map(|(_, port, _)| *port),
        };
        let kw = match proto.as_str() {
            "TCP" => "tcp",
            "UDP" => "udp",
            _ => continue,
        };
        let spec = match (&p.port, number, p.end_port) {
            (None, _, _) => format!("meta l4proto {kw}"),
            (Some(_), None, _) => continue,
            (Some(_), Some(n), Some(end)) if end > n => format!("{n}-{end}"),
            (Some(_), Some(n), _) => n.to_string(),
        };
        by_proto.entry(kw.to_string()).or_default().push(spec);
    }
    let out: Vec<String> = by_proto
        .into_iter()
        .flat_map(|(kw, specs)| {
            let any = specs.iter().any(|s| s.starts_with("meta "));
            if any {
                vec![format!("meta l4proto {kw}")]
            } else {
                vec![format!("{kw} dport {{ {} }}", specs.join(", "))]
            }
        })
        .collect();
    (!out.is_empty()).then_some(out)
}

/// Whether `p` isolates the pods it selects for ingress.
fn isolates_ingress(p: &NetworkPolicy) -> bool {
    let spec = p.spec.as_ref();
    match spec.and_then(|s| s.policy_types.as_ref()) {
        Some(types) => types.iter().any(|t| t == "Ingress"),
        // No policyTypes: Ingress always (plus Egress when it has egress rules).
        None => spec.is_some(),
    }
}

/// The nftables script for table `table`: for each pod a policy isolates,
/// accept what the union of its policies' ingress rules allows, reject the
/// rest. Replaces the whole table in one transaction.
pub fn render(
    table: &str,
    pods: &[PodNet],
    policies: &[NetworkPolicy],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> String {
    let mut chains = String::new();
    let mut jumps = String::new();
    for (i, target) in pods.iter().enumerate() {
        let selecting: Vec<&NetworkPolicy> = policies
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(target.namespace.as_str()))
            .filter(|p| isolates_ingress(p))
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.pod_selector.as_ref())
                    .is_none_or(|s| selects(s, &target.labels))
            })
            .collect();
        if selecting.is_empty() {
            continue;
        }
        let chain = format!("pod{i}");
        let _ = writeln!(jumps, "    ip daddr {} jump {chain}", target.ip);
        let _ = writeln!(chains, "  chain {chain} {{");
        let _ = writeln!(chains, "    ip saddr {NODE_IP} accept");
        for policy in selecting {
            let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
            let rules = policy
                .spec
                .as_ref()
                .and_then(|s| s.ingress.clone())
                .unwrap_or_default();
            for rule in rules {
                let Some(ports) = port_matches(&rule.ports.unwrap_or_default(), target) else {
                    continue;
                };
                let from = rule.from.unwrap_or_default();
                let sources: Vec<String> = if from.is_empty() {
                    vec![String::new()]
                } else {
                    from.iter()
                        .filter_map(|peer| peer_sources(peer, ns, pods, namespaces))
                        .collect()
                };
                for src in &sources {
                    for port in &ports {
                        let line = [src.as_str(), port.as_str(), "accept"]
                            .iter()
                            .filter(|s| !s.is_empty())
                            .copied()
                            .collect::<Vec<_>>()
                            .join(" ");
                        let _ = writeln!(chains, "    {line}");
                    }
                }
            }
        }
        let _ = writeln!(chains, "    meta l4proto tcp reject with tcp reset");
        let _ = writeln!(chains, "    drop");
        let _ = writeln!(chains, "  }}");
    }
    format!(
        "table inet {table}\ndelete table inet {table}\ntable inet {table} {{\n  chain input {{\n    type filter hook input priority 0; policy accept;\n    ct state established,related accept\n{jumps}  }}\n{chains}}}\n"
    )
}

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
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, ip: &str, labels: serde_json::Value) -> PodNet {
        PodNet {
            namespace: ns.into(),
            labels: serde_json::from_value(labels).unwrap(),
            ip: ip.into(),
            named_ports: vec![("metrics".into(), 9400, "TCP".into())],
        }
    }

    fn policy(ns: &str, spec: serde_json::Value) -> NetworkPolicy {
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": ns}, "spec": spec}))
            .unwrap()
    }

    /// The accept lines of the chain of the pod at `ip` (`None`: not isolated).
    fn chain_of(script: &str, pods: &[PodNet], ip: &str) -> Option<Vec<String>> {
        let i = pods.iter().position(|p| p.ip == ip)?;
        script
            .contains(&format!("ip daddr {ip} jump pod{i}"))
            .then_some(())?;
        let body = script.split(&format!("chain pod{i} {{\n")).nth(1)?;
        Some(
            body.lines()
                .take_while(|l| l.trim() != "}")
                .map(|l| l.trim().to_string())
                .collect(),
        )
    }

    #[test]
    fn selectors_follow_the_api_semantics() {
        let labels: BTreeMap<String, String> =
            serde_json::from_value(json!({"app": "a", "tier": "x"})).unwrap();
        let sel = |v: serde_json::Value| -> LabelSelector { serde_json::from_value(v).unwrap() };
        assert!(selects(&sel(json!({})), &labels));
        assert!(selects(&sel(json!({"matchLabels": {"app": "a"}})), &labels));
        assert!(!selects(
            &sel(json!({"matchLabels": {"app": "b"}})),
            &labels
        ));
        let expr = |op: &str, values: serde_json::Value| {
            sel(json!({"matchExpressions": [{"key": "tier", "operator": op, "values": values}]}))
        };
        assert!(selects(&expr("In", json!(["x", "y"])), &labels));
        assert!(!selects(&expr("NotIn", json!(["x"])), &labels));
        assert!(selects(&expr("Exists", json!(null)), &labels));
        assert!(!selects(&expr("DoesNotExist", json!(null)), &labels));
        assert!(!selects(&expr("Bogus", json!(null)), &labels));
    }

    #[test]
    fn isolated_pods_accept_only_their_peers_on_their_ports() {
        let pods = vec![
            pod("a", "127.5.0.2", json!({"job": "j", "rank": "0"})),
            pod("a", "127.5.0.3", json!({"job": "j", "rank": "1"})),
            pod("a", "127.5.0.4", json!({"job": "k"})),
            pod("mon", "127.5.0.5", json!({"app": "prom"})),
        ];
        let policies = vec![policy(
            "a",
            json!({
                "podSelector": {"matchLabels": {"job": "j"}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [
                    {"from": [{"podSelector": {"matchLabels": {"job": "j"}}}]},
                    {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}],
                     "ports": [{"port": "metrics"}, {"port": 9500, "endPort": 9510, "protocol": "UDP"}]}
                ]
            }),
        )];
        let script = render("t", &pods, &policies, &BTreeMap::new());
        let rank0 = chain_of(&script, &pods, "127.5.0.2").expect("rank 0 isolated");
        assert_eq!(
            rank0,
            vec![
                "ip saddr 127.0.0.1 accept",
                "ip saddr { 127.5.0.2, 127.5.0.3 } accept",
                "ip saddr { 127.5.0.5 } tcp dport { 9400 } accept",
                "ip saddr { 127.5.0.5 } udp dport { 9500-9510 } accept",
                "meta l4proto tcp reject with tcp reset",
                "drop",
            ]
        );
        assert!(chain_of(&script, &pods, "127.5.0.3").is_some());
        assert_eq!(chain_of(&script, &pods, "127.5.0.4"), None, "not selected");
        assert_eq!(
            chain_of(&script, &pods, "127.5.0.5"),
            None,
            "other namespace"
        );
        assert!(script.contains("ct state established,related accept"));
    }

    #[test]
    fn empty_peers_ports_and_types() {
        let pods = vec![
            pod("a", "127.5.0.2", json!({})),
            pod("b", "127.5.0.3", json!({})),
        ];
        // No ingress rules: deny all (but the node).
        let deny = policy("a", json!({"podSelector": {}}));
        let script = render("t", &pods, &[deny], &BTreeMap::new());
        assert_eq!(
            chain_of(&script, &pods, "127.5.0.2").unwrap(),
            vec![
                "ip saddr 127.0.0.1 accept",
                "meta l4proto tcp reject with tcp reset",
                "drop"
            ]
        );
        // An empty `from`: any source, on the named port only.
        let open = policy(
            "a",
            json!({"podSelector": {}, "ingress": [{"ports": [{"port": 9400}]}]}),
        );
        let script = render("t", &pods, &[open], &BTreeMap::new());
        assert!(chain_of(&script, &pods, "127.5.0.2")
            .unwrap()
            .contains(&"tcp dport { 9400 } accept".to_string()));
        // Egress-only: nothing isolated for ingress.
        let egress = policy("a", json!({"podSelector": {}, "policyTypes": ["Egress"]}));
        let script = render("t", &pods, &[egress], &BTreeMap::new());
        assert_eq!(chain_of(&script, &pods, "127.5.0.2"), None);
        // A namespace selector on the namespace's own labels; a missing
        // named port allows nothing; an ipBlock with an exception.
        let ns_labels = BTreeMap::from([(
            "b".to_string(),
            BTreeMap::from([("team".to_string(), "blue".to_string())]),
        )]);
        let mixed = policy(
            "a",
            json!({"podSelector": {}, "ingress": [
                {"from": [{"namespaceSelector": {"matchLabels": {"team": "blue"}}}]},
                {"ports": [{"port": "nope"}]},
                {"from": [{"ipBlock": {"cidr": "127.6.0.0/16", "except": ["127.6.0.9/32"]}}]}
            ]}),
        );
        let script = render("t", &pods, &[mixed], &ns_labels);
        let chain = chain_of(&script, &pods, "127.5.0.2").unwrap();
        assert!(
            chain.contains(&"ip saddr { 127.5.0.3 } accept".to_string()),
            "{chain:?}"
        );
        assert!(
            !chain.iter().any(|l| l.contains("nope") || l == "accept"),
            "{chain:?}"
        );
        assert!(chain
            .contains(&"ip saddr 127.6.0.0/16 ip saddr != { 127.6.0.9/32 } accept".to_string()));
    }
}
