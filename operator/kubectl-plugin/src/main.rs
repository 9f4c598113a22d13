//! `kubectl-heterotrain` (used as `kubectl heterotrain ...`): status, a live
//! view, plan history and hardware profiles of HeteroTrainingJobs.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use k8s_openapi::jiff::Timestamp;
use kubectl_heterotrain::{fetch, render, JobView};

/// Inspect HeteroTrain jobs: groups, ranks, batches, throughput, balance and plans.
#[derive(Parser, Debug)]
#[command(name = "kubectl heterotrain", version)]
struct Cli {
    /// Namespace of the job (default: the kubeconfig context's namespace).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// Kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the
    /// in-cluster ServiceAccount).
    #[arg(long, global = true, value_name = "FILE")]
    kubeconfig: Option<std::path::PathBuf>,
    /// Kubeconfig context (default: the current context).
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// The jobs of the namespace (or all, -A), as `kubectl get htj` shows
    /// them; `-o wide` adds restarts, balance and the last decision.
    #[command(visible_alias = "ls")]
    List {
        /// Every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        #[arg(short = 'o', long, value_enum, default_value = "table")]
        output: render::Output,
    },
    /// One job, as `list` shows it (`-o json|yaml`: the object itself).
    Get {
        job: String,
        #[arg(short = 'o', long, value_enum, default_value = "table")]
        output: render::Output,
    },
    /// Groups, ranks, nodes, batches, samples/s, plan generation, balance, last decisions.
    Status { job: String },
    /// `status`, redrawn every --interval seconds (Ctrl-C to leave).
    Top {
        job: String,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 2.0)]
        interval: f64,
        /// Draw once and exit.
        #[arg(long)]
        once: bool,
    },
    /// The plan in use and the history of plan decisions.
    Plan { job: String },
    /// Hardware comparison of the job's ranks (profiles).
    Profile {
        job: String,
        /// Namespace of the operator (its profile cache).
        #[arg(
            long,
            env = "HETEROTRAIN_OPERATOR_NAMESPACE",
            default_value = "heterotrain-system"
        )]
        operator_namespace: String,
        /// Do not read the ranks' live profile gauges from their /metrics
        /// (read through the API server's pod proxy: needs `get pods/proxy`).
        #[arg(long)]
        no_live: bool,
        /// Seconds to wait for one rank's live gauges before showing its
        /// cached profile instead.
        #[arg(long, value_name = "SECONDS", default_value_t = fetch::LIVE_TIMEOUT.as_secs_f64())]
        live_timeout: f64,
    },
}

/// A client from `kubeconfig` (else the usual places) and `context` (else
/// the current one).
async fn client(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> anyhow::Result<kube::Client> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options).await
        }
        None if context.is_some() => kube::Config::from_kubeconfig(&options).await,
        None => {
            return kube::Client::try_default()
                .await
                .context("connecting to Kubernetes (KUBECONFIG / current context)")
        }
    }
    .with_context(|| match context {
        Some(c) => format!("kubeconfig context {c:?}"),
        None => "kubeconfig".to_string(),
    })?;
    kube::Client::try_from(config).context("connecting to Kubernetes")
}

/// The job `job` in `ns`, fetched and drawn by `draw` as of now.
async fn view(
    client: &kube::Client,
    ns: &str,
    job: &str,
    draw: fn(&JobView, Timestamp) -> String,
) -> anyhow::Result<String> {
    let v = fetch::job_view(client, ns, job).await?;
    Ok(draw(&v, Timestamp::now()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let client = client(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?;
    let ns = cli
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let mut stdout = std::io::stdout();
    match cli.command {
        Cmd::List {
            all_namespaces,
            output,
        } => {
            let jobs = fetch::jobs(&client, (!all_namespaces).then_some(ns.as_str())).await?;
            print!(
                "{}",
                render::jobs(&jobs, output, all_namespaces, Timestamp::now())
            );
        }
        Cmd::Get { job, output } => {
            let j = fetch::job(&client, &ns, &job).await?;
            let text = match output {
                o @ (render::Output::Json | render::Output::Yaml) => render::serialized(&j, o),
                o => render::jobs(&[j], o, false, Timestamp::now()),
            };
            print!("{text}");
        }
        Cmd::Status { job } => print!("{}", view(&client, &ns, &job, render::status).await?),
        Cmd::Top {
            job,
            interval,
            once,
        } => {
            let every = Duration::try_from_secs_f64(interval)
                .ok()
                .filter(|d| !d.is_zero())
                .context("--interval must be a positive number of seconds")?;
            loop {
                let text = match view(&client, &ns, &job, render::status).await {
                    Ok(text) => text,
                    Err(e) if !once => format!("{e:#}\n"),
                    Err(e) => return Err(e),
                };
                if once {
                    print!("{text}");
                    break;
                }
                // Clear the screen and draw from the top, like top(1).
                let _ = write!(
                    stdout,
                    "\x1b[H\x1b[2J{} every {interval}s: {job} in {ns}\n\n{text}",
                    Timestamp::now().strftime("%H:%M:%S")
                );
                let _ = stdout.flush();
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = tokio::signal::ctrl_c() => break,
                }
            }
        }
        Cmd::Plan { job } => print!("{}", view(&client, &ns, &job, render::plan_history).await?),
        Cmd::Profile {
            job,
            operator_namespace,
            no_live,
            live_timeout,
        } => {
            let live_timeout = Duration::try_from_secs_f64(live_timeout)
                .ok()
                .filter(|d| !d.is_zero())
                .context("--live-timeout must be a positive number of seconds")?;
            let v = fetch::job_view(&client, &ns, &job).await?;
            let cache = match fetch::profile_cache(&client, &operator_namespace).await {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("warning: {e:#}");
                    BTreeMap::new()
                }
            };
            let mut live = BTreeMap::new();
            if !no_live {
                let port = v.job.spec.metrics_port;
                for rank in 0..v.job.spec.world_size() {
                    let running = v.pod_of(rank).filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    });
                    if let Some(pod) = running.and_then(|p| p.metadata.name.as_deref()) {
                        if let Some(p) =
                            fetch::live_profile(&client, &ns, pod, port, live_timeout).await
                        {
                            live.insert(rank, p);
                        }
                    }
                }
            }
            print!("{}", render::profile(&v, &cache, &live));
        }
    }
    Ok(())
}
