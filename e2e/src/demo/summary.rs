//! The comparison printed after the runs.

use std::time::Instant;

use heterotrain_crds::HeteroTrainingJob;

use super::job::dataset_label;
use super::run::RunResult;

fn accuracy_text(a: Option<(f64, Option<u64>)>) -> String {
    match a {
        Some((a, Some(n))) => format!("{:.1}% of {n}", a * 100.0),
        Some((a, None)) => format!("{:.1}%", a * 100.0),
        None => "(no evaluation reported)".into(),
    }
}

/// Print the balanced run against the equal split (when it ran).
pub fn print(
    job: &HeteroTrainingJob,
    balanced: &RunResult,
    equal: Option<&RunResult>,
    t0: Instant,
) {
    println!("\n==> summary");
    println!("  ranks on nodes:           {:?}", balanced.nodes);
    println!("  final balanced plan:      {:?}", balanced.final_plan);
    println!(
        "  balanced throughput:      {:.1} samples/s (steady state)",
        balanced.steady_samples_per_second
    );
    if let Some(e) = equal {
        println!(
            "  equal-split throughput:   {:.1} samples/s (steady state)",
            e.steady_samples_per_second
        );
        if e.steady_samples_per_second > 0.0 {
            println!(
                "  speed-up:                 {:.2}x",
                balanced.steady_samples_per_second / e.steady_samples_per_second
            );
        }
    }
    match balanced.converge {
        Some(d) => println!("  time to final plan:       {d:.1?} after the first step"),
        None => println!("  time to final plan:       plan never changed"),
    }
    let note = if job
        .spec
        .dataset
        .as_ref()
        .is_some_and(|d| d.name.from_files())
    {
        format!(" ({})", dataset_label(job))
    } else {
        " (synthetic data with random labels: chance level)".to_string()
    };
    println!(
        "  held-out accuracy:        {} balanced{}{note}",
        accuracy_text(balanced.accuracy),
        equal
            .map(|e| format!(", {} equal split", accuracy_text(e.accuracy)))
            .unwrap_or_default()
    );
    println!(
        "  wall time:                {:.0?} (balanced run {:.0?})",
        t0.elapsed(),
        balanced.elapsed
    );
}
