//! Certificates and keys for the local API server, made with `openssl`:
//! a CA, a serving certificate for 127.0.0.1, and the service-account
//! signing key pair.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .context("running openssl (install it with `make setup`)")?;
    if !out.status.success() {
        bail!(
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// Create `ca.{crt,key}`, `server.{crt,key}`, `sa.{key,pub}` in `dir` unless present.
pub fn ensure_pki(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    if dir.join("server.crt").exists() && dir.join("sa.pub").exists() {
        return Ok(());
    }
    openssl(dir, &["genrsa", "-out", "ca.key", "2048"])?;
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-nodes",
            "-key",
            "ca.key",
            "-subj",
            "/CN=heterotrain-local-ca",
            "-days",
            "3650",
            "-out",
            "ca.crt",
        ],
    )?;
    openssl(dir, &["genrsa", "-out", "server.key", "2048"])?;
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-key",
            "server.key",
            "-subj",
            "/CN=kube-apiserver",
            "-out",
            "server.csr",
        ],
    )?;
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,\
         DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n\
         extendedKeyUsage=serverAuth\n",
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "3650",
            "-extfile",
            "server.ext",
        ],
    )?;
    openssl(dir, &["genrsa", "-out", "sa.key", "2048"])?;
    openssl(dir, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;
    Ok(())
}
