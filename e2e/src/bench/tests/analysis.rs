use super::*;
use crate::bench::propagation::*;

fn rec(rank: usize, step: u64, gen: u64, b: u32, compute: f64, secs: f64, end: f64) -> StepRec {
    StepRec {
        rank,
        step,
        generation: gen,
        batch_size: b,
        global_batch_size: 64,
        global_loss: 1.0 / step as f64,
        compute_seconds: compute,
        allreduce_seconds: secs - compute,
        optimizer_seconds: 0.01,
        optimizer_elements: 100,
        step_seconds: secs,
        unix_seconds: end,
    }
}

/// Two ranks; the first 10 steps take 1 s (equal split, rank 1 slow),
/// then a new plan makes steps take 0.5 s.
fn run() -> Vec<Vec<StepRec>> {
    let mut r0 = Vec::new();
    let mut r1 = Vec::new();
    let mut t = 1000.0;
    for step in 1..=30u64 {
        let (gen, secs, b0, c0, c1) = if step <= 10 {
            (0, 1.0, 32, 0.3, 0.9)
        } else {
            (1, 0.5, 48, 0.45, 0.45)
        };
        t += secs;
        r0.push(rec(0, step, gen, b0, c0, secs, t));
        r1.push(rec(1, step, gen, 64 - b0, c1, secs, t));
    }
    vec![r0, r1]
}

#[test]
fn parses_logs_skipping_noise_and_keeping_restarted_steps_once() {
    let text = concat!(
        r#"{"event":"step","rank":0,"step":1,"generation":0,"batch_size":32,"global_batch_size":64,"loss":1,"global_loss":2.0,"lr":0.1,"compute_seconds":0.1,"step_seconds":0.2,"unix_seconds":10.0}"#,
        "\nnot json\n",
        r#"{"event":"profile","x":1}"#,
        "\n",
        r#"{"event":"step","rank":0,"step":1,"generation":1,"batch_size":40,"global_batch_size":64,"global_loss":1.5,"compute_seconds":0.1,"step_seconds":0.2,"unix_seconds":20.0}"#,
        "\n",
        r#"{"event":"eval","rank":0,"step":1,"epoch":0,"eval_loss":0.5,"eval_accuracy":0.75,"eval_samples":10}"#,
    );
    let (steps, evals) = parse_rank_log(text);
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].batch_size, 40, "the later record of a step wins");
    assert_eq!(
        evals,
        vec![EvalRec {
            step: 1,
            eval_loss: 0.5,
            eval_accuracy: 0.75
        }]
    );
}

#[test]
fn summary_measures_steady_rate_convergence_and_balance() {
    let steps = cluster_steps(&run());
    assert_eq!(steps.len(), 30);
    let s = summarise(&steps, &[]);
    // Steady state = steps 16..=30, 0.5 s each → 128 samples/s.
    assert!((s.samples_per_second - 128.0).abs() < 1e-9, "{s:?}");
    // Rolling 10-step rate first ≥ 0.95 × 128 when the window holds ≤ 0 slow steps
    // beyond what 121.6 allows: window rate = 640 / (k·1 + (10−k)·0.5) ≥ 121.6 → k = 0.
    assert_eq!(s.steps_to_95, Some(20));
    assert_eq!(s.plan_changes, 1);
    assert_eq!(s.final_plan, vec![48, 16]);
    assert!(s.balance_cv_percent.abs() < 1e-9);
    let early = summarise(&steps[..10], &[]);
    // CV of (0.3, 0.9): sd 0.3 / mean 0.6 = 50%.
    assert!((early.balance_cv_percent - 50.0).abs() < 1e-6);
}

#[test]
fn step_records_carry_the_time_split() {
    let line = r#"{"event":"step","rank":1,"step":3,"generation":0,"batch_size":32,"global_batch_size":64,"data_seconds":0.01,"forward_seconds":0.02,"backward_seconds":0.03,"allreduce_seconds":0.04,"optimizer_seconds":0.005,"compute_seconds":0.065,"step_seconds":0.11,"optimizer_elements":1234,"unix_seconds":10.0}"#;
    let (steps, _) = parse_rank_log(line);
    assert_eq!(steps.len(), 1);
    assert!((steps[0].allreduce_seconds - 0.04).abs() < 1e-12);
    assert!((steps[0].optimizer_seconds - 0.005).abs() < 1e-12);
    assert_eq!(steps[0].optimizer_elements, 1234);
    let cs = cluster_steps(&[steps.clone(), steps]);
    assert_eq!(cs[0].allreduce_seconds, vec![0.04, 0.04]);
    assert_eq!(cs[0].optimizer_elements, vec![1234, 1234]);
}

#[test]
fn runs_side_by_side_are_measured_while_all_of_them_step() {
    // Run a: 30 steps from t = 0, of 1 s (64 samples/s) in [5, 15] and of
    // 0.5 s (128 samples/s) before and after; run b: 10 steps of 1 s in
    // [5, 15], the window in which both step.
    let step = |i: u64, start: f64, secs: f64| ClusterStep {
        step: i,
        start,
        end: start + secs,
        seconds: secs,
        longest_rank_seconds: secs,
        global_batch: 64,
        generation: 0,
        batches: vec![64],
        compute_seconds: vec![secs],
        allreduce_seconds: vec![0.0],
        optimizer_seconds: vec![0.0],
        optimizer_elements: vec![1],
        loss: 1.0,
    };
    let mut a = Vec::new();
    let mut t = 0.0;
    for i in 1..=30 {
        let secs = if (5.0..15.0).contains(&t) { 1.0 } else { 0.5 };
        a.push(step(i, t, secs));
        t += secs;
    }
    let b: Vec<ClusterStep> = (1..=10).map(|i| step(i, 4.0 + i as f64, 1.0)).collect();
    let r = overlap_rates(&[a.clone(), b]);
    assert!((r[0] - 64.0).abs() < 1e-9, "{r:?}");
    assert!((r[1] - 64.0).abs() < 1e-9, "{r:?}");
    // Alone, run a's steady state (its last 15 steps: 5 slow, 10 fast).
    assert!((overlap_rates(&[a])[0] - 96.0).abs() < 1e-9);
}

#[test]
fn recovery_splits_phases_and_times_the_return() {
    let steps = cluster_steps(&run());
    // "Throttle" at the end of step 5 (t = 1005), restore at t = 1012.5
    // (end of step 15). Throttled-phase steps: 6..=15.
    let r = recovery(&steps, 1005.0, 1012.5, 120.0);
    assert!((r.before_samples_per_second - 64.0).abs() < 1e-9);
    assert!((r.throttled_samples_per_second - 128.0).abs() < 1e-9);
    assert!((r.restored_samples_per_second - 128.0).abs() < 1e-9);
    // Rolling 10 over steps 6..=15 (5 × 1 s + 5 × 0.5 s): 640 / 7.5 = 85 < 114.
    assert_eq!(r.seconds_to_ideal_95, None);
    assert_eq!(r.plan_changes_throttled, 1);
    // A lower ideal is reached once the window is all fast steps... the
    // window is the whole phase here, so reached at its last step.
    let low = recovery(&steps, 1005.0, 1012.5, 80.0);
    assert_eq!(low.seconds_to_ideal_95, Some(7.5));
}

#[test]
fn propagation_latency_is_write_to_first_step_of_all_ranks() {
    let mut ranks = run();
    // Rank 1 only switched one step later.
    ranks[1][10].generation = 0;
    // Step 11 starts at 1010.0 on rank 0 and step 12 at 1010.5 on rank 1.
    let l = propagation_latencies(&ranks, &[(1, 1009.8), (2, 1020.0)]);
    assert_eq!(l.len(), 1, "generation 2 was never run");
    assert!((l[0] - 0.7).abs() < 1e-9, "{l:?}");
}

#[test]
fn operator_log_plan_writes() {
    let log = "2026-11-22T23:40:01.500000Z  INFO heterotrain_operator::rebalance: plan generation 3: batches [40, 24]; predicted gain 12.0%; x job=bench-a\n\
               \x1b[2m2026-11-22T23:40:02.000000Z\x1b[0m \x1b[32m INFO\x1b[0m plan generation 4: batches [1]; job=other\n\
               2026-11-22T23:40:03Z INFO something else job=bench-a\n";
    let w = plan_writes(log, "bench-a");
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].0, 3);
    assert!((w[0].1 - parse_rfc3339("2026-11-22T23:40:01.5Z").unwrap()).abs() < 1e-6);
    assert!(
        plan_writes(log, "bench").is_empty(),
        "a prefix is not the job"
    );
    let coloured = plan_writes(log, "other");
    assert_eq!(coloured.len(), 1);
    assert_eq!(parse_rfc3339("1970-01-02T00:00:01Z"), Some(86_401.0));
    assert_eq!(parse_rfc3339("2000-03-01T00:00:00Z"), Some(951_868_800.0));
    assert_eq!(parse_rfc3339("2000-13-01T00:00:00Z"), None);
}

#[test]
fn quantiles_and_cv() {
    let xs: Vec<f64> = (1..=100).map(f64::from).collect();
    assert_eq!(quantile(&xs, 0.5), Some(50.0));
    assert_eq!(quantile(&xs, 0.99), Some(99.0));
    assert_eq!(quantile(&[], 0.5), None);
    assert_eq!(cv(&[1.0, 1.0]), 0.0);
}

/// Two ranks in lockstep, 1 s a step, except that rank 1 records step 3
/// 0.3 s late (descheduled, say) and so starts step 4 late, and rank 0 waits
/// for it inside step 4; after step 6 both pause 2 s (evaluation). The
/// union of the step intervals is the wall time less the pause; the
/// longest rank's step time (the measure before) counts the 0.3 s twice:
/// in rank 1's step 3 and in rank 0's step 4.
#[test]
fn the_step_time_is_the_wall_time_some_rank_trains() {
    let (mut r0, mut r1) = (Vec::new(), Vec::new());
    let mut end = 100.0;
    for step in 1..=10u64 {
        end += if step == 7 { 3.0 } else { 1.0 };
        match step {
            3 => {
                r0.push(rec(0, step, 0, 32, 0.5, 1.0, end));
                r1.push(rec(1, step, 0, 32, 0.9, 1.3, end + 0.3));
                end += 0.3;
            }
            4 => {
                r0.push(rec(0, step, 0, 32, 0.5, 1.3, end));
                r1.push(rec(1, step, 0, 32, 0.9, 1.0, end));
            }
            _ => {
                r0.push(rec(0, step, 0, 32, 0.5, 1.0, end));
                r1.push(rec(1, step, 0, 32, 0.9, 1.0, end));
            }
        }
    }
    // A rank alone (the ideals): its own step times, pauses left out.
    for (c, r) in cluster_steps(std::slice::from_ref(&r0)).iter().zip(&r0) {
        assert!((c.seconds - r.step_seconds).abs() < 1e-9, "{c:?}");
    }
    let cs = cluster_steps(&[r0, r1]);
    let wall = cs[9].end - cs[0].start;
    assert!((wall - 12.3).abs() < 1e-9, "{wall}");
    let trained: f64 = cs.iter().map(|s| s.seconds).sum();
    assert!((trained - 10.3).abs() < 1e-9, "{trained}: {cs:?}");
    let seconds: Vec<f64> = cs
        .iter()
        .map(|s| (s.seconds * 10.0).round() / 10.0)
        .collect();
    assert_eq!(seconds, [1.0, 1.0, 1.3, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
    let longest: f64 = cs.iter().map(|s| s.longest_rank_seconds).sum();
    assert!((longest - 10.6).abs() < 1e-9, "{longest}");
    assert!((rate_over(&cs) - 640.0 / 10.3).abs() < 1e-9);
    assert!((rate_over_longest_rank(&cs) - 640.0 / 10.6).abs() < 1e-9);
    // The summary's steady state (steps 6–10) has no late rank.
    let s = summarise(&cs, &[]);
    assert_eq!(s.samples_per_second, s.samples_per_second_longest_rank);
}
