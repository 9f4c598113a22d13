//! The webhook's serving certificate. Either files a certificate manager
//! keeps up to date (`--webhook-cert-dir`: `tls.crt`, `tls.key`, reread when
//! they change), or self-signed: a CA and a serving certificate for the
//! webhook Service's names, made once by whichever replica comes first,
//! kept in a Secret every replica reads, with the CA written into the
//! ValidatingWebhookConfiguration's `caBundle` (and written again if
//! something, such as `helm upgrade`, clears it).

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{anyhow, bail, Context, Result};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use kube::Client;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A serving certificate, its key and the CA that signed it (PEM).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pem {
    pub cert: String,
    pub key: String,
    pub ca: String,
}

/// Annotation on the Secret: the names its certificate was made for.
pub const NAMES_ANNOTATION: &str = "heterotrain.dev/webhook-names";
/// How long a self-signed certificate is valid.
const VALID_DAYS: i64 = 5 * 365;

/// The names the API server may use for Service `service` in `namespace`.
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ]
}

fn named(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn
}

/// A fresh CA and a serving certificate for `names` (ECDSA P-256).
pub fn self_signed(names: &[String]) -> Result<Pem> {
    // A minute back: a clock a little behind ours still takes it as valid.
    let now = time::OffsetDateTime::now_utc() - time::Duration::minutes(1);
    let until = now + time::Duration::days(VALID_DAYS);
    let ca_key = KeyPair::generate().context("generating the webhook CA key")?;
    let mut ca = CertificateParams::default();
    ca.distinguished_name = named("heterotrain-webhook-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = now;
    ca.not_after = until;
    let ca_cert = ca
        .self_signed(&ca_key)
        .context("self-signing the webhook CA")?;
    let key = KeyPair::generate().context("generating the webhook key")?;
    let mut leaf = CertificateParams::new(names.to_vec()).context("the webhook's names")?;
    leaf.distinguished_name = named(names.first().map_or("heterotrain-webhook", |n| n.as_str()));
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.not_before = now;
    leaf.not_after = until;
    let cert = leaf
        .signed_by(&key, &ca_cert, &ca_key)
        .context("signing the webhook certificate")?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
        ca: ca_cert.pem(),
    })
}

/// The certificate kept in `secret`, when complete and made for `names`.
pub fn pem_of(secret: &Secret, names: &[String]) -> Option<Pem> {
    let made_for = secret
        .metadata
        .annotations
        .as_ref()?
        .get(NAMES_ANNOTATION)?;
    if *made_for != names.join(",") {
        return None;
    }
    let data = secret.data.as_ref()?;
    let text = |k: &str| {
        data.get(k)
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .filter(|s| !s.is_empty())
    };
    Some(Pem {
        cert: text("tls.crt")?,
        key: text("tls.key")?,
        ca: text("ca.crt")?,
    })
}

fn fill(secret: &mut Secret, pem: &Pem, names: &[String]) {
    secret
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(NAMES_ANNOTATION.into(), names.join(","));
    let data = secret.data.get_or_insert_with(Default::default);
    for (k, v) in [
        ("tls.crt", &pem.cert),
        ("tls.key", &pem.key),
        ("ca.crt", &pem.ca),
    ] {
        data.insert(k.into(), ByteString(v.as_bytes().to_vec()));
    }
}

/// The self-signed certificate for `names` from Secret `name` in
/// `namespace`: the one there when it is complete and made for these names,
/// else a new one written there. Replicas starting together race on the
/// write; the loser (a conflict) reads the winner's.
pub async fn ensure_secret(
    client: &Client,
    namespace: &str,
    name: &str,
    names: &[String],
) -> Result<Pem> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for _ in 0..5 {
        let existing = api
            .get_opt(name)
            .await
            .with_context(|| format!("reading Secret {namespace}/{name}"))?;
        if let Some(pem) = existing.as_ref().and_then(|s| pem_of(s, names)) {
            return Ok(pem);
        }
        let pem = self_signed(names)?;
        let written = match existing {
            Some(mut s) => {
                fill(&mut s, &pem, names);
                api.replace(name, &PostParams::default(), &s).await
            }
            None => {
                let mut s = Secret::default();
                s.metadata.name = Some(name.into());
                fill(&mut s, &pem, names);
                api.create(&PostParams::default(), &s).await
            }
        };
        match written {
            Ok(_) => {
                tracing::info!(secret = %format!("{namespace}/{name}"), "made the webhook's self-signed certificate");
                return Ok(pem);
            }
            // Another replica wrote first: read theirs.
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(e) => {
                return Err(anyhow!(e)).with_context(|| format!("writing Secret {namespace}/{name} (the chart creates it and lets the operator update it)"))
            }
        }
    }
    bail!("Secret {namespace}/{name} kept changing under the operator")
}

/// Write `ca` into every webhook of configuration `name` whose `caBundle`
/// differs. Returns whether anything was written.
pub async fn ensure_ca_bundle(client: &Client, name: &str, ca: &str) -> Result<bool> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mut cfg = api
        .get(name)
        .await
        .with_context(|| format!("reading ValidatingWebhookConfiguration {name}"))?;
    let want = ByteString(ca.as_bytes().to_vec());
    let mut changed = false;
    for w in cfg.webhooks.iter_mut().flatten() {
        if w.client_config.ca_bundle.as_ref() != Some(&want) {
            w.client_config.ca_bundle = Some(want.clone());
            changed = true;
        }
    }
    if changed {
        api.replace(name, &PostParams::default(), &cfg)
            .await
            .with_context(|| {
                format!("writing the caBundle of ValidatingWebhookConfiguration {name}")
            })?;
    }
    Ok(changed)
}

/// Certificate files a certificate manager keeps: `tls.crt` and `tls.key`
/// in a directory, with when they were last read.
#[derive(Debug)]
pub struct CertDir {
    dir: PathBuf,
    seen: Option<(SystemTime, SystemTime)>,
}

impl CertDir {
    pub fn new(dir: &Path) -> CertDir {
        CertDir {
            dir: dir.to_path_buf(),
            seen: None,
        }
    }

    fn mtimes(&self) -> Option<(SystemTime, SystemTime)> {
        let m = |f: &str| {
            std::fs::metadata(self.dir.join(f))
                .and_then(|m| m.modified())
                .ok()
        };
        Some((m("tls.crt")?, m("tls.key")?))
    }

    /// The certificate and key when they changed since the last call (or on
    /// the first); `None` while unchanged.
    pub fn changed(&mut self) -> Result<Option<(String, String)>> {
        let now = self.mtimes();
        if now.is_some() && now == self.seen {
            return Ok(None);
        }
        let read = |f: &str| {
            std::fs::read_to_string(self.dir.join(f))
                .with_context(|| format!("reading {}", self.dir.join(f).display()))
        };
        let pair = (read("tls.crt")?, read("tls.key")?);
        self.seen = now;
        Ok(Some(pair))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_certificate_is_kept_only_for_its_names() {
        let names = service_names("hw", "sys");
        let pem = self_signed(&names).unwrap();
        let mut s = Secret::default();
        assert_eq!(pem_of(&s, &names), None, "an empty Secret holds nothing");
        fill(&mut s, &pem, &names);
        assert_eq!(pem_of(&s, &names), Some(pem));
        assert_eq!(pem_of(&s, &service_names("hw", "other")), None);
    }

    #[test]
    fn cert_files_are_reread_when_they_change() {
        let dir = std::env::temp_dir().join(format!("ht-certdir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tls.crt"), "one").unwrap();
        std::fs::write(dir.join("tls.key"), "k").unwrap();
        let mut d = CertDir::new(&dir);
        assert_eq!(d.changed().unwrap(), Some(("one".into(), "k".into())));
        assert_eq!(d.changed().unwrap(), None);
        // A rotation replaces the files (a later modification time).
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(dir.join("tls.crt"), "two").unwrap();
        assert_eq!(d.changed().unwrap(), Some(("two".into(), "k".into())));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
