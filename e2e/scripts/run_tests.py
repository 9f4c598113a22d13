#!/usr/bin/env python3
"""Run the workspace's test binaries (and other test commands) in parallel
lanes, longest first, each with its output kept in a log of its own; print
each result as it comes, every failure's log, the ten slowest and the total.

Used by `make test` (e2e/scripts/test.sh). Input: the JSON messages of
`cargo test --no-run --message-format=json` on stdin, or a file given with
--cargo-json; extra commands with --extra NAME=COMMAND (run by bash, in the
repository root). The durations of the last run are kept in
$HETEROTRAIN_CACHE/results/test-times.json and order the next run (longest
first, so that the lanes end together); a binary never timed gets a place
from DEFAULT_SECONDS, else goes last.

Exit status 0 when every job passed, 1 otherwise (all jobs still run, so
one failure does not hide another). A job past --timeout is killed with its
children and fails. Doc tests are not run (`--no-run` builds none; the
workspace has none).
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

# Durations measured on a 2-core machine (seconds), for a first run with no
# timing file: they only decide the order.
DEFAULT_SECONDS = {
    "heterotrain-e2e/chaos": 800,
    "clippy": 700,
    "heterotrain-e2e/system": 330,
    "heterotrain-e2e/own_trainer": 230,
    "heterotrain-e2e/bench": 200,
    "python": 150,
    "heterotrain-trainer/equivalence": 100,
    "heterotrain-e2e/helm_install": 85,
    "heterotrain-e2e/prometheus_dashboard": 80,
    "heterotrain-e2e/demo": 70,
}


def package_name(package_id):
    """The name in a package id: `path+file:///w/e2e#heterotrain-e2e@0.1.0`,
    or `path+file:///w/foo#0.1.0` when the folder has the package's name."""
    url, _, frag = package_id.partition("#")
    if "@" in frag:
        return frag.split("@")[0]
    return url.rstrip("/").rsplit("/", 1)[-1]


def binaries(messages):
    """(name, executable, cwd) of every test executable in cargo's JSON."""
    out = []
    seen = set()
    for line in messages:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            m = json.loads(line)
        except json.JSONDecodeError:
            continue
        exe = m.get("executable")
        if m.get("reason") != "compiler-artifact" or not exe:
            continue
        if not m.get("profile", {}).get("test"):
            continue
        if exe in seen:
            continue
        seen.add(exe)
        pkg = m["package_id"]
        target = m["target"]
        pkg_name = package_name(pkg)
        kind = target["kind"][0]
        name = f"{pkg_name}/{target['name']}" if kind != "lib" else f"{pkg_name}/lib"
        if kind == "bin":
            name = f"{pkg_name}/bin-{target['name']}"
        cwd = os.path.dirname(m["manifest_path"])
        out.append((name, exe, cwd))
    return out


def fmt_secs(s):
    return f"{int(s) // 60}m{int(s) % 60:02d}s" if s >= 60 else f"{s:.0f}s"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cargo-json", help="cargo's JSON messages (default: stdin)")
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=COMMAND",
                    help="another test command, run by bash in the repository root")
    ap.add_argument("--lanes", type=int, default=os.cpu_count() or 2,
                    help="jobs at once (default: the CPU count)")
    ap.add_argument("--test-threads", type=int, default=os.cpu_count() or 2,
                    help="--test-threads of each test binary (default: the CPU count)")
    ap.add_argument("--logs", required=True, help="folder for each job's log")
    ap.add_argument("--times", help="timing file to read and update")
    ap.add_argument("--root", default=os.getcwd(), help="repository root")
    ap.add_argument("--timeout", type=int, default=3600,
                    help="seconds a job may run before it is killed and failed (default 3600)")
    a = ap.parse_args()

    src = open(a.cargo_json) if a.cargo_json else sys.stdin
    jobs = [(n, [exe, f"--test-threads={a.test_threads}"], cwd)
            for n, exe, cwd in binaries(src)]
    for e in a.extra:
        name, _, cmd = e.partition("=")
        jobs.append((name, ["bash", "-c", cmd], a.root))
    if not jobs:
        print("run_tests: no test binaries in cargo's output", file=sys.stderr)
        return 1

    known = {}
    if a.times and os.path.exists(a.times):
        try:
            with open(a.times) as f:
                known = json.load(f)
        except (OSError, ValueError):
            known = {}

    def estimate(name):
        return known.get(name, DEFAULT_SECONDS.get(name, 0))

    jobs.sort(key=lambda j: -estimate(j[0]))
    os.makedirs(a.logs, exist_ok=True)
    print(f"==> {len(jobs)} test jobs in {a.lanes} lanes, --test-threads={a.test_threads}; "
          f"logs in {a.logs}", flush=True)

    lock = threading.Lock()
    queue = list(jobs)
    results = {}
    t_start = time.monotonic()

    def lane():
        while True:
            with lock:
                if not queue:
                    return
                name, cmd, cwd = queue.pop(0)
                print(f"    start {name}", flush=True)
            log = os.path.join(a.logs, name.replace("/", "__") + ".log")
            t0 = time.monotonic()
            try:
                with open(log, "wb") as f:
                    p = subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
                    try:
                        rc = p.wait(timeout=a.timeout)
                    except subprocess.TimeoutExpired:
                        # The whole process group: a test's children too.
                        os.killpg(p.pid, signal.SIGKILL)
                        p.wait()
                        f.write(f"\nrun_tests: killed after {a.timeout} s "
                                f"(--timeout)\n".encode())
                        rc = 124
            except OSError as e:
                with open(log, "ab") as f:
                    f.write(f"run_tests: could not run {cmd}: {e}\n".encode())
                rc = 127
            dt = time.monotonic() - t0
            with lock:
                results[name] = (rc, dt, log)
                verdict = "ok    " if rc == 0 else f"FAILED (exit {rc})"
                print(f"    {verdict} {name} in {fmt_secs(dt)} "
                      f"[{fmt_secs(time.monotonic() - t_start)} elapsed, "
                      f"{len(results)}/{len(jobs)} done]", flush=True)

    threads = [threading.Thread(target=lane) for _ in range(max(1, a.lanes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = time.monotonic() - t_start

    for name, _, _ in jobs:
        if name not in results:
            results[name] = (-1, 0.0, os.path.join(a.logs, "(none)"))
    failed = [(n, r) for n, r in results.items() if r[0] != 0]
    for name, (rc, dt, log) in failed:
        print(f"\n===== {name} FAILED (exit {rc}); its log ({log}) =====", flush=True)
        try:
            with open(log, "rb") as f:
                sys.stdout.write(f.read().decode("utf-8", "replace"))
        except OSError as e:
            print(f"(no log: {e})")
        print(f"===== end of {name} =====", flush=True)

    if a.times:
        try:
            os.makedirs(os.path.dirname(a.times), exist_ok=True)
            merged = dict(known)
            merged.update({n: round(r[1], 1) for n, r in results.items() if r[0] == 0})
            with open(a.times, "w") as f:
                json.dump(merged, f, indent=1, sort_keys=True)
        except OSError as e:
            print(f"run_tests: could not write {a.times}: {e}", file=sys.stderr)

    print("\n==> the ten slowest test jobs")
    for name, (rc, dt, _) in sorted(results.items(), key=lambda r: -r[1][1])[:10]:
        print(f"    {fmt_secs(dt):>7}  {name}{'' if rc == 0 else '  (FAILED)'}")
    busy = sum(r[1] for r in results.values())
    print(f"==> tests: {len(results) - len(failed)} of {len(results)} jobs passed in "
          f"{fmt_secs(total)} ({fmt_secs(busy)} of job time in {a.lanes} lanes)", flush=True)
    if failed:
        print("==> failed: " + ", ".join(n for n, _ in failed), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
