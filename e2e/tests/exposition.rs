//! `promtool check metrics` on the operator's `/metrics` exposition. The
//! operator binary serves /metrics as soon as it starts (before it reaches
//! the API server), so no cluster is needed. (A trainer's exposition is
//! checked in tests/prometheus_dashboard.rs, where trainers run.)
//!
//! Needs `target/<profile>/heterotrain-operator` (`cargo build -p heterotrain-operator`).

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn operator_binary() -> std::path::PathBuf {
    heterotrain_e2e::nodesim::container::find_program("heterotrain-operator")
        .expect("heterotrain-operator not built: run `cargo build -p heterotrain-operator`")
}

#[test]
fn operator_exposition_passes_promtool() {
    let dir = std::env::temp_dir().join(format!("heterotrain-exposition-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A kubeconfig for a server that is not there: the operator keeps
    // retrying while its HTTP server answers.
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}\n\
         users:\n- name: u\n  user: {token: x}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
    )
    .unwrap();
    let port = heterotrain_e2e::ports::free_ports(1).unwrap()[0];
    let mut child = Command::new(operator_binary())
        .env("KUBECONFIG", &kubeconfig)
        .env("HETEROTRAIN_HTTP_ADDR", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start heterotrain-operator");
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        match support::http_get(&format!("127.0.0.1:{port}"), "/metrics") {
            Ok(b) => break b,
            Err(e) if Instant::now() > deadline => {
                let _ = child.kill();
                panic!("operator /metrics: {e}");
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        body.contains("heterotrain_operator_reconciles_total"),
        "{body}"
    );
    support::promtool_check_metrics(&body);
}
