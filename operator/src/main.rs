//! `heterotrain-operator`: parses flags ([`cli`]), builds a context, runs
//! the controller (with leader election), the metrics/health server and the
//! admission webhook, until SIGTERM or Ctrl-C.

mod cli;

use anyhow::Context as _;
use clap::Parser;
use heterotrain_operator::metrics::Metrics;
use heterotrain_operator::{rbac, server, webhook, Context};
use tracing_subscriber::EnvFilter;

use cli::{Cli, Cmd};

#[tokio::main]
async fn main() {
    // One line and exit 1 for every error (a lost leader Lease included:
    // the Deployment restarts the replica).
    if let Err(e) = run().await {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Cmd::Rbac) = cli.command {
        print!("{}", rbac::cluster_role_yaml());
        return Ok(());
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let webhook = cli::webhook_options(&cli)?;
    let config = cli.config()?;
    let client = kube::Client::try_default()
        .await
        .context("connecting to Kubernetes")?;
    let ctx = Context::new(client, config, Metrics::new())?;
    let (listener, addr) = server::bind(cli.http_addr)
        .await
        .context("binding the HTTP server")?;
    tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    if let Some(opts) = webhook {
        ctx.webhook_pending
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let ctx = ctx.clone();
        tokio::spawn(async move {
            if let Err(e) = webhook::run(ctx, opts).await {
                // Without its webhook the operator would look healthy while
                // every apply fails (failurePolicy Fail) or goes unchecked.
                tracing::error!(error = %format!("{e:#}"), "the admission webhook stopped");
                std::process::exit(1);
            }
        });
    }
    let (tx, rx) = tokio::sync::watch::channel(false);
    let http = tokio::spawn(server::serve(listener, ctx.clone(), {
        let mut rx = rx.clone();
        async move {
            let _ = rx.wait_for(|v| *v).await;
        }
    }));
    let res = heterotrain_operator::run(ctx, shutdown(tx)).await;
    http.abort();
    res.map_err(Into::into)
}

/// Resolves on SIGTERM or Ctrl-C, telling the HTTP server through `tx`.
async fn shutdown(tx: tokio::sync::watch::Sender<bool>) {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
    tracing::info!("shutting down");
    let _ = tx.send(true);
}
