//! The container images' Dockerfiles, read as text: no Docker engine exists
//! here to run them (the images themselves are built without one by `make
//! images` and tested in `oci_images.rs`). Both are multi-stage, build and
//! copy exactly the workspace binaries the tests run
//! (`heterotrain-operator`, `heterotrain-trainer`), run them as non-root,
//! and use the image names the chart and the node simulator expect; the
//! trainer pins the libtorch version the `tch` crate expects.

mod support;

use std::collections::BTreeMap;
use std::process::Command;

use support::repo_root;

/// bin target name → package name, from `cargo metadata`.
fn workspace_bins() -> BTreeMap<String, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(repo_root())
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let mut bins = BTreeMap::new();
    for p in meta["packages"].as_array().expect("packages") {
        for t in p["targets"].as_array().expect("targets") {
            if t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"))
            {
                bins.insert(
                    t["name"].as_str().unwrap().to_string(),
                    p["name"].as_str().unwrap().to_string(),
                );
            }
        }
    }
    bins
}

struct Dockerfile {
    text: String,
}

impl Dockerfile {
    fn read(path: &str) -> Dockerfile {
        let text = std::fs::read_to_string(repo_root().join(path)).expect(path);
        // Join continuation lines so each instruction is one line.
        Dockerfile {
            text: text.replace("\\\n", " "),
        }
    }

    fn instructions(&self, op: &str) -> Vec<String> {
        self.text
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.strip_prefix(&format!("{op} ")))
            .map(str::to_string)
            .collect()
    }

    fn arg(&self, name: &str) -> Option<String> {
        self.instructions("ARG")
            .into_iter()
            .find_map(|a| a.strip_prefix(&format!("{name}=")).map(str::to_string))
    }

    /// Stages after the first FROM (the final one is the image).
    fn final_stage(&self) -> String {
        let idx = self.text.rfind("\nFROM ").expect("a FROM");
        self.text[idx..].to_string()
    }
}

/// `(package, bin)` of every `cargo build -p P --bin B` in the Dockerfile.
fn cargo_builds(d: &Dockerfile) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for run in d.instructions("RUN") {
        let words: Vec<&str> = run.split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            if *w == "cargo" && words.get(i + 1) == Some(&"build") {
                let after = &words[i..];
                let flag = |f: &str| {
                    after
                        .windows(2)
                        .find(|w| w[0] == f)
                        .map(|w| w[1].to_string())
                        .unwrap_or_else(|| panic!("cargo build without {f}: {run}"))
                };
                assert!(after.contains(&"--release"), "release build: {run}");
                assert!(after.contains(&"--locked"), "locked build: {run}");
                out.push((flag("-p"), flag("--bin")));
            }
        }
    }
    out
}

fn check_image(path: &str, binary: &str) -> Dockerfile {
    let d = Dockerfile::read(path);
    let bins = workspace_bins();
    assert!(d.instructions("FROM").len() >= 2, "{path}: multi-stage");
    assert!(
        d.instructions("FROM")
            .iter()
            .any(|f| f.ends_with("AS builder")),
        "{path}: a builder stage"
    );
    let builds = cargo_builds(&d);
    assert_eq!(builds.len(), 1, "{path}: one cargo build");
    let (package, bin) = &builds[0];
    assert_eq!(bin, binary, "{path}");
    assert_eq!(
        bins.get(bin),
        Some(package),
        "{path}: --bin {bin} is a bin target of package {package} in this workspace ({bins:?})"
    );
    // The runtime stage copies that binary from the builder and runs it
    // (besides the Python library's wheels, which pip installs).
    let fin = d.final_stage();
    let copies: Vec<String> = fin
        .lines()
        .filter_map(|l| l.trim().strip_prefix("COPY --from=builder "))
        .filter(|c| !c.starts_with("/out/wheels "))
        .map(str::to_string)
        .collect();
    assert_eq!(
        copies.len(),
        1,
        "{path}: the runtime stage copies one binary: {copies:?}"
    );
    let parts: Vec<&str> = copies[0].split_whitespace().collect();
    let base = |p: &str| p.rsplit('/').next().unwrap_or("").to_string();
    assert_eq!(base(parts[0]), *binary, "{path}: copies {binary}");
    let dest = parts[1];
    assert_eq!(
        base(dest),
        *binary,
        "{path}: installs it under its own name"
    );
    assert!(
        fin.contains(&format!("ENTRYPOINT [\"{dest}\"]")),
        "{path}: the entrypoint is the binary"
    );
    assert!(
        dest.starts_with("/usr/local/bin/"),
        "{path}: on PATH (pods run `{binary}` as their command)"
    );
    let user = fin
        .lines()
        .filter_map(|l| l.trim().strip_prefix("USER "))
        .next_back()
        .unwrap_or_else(|| panic!("{path}: no USER in the runtime stage"));
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("numeric USER (runAsNonRoot)");
    assert_ne!(uid, 0, "{path}: non-root");
    d
}

#[test]
fn operator_dockerfile_builds_and_runs_the_operator_binary() {
    let d = check_image("operator/Dockerfile", "heterotrain-operator");
    let runtime = d.arg("RUNTIME_IMAGE").expect("RUNTIME_IMAGE");
    assert!(
        runtime.contains("distroless/cc") && runtime.ends_with(":nonroot"),
        "{runtime}"
    );
    // The build checks the RBAC it ships with is the generated one.
    assert!(d.text.contains("heterotrain-operator rbac"));
}

#[test]
fn trainer_dockerfile_builds_the_trainer_against_pytorch_2_11() {
    let d = check_image("trainer-image/Dockerfile", "heterotrain-trainer");
    let torch = d.arg("TORCH_VERSION").expect("TORCH_VERSION");
    assert_eq!(
        torch, "2.11.0",
        "tch 0.24 needs PyTorch 2.11.0 (see TOOLCHAIN)"
    );
    let cargo_toml = std::fs::read_to_string(repo_root().join("trainer-image/Cargo.toml")).unwrap();
    assert!(
        cargo_toml.contains("tch = \"=0.24.0\""),
        "the tch pin this torch version matches"
    );
    assert!(d
        .text
        .contains("pip install --no-cache-dir \"torch==${TORCH_VERSION}\""));
    assert!(d.text.contains("libgloo-dev"));
    let runtime = d.arg("RUNTIME_IMAGE").expect("RUNTIME_IMAGE");
    assert!(
        runtime.contains("pytorch") && runtime.contains(&torch) && runtime.contains("cuda"),
        "a CUDA PyTorch {torch} runtime: {runtime}"
    );
    let fin = d.final_stage();
    assert!(
        fin.contains("ENV LD_LIBRARY_PATH="),
        "libtorch on the loader path"
    );
    // The Python library for jobs' own scripts: built as a wheel
    // in the builder, installed in the runtime stage.
    assert!(d
        .text
        .contains("pip wheel --no-cache-dir --no-deps --no-build-isolation /tmp/heterotrain-py -w /out/wheels"));
    assert!(fin.contains("COPY --from=builder /out/wheels /tmp/wheels"));
    assert!(fin.contains("pip install --no-cache-dir /tmp/wheels/heterotrain-*.whl"));
}

#[test]
fn chart_images_are_the_ones_the_dockerfiles_build() {
    let values: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(support::chart_dir().join("values.yaml")).unwrap(),
    )
    .unwrap();
    for (key, binary) in [
        ("operator", "heterotrain-operator"),
        ("trainer", "heterotrain-trainer"),
    ] {
        let repo = values[key]["image"]["repository"]
            .as_str()
            .expect("repository");
        assert_eq!(
            repo.rsplit('/').next(),
            Some(binary),
            "{key} image repository"
        );
    }
    let ignore = std::fs::read_to_string(repo_root().join(".dockerignore")).expect(".dockerignore");
    assert!(
        ignore.lines().any(|l| l.trim() == "target"),
        "build outputs stay out of the context"
    );
}
