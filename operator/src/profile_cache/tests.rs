//! Tests of the profile cache: keys, hardware classes, lookups.
use super::*;

#[test]
fn a_torchscript_key_names_its_file() {
    let mut m: ModelSpec =
        serde_json::from_value(serde_json::json!({"name": "torchscript", "file": "/data/a.pt"}))
            .expect("model");
    let g: WorkerGroup =
        serde_json::from_value(serde_json::json!({"name": "gpu", "replicas": 1, "device": "cuda"}))
            .expect("group");
    let a = key("ml", "H100", &g, Some(&m));
    assert_eq!(a, "ml.H100_cuda_t1_torchscript.f_data_a.pt");
    m.file = Some("/data/b.pt".into());
    assert_ne!(key("ml", "H100", &g, Some(&m)), a);
}

#[test]
fn keys_tell_namespaces_and_threads_apart() {
    let m: ModelSpec = serde_json::from_value(serde_json::json!({"name": "mlp"})).expect("model");
    let group = |threads: u32| -> WorkerGroup {
        serde_json::from_value(
            serde_json::json!({"name": "cpu", "replicas": 1, "threads": threads}),
        )
        .expect("group")
    };
    let a = key("team-a", "acc-xeon", &group(2), Some(&m));
    assert_ne!(a, key("team-b", "acc-xeon", &group(2), Some(&m)));
    assert_ne!(a, key("team-a", "acc-xeon", &group(4), Some(&m)));
    assert_eq!(a, key("team-a", "acc-xeon", &group(2), Some(&m)));
    // A job of commands without a model has its own entries.
    assert_eq!(
        key("team-a", "acc-xeon", &group(2), None),
        "team-a.acc-xeon_cpu_t2_command"
    );
    // A job in team-b finds none of team-a's profiles.
    let spec: HeteroTrainingJobSpec = serde_json::from_value(serde_json::json!({
        "workers": [{"name": "cpu", "replicas": 2, "threads": 2,
                     "nodeSelector": {"heterotrain.dev/accelerator": "xeon"}}],
        "model": {"name": "mlp"},
        "dataset": {"name": "synthetic_image"},
        "training": {"globalBatchSize": 32, "maxSteps": 10}
    }))
    .expect("spec");
    let cache = BTreeMap::from([(
        a,
        CachedProfile {
            points: vec![(8, 0.1)],
            max_batch: 64,
            stored_at: 1,
        },
    )]);
    assert_eq!(lookup("team-a", &spec, &cache).map(|p| p.len()), Some(2));
    assert_eq!(lookup("team-b", &spec, &cache), None);
}

#[test]
fn hardware_is_told_apart_by_the_most_specific_label() {
    let l = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let nfd = [
        (labels::NFD_CPU_MODEL[0], "GenuineIntel"),
        (labels::NFD_CPU_MODEL[1], "6"),
        (labels::NFD_CPU_MODEL[2], "143"),
    ];
    let gpu = (labels::GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3");
    let generic = (labels::ACCELERATOR, "cpu");
    // Two CPU nodes labelled only `accelerator: cpu` are not told
    // apart, so nothing is cached for them (the old false sharing).
    assert_eq!(hardware_class(&l(&[generic]), Device::Cpu), None);
    assert_eq!(
        hardware_class(&l(&[(labels::ACCELERATOR, "gpu")]), Device::Cuda),
        None
    );
    assert_eq!(
        hardware_class(&l(&[generic, nfd[0], nfd[1], nfd[2]]), Device::Cpu).as_deref(),
        Some("cpu-GenuineIntel-6-143")
    );
    // An incomplete NFD model is no model.
    assert_eq!(hardware_class(&l(&[nfd[0], nfd[1]]), Device::Cpu), None);
    // The GPU names a CUDA rank's hardware, not a CPU rank's on the same node.
    assert_eq!(
        hardware_class(&l(&[gpu, nfd[0], nfd[1], nfd[2]]), Device::Cuda).as_deref(),
        Some("gpu-NVIDIA-H100-80GB-HBM3")
    );
    assert_eq!(
        hardware_class(&l(&[gpu, nfd[0], nfd[1], nfd[2]]), Device::Cpu).as_deref(),
        Some("cpu-GenuineIntel-6-143")
    );
    assert_eq!(hardware_class(&l(&[gpu]), Device::Cpu), None);
    // The cloud's instance type, then the administrator's node type, win.
    let inst = (labels::INSTANCE_TYPE, "m7i.4xlarge");
    assert_eq!(
        hardware_class(&l(&[gpu, inst]), Device::Cuda).as_deref(),
        Some("inst-m7i.4xlarge")
    );
    assert_eq!(
        hardware_class(&l(&[gpu, inst, (labels::NODE_TYPE, "dgx-a")]), Device::Cuda).as_deref(),
        Some("type-dgx-a")
    );
    assert_eq!(
        hardware_class(&l(&[(labels::ACCELERATOR, "xeon")]), Device::Cpu).as_deref(),
        Some("acc-xeon")
    );
}

#[test]
fn the_oldest_profiles_are_dropped_past_the_bound() {
    let mut merged: BTreeMap<String, u64> = (0..MAX_ENTRIES as u64)
        .map(|i| (format!("k{i:04}"), 100 + i))
        .collect();
    assert!(evictions(&merged).is_empty());
    merged.insert("new-1".into(), 10_000);
    merged.insert("new-2".into(), 10_000);
    merged.insert("legacy".into(), 0);
    assert_eq!(evictions(&merged), ["legacy", "k0000", "k0001"]);
}
