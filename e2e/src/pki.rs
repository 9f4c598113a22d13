//! Certificates and keys for the local API server, made with `rcgen`
//! (ECDSA P-256): a CA, a serving certificate for 127.0.0.1 and the API
//! server's names, and the service-account signing key pair. (rcgen's
//! default validity, 1975–4096, suits a test bed whose state may be kept.)

use std::path::Path;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// The serving certificate's names: loopback and the `kubernetes`
/// Service's DNS names.
const SERVER_NAMES: [&str; 6] = [
    "127.0.0.1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

fn named(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

fn write(dir: &Path, name: &str, pem: &str) -> Result<()> {
    std::fs::write(dir.join(name), pem).with_context(|| format!("writing {name}"))
}

/// Create `ca.{crt,key}`, `server.{crt,key}`, `sa.{key,pub}` in `dir` unless present.
pub fn ensure_pki(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    if dir.join("server.crt").exists() && dir.join("sa.pub").exists() {
        return Ok(());
    }
    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = named("heterotrain-local-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).context("self-signing the CA")?;

    let server_key = KeyPair::generate().context("generating the server key")?;
    let mut server = CertificateParams::default();
    server.distinguished_name = named("kube-apiserver");
    server.subject_alt_names = SERVER_NAMES
        .iter()
        .map(|n| match n.parse::<std::net::IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => Ok(SanType::DnsName((*n).try_into()?)),
        })
        .collect::<Result<_, rcgen::Error>>()
        .context("the server's names")?;
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let server_cert = server
        .signed_by(&server_key, &ca_cert, &ca_key)
        .context("signing the server certificate")?;

    let sa = KeyPair::generate().context("generating the service-account key")?;
    write(dir, "ca.key", &ca_key.serialize_pem())?;
    write(dir, "ca.crt", &ca_cert.pem())?;
    write(dir, "server.key", &server_key.serialize_pem())?;
    write(dir, "server.crt", &server_cert.pem())?;
    write(dir, "sa.key", &sa.serialize_pem())?;
    // Last: its presence says the set is complete.
    write(dir, "sa.pub", &sa.public_key_pem())?;
    Ok(())
}
