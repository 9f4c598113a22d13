//! The validating admission webhook: `kubectl apply` of a job that breaks
//! a rule is refused with every problem and its field path, by the same
//! check reconcile runs ([`crate::validate::problems`]), plus the fields a
//! running gang cannot change. Reconcile keeps reporting problems as a
//! condition for jobs admitted before the webhook existed (or while it was
//! down, with `failurePolicy: Ignore`).

pub mod certs;
pub mod review;
pub mod serve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use tokio::net::TcpListener;

use crate::context::Context;
use certs::CertDir;
use serve::Certs;

/// How often the certificate files are checked for a rotation and the
/// caBundle for a reset.
const REFRESH: Duration = Duration::from_secs(30);

/// Where the serving certificate comes from.
#[derive(Clone, Debug)]
pub enum CertSource {
    /// `tls.crt` and `tls.key` in a directory a certificate manager keeps.
    Files(PathBuf),
    /// Made by the operator, kept in Secret `secret` of `namespace`, for
    /// Service `service`; its CA written into ValidatingWebhookConfiguration
    /// `configuration`.
    SelfSigned {
        namespace: String,
        secret: String,
        service: String,
        configuration: String,
    },
}

/// The webhook's address and certificate.
#[derive(Clone, Debug)]
pub struct Options {
    pub addr: SocketAddr,
    pub certs: CertSource,
}

/// Get the certificate (retrying a few times: the API server may be
/// starting too), then serve reviews on `opts.addr` until the process
/// ends, keeping the certificate and the caBundle current. `/readyz` fails
/// until the webhook serves with a certificate the API server trusts.
pub async fn run(ctx: Arc<Context>, opts: Options) -> Result<()> {
    let listener = TcpListener::bind(opts.addr)
        .await
        .with_context(|| format!("binding the webhook on {}", opts.addr))?;
    let certs = Arc::new(Certs::default());
    match opts.certs {
        CertSource::Files(dir) => from_files(&dir, &certs)?,
        CertSource::SelfSigned {
            namespace,
            secret,
            service,
            configuration,
        } => {
            let at = SelfSignedAt {
                namespace,
                secret,
                service,
                configuration,
            };
            self_signed(&ctx, at, &certs).await?
        }
    }
    tracing::info!(addr = %opts.addr, path = serve::PATH, "serving the admission webhook");
    ctx.webhook_pending
        .store(false, std::sync::atomic::Ordering::SeqCst);
    serve::serve(listener, certs, ctx).await
}

/// Serves the certificate in `dir`, and a rotated one within [`REFRESH`].
fn from_files(dir: &std::path::Path, certs: &Arc<Certs>) -> Result<()> {
    let mut files = CertDir::new(dir);
    if let Some((cert, key)) = files.changed()? {
        certs.set(&cert, &key)?;
    }
    let certs = Arc::clone(certs);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(REFRESH).await;
            match files.changed() {
                Ok(Some((cert, key))) => match certs.set(&cert, &key) {
                    Ok(()) => tracing::info!("webhook: serving the rotated certificate"),
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"), "webhook: the rotated certificate is unusable; keeping the old one")
                    }
                },
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "webhook: reading the certificate files")
                }
            }
        }
    });
    Ok(())
}

/// Where a self-signed certificate is kept and announced.
struct SelfSignedAt {
    namespace: String,
    secret: String,
    service: String,
    configuration: String,
}

/// Serves the self-signed certificate kept in a Secret (made when there is
/// none), once the API server trusts it: the caBundle of the webhook
/// configuration is written, and kept there.
async fn self_signed(ctx: &Context, at: SelfSignedAt, certs: &Certs) -> Result<()> {
    let SelfSignedAt {
        namespace,
        secret,
        service,
        configuration,
    } = at;
    let names = certs::service_names(&service, &namespace);
    let mut tries = 0;
    let pem = loop {
        match certs::ensure_secret(&ctx.client, &namespace, &secret, &names).await {
            Ok(p) => break p,
            Err(e) if tries < 5 => {
                tries += 1;
                tracing::warn!(error = %format!("{e:#}"), "webhook: getting the certificate; retrying");
                tokio::time::sleep(Duration::from_secs(2 * tries)).await;
            }
            Err(e) => return Err(e),
        }
    };
    certs.set(&pem.cert, &pem.key)?;
    // Ready (for `/readyz`) once the API server can trust us; then
    // keep the caBundle there.
    let mut tries = 0;
    while let Err(e) = certs::ensure_ca_bundle(&ctx.client, &configuration, &pem.ca).await {
        if tries >= 5 {
            return Err(e);
        }
        tries += 1;
        tracing::warn!(error = %format!("{e:#}"), "webhook: writing the caBundle; retrying");
        tokio::time::sleep(Duration::from_secs(2 * tries)).await;
    }
    let client = ctx.client.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(REFRESH).await;
            match certs::ensure_ca_bundle(&client, &configuration, &pem.ca).await {
                Ok(true) => {
                    tracing::info!(configuration = %configuration, "webhook: wrote the caBundle again")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "webhook: the caBundle")
                }
            }
        }
    });
    Ok(())
}
