//! Plan tests: born, read back, checked and advanced, from the job fixtures.

use std::collections::BTreeMap;

use heterotrain_crds::{BatchPlan, PlanError, PLAN_KEY};
use k8s_openapi::api::core::v1::ConfigMap;

use super::*;
use crate::testing::{fixture, valid};

fn cm(text: &str) -> ConfigMap {
    ConfigMap {
        data: Some(BTreeMap::from([(PLAN_KEY.to_string(), text.to_string())])),
        ..Default::default()
    }
}

/// Rank 0 takes 0.01 s per sample, rank 1 0.03 s.
fn profiles() -> Vec<Option<RankProfile>> {
    [0.01, 0.03]
        .into_iter()
        .map(|per| {
            Some(RankProfile {
                points: vec![(8, 8.0 * per), (16, 16.0 * per)],
                max_batch: 512,
                fixed_seconds: None,
                per_sample_seconds: None,
            })
        })
        .collect()
}

fn new_plan(batch_sizes: Vec<u32>, predicted: f64) -> NewPlan {
    NewPlan {
        batch_sizes,
        reason: "measured".into(),
        gain_percent: 12.0,
        predicted_step_seconds: predicted,
        communication_seconds: 0.01,
        policy: "dynamic",
    }
}

#[test]
fn read_keeps_the_generation_of_an_unparsable_plan() {
    let good = read(Some(&cm(&BatchPlan::equal(4, 33, 2).to_json())));
    assert!(good.exists);
    assert_eq!(good.generation, Some(4));
    assert_eq!(good.plan.map(|p| p.batch_sizes), Some(vec![17, 16]));
    let bad = read(Some(&cm(r#"{"generation": 7, "batchSizes": "lots"}"#)));
    assert!(bad.exists);
    assert_eq!(bad.plan, None);
    assert_eq!(bad.generation, Some(7));
    assert_eq!(read(None), Stored::default());
}

#[test]
fn current_is_the_stored_plan_only_when_it_fits_the_job() {
    let job = fixture("minimal.yaml");
    let v = valid(&job);
    let fits = Stored {
        exists: true,
        plan: Some(BatchPlan::equal(2, 33, 2)),
        generation: Some(2),
    };
    assert_eq!(current(&v, &fits).map(|p| p.generation), Some(2));
    for wrong in [BatchPlan::equal(2, 33, 3), BatchPlan::equal(2, 32, 2)] {
        let stored = Stored {
            exists: true,
            plan: Some(wrong),
            generation: Some(2),
        };
        assert_eq!(current(&v, &stored), None);
    }
}

#[test]
fn born_equal_and_after_an_unusable_plan() {
    let job = fixture("minimal.yaml");
    let v = valid(&job);
    let p = born(&v, None, None, None);
    assert_eq!((p.generation, p.batch_sizes.clone()), (0, vec![17, 16]));
    assert_eq!(
        (p.policy.as_str(), p.reason.as_str()),
        ("static", "equal split")
    );
    // After an unusable stored plan of generation 4: generation 5.
    assert_eq!(born(&v, None, Some(4), None).generation, 5);
    // A usable current plan is kept as it is.
    let kept = BatchPlan::equal(9, 33, 2);
    assert_eq!(born(&v, Some(&kept), Some(9), None), kept);
}

#[test]
fn current_or_equal_keeps_a_plan_and_falls_back_to_generation_0() {
    let job = fixture("minimal.yaml");
    let v = valid(&job);
    let kept = BatchPlan::equal(9, 33, 2);
    assert_eq!(current_or_equal(&v, Some(&kept)), kept);
    assert_eq!(current_or_equal(&v, None), equal(&v, 0));
}

#[test]
fn born_from_cached_profiles_unless_static() {
    let job = fixture("minimal.yaml");
    let v = valid(&job);
    let p = born(&v, None, None, Some(&profiles()));
    // t = 0.01·b0 = 0.03·b1 with b0 + b1 = 33: [25, 8] has the shorter step.
    assert_eq!(p.batch_sizes, [25, 8]);
    assert_eq!(p.generation, 0);
    assert_eq!(p.policy, "proportional");
    assert!(p.reason.starts_with("cached profiles: "), "{}", p.reason);
    // One rank without a profile: equal.
    let mut partial = profiles();
    partial[1] = None;
    assert_eq!(born(&v, None, None, Some(&partial)).batch_sizes, [17, 16]);
    // A static job never uses profiles.
    let mut fixed = job.clone();
    fixed.spec.load_balancing.policy = heterotrain_crds::BalancePolicy::Static;
    let v = valid(&fixed);
    assert_eq!(
        born(&v, None, None, Some(&profiles())).batch_sizes,
        [17, 16]
    );
}

#[test]
fn advance_bumps_the_generation_and_checks_the_split() {
    let job = fixture("minimal.yaml");
    let v = valid(&job);
    let current = BatchPlan::equal(2, 33, 2);
    let next = advance(&v, &current, new_plan(vec![20, 13], 0.5)).expect("valid");
    assert_eq!(next.generation, 3);
    assert_eq!(next.batch_sizes, [20, 13]);
    assert_eq!(next.global_batch_size, 33);
    assert_eq!(next.policy, "dynamic");
    assert_eq!(next.predicted_step_seconds, Some(0.5));
    assert_eq!(next.predicted_communication_seconds, Some(0.01));
    let mut silent = new_plan(vec![20, 13], 0.5);
    silent.communication_seconds = 0.0;
    let silent = advance(&v, &current, silent).expect("valid");
    assert_eq!(
        silent.predicted_communication_seconds, None,
        "0 = not measured"
    );
    let unknown = advance(&v, &current, new_plan(vec![20, 13], f64::NAN)).expect("valid");
    assert_eq!(unknown.predicted_step_seconds, None);
    assert_eq!(
        advance(&v, &current, new_plan(vec![20, 12], 0.5)),
        Err(PlanError::WrongSum {
            sum: 32,
            global: 33
        })
    );
    assert!(matches!(
        advance(&v, &current, new_plan(vec![33], 0.5)),
        Err(PlanError::WrongLength { .. })
    ));
}

#[test]
fn configmap_is_owned_and_named_after_the_job() {
    let job = fixture("mixed.yaml");
    let v = valid(&job);
    let cm = configmap(&v, &equal(&v, 0));
    assert_eq!(cm.metadata.name.as_deref(), Some("mixed-plan"));
    assert_eq!(cm.metadata.namespace.as_deref(), Some("research"));
    let labels = cm.metadata.labels.as_ref().expect("labels");
    assert_eq!(labels["heterotrain.dev/job"], "mixed");
    let owner = &cm.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(owner.uid, "6f1c2a9e-0000-4000-8000-000000000001");
    let back = read(Some(&cm));
    assert_eq!(back.plan.map(|p| p.batch_sizes), Some(vec![32, 32, 32]));
}

/// `minimal.yaml` (2 ranks of group `cpu`, B = 33) with a status that
/// records plan generation `generation` and the group's `batches`.
fn with_status(generation: u64, batches: &[u32]) -> heterotrain_crds::HeteroTrainingJob {
    let mut job = fixture("minimal.yaml");
    job.status = Some(heterotrain_crds::HeteroTrainingJobStatus {
        plan_generation: generation,
        groups: vec![heterotrain_crds::GroupStatus {
            name: "cpu".into(),
            batch_sizes: batches.to_vec(),
            ..Default::default()
        }],
        ..Default::default()
    });
    job
}

#[test]
fn a_lost_plan_comes_back_from_the_status_at_its_generation() {
    let job = with_status(4, &[25, 8]);
    let v = valid(&job);
    let p = from_status(&v).expect("restorable");
    assert_eq!(p.generation, 4);
    assert_eq!(p.batch_sizes, [25, 8]);
    assert_eq!(p.global_batch_size, 33);
    assert!(p.reason.contains("restored"), "{}", p.reason);
    // The next plan numbers on from it.
    let next = advance(&v, &p, new_plan(vec![20, 13], 0.5)).expect("valid");
    assert_eq!(next.generation, 5);
    // Nothing to restore: no status, no batches yet, or batches that no
    // longer fit the job (B changed).
    assert_eq!(from_status(&valid(&fixture("minimal.yaml"))), None);
    assert_eq!(from_status(&valid(&with_status(0, &[]))), None);
    assert_eq!(from_status(&valid(&with_status(4, &[25, 7]))), None);
    assert_eq!(from_status(&valid(&with_status(4, &[33]))), None);
}

#[test]
fn a_new_plan_numbers_after_the_generation_the_status_saw() {
    // The ConfigMap is gone and the status cannot be restored from (its
    // batches no longer sum to B): the new plan still outnumbers the
    // generation the trainers last saw, so they accept it.
    let job = with_status(6, &[30, 2]);
    let v = valid(&job);
    assert_eq!(born(&v, None, None, None).generation, 7);
    assert_eq!(born(&v, None, Some(9), None).generation, 10);
    assert_eq!(
        born(&valid(&fixture("minimal.yaml")), None, None, None).generation,
        0
    );
}
