//! The rendered rules, read back chain by chain.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::json;

use super::*;

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

/// The accept lines of the `prefix` chain (`pod`: ingress, `out`:
/// egress) of the pod at `ip`, jumped to on `field` (`None`: not isolated).
fn chain_in(
    script: &str,
    pods: &[PodNet],
    ip: &str,
    prefix: &str,
    field: &str,
) -> Option<Vec<String>> {
    let i = pods.iter().position(|p| p.ip == ip)?;
    script
        .contains(&format!("ip {field} {ip} jump {prefix}{i}"))
        .then_some(())?;
    let body = script.split(&format!("chain {prefix}{i} {{\n")).nth(1)?;
    Some(
        body.lines()
            .take_while(|l| l.trim() != "}")
            .map(|l| l.trim().to_string())
            .collect(),
    )
}

/// The ingress chain of the pod at `ip`.
fn chain_of(script: &str, pods: &[PodNet], ip: &str) -> Option<Vec<String>> {
    chain_in(script, pods, ip, "pod", "daddr")
}

/// The egress chain of the pod at `ip`.
fn egress_of(script: &str, pods: &[PodNet], ip: &str) -> Option<Vec<String>> {
    chain_in(script, pods, ip, "out", "saddr")
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
    assert!(
        chain.contains(&"ip saddr 127.6.0.0/16 ip saddr != { 127.6.0.9/32 } accept".to_string())
    );
}

#[test]
fn egress_reaches_only_the_listed_destinations() {
    let pods = vec![
        pod("a", "127.5.0.2", json!({"job": "j"})),
        pod("a", "127.5.0.3", json!({"job": "j"})),
        pod("a", "127.5.0.4", json!({"job": "k"})),
        pod("a", "127.5.0.5", json!({"app": "prom"})),
    ];
    let job = policy(
        "a",
        json!({
            "podSelector": {"matchLabels": {"job": "j"}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"job": "j"}}}]}],
            "egress": [
                {"to": [{"podSelector": {"matchLabels": {"job": "j"}}}]},
                {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
                {"to": [{"ipBlock": {"cidr": "127.0.0.0/24", "except": ["127.0.0.3/32"]}}], "ports": [{"port": 9000, "endPort": 9005}]},
                {"to": [{"podSelector": {"matchLabels": {"app": "prom"}}}], "ports": [{"port": "metrics"}]},
                {"to": [{"ipBlock": {"cidr": "127.9.0.0/16"}}], "ports": [{"port": "metrics"}]}
            ]
        }),
    );
    let script = render("t", &pods, &[job], &BTreeMap::new());
    assert!(script.contains("type filter hook output priority 0"));
    let out = egress_of(&script, &pods, "127.5.0.2").expect("egress isolated");
    assert_eq!(
        out,
        vec![
            "ip daddr 127.0.0.1 accept",
            "ip daddr { 127.5.0.2 } accept",
            "ip daddr { 127.5.0.3 } accept",
            "tcp dport { 53 } accept",
            "udp dport { 53 } accept",
            "ip daddr 127.0.0.0/24 ip daddr != { 127.0.0.3/32 } tcp dport { 9000-9005 } accept",
            // A named port on the destination pod; on an address block, nothing.
            "ip daddr { 127.5.0.5 } tcp dport { 9400 } accept",
            "meta l4proto tcp reject with tcp reset",
            "drop",
        ]
    );
    assert!(egress_of(&script, &pods, "127.5.0.3").is_some());
    assert_eq!(egress_of(&script, &pods, "127.5.0.4"), None, "not selected");
    // Ingress chains are as before, on the input hook.
    assert!(chain_of(&script, &pods, "127.5.0.2").is_some());

    // An Ingress-only policy isolates no egress; one without policyTypes
    // isolates egress only when it has egress rules.
    let ingress_only = policy(
        "a",
        json!({"podSelector": {}, "policyTypes": ["Ingress"], "egress": []}),
    );
    let no_types = policy("a", json!({"podSelector": {}}));
    let script = render("t", &pods, &[ingress_only, no_types], &BTreeMap::new());
    assert_eq!(egress_of(&script, &pods, "127.5.0.4"), None);
    let deny_out = policy(
        "a",
        json!({"podSelector": {"matchLabels": {"job": "k"}}, "egress": []}),
    );
    let script = render("t", &pods, &[deny_out], &BTreeMap::new());
    assert_eq!(
        egress_of(&script, &pods, "127.5.0.4").expect("deny all egress"),
        vec![
            "ip daddr 127.0.0.1 accept",
            "meta l4proto tcp reject with tcp reset",
            "drop"
        ]
    );
}
