//! `heterotrain-demo` (`make demo`): the whole system on this machine; the
//! work is in `heterotrain_e2e::demo`.

use std::path::PathBuf;

use clap::Parser;
use heterotrain_e2e::demo;

#[derive(Parser)]
#[command(
    name = "heterotrain-demo",
    version,
    about = "Run HeteroTrain end to end on this machine",
    long_about = "Starts (or reuses) the local control plane `demo` with three simulated \
nodes of different speed and the operator, trains examples/quickstart.yaml with dynamic \
balancing while showing a live table, then trains the same job with the equal split on \
the same nodes and prints the throughput and held-out accuracy of both. A job whose \
dataset names a claim gets it filled from `make setup`'s datasets (digits-mnist, \
digits-cifar10, pystdlib-bytes). The cluster stays up; `--down` stops it."
)]
struct Cli {
    /// Stop the demo cluster and exit.
    #[arg(long)]
    down: bool,
    /// Nodes file for the simulated nodes.
    #[arg(long, default_value = "e2e/nodes/demo.yaml")]
    nodes: PathBuf,
    /// The job to run.
    #[arg(long, default_value = "examples/quickstart.yaml")]
    job: PathBuf,
    /// Namespace for the demo's jobs.
    #[arg(long, default_value = "demo")]
    namespace: String,
    /// Skip the equal-split comparison run.
    #[arg(long)]
    no_baseline: bool,
    /// Name of the local control plane to start, reuse or stop (its state
    /// lives under the cache by this name).
    #[arg(long, default_value = "demo")]
    cluster: String,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let result = if cli.down {
        demo::down(&cli.cluster)
    } else {
        demo::run(&demo::Options {
            nodes: cli.nodes,
            job: cli.job,
            namespace: cli.namespace,
            baseline: !cli.no_baseline,
            cluster: cli.cluster,
        })
        .await
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
