//! `heterotrain-trainer`: parses flags, runs the subcommand, maps errors to
//! a one-line `error: rank <r>: ...` and a non-zero exit code.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Parser;
use heterotrain_trainer::cli::{Cli, Command};
use heterotrain_trainer::train;

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Train(cfg) => {
            let stop = Arc::new(AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
                if let Err(e) = signal_hook::flag::register(sig, Arc::clone(&stop)) {
                    eprintln!("warning: cannot handle signal {sig}: {e}");
                }
            }
            match train::run(&cfg, stop) {
                Ok(s) => {
                    if s.stopped_by_signal {
                        eprintln!(
                            "rank {}: stopped by signal after step {}, checkpoint written",
                            cfg.rank, s.steps
                        );
                    }
                }
                Err(e) => {
                    eprintln!("error: rank {}: {e}", cfg.rank);
                    std::process::exit(1);
                }
            }
        }
    }
}
