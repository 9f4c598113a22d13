//! Spawns child processes that die with this process.
//!
//! Children get `PR_SET_PDEATHSIG(SIGKILL)`, which fires when the *thread*
//! that forked them exits; so every spawn happens on one keeper thread that
//! lives as long as the process. A test binary that crashes or is killed
//! therefore never leaves an API server behind. Each child also gets its own
//! process group so it can be signalled with everything it started.

use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

type Job = (Command, mpsc::Sender<std::io::Result<Child>>);

fn keeper() -> &'static Mutex<mpsc::Sender<Job>> {
    static KEEPER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("process-keeper".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The sender lives in a static, so this loop never ends; park
                // anyway in case it does, to keep children alive.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawn keeper thread");
        Mutex::new(tx)
    })
}

/// Spawn `cmd` so that it is killed when this process dies.
pub fn spawn_tied(mut cmd: Command) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let (tx, rx) = mpsc::channel();
    keeper()
        .lock()
        .map_err(|_| std::io::Error::other("process keeper poisoned"))?
        .send((cmd, tx))
        .map_err(|_| std::io::Error::other("process keeper gone"))?;
    rx.recv()
        .map_err(|_| std::io::Error::other("process keeper gone"))?
}

/// Send `sig` to the process group led by `pid`.
pub fn signal_group(pid: u32, sig: i32) {
    // SAFETY: plain syscall.
    unsafe {
        libc::kill(-(pid as i32), sig);
    }
}

/// SIGTERM the child's group, wait up to `grace`, then SIGKILL and reap.
pub fn stop_child(child: &mut Child, grace: std::time::Duration) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    signal_group(child.id(), libc::SIGTERM);
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            signal_group(child.id(), libc::SIGKILL);
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    signal_group(child.id(), libc::SIGKILL);
    let _ = child.kill();
    let _ = child.wait();
}
