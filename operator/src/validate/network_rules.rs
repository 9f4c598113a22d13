//! Rules for `spec.isolation.egress`: the rules the API server would
//! refuse when the operator writes the job's NetworkPolicy (a CIDR that is
//! not one, a selector with an unknown operator, an `endPort` below its
//! port), reported at admission with the field instead of as a failed apply.

use std::net::IpAddr;

use heterotrain_crds::HeteroTrainingJobSpec;
use k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// Protocols a NetworkPolicy port may name.
pub const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];

/// An address block `addr/prefix`: the address and the prefix length.
pub fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (addr, prefix) = s.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= max && !s.contains(' ')).then_some((addr, prefix))
}

/// The address's bits as a 128-bit number, left-aligned.
fn bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)) << 96,
        IpAddr::V6(a) => u128::from(a),
    }
}

/// Whether block `inner` lies inside block `outer` (same family).
pub fn cidr_contains(outer: (IpAddr, u8), inner: (IpAddr, u8)) -> bool {
    if outer.0.is_ipv4() != inner.0.is_ipv4() || inner.1 < outer.1 {
        return false;
    }
    // Both families are left-aligned in 128 bits: the prefix is the top bits.
    let mask = match outer.1 {
        0 => 0,
        p => u128::MAX << (128 - u32::from(p)),
    };
    bits(outer.0) & mask == bits(inner.0) & mask
}

/// An IANA service name, as a named port: 1–15 lower-case letters, digits
/// and single inner hyphens, with at least one letter.
fn is_port_name(s: &str) -> bool {
    let b = s.as_bytes();
    (1..=15).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.iter().any(u8::is_ascii_lowercase)
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !s.contains("--")
}

fn check_ip_block(block: &IPBlock, field: &str, bad: &mut dyn FnMut(&str, String)) {
    let Some(outer) = parse_cidr(&block.cidr) else {
        bad(
            &format!("{field}.cidr"),
            format!(
                "{:?} is not an address block; write it as address/prefix, e.g. 10.0.0.0/8 or 203.0.113.7/32",
                block.cidr
            ),
        );
        return;
    };
    for (k, e) in block.except.iter().flatten().enumerate() {
        let f = format!("{field}.except[{k}]");
        match parse_cidr(e) {
            None => bad(&f, format!("{e:?} is not an address block")),
            Some(inner) if !cidr_contains(outer, inner) => bad(
                &f,
                format!(
                    "{e:?} is not inside {:?}; an exception must lie within the block it narrows",
                    block.cidr
                ),
            ),
            Some(_) => {}
        }
    }
}

fn check_selector(sel: &LabelSelector, field: &str, bad: &mut dyn FnMut(&str, String)) {
    for (k, e) in sel.match_expressions.iter().flatten().enumerate() {
        let f = format!("{field}.matchExpressions[{k}]");
        let values = e.values.as_ref().map_or(0, Vec::len);
        match e.operator.as_str() {
            "In" | "NotIn" if values == 0 => bad(
                &format!("{f}.values"),
                format!("operator {} needs at least one value", e.operator),
            ),
            "Exists" | "DoesNotExist" if values > 0 => bad(
                &format!("{f}.values"),
                format!("operator {} takes no values", e.operator),
            ),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => bad(
                &format!("{f}.operator"),
                format!("unknown operator {other:?}; use In, NotIn, Exists or DoesNotExist"),
            ),
        }
    }
}

fn check_peer(peer: &NetworkPolicyPeer, field: &str, bad: &mut dyn FnMut(&str, String)) {
    let selectors = [
        ("namespaceSelector", &peer.namespace_selector),
        ("podSelector", &peer.pod_selector),
    ];
    match &peer.ip_block {
        Some(_) if selectors.iter().any(|(_, s)| s.is_some()) => bad(
            field,
            "ipBlock cannot be combined with a selector in one peer; give them as two entries of `to`".into(),
        ),
        Some(block) => check_ip_block(block, &format!("{field}.ipBlock"), bad),
        None if selectors.iter().all(|(_, s)| s.is_none()) => bad(
            field,
            "a peer needs ipBlock, namespaceSelector or podSelector (for any destination, leave `to` out)".into(),
        ),
        None => {}
    }
    for (name, sel) in selectors {
        if let Some(sel) = sel {
            check_selector(sel, &format!("{field}.{name}"), bad);
        }
    }
}

fn check_port(p: &NetworkPolicyPort, field: &str, bad: &mut dyn FnMut(&str, String)) {
    if let Some(proto) = &p.protocol {
        if !PROTOCOLS.contains(&proto.as_str()) {
            bad(
                &format!("{field}.protocol"),
                format!("protocol {proto:?} is not one of TCP, UDP, SCTP"),
            );
        }
    }
    match (&p.port, p.end_port) {
        (Some(IntOrString::Int(n)), _) if !(1..=65535).contains(n) => bad(
            &format!("{field}.port"),
            format!("port {n} is outside 1–65535"),
        ),
        (Some(IntOrString::Int(n)), Some(end)) if end < *n || end > 65535 => bad(
            &format!("{field}.endPort"),
            format!("endPort {end} must lie between port {n} and 65535"),
        ),
        (Some(IntOrString::String(name)), end) => {
            if !is_port_name(name) {
                bad(
                    &format!("{field}.port"),
                    format!("{name:?} is neither a port number nor a port name (1–15 lower-case letters, digits, '-')"),
                );
            }
            if end.is_some() {
                bad(
                    &format!("{field}.endPort"),
                    "endPort needs a numbered port, not a named one".into(),
                );
            }
        }
        (None, Some(_)) => bad(
            &format!("{field}.endPort"),
            "endPort needs port (the first port of the range)".into(),
        ),
        _ => {}
    }
}

/// Check `spec.isolation.egress`, reporting each problem through
/// `bad(field, message)`.
pub fn check_egress(spec: &HeteroTrainingJobSpec, bad: &mut dyn FnMut(&str, String)) {
    let iso = &spec.isolation;
    if !iso.egress.is_empty() && !iso.network_policy {
        bad(
            "spec.isolation.egress",
            "egress rules widen the job's NetworkPolicy, but networkPolicy is false (no policy, nothing isolated); set networkPolicy: true or remove egress".into(),
        );
    }
    for (i, rule) in iso.egress.iter().enumerate() {
        let field = format!("spec.isolation.egress[{i}]");
        for (j, peer) in rule.to.iter().flatten().enumerate() {
            check_peer(peer, &format!("{field}.to[{j}]"), bad);
        }
        for (k, port) in rule.ports.iter().flatten().enumerate() {
            check_port(port, &format!("{field}.ports[{k}]"), bad);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_parse_and_nest() {
        let c = |s| parse_cidr(s).unwrap();
        assert_eq!(
            parse_cidr("10.0.0.0/8"),
            Some(("10.0.0.0".parse().unwrap(), 8))
        );
        for bad in [
            "10.0.0.0",
            "10.0.0.0/33",
            "10.0.0/8",
            "fd00::/129",
            "x/1",
            "",
        ] {
            assert_eq!(parse_cidr(bad), None, "{bad}");
        }
        assert!(cidr_contains(c("10.0.0.0/8"), c("10.1.2.0/24")));
        assert!(!cidr_contains(c("10.0.0.0/8"), c("11.0.0.0/24")));
        assert!(!cidr_contains(c("10.1.0.0/16"), c("10.0.0.0/8")), "wider");
        assert!(cidr_contains(c("0.0.0.0/0"), c("192.168.1.1/32")));
        assert!(!cidr_contains(c("0.0.0.0/0"), c("fd00::/8")), "family");
        assert!(cidr_contains(c("fd00::/8"), c("fd12:3456::/32")));
        assert!(!cidr_contains(c("fd00::/8"), c("fe80::/16")));
        assert!(cidr_contains(c("127.0.0.2/32"), c("127.0.0.2/32")));
    }

    #[test]
    fn port_names() {
        for ok in ["metrics", "https", "s3-api", "h2c"] {
            assert!(is_port_name(ok), "{ok}");
        }
        for bad in [
            "",
            "443",
            "UPPER",
            "-a",
            "a-",
            "a--b",
            "averyveryverylongname",
        ] {
            assert!(!is_port_name(bad), "{bad}");
        }
    }
}
