//! `heterotrain-local up` gives a working API server reachable with the
//! printed KUBECONFIG; `down` leaves no process behind.

use std::process::Command;

fn local(name: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_heterotrain-local"))
        .args(["--name", name])
        .args(args)
        .output()
        .expect("run heterotrain-local")
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks existence; a zombie still counts, so reap first.
    unsafe { libc::kill(pid, 0) == 0 }
}

#[test]
fn up_env_status_down() {
    let name = format!("cli-test-{}", std::process::id());
    let up = local(&name, &["up"]);
    assert!(
        up.status.success(),
        "up failed: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let stdout = String::from_utf8_lossy(&up.stdout).to_string();
    let kubeconfig = stdout
        .lines()
        .find_map(|l| l.strip_prefix("export KUBECONFIG="))
        .expect("up prints export KUBECONFIG=")
        .to_string();

    // A second `up` is a no-op that prints the same line.
    let again = local(&name, &["up"]);
    assert!(String::from_utf8_lossy(&again.stdout).contains(&kubeconfig));

    // kubectl works with the printed kubeconfig.
    let ns = Command::new("kubectl")
        .args(["get", "nodes,ns", "-o", "name"])
        .env("KUBECONFIG", &kubeconfig)
        .output();
    if let Ok(ns) = ns {
        let text = String::from_utf8_lossy(&ns.stdout);
        assert!(
            ns.status.success(),
            "kubectl failed: {}",
            String::from_utf8_lossy(&ns.stderr)
        );
        assert!(text.contains("namespace/kube-system"), "{text}");
    }

    let status = local(&name, &["status"]);
    let text = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(text.contains("running"), "{text}");
    let pids: Vec<i32> = text
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let n = w.next()?;
            (n.starts_with("etcd") || n.starts_with("kube-")).then_some(())?;
            w.next()?.parse().ok()
        })
        .collect();
    assert_eq!(pids.len(), 4, "expected 4 component pids in: {text}");

    let down = local(&name, &["down"]);
    assert!(down.status.success());
    // Exiting (and being reaped) takes a moment, longer on a loaded
    // machine: poll, rather than look once after a fixed sleep. A process
    // `down` did not stop is still there after 20 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut survivors = pids;
    loop {
        survivors.retain(|&pid| alive(pid));
        if survivors.is_empty() || std::time::Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        survivors.is_empty(),
        "processes {survivors:?} survived `down` (20 s)"
    );
    let env = local(&name, &["env"]);
    assert!(
        !env.status.success(),
        "env should fail once the cluster is down"
    );
}
