//! The operator's container image, built for real from scratch by `make
//! images`' script (buildah, no base image, no daemon) and run with podman
//! against the local control plane, where it reconciles a job to
//! `Succeeded` — the operator inside the image is the only one running.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use heterotrain_crds::HeteroTrainingJob;
use heterotrain_e2e::nodesim::NodesFile;
use heterotrain_e2e::system::{replica_kubeconfig, System, SystemOptions, OPERATOR_NAMESPACE};
use support::{repo_root, SHORT_RUN};

const NODES: &str = r#"
nodes:
  - {name: a, speed: 1.0, cpu: "2", memory: 4Gi}
  - {name: b, speed: 1.0, cpu: "2", memory: 4Gi}
"#;

const JOB: &str = r#"apiVersion: heterotrain.dev/v1alpha1
kind: HeteroTrainingJob
metadata: {name: from-image}
spec:
  workers:
    - {name: cpu, replicas: 2, threads: 1, resources: {requests: {cpu: "1"}, limits: {cpu: "1"}}}
"#;

/// The container storage `make images` builds into (this project's own).
fn storage_flags() -> Vec<String> {
    let cache = heterotrain_e2e::cache_dir();
    vec![
        format!("--root={}", cache.join("containers/storage").display()),
        format!("--runroot={}", cache.join("containers/run").display()),
        "--storage-driver=vfs".into(),
    ]
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (make setup installs buildah and podman)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Removes the container when the test ends, passed or not.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(storage_flags())
            .args(["rm", "--force", &self.0])
            .output();
    }
}

fn logs(name: &str) -> String {
    Command::new("podman")
        .args(storage_flags())
        .args(["logs", "--tail", "40", name])
        .output()
        .map(|o| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .unwrap_or_default()
}

/// Build the operator image from `binary` into `out`; the archive's path.
fn build_image(binary: &Path, out: &Path) -> PathBuf {
    run(Command::new("bash")
        .arg(repo_root().join("e2e/scripts/images.sh"))
        .arg("operator")
        .env("OUT", out)
        .env("TAG", "e2e")
        .env("OPERATOR_BINARY", binary));
    let archive = out.join("heterotrain-operator-e2e.oci.tar");
    assert!(archive.exists(), "no archive at {}", archive.display());
    archive
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_image_builds_from_scratch_and_reconciles_a_job() {
    let binary = heterotrain_e2e::nodesim::container::find_program("heterotrain-operator")
        .expect("heterotrain-operator binary (build the workspace)");
    let out = tempfile::tempdir().expect("temp dir");
    let archive = build_image(&binary, out.path());

    // The image: the binary, its libraries, the non-root user; nothing else.
    let listing = run(Command::new("tar").arg("-tf").arg(&archive));
    assert!(String::from_utf8_lossy(&listing.stdout).contains("index.json"));

    let system = System::start(SystemOptions {
        operator: false,
        ..SystemOptions::new("oci-image", NodesFile::parse(NODES).expect("nodes"))
    })
    .await
    .expect("start the system");
    let kubeconfig = out.path().join("operator.kubeconfig");
    replica_kubeconfig(&system.cluster, "operator-from-image", None, &kubeconfig)
        .await
        .expect("the image's kubeconfig");
    // The container runs as 65532: it must be able to read it.
    std::fs::set_permissions(
        &kubeconfig,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .expect("chmod");
    let http = heterotrain_e2e::ports::free_ports(1).expect("a port")[0];
    let name = format!("heterotrain-operator-e2e-{}", std::process::id());
    let _container = Container(name.clone());
    run(Command::new("podman")
        .args(storage_flags())
        .args(["run", "--detach", "--name", &name])
        // This sandbox refuses crun's rlimits and cgroup set-up: runc, and
        // limits no higher than the host's.
        .args(["--runtime", "runc", "--ulimit", "nofile=1024:4096"])
        .args(["--ulimit", "nproc=1024:4096", "--network", "host"])
        .arg(format!(
            "--volume={}:/etc/heterotrain/kubeconfig:ro",
            kubeconfig.display()
        ))
        .args(["--env", "KUBECONFIG=/etc/heterotrain/kubeconfig"])
        .arg(format!("--env=POD_NAMESPACE={OPERATOR_NAMESPACE}"))
        .args(["--env", "POD_NAME=operator-from-image"])
        .arg(format!("oci-archive:{}", archive.display()))
        .arg(format!("--http-addr=127.0.0.1:{http}"))
        .arg("--scrape-interval=1"));

    system.create_namespace("image").await.expect("namespace");
    system
        .create_job("image", &format!("{JOB}{SHORT_RUN}"))
        .await
        .expect("job");
    let done = system
        .wait_job(
            "image",
            "from-image",
            Duration::from_secs(300),
            "Succeeded",
            |j: &HeteroTrainingJob| {
                j.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
            },
        )
        .await;
    if let Err(e) = done {
        panic!(
            "{e}\n--- the operator in the image ---\n{}\n--- dump ---\n{}",
            logs(&name),
            system.dump("image").await
        );
    }
    // The operator that did it ran in the container (no other was started),
    // as the image's non-root user.
    let user = run(Command::new("podman").args(storage_flags()).args([
        "inspect",
        "--format",
        "{{.Config.User}}",
        &name,
    ]));
    assert_eq!(String::from_utf8_lossy(&user.stdout).trim(), "65532:65532");
}
