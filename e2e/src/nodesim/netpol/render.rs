//! NetworkPolicies as one nftables script: a chain per isolated pod and
//! direction, accepting what the union of the selecting policies' rules
//! allows and rejecting the rest (see the module docs of [`super`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

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

/// Which way a chain filters: traffic to its pod or from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    /// The policy type that isolates pods this way.
    fn policy_type(self) -> &'static str {
        match self {
            Direction::Ingress => "Ingress",
            Direction::Egress => "Egress",
        }
    }

    /// The nftables address field of the peer (the other end).
    fn peer_field(self) -> &'static str {
        match self {
            Direction::Ingress => "saddr",
            Direction::Egress => "daddr",
        }
    }

    /// The nftables address field of the isolated pod itself.
    fn own_field(self) -> &'static str {
        match self {
            Direction::Ingress => "daddr",
            Direction::Egress => "saddr",
        }
    }
}

/// The everything-in-this-namespace context of one policy's peers.
struct World<'a> {
    pods: &'a [PodNet],
    namespaces: &'a BTreeMap<String, BTreeMap<String, String>>,
}

impl World<'_> {
    /// Labels of namespace `ns` as selectors see them.
    fn namespace_labels(&self, ns: &str) -> BTreeMap<String, String> {
        let mut l = self.namespaces.get(ns).cloned().unwrap_or_default();
        l.insert(NAMESPACE_NAME_LABEL.into(), ns.into());
        l
    }

    /// The pods `peer` (of a policy in namespace `ns`) selects.
    fn peer_pods(&self, peer: &NetworkPolicyPeer, ns: &str) -> Vec<&PodNet> {
        self.pods
            .iter()
            .filter(|p| match &peer.namespace_selector {
                Some(nsel) => selects(nsel, &self.namespace_labels(&p.namespace)),
                None => p.namespace == ns,
            })
            .filter(|p| {
                peer.pod_selector
                    .as_ref()
                    .is_none_or(|s| selects(s, &p.labels))
            })
            .collect()
    }
}

/// The `tcp dport …` / `udp dport …` matches of `ports` on the pod
/// `target` listens as (named ports resolved on its containers; `None`: an
/// address block, where a named port matches nothing). An empty list: any
/// port, as `[""]`. `None`: no port of the list exists on the target.
fn port_matches(ports: &[NetworkPolicyPort], target: Option<&PodNet>) -> Option<Vec<String>> {
    if ports.is_empty() {
        return Some(vec![String::new()]);
    }
    let mut by_proto: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in ports {
        let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        let number = match &p.port {
            None => None,
            Some(IntOrString::Int(n)) => Some(*n),
            Some(IntOrString::String(name)) => target.and_then(|t| {
                t.named_ports
                    .iter()
                    .find(|(n, _, pr)| n == name && *pr == proto)
                    .map(|(_, port, _)| *port)
            }),
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

/// Whether `p` isolates the pods it selects in direction `dir`.
fn isolates(p: &NetworkPolicy, dir: Direction) -> bool {
    let spec = p.spec.as_ref();
    match spec.and_then(|s| s.policy_types.as_ref()) {
        Some(types) => types.iter().any(|t| t == dir.policy_type()),
        // No policyTypes: Ingress always, Egress when it has egress rules.
        None => match dir {
            Direction::Ingress => spec.is_some(),
            Direction::Egress => spec.is_some_and(|s| s.egress.is_some()),
        },
    }
}

/// One rule of a policy as (peers, ports) in direction-neutral form.
type Rule = (
    Option<Vec<NetworkPolicyPeer>>,
    Option<Vec<NetworkPolicyPort>>,
);

/// The rules of `policy` in direction `dir`.
fn rules_of(policy: &NetworkPolicy, dir: Direction) -> Vec<Rule> {
    let spec = policy.spec.clone().unwrap_or_default();
    match dir {
        Direction::Ingress => spec
            .ingress
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.from, r.ports))
            .collect(),
        Direction::Egress => spec
            .egress
            .unwrap_or_default()
            .into_iter()
            .map(|r| (r.to, r.ports))
            .collect(),
    }
}

/// The accept lines of one rule of a policy in namespace `ns`, for the
/// isolated pod `own` in direction `dir`. Named ports are resolved on the
/// pod that listens: `own` for ingress, each destination pod for egress.
fn rule_lines(rule: &Rule, ns: &str, own: &PodNet, dir: Direction, world: &World) -> Vec<String> {
    let (peers, ports) = rule;
    let ports = ports.clone().unwrap_or_default();
    let field = dir.peer_field();
    // (address match, the pod whose named ports apply)
    let mut targets: Vec<(String, Option<&PodNet>)> = Vec::new();
    let peers = peers.clone().unwrap_or_default();
    if peers.is_empty() {
        targets.push((
            String::new(),
            Some(own).filter(|_| dir == Direction::Ingress),
        ));
    }
    for peer in &peers {
        if let Some(block) = &peer.ip_block {
            let mut m = format!("ip {field} {}", block.cidr);
            let except = block.except.clone().unwrap_or_default();
            if !except.is_empty() {
                let _ = write!(m, " ip {field} != {{ {} }}", except.join(", "));
            }
            let listener = Some(own).filter(|_| dir == Direction::Ingress);
            targets.push((m, listener));
            continue;
        }
        let selected = world.peer_pods(peer, ns);
        let set = |ps: &[&PodNet]| {
            let ips: Vec<&str> = ps.iter().map(|p| p.ip.as_str()).collect();
            format!("ip {field} {{ {} }}", ips.join(", "))
        };
        match dir {
            _ if selected.is_empty() => {}
            Direction::Ingress => targets.push((set(&selected), Some(own))),
            Direction::Egress => {
                targets.extend(selected.iter().map(|p| (set(&[*p]), Some(*p))));
            }
        }
    }
    let mut lines = Vec::new();
    for (addr, listener) in targets {
        let Some(port_lines) = port_matches(&ports, listener) else {
            continue;
        };
        for port in port_lines {
            let line = [addr.as_str(), port.as_str(), "accept"]
                .iter()
                .filter(|s| !s.is_empty())
                .copied()
                .collect::<Vec<_>>()
                .join(" ");
            if !lines.contains(&line) {
                lines.push(line);
            }
        }
    }
    lines
}

/// The chains of direction `dir`: (jump lines for the base chain, the
/// pods' chains).
fn chains(
    pods: &[PodNet],
    policies: &[NetworkPolicy],
    world: &World,
    dir: Direction,
) -> (String, String) {
    let (mut jumps, mut chains) = (String::new(), String::new());
    let prefix = match dir {
        Direction::Ingress => "pod",
        Direction::Egress => "out",
    };
    for (i, own) in pods.iter().enumerate() {
        let selecting: Vec<&NetworkPolicy> = policies
            .iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(own.namespace.as_str()))
            .filter(|p| isolates(p, dir))
            .filter(|p| {
                p.spec
                    .as_ref()
                    .and_then(|s| s.pod_selector.as_ref())
                    .is_none_or(|s| selects(s, &own.labels))
            })
            .collect();
        if selecting.is_empty() {
            continue;
        }
        let chain = format!("{prefix}{i}");
        let _ = writeln!(jumps, "    ip {} {} jump {chain}", dir.own_field(), own.ip);
        let _ = writeln!(chains, "  chain {chain} {{");
        let _ = writeln!(chains, "    ip {} {NODE_IP} accept", dir.peer_field());
        for policy in selecting {
            let ns = policy.metadata.namespace.as_deref().unwrap_or_default();
            for rule in rules_of(policy, dir) {
                for line in rule_lines(&rule, ns, own, dir, world) {
                    let _ = writeln!(chains, "    {line}");
                }
            }
        }
        let _ = writeln!(chains, "    meta l4proto tcp reject with tcp reset");
        let _ = writeln!(chains, "    drop");
        let _ = writeln!(chains, "  }}");
    }
    (jumps, chains)
}

/// The nftables script for table `table`: for each pod a policy isolates,
/// accept what the union of its policies' rules allows, reject the rest —
/// ingress on the input hook, egress on the output hook. Replaces the
/// whole table in one transaction.
pub fn render(
    table: &str,
    pods: &[PodNet],
    policies: &[NetworkPolicy],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> String {
    let world = World { pods, namespaces };
    let (in_jumps, in_chains) = chains(pods, policies, &world, Direction::Ingress);
    let (out_jumps, out_chains) = chains(pods, policies, &world, Direction::Egress);
    let base = |name: &str, hook: &str, jumps: &str| {
        format!(
            "  chain {name} {{\n    type filter hook {hook} priority 0; policy accept;\n    ct state established,related accept\n{jumps}  }}\n"
        )
    };
    format!(
        "table inet {table}\ndelete table inet {table}\ntable inet {table} {{\n{}{}{in_chains}{out_chains}}}\n",
        base("input", "input", &in_jumps),
        base("output", "output", &out_jumps),
    )
}
