use super::*;

use crate::cli::train_args as cfg;

fn fp(args: &[&str]) -> Fingerprint {
    Fingerprint::of(&cfg(args), 1000)
}

fn weights(v: f32) -> Vec<(String, Tensor)> {
    vec![("fc.weight".to_string(), Tensor::from_slice(&[v, 2.0]))]
}

fn momentum() -> Vec<(String, Tensor)> {
    vec![(
        "momentum.fc.weight".to_string(),
        Tensor::from_slice(&[0.5f32, 0.5]),
    )]
}

/// Save a checkpoint at `step` whose first weight is `step` (plan B = 8, 2 ranks).
fn save_at(dir: &Path, step: u64, fingerprint: &Fingerprint) {
    let plan = BatchPlan::equal(0, 8, 2);
    let s = Snapshot {
        step,
        position: SamplerPosition {
            epoch: 0,
            step_in_epoch: step,
        },
        seed: 1,
        shuffle: true,
        optimizer_steps: step,
        plan: &plan,
        model: "mlp",
        fingerprint,
        weights: &weights(step as f32),
        optimizer: &momentum(),
    };
    save(dir, &s).unwrap();
}

fn target() -> Vec<(String, Tensor)> {
    vec![(
        "fc.weight".to_string(),
        Tensor::zeros([2], tch::kind::FLOAT_CPU),
    )]
}

/// Resume with `run`, loading into `t`; the resumed step.
fn resume_step(dir: &Path, run: &Fingerprint, t: &[(String, Tensor)]) -> Option<u64> {
    resume(dir, run, |m| load_into(dir, &m.weights, t)).map(|m| m.step)
}

fn steps_on_disk(dir: &Path) -> Vec<u64> {
    manifests(dir).into_iter().map(|(s, _)| s).collect()
}

#[test]
fn fingerprint_records_the_runs_meaning() {
    let f = fp(&[
        "--model",
        "gpt",
        "--dataset",
        "synthetic_text",
        "--hidden",
        "64",
        "--layers",
        "3",
        "--heads",
        "8",
        "--context",
        "32",
        "--vocab",
        "100",
        "--batch-size",
        "48",
        "--optimizer",
        "adamw",
        "--world-size",
        "4",
        "--job-uid",
        "6f1c2a9e",
    ]);
    let want = Fingerprint {
        model: "gpt".into(),
        hidden: Some(64),
        resnet_width: None,
        layers: Some(3),
        heads: Some(8),
        context: Some(32),
        vocab: Some(100),
        model_file: None,
        batch_size: 48,
        dataset: "synthetic_text".into(),
        train_samples: 1000,
        optimizer: "adamw".into(),
        world_size: 4,
        job_uid: Some("6f1c2a9e".into()),
    };
    assert_eq!(f, want);
    // Readable JSON with camelCase names; round trip.
    let v = serde_json::to_value(&f).unwrap();
    assert_eq!(v["batchSize"], 48);
    assert_eq!(v["jobUid"], "6f1c2a9e");
    assert_eq!(serde_json::from_value::<Fingerprint>(v).unwrap(), f);
    assert_eq!(f.hash().len(), 16);
    assert_ne!(f.hash(), fp(&[]).hash());
}

#[test]
fn flags_a_model_does_not_use_are_not_part_of_it() {
    let a = fp(&["--model", "mlp", "--hidden", "32", "--layers", "2"]);
    let b = fp(&["--model", "mlp", "--hidden", "32", "--layers", "7"]);
    assert_eq!(a, b);
    assert_eq!(a.layers, None);
    let r1 = fp(&["--model", "resnet18", "--hidden", "32"]);
    let r2 = fp(&["--model", "resnet18", "--hidden", "64"]);
    assert!(r1.differences(&r2).is_empty());
    assert_eq!(r1.hidden, None);
    // An empty UID (unset env in a template) is no UID.
    assert_eq!(fp(&["--job-uid", ""]).job_uid, None);
}

#[test]
fn differences_name_each_changed_field() {
    let base = fp(&["--batch-size", "32"]);
    assert!(base.differences(&base.clone()).is_empty());

    let d = base.differences(&fp(&["--batch-size", "64"]));
    assert_eq!(
        d,
        [Difference {
            field: "batch size",
            checkpoint: "32".into(),
            run: "64".into()
        }]
    );
    assert_eq!(d[0].to_string(), "batch size 32 ≠ 64");

    let other = fp(&[
        "--batch-size",
        "32",
        "--hidden",
        "48",
        "--optimizer",
        "adamw",
        "--world-size",
        "2",
        "--job-uid",
        "abc",
    ]);
    let fields: Vec<&str> = base.differences(&other).iter().map(|d| d.field).collect();
    assert_eq!(
        fields,
        ["hidden width", "optimizer", "world size", "job UID"]
    );
    let uid = base.differences(&other).pop().unwrap();
    assert_eq!(uid.to_string(), "job UID none ≠ abc");

    let mut data = base.clone();
    data.train_samples = 999;
    data.dataset = "mnist".into();
    let fields: Vec<&str> = data.differences(&base).iter().map(|d| d.field).collect();
    assert_eq!(fields, ["dataset", "train samples"]);

    let gpt = fp(&[
        "--model",
        "gpt",
        "--dataset",
        "synthetic_text",
        "--batch-size",
        "32",
    ]);
    let fields: Vec<&str> = base.differences(&gpt).iter().map(|d| d.field).collect();
    assert_eq!(
        fields,
        ["model", "layers", "heads", "context", "vocab", "dataset"]
    );
}

#[test]
fn version_1_manifests_are_checked_by_what_they_record() {
    let v1 = serde_json::json!({
        "version": 1,
        "step": 40,
        "position": {"epoch": 0, "step_in_epoch": 40},
        "seed": 0,
        "shuffle": true,
        "optimizerSteps": 40,
        "plan": BatchPlan::equal(3, 64, 2),
        "model": "mlp",
        "weights": {"name": "w", "bytes": 1, "sha256": "00"},
        "optimizer": {"name": "o", "bytes": 1, "sha256": "00"},
    });
    let m: Manifest = serde_json::from_value(v1).unwrap();
    assert_eq!(m.fingerprint, None);
    let run = fp(&["--batch-size", "64", "--world-size", "2"]);
    assert_eq!(m.belongs_to(&run), Belongs::Unchecked);
    let Belongs::No(d) = m.belongs_to(&fp(&["--batch-size", "32", "--world-size", "2"])) else {
        panic!("batch size differs")
    };
    assert_eq!(d[0].to_string(), "batch size 64 ≠ 32");
    let Belongs::No(d) = m.belongs_to(&fp(&[
        "--model",
        "simple_cnn",
        "--batch-size",
        "64",
        "--world-size",
        "3",
    ])) else {
        panic!("model and world size differ")
    };
    let fields: Vec<&str> = d.iter().map(|d| d.field).collect();
    assert_eq!(fields, ["model", "world size"]);
}

#[test]
fn resume_skips_a_truncated_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = fp(&[]);
    for step in [5, 10, 15, 20] {
        save_at(dir.path(), step, &run);
    }
    assert_eq!(steps_on_disk(dir.path()), [20, 15, 10], "old ones pruned");
    let newest = dir.path().join("ckpt-0000000020.model.safetensors");
    let len = std::fs::metadata(&newest).unwrap().len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap();
    f.set_len(len / 2).unwrap();
    let t = target();
    assert_eq!(resume_step(dir.path(), &run, &t), Some(15));
    assert_eq!(t[0].1.double_value(&[0]), 15.0);
    assert_eq!(t[0].1.double_value(&[1]), 2.0);
}

#[test]
fn resume_skips_other_runs_and_pruning_leaves_them_alone() {
    let dir = tempfile::tempdir().unwrap();
    let old = fp(&["--batch-size", "32"]);
    let run = fp(&["--batch-size", "64"]);
    for step in [30, 35, 40] {
        save_at(dir.path(), step, &old);
    }
    let t = target();
    assert_eq!(resume_step(dir.path(), &run, &t), None);
    assert_eq!(t[0].1.double_value(&[0]), 0.0, "nothing loaded");
    // The new run's checkpoints (lower steps) are kept and counted on
    // their own; the other run's stay.
    for step in [5, 10, 15, 20] {
        save_at(dir.path(), step, &run);
    }
    assert_eq!(steps_on_disk(dir.path()), [40, 35, 30, 20, 15, 10]);
    assert_eq!(resume_step(dir.path(), &run, &t), Some(20));
    assert_eq!(resume_step(dir.path(), &old, &t), Some(40));
    assert_eq!(t[0].1.double_value(&[0]), 40.0);
}

#[test]
fn an_earlier_run_is_continued_only_when_all_but_its_uid_match() {
    let dir = tempfile::tempdir().unwrap();
    let first = fp(&["--batch-size", "64", "--job-uid", "first"]);
    let second = fp(&["--batch-size", "64", "--job-uid", "second"]);
    for step in [20, 40] {
        save_at(dir.path(), step, &first);
    }
    let t = target();
    // Another job UID: not this run's own checkpoint.
    assert_eq!(resume_step(dir.path(), &second, &t), None);
    // As an earlier run: the newest one, loaded.
    let got = resume_earlier(dir.path(), &second, |m| {
        load_into(dir.path(), &m.weights, &t)
    });
    assert_eq!(got.map(|m| m.step), Some(40));
    assert_eq!(t[0].1.double_value(&[0]), 40.0);
    // Any other difference still refuses it.
    let other_batch = fp(&["--batch-size", "32", "--job-uid", "second"]);
    let t = target();
    let got = resume_earlier(dir.path(), &other_batch, |m| {
        load_into(dir.path(), &m.weights, &t)
    });
    assert_eq!(got, None);
    assert_eq!(t[0].1.double_value(&[0]), 0.0, "nothing loaded");
}

#[test]
fn resume_falls_back_when_loading_fails() {
    let dir = tempfile::tempdir().unwrap();
    let run = fp(&[]);
    for step in [10, 15, 20] {
        save_at(dir.path(), step, &run);
    }
    // Step 20: the weights have another shape (checksums fixed up, so
    // only loading can notice).
    let st = stem(20);
    let wrong = vec![(
        "fc.weight".to_string(),
        Tensor::from_slice(&[9.0f32, 9.0, 9.0]),
    )];
    let entry = write_tensors(dir.path(), &format!("{st}.model.safetensors"), &wrong).unwrap();
    let mpath = dir.path().join(format!("{st}.json"));
    let mut m = read_manifest(&mpath).unwrap();
    m.weights = entry;
    std::fs::write(&mpath, serde_json::to_string(&m).unwrap()).unwrap();
    // Step 15: not safetensors at all (checksums fixed up too).
    let st = stem(15);
    let garbage = dir.path().join(format!("{st}.model.safetensors"));
    std::fs::write(&garbage, b"not a safetensors file").unwrap();
    let (bytes, sha256) = sha256_file(&garbage).unwrap();
    let mpath = dir.path().join(format!("{st}.json"));
    let mut m = read_manifest(&mpath).unwrap();
    m.weights.bytes = bytes;
    m.weights.sha256 = sha256;
    std::fs::write(&mpath, serde_json::to_string(&m).unwrap()).unwrap();

    let t = target();
    let mut tried = Vec::new();
    let got = resume(dir.path(), &run, |m| {
        tried.push(m.step);
        load_into(dir.path(), &m.weights, &t)
    });
    assert_eq!(got.map(|m| m.step), Some(10));
    assert_eq!(tried, [20, 15, 10]);
    assert_eq!(t[0].1.double_value(&[0]), 10.0);
}

#[test]
fn a_failed_load_leaves_the_targets_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let run = fp(&[]);
    save_at(dir.path(), 5, &run);
    let m = read_manifest(&dir.path().join("ckpt-0000000005.json")).unwrap();
    let w = target();
    // The optimizer file lacks this tensor: the weights (first file)
    // must not be copied either.
    let o = vec![(
        "exp_avg.fc.weight".to_string(),
        Tensor::zeros([2], tch::kind::FLOAT_CPU),
    )];
    let err = load_files(dir.path(), &[(&m.weights, &w), (&m.optimizer, &o)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("no tensor exp_avg.fc.weight"), "{err}");
    assert_eq!(w[0].1.double_value(&[0]), 0.0);
    let o = vec![(
        "momentum.fc.weight".to_string(),
        Tensor::zeros([2], tch::kind::FLOAT_CPU),
    )];
    load_files(dir.path(), &[(&m.weights, &w), (&m.optimizer, &o)]).unwrap();
    assert_eq!(w[0].1.double_value(&[0]), 5.0);
    assert_eq!(o[0].1.double_value(&[0]), 0.5);
}

#[test]
fn a_manifest_naming_a_file_outside_its_directory_is_skipped() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ckpt");
    std::fs::create_dir(&dir).unwrap();
    let run = fp(&[]);
    save_at(&dir, 10, &run);
    save_at(&dir, 20, &run);
    // Move the newest weights out of the directory and point the manifest
    // at them: sizes and checksums still match.
    let name = "ckpt-0000000020.model.safetensors";
    std::fs::rename(dir.join(name), root.path().join(name)).unwrap();
    let manifest = dir.join("ckpt-0000000020.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    for outside in [
        format!("../{name}"),
        root.path().join(name).display().to_string(),
    ] {
        m["weights"]["name"] = serde_json::Value::String(outside.clone());
        std::fs::write(&manifest, m.to_string()).unwrap();
        let t = target();
        assert_eq!(resume_step(&dir, &run, &t), Some(10), "{outside}");
        assert_eq!(t[0].1.double_value(&[0]), 10.0);
    }
    assert!(is_plain_file_name(name));
    for bad in ["", ".", "..", "a/b", "/abs", "a/"] {
        assert!(!is_plain_file_name(bad), "{bad:?}");
    }
}
