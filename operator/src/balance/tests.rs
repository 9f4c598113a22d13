//! Unit tests of the balancer adapter.

use super::*;
use heterotrain_crds::HeteroTrainingJob;

fn spec(batch_norm: &str) -> HeteroTrainingJobSpec {
    let yaml = format!(
        r#"
apiVersion: heterotrain.dev/v1alpha1
kind: HeteroTrainingJob
metadata: {{name: job, namespace: ns}}
spec:
  workers: [{{name: cpu, replicas: 2}}]
  model: {{name: resnet18}}
  dataset: {{name: synthetic_image}}
  training: {{globalBatchSize: 32, maxSteps: 5, batchNorm: {batch_norm}}}
"#
    );
    let job: HeteroTrainingJob = serde_yaml::from_str(&yaml).expect("job");
    job.spec
}

/// Rank 1 is 200× slower: with every rank in, the best split gives it
/// one sample, which per-rank BatchNorm cannot use; the balancer is
/// floored at 2 then. (Left to itself, it leaves rank 1 out.)
fn decide_with_a_very_slow_rank(batch_norm: &str, leave_out: bool) -> Vec<u32> {
    let mut s = spec(batch_norm);
    s.load_balancing.leave_out_slow_ranks = leave_out;
    let mut b = Balancer::new(config_of(&s, Policy::Dynamic, 8), 2).expect("balancer");
    for batch in [8u32, 16, 24, 8, 16, 24] {
        let n = f64::from(batch);
        b.observe_step(0, batch, 0.001 * n).expect("observe");
        b.observe_step(1, batch, 0.2 * n).expect("observe");
    }
    b.decide(&[16, 16])
        .expect("decide")
        .plan
        .expect("a new plan")
}

#[test]
fn local_batch_norm_floors_the_split_at_two() {
    assert_eq!(spec("local").effective_min_local_batch(), 2);
    assert_eq!(spec("sync").effective_min_local_batch(), 1);
    let synced = decide_with_a_very_slow_rank("sync", false);
    assert_eq!(synced, vec![31, 1], "sync may give a rank one sample");
    let local = decide_with_a_very_slow_rank("local", false);
    assert_eq!(local, vec![30, 2], "local BatchNorm keeps 2 per rank");
    // One sample at 0.2 s is 6× rank 0's whole step: rank 1 is left out.
    for bn in ["sync", "local"] {
        assert_eq!(decide_with_a_very_slow_rank(bn, true), vec![32, 0], "{bn}");
    }
}

#[test]
fn config_maps_the_leave_out_settings() {
    let c = config_of(&spec("sync"), Policy::Dynamic, 8);
    assert!(c.leave_out_slow_ranks);
    assert_eq!(c.leave_out_margin_percent, 10);
    assert_eq!(c.readmit_after_decisions, 20);
    let mut s = spec("sync");
    s.load_balancing.leave_out_slow_ranks = false;
    s.load_balancing.leave_out_margin_percent = 25;
    s.load_balancing.readmit_after_decisions = 7;
    let c = config_of(&s, Policy::Hybrid, 8);
    assert!(!c.leave_out_slow_ranks);
    assert_eq!(c.leave_out_margin_percent, 25);
    assert_eq!(c.readmit_after_decisions, 7);
    // Out of the schema's range (objects it never saw): still usable.
    s.load_balancing.leave_out_margin_percent = 1000;
    s.load_balancing.readmit_after_decisions = 0;
    let c = config_of(&s, Policy::Hybrid, 8);
    assert!(c.validate().is_ok(), "{c:?}");
}

/// A left-out rank reports local batch 0: no sample, and its counters
/// restart, so the first sample after re-admission does not average in
/// the time it sat idle.
#[test]
fn a_left_out_rank_gives_no_sample_and_its_counters_restart() {
    let job = crate::testing::fixture("mixed.yaml");
    let v = crate::testing::valid(&job);
    let mut jb = JobBalancer::new(&v, 8).expect("balancer");
    let metrics = |batch: u32, steps: f64, compute: f64| RankMetrics {
        steps_total: Some(steps),
        compute_seconds_total: Some(compute),
        local_batch: Some(batch),
        ..RankMetrics::default()
    };
    assert!(
        !jb.observe(1, &metrics(8, 10.0, 1.0)),
        "first read: baseline"
    );
    assert!(jb.observe(1, &metrics(8, 20.0, 2.0)));
    assert!(!jb.observe(1, &metrics(0, 30.0, 2.0)), "left out");
    // Back in: the counters moved on, but the baseline is gone.
    assert!(!jb.observe(1, &metrics(8, 40.0, 3.0)));
    assert!(jb.observe(1, &metrics(8, 50.0, 4.0)));
}

/// Two reads on either side of a plan switch give no compute sample (their
/// steps ran two batches); the next pair within the new generation does.
#[test]
fn compute_samples_come_from_reads_of_one_generation() {
    let job = crate::testing::fixture("mixed.yaml");
    let v = crate::testing::valid(&job);
    let mut jb = JobBalancer::new(&v, 8).expect("balancer");
    let metrics = |generation: u64, batch: u32, steps: f64, compute: f64| RankMetrics {
        steps_total: Some(steps),
        compute_seconds_total: Some(compute),
        local_batch: Some(batch),
        plan_generation: Some(generation),
        ..RankMetrics::default()
    };
    assert!(!jb.observe(1, &metrics(1, 8, 10.0, 1.0)), "baseline");
    assert!(jb.observe(1, &metrics(1, 8, 20.0, 2.0)));
    assert!(
        !jb.observe(1, &metrics(2, 16, 30.0, 3.5)),
        "steps of generations 1 and 2"
    );
    assert!(jb.observe(1, &metrics(2, 16, 40.0, 5.5)));
    // Without generations (a trainer that does not export them) every
    // pair counts, as before.
    let mut jb = JobBalancer::new(&v, 8).expect("balancer");
    let plain = |steps: f64, compute: f64| RankMetrics {
        plan_generation: None,
        ..metrics(0, 8, steps, compute)
    };
    assert!(!jb.observe(1, &plain(10.0, 1.0)));
    assert!(jb.observe(1, &plain(20.0, 2.0)));
}

/// The operator turns the ranks' step and communication counters into
/// per-step communication; the least of the ranks' is what no split
/// removes.
#[test]
fn communication_per_step_comes_from_the_counters() {
    let job = crate::testing::fixture("mixed.yaml");
    let v = crate::testing::valid(&job);
    let world = v.ranks();
    let mut jb = JobBalancer::new(&v, 8).expect("balancer");
    let metrics = |steps: f64, compute: f64, comm: f64| RankMetrics {
        steps_total: Some(steps),
        compute_seconds_total: Some(compute),
        communication_seconds_total: Some(comm),
        local_batch: Some(8),
        ..RankMetrics::default()
    };
    assert_eq!(jb.communication_seconds(), 0.0);
    for r in 0..world {
        jb.observe(r, &metrics(10.0, 1.0, 1.0));
    }
    // 10 more steps: rank 0 waited 0.5 s (0.05 per step), the others 2 s.
    for r in 0..world {
        let comm = if r == 0 { 1.5 } else { 3.0 };
        jb.observe(r, &metrics(20.0, 2.0 + r as f64, comm));
    }
    assert!((jb.communication_seconds() - 0.05).abs() < 1e-12);
    // Counters that went backwards (a restarted rank) are not a sample.
    jb.observe(0, &metrics(5.0, 0.5, 0.1));
    assert!((jb.communication_seconds() - 0.05).abs() < 1e-12);
}

/// Whole step times come from the compute and communication counters,
/// only between two reads of the plan generation the last decision left
/// running: a pair of reads across a plan switch, or of an older plan,
/// gives none.
#[test]
fn step_times_count_only_within_the_generation_the_last_decision_left_running() {
    let job = crate::testing::fixture("mixed.yaml");
    let v = crate::testing::valid(&job);
    let world = v.ranks();
    let mut jb = JobBalancer::new(&v, 8).expect("balancer");
    let plan = |generation: u64| BatchPlan::equal(generation, v.global_batch, world);
    // Every rank: 0.1 s compute per step (all equally fast); 10 steps of
    // `step` seconds each since the previous read.
    let mut steps = 0.0;
    let mut total = 0.0;
    let mut read = |jb: &mut JobBalancer, generation: u64, step: f64| {
        steps += 10.0;
        total += 10.0 * step;
        for (r, &b) in plan(generation).batch_sizes.iter().enumerate() {
            jb.observe(
                r,
                &RankMetrics {
                    steps_total: Some(steps),
                    compute_seconds_total: Some(0.1 * steps),
                    communication_seconds_total: Some(total - 0.1 * steps),
                    local_batch: Some(b),
                    plan_generation: Some(generation),
                    ..RankMetrics::default()
                },
            );
        }
    };
    for _ in 0..3 {
        read(&mut jb, 4, 0.12);
    }
    let d = jb.decide(&plan(4)).expect("decide");
    assert!(d.plan.is_none(), "{}", d.reason);
    assert_eq!(d.measured_step_seconds, 0.0, "no decision before this one");
    // Generation 4 still runs: 0.15 s per step.
    for _ in 0..3 {
        read(&mut jb, 4, 0.15);
    }
    let d = jb.decide(&plan(4)).expect("decide");
    assert!(d.plan.is_none(), "{}", d.reason);
    assert!((d.measured_step_seconds - 0.15).abs() < 1e-9, "{d:?}");
    // Reads of another generation (an older plan, or one switched to
    // between two reads) give no step time.
    read(&mut jb, 3, 0.18);
    read(&mut jb, 3, 0.18);
    read(&mut jb, 4, 0.18);
    let d = jb.decide(&plan(4)).expect("decide");
    assert_eq!(d.measured_step_seconds, 0.0, "{d:?}");
}

/// The ranks' start-up link figures reach the balancer: before any live
/// communication the predicted exchange is what the job reports, and a
/// rank without figures (or figures that are not numbers) keeps the model
/// off.
#[test]
fn start_up_link_figures_give_the_communication_before_live_measurements() {
    let job = crate::testing::fixture("mixed.yaml");
    let v = crate::testing::valid(&job);
    let world = v.ranks();
    assert!(world >= 2);
    let mut jb = JobBalancer::new(&v, 8).expect("balancer");
    let with_link = |bandwidth: f64| RankMetrics {
        link: Some(crate::scrape::RankLink {
            latency_seconds: 1e-4,
            bandwidth_bytes_per_second: bandwidth,
            gradient_bytes: Some(10_000_000),
        }),
        ..RankMetrics::default()
    };
    for r in 0..world - 1 {
        jb.observe(r, &with_link(1e9));
    }
    jb.observe(world - 1, &with_link(f64::NAN));
    assert_eq!(jb.communication_seconds(), 0.0, "a rank without figures");
    jb.observe(world - 1, &with_link(1e8));
    // Ring all-reduce of 10 MB among `world` ranks over the slowest link.
    let k = world as f64;
    let expected = 1e-4 + 2.0 * (k - 1.0) / k * 1e7 / 1e8;
    assert!(
        (jb.communication_seconds() - expected).abs() < 1e-9,
        "{} vs {expected}",
        jb.communication_seconds()
    );
}
