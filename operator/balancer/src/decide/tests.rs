//! Table tests of the decision's stages, each on its own typed values.

use super::judge::{damping, hysteresis, Hysteresis};
use super::{initial, Verdict};
use crate::{Balancer, BalancerConfig, Policy};

fn balancer(policy: Policy, global: u32, ranks: usize) -> Balancer {
    let cfg = BalancerConfig {
        policy,
        global_batch_size: global,
        ..BalancerConfig::default()
    };
    Balancer::new(cfg, ranks).expect("valid config")
}

/// `n` steps of every rank at `plan`, compute time `c_r · b_r`.
fn feed(bal: &mut Balancer, plan: &[u32], c: &[f64], n: usize) {
    for _ in 0..n {
        for (r, (&b, &c)) in plan.iter().zip(c).enumerate() {
            bal.observe_step(r, b, c * f64::from(b))
                .expect("valid sample");
        }
    }
}

#[test]
fn hysteresis_table() {
    use Hysteresis::*;
    // (gain, threshold, climbing) → verdict
    let table = [
        (-1.0, 5.0, false, Keep),
        (0.0, 5.0, true, Keep),
        (4.9, 5.0, false, Keep),
        (4.9, 5.0, true, Climbs),
        (5.0, 5.0, false, Clears),
        (12.0, 5.0, true, Clears),
    ];
    for (gain, threshold, climbing, want) in table {
        assert_eq!(
            hysteresis(gain, threshold, climbing),
            want,
            "gain {gain}, threshold {threshold}, climbing {climbing}"
        );
    }
}

#[test]
fn damping_table() {
    let cfg = BalancerConfig {
        window: 20,
        min_damping: 0.25,
        ..BalancerConfig::default()
    };
    // (young ranks with their samples) → share of the way
    let table: [(&[(usize, u64)], f64); 4] = [
        (&[], 1.0),
        (&[(1, 5)], 0.5),
        (&[(1, 8), (2, 3)], 0.3),
        (&[(2, 1)], 0.25),
    ];
    for (young, want) in table {
        let got = damping(young, &cfg);
        assert!((got - want).abs() < 1e-12, "{young:?}: {got} != {want}");
    }
}

#[test]
fn frame_finds_an_unusable_plan_the_models_and_the_silent_ranks() {
    let c = [0.002, 0.004, 0.004];
    let mut bal = balancer(Policy::Dynamic, 120, 3);
    // (current plan, why it is unusable)
    let table: [(&[u32], Option<&str>); 3] = [
        (&[40, 40, 40], None),
        (&[40, 40], Some("2 entries for 3 ranks")),
        (&[40, 40, 41], Some("sums to 121")),
    ];
    for (current, problem) in table {
        let frame = bal.frame(current);
        match problem {
            None => assert_eq!(frame.cur.as_deref(), Some(current)),
            Some(word) => {
                assert!(frame.cur.is_none(), "{current:?} kept");
                let p = frame.problem.clone().unwrap_or_default();
                assert!(p.contains(word), "{current:?}: {p}");
            }
        }
        assert!(frame.no_data, "no rank has reported yet");
    }
    feed(&mut bal, &[40, 40, 40], &c, 10);
    let frame = bal.frame(&[40, 40, 40]);
    assert!(!frame.no_data);
    assert_eq!(frame.pm.known, 3);
    assert!(
        (frame.current_pred - 0.16).abs() < 1e-9,
        "{}",
        frame.current_pred
    );
    assert_eq!(frame.unknown_note, "");
    // Nobody reports after the first decision: at the second decision
    // missed (staleAfterDecisions 2), every rank is stale.
    let plan = bal
        .decide(&[40, 40, 40])
        .expect("decide")
        .batches_or(&[40, 40, 40])
        .to_vec();
    assert!(bal.frame(&plan).stale.is_empty());
    let _ = bal.decide(&plan).expect("decide");
    assert_eq!(bal.frame(&plan).stale, vec![0, 1, 2]);
}

#[test]
fn choose_then_judge_on_measured_speeds() {
    let c = [0.002, 0.004, 0.004];
    let mut bal = balancer(Policy::Dynamic, 120, 3);
    feed(&mut bal, &[40, 40, 40], &c, 10);
    let mut frame = bal.frame(&[40, 40, 40]);
    let observed = bal.observe(&mut frame);
    assert!(observed.readmit.is_empty() && observed.current_out.is_empty());
    let chosen = bal.choose(&frame, &observed).expect("a split");
    assert_eq!(chosen.plan, vec![60, 30, 30]);
    assert!((chosen.predicted - 0.12).abs() < 1e-9);
    assert!(bal
        .readmission(&frame, &observed, &chosen, &[40, 40, 40])
        .is_none());
    assert!(bal
        .trial(&frame, &observed, &chosen, &[40, 40, 40])
        .is_none());
    let v = bal.judge(&frame, &observed, chosen, &[40, 40, 40]);
    assert_eq!(v.plan, Some(vec![60, 30, 30]));
    assert!((v.gain - 25.0).abs() < 1e-9, "{v:?}");
    assert!(v
        .reason
        .starts_with("dynamic: predicted step 0.1200s vs 0.1600s now"));
    // The same split judged from where it is: kept.
    let mut frame = bal.frame(&[60, 30, 30]);
    let observed = bal.observe(&mut frame);
    let chosen = bal.choose(&frame, &observed).expect("a split");
    let v = bal.judge(&frame, &observed, chosen, &[60, 30, 30]);
    assert_eq!(
        v,
        Verdict::keep(
            v.predicted,
            0.0,
            "dynamic: the current plan is already optimal".into()
        )
    );
}

#[test]
fn initial_plan_says_why_and_takes_the_split() {
    let mut bal = balancer(Policy::Proportional, 9, 2);
    let mut frame = bal.frame(&[]);
    let observed = bal.observe(&mut frame);
    let chosen = bal.choose(&frame, &observed).expect("a split");
    let v = initial(&frame, chosen);
    assert_eq!(v.plan, Some(vec![5, 4]));
    assert!(
        v.reason.starts_with("proportional: new plan because")
            && v.reason.contains("no measurements yet: equal split"),
        "{}",
        v.reason
    );
}
