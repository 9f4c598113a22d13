use heterotrain_crds::{GangScheduler, HeteroTrainingJob, SchedulingPolicy};
use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::build::{desired, BuildInputs, Desired};
use crate::testing::{fixture, valid};
use crate::validate::{self, Checked};

const ALL: Served = Served {
    volcano: true,
    scheduler_plugins: true,
    kueue: true,
};
const NONE: Served = Served {
    volcano: false,
    scheduler_plugins: false,
    kueue: false,
};

fn policy(gang: GangScheduler, queue: Option<&str>) -> SchedulingPolicy {
    SchedulingPolicy {
        gang_scheduler: gang,
        queue: queue.map(String::from),
        ..Default::default()
    }
}

#[test]
fn auto_takes_the_first_served_and_explicit_takes_its_own() {
    use GangScheduler as G;
    let q = Some("team-a");
    assert_eq!(choose(&policy(G::Auto, q), ALL), Ok(Some(Wiring::Volcano)));
    let no_volcano = Served {
        volcano: false,
        ..ALL
    };
    assert_eq!(
        choose(&policy(G::Auto, q), no_volcano),
        Ok(Some(Wiring::SchedulerPlugins))
    );
    let kueue_only = Served {
        kueue: true,
        ..NONE
    };
    assert_eq!(
        choose(&policy(G::Auto, q), kueue_only),
        Ok(Some(Wiring::Kueue))
    );
    // Kueue admits by queue: without one, Auto does not pick it.
    assert!(choose(&policy(G::Auto, None), kueue_only).is_err());
    assert_eq!(choose(&policy(G::Kueue, q), ALL), Ok(Some(Wiring::Kueue)));
    assert_eq!(
        choose(&policy(G::SchedulerPlugins, None), ALL),
        Ok(Some(Wiring::SchedulerPlugins))
    );
    assert_eq!(choose(&policy(G::None, q), ALL), Ok(None));
    assert_eq!(choose(&policy(G::None, q), NONE), Ok(None));
    for g in [G::Auto, G::Volcano, G::SchedulerPlugins, G::Kueue] {
        let why = choose(&policy(g, q), NONE).expect_err("nothing served");
        assert!(why.contains("pod by pod"), "{why}");
    }
    let why = choose(&policy(G::Volcano, q), kueue_only).expect_err("no Volcano");
    assert!(why.contains(VOLCANO_API), "{why}");
}

fn job_with(policy: Option<SchedulingPolicy>) -> HeteroTrainingJob {
    let mut job = fixture("minimal.yaml");
    job.spec.run_policy.scheduling_policy = policy;
    job
}

fn build(job: &HeteroTrainingJob, gang: Option<Wiring>) -> Desired {
    let inputs = BuildInputs {
        default_image: "default/trainer:1".into(),
        restart_count: 0,
        metrics_from: vec![],
        gang,
    };
    desired(&valid(job), &inputs).expect("build")
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

#[test]
fn volcano_gets_a_pod_group_and_pods_pointing_at_it() {
    let job = job_with(Some(SchedulingPolicy {
        gang_scheduler: GangScheduler::Auto,
        queue: Some("research".into()),
        priority_class: Some("high".into()),
        ..Default::default()
    }));
    let d = build(&job, Some(Wiring::Volcano));
    let (api, group) = d.pod_group.expect("a PodGroup");
    assert_eq!(api.api_version, VOLCANO_API);
    assert_eq!(api.kind, "PodGroup");
    assert_eq!(group.metadata.name.as_deref(), Some("small"));
    assert_eq!(group.metadata.namespace.as_deref(), Some("default"));
    let owner = &group.metadata.owner_references.as_ref().expect("owned")[0];
    assert_eq!(owner.uid, "6f1c2a9e-0000-4000-8000-000000000002");
    assert_eq!(group.data["spec"]["minMember"], 2, "every rank by default");
    assert_eq!(group.data["spec"]["queue"], "research");
    assert_eq!(group.data["spec"]["priorityClassName"], "high");
    assert_eq!(d.pods.len(), 2);
    for pod in &d.pods {
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.scheduler_name.as_deref(), Some("volcano"));
        assert_eq!(spec.priority_class_name.as_deref(), Some("high"));
        assert_eq!(annotation(pod, VOLCANO_GROUP_ANNOTATION), Some("small"));
        assert_eq!(label(pod, KUEUE_QUEUE_LABEL), None);
    }
}

#[test]
fn scheduler_plugins_label_the_pods_and_keep_the_named_scheduler() {
    let job = job_with(Some(SchedulingPolicy {
        scheduler_name: Some("scheduler-plugins-scheduler".into()),
        min_available: Some(1),
        ..Default::default()
    }));
    let d = build(&job, Some(Wiring::SchedulerPlugins));
    let (api, group) = d.pod_group.expect("a PodGroup");
    assert_eq!(api.api_version, SCHEDULER_PLUGINS_API);
    assert_eq!(group.data["spec"]["minMember"], 1);
    assert!(group.data["spec"].get("queue").is_none());
    for pod in &d.pods {
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(
            spec.scheduler_name.as_deref(),
            Some("scheduler-plugins-scheduler")
        );
        assert_eq!(label(pod, SCHEDULER_PLUGINS_GROUP_LABEL), Some("small"));
    }
}

#[test]
fn kueue_labels_the_pods_as_one_group_and_creates_no_object() {
    let job = job_with(Some(policy(GangScheduler::Kueue, Some("team-a"))));
    let d = build(&job, Some(Wiring::Kueue));
    assert!(d.pod_group.is_none());
    for pod in &d.pods {
        assert_eq!(label(pod, KUEUE_QUEUE_LABEL), Some("team-a"));
        assert_eq!(label(pod, KUEUE_GROUP_LABEL), Some("small"));
        assert_eq!(annotation(pod, KUEUE_TOTAL_ANNOTATION), Some("2"));
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(
            spec.scheduler_name, None,
            "Kueue admits; the default scheduler places"
        );
    }
}

#[test]
fn a_group_priority_class_wins_over_the_policys() {
    let mut job = job_with(Some(SchedulingPolicy {
        priority_class: Some("high".into()),
        ..Default::default()
    }));
    job.spec.workers[0].priority_class_name = Some("own".into());
    let d = build(&job, None);
    for pod in &d.pods {
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(spec.priority_class_name.as_deref(), Some("own"));
    }
}

/// Pods without the spec-hash annotation (which covers the whole spec, the
/// policy included).
fn without_hash(pods: Vec<Pod>) -> Vec<Pod> {
    pods.into_iter()
        .map(|mut p| {
            if let Some(a) = p.metadata.annotations.as_mut() {
                a.remove(heterotrain_crds::labels::SPEC_HASH_ANNOTATION);
            }
            p
        })
        .collect()
}

#[test]
fn without_a_served_gang_scheduler_nothing_changes() {
    let plain = build(&job_with(None), None);
    let unserved = job_with(Some(policy(GangScheduler::Auto, Some("team-a"))));
    let d = build(&unserved, None);
    assert!(d.pod_group.is_none());
    assert_eq!(without_hash(d.pods), without_hash(plain.pods));
    // A job without a policy is never wired, whatever is served.
    let d = build(&job_with(None), Some(Wiring::Volcano));
    assert!(d.pod_group.is_none());
    assert_eq!(
        without_hash(d.pods),
        without_hash(build(&job_with(None), None).pods)
    );
}

fn problems(job: &HeteroTrainingJob) -> Vec<String> {
    match validate::check(job, Default::default()).expect("namespace and uid") {
        Checked::Valid(_) => vec![],
        Checked::Invalid { problems, .. } => problems.into_iter().map(|p| p.to_string()).collect(),
    }
}

#[test]
fn bad_policies_are_named() {
    let bad = |p: SchedulingPolicy| problems(&job_with(Some(p)));
    let p = bad(SchedulingPolicy {
        min_available: Some(3),
        ..Default::default()
    });
    assert!(
        p.iter()
            .any(|p| p.contains("minAvailable 3 must be between 1 and the job's 2 ranks")),
        "{p:?}"
    );
    let p = bad(policy(GangScheduler::Kueue, None));
    assert!(
        p.iter()
            .any(|p| p.contains("schedulingPolicy.queue") && p.contains("LocalQueue")),
        "{p:?}"
    );
    let p = bad(SchedulingPolicy {
        scheduler_name: Some("Volcano!".into()),
        ..Default::default()
    });
    assert!(
        p.iter()
            .any(|p| p.contains("schedulingPolicy.schedulerName")),
        "{p:?}"
    );
    let p = bad(policy(GangScheduler::Auto, Some(&"q".repeat(64))));
    assert!(p.iter().any(|p| p.contains("longer than 63")), "{p:?}");
    assert!(bad(policy(GangScheduler::Kueue, Some("team-a"))).is_empty());
}
