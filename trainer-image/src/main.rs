//! `heterotrain-trainer`: parses flags, runs the subcommand, maps errors to
//! a one-line `error: rank <r>: ...` and a non-zero exit code.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::Parser;
use heterotrain_trainer::cli::{Cli, Command};
use heterotrain_trainer::{data, profile, train};

fn main() {
    let cli = Cli::parse();
    let rank = match &cli.command {
        Command::Train(cfg) | Command::Profile(cfg) => cfg.dist.rank,
    };
    // A panic (tch panics on out-of-memory and shape errors) is reported
    // like every other error: one line, exit 1.
    std::panic::set_hook(Box::new(move |info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        // libtorch's messages carry a C++ stack, escaped ("\\n") inside
        // tch's error text: keep the first line of it.
        let what = what.lines().next().unwrap_or("panic");
        let what = what.split("\\n").next().unwrap_or(what).to_string();
        let at = info
            .location()
            .map(|l| format!(" ({}:{})", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("error: rank {rank}: internal error: {what}{at}");
    }));
    if std::panic::catch_unwind(move || run(cli)).is_err() {
        std::process::exit(1);
    }
}

fn run(cli: Cli) {
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
                            cfg.dist.rank, s.steps
                        );
                        note_stop(s.steps);
                    } else {
                        note_finished(s.steps);
                    }
                }
                Err(e) => {
                    eprintln!("error: rank {}: {e}", cfg.dist.rank);
                    std::process::exit(1);
                }
            }
        }
        Command::Profile(cfg) => {
            if let Err(e) = run_profile(&cfg) {
                eprintln!("error: rank {}: {e}", cfg.dist.rank);
                std::process::exit(1);
            }
        }
    }
}

/// In a pod, say in the termination message that this exit 0 is a stop on
/// SIGTERM, not the end of training: the operator then recreates the gang
/// without counting it toward `backoffLimit`.
fn note_stop(steps: u64) {
    termination_message(&format!(
        "{} after step {steps}, checkpoint written",
        heterotrain_crds::STOPPED_BY_SIGNAL
    ));
}

/// In a pod, say in the termination message at which step training ended,
/// so the job's `status.step` is right even when it ended before the
/// operator read any rank's metrics.
fn note_finished(steps: u64) {
    termination_message(&format!("{} {steps}", heterotrain_crds::FINISHED_AT_STEP));
}

/// Write the container's termination message (`/dev/termination-log`, where
/// the kubelet provides one; outside a pod there is none and nothing is
/// written).
fn termination_message(note: &str) {
    let path = std::path::Path::new("/dev/termination-log");
    if !path.exists() {
        return;
    }
    if let Err(e) = std::fs::write(path, note) {
        eprintln!("warning: cannot write {}: {e}", path.display());
    }
}

/// `heterotrain-trainer profile`: measure, print the profile JSON on stdout.
fn run_profile(cfg: &heterotrain_trainer::cli::TrainerArgs) -> heterotrain_trainer::Result<()> {
    use heterotrain_trainer::TrainerError;
    heterotrain_trainer::cli::validate(cfg).map_err(TrainerError::Config)?;
    train::apply_threads(&cfg.dist);
    let device = train::pick_device(&cfg.dist)?;
    let gpu = train::open_gpu(device);
    let data = data::load(&cfg.data, data::Needs::of(cfg))?;
    let p = profile::measure(cfg, device, &data, gpu.as_ref(), None)?;
    let text = serde_json::to_string_pretty(&p)
        .map_err(|e| TrainerError::Config(format!("cannot encode the profile: {e}")))?;
    println!("{text}");
    Ok(())
}
