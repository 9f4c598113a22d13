//! The krew package (`krew/release.sh`): the manifest names an archive
//! whose sha256 it carries, and the archive holds this plugin binary
//! under the name the manifest's `bin` gives, runnable.

use std::process::Command;

use sha2::{Digest, Sha256};

#[test]
fn release_builds_an_archive_the_krew_manifest_describes() {
    let out = tempfile::tempdir().expect("temp dir");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/krew/release.sh");
    let binary = env!("CARGO_BIN_EXE_kubectl-heterotrain");
    let run = Command::new("bash")
        .arg(script)
        .arg(out.path())
        .arg("https://example.invalid/releases/v9")
        .env("BINARY", binary)
        .env("VERSION", "v9.8.7")
        .output()
        .expect("run release.sh");
    assert!(
        run.status.success(),
        "release.sh failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let manifest: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(out.path().join("heterotrain.yaml")).expect("manifest"),
    )
    .expect("the manifest is YAML");
    assert_eq!(
        manifest["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(manifest["metadata"]["name"], "heterotrain");
    let spec = &manifest["spec"];
    assert_eq!(spec["version"], "v9.8.7");
    assert!(spec["shortDescription"]
        .as_str()
        .is_some_and(|d| d.len() < 60));
    let platform = &spec["platforms"][0];
    assert_eq!(platform["selector"]["matchLabels"]["os"], "linux");
    assert_eq!(platform["bin"], "kubectl-heterotrain");
    let uri = platform["uri"].as_str().expect("uri");
    let name = uri
        .strip_prefix("https://example.invalid/releases/v9/")
        .expect("the archive under the base URL");
    let archive = out.path().join(name);
    let bytes = std::fs::read(&archive).expect("the archive the manifest names");
    let sha: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(platform["sha256"], sha.as_str());

    // Unpacked, `bin` is this very binary and runs.
    let unpacked = tempfile::tempdir().expect("temp dir");
    let tar = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(unpacked.path())
        .status()
        .expect("tar");
    assert!(tar.success());
    let bin = unpacked.path().join("kubectl-heterotrain");
    assert_eq!(
        std::fs::read(&bin).expect("bin in the archive"),
        std::fs::read(binary).expect("the plugin binary")
    );
    for f in platform["files"].as_array().expect("files") {
        let from = f["from"].as_str().expect("from");
        assert!(
            unpacked.path().join(from).exists(),
            "{from} is in the archive"
        );
    }
    let help = Command::new(&bin).arg("--help").output().expect("run bin");
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("profile"));
}
