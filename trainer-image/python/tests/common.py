"""Helpers for the tests: launching real processes, finding promtool."""

import glob
import os
import shutil
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
REPO_ROOT = os.path.dirname(os.path.dirname(PKG_ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(**extra) -> dict:
    env = dict(os.environ)
    for k in ("HT_PLAN_FILE", "HETEROTRAIN_PLAN_CONFIGMAP", "POD_IP", "HT_METRICS_PORT"):
        env.pop(k, None)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def launch_ranks(argv, world_size, out_dir, **extra):
    """Start ``world_size`` ranks of ``python argv...`` on 127.0.0.1 (Gloo);
    stdout/stderr of rank r go to ``out_dir/rank<r>.log``."""
    port = free_port()
    procs = []
    for r in range(world_size):
        log = open(os.path.join(out_dir, f"rank{r}.log"), "w")
        env = child_env(RANK=r, LOCAL_RANK=r, WORLD_SIZE=world_size,
                        MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **extra)
        procs.append((subprocess.Popen([sys.executable] + list(argv), env=env, stdout=log,
                                       stderr=subprocess.STDOUT), log))
    return procs


def wait_all(procs, timeout=150):
    codes = []
    try:
        for p, _ in procs:
            codes.append(p.wait(timeout=timeout))
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    return codes


def max_param_diff(out) -> float:
    """Largest |hetero - reference| over the parameters both runs saved in ``out``."""
    import torch

    a = torch.load(os.path.join(out, "hetero.pt"))
    b = torch.load(os.path.join(out, "reference.pt"))
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def read(path) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def promtool():
    """Path of promtool, or None."""
    found = shutil.which("promtool")
    if found:
        return found
    cache = os.environ.get("HETEROTRAIN_CACHE", os.path.expanduser("~/.cache/heterotrain"))
    for pattern in ("promtool", "*/promtool", "*/*/promtool", "*/*/*/promtool"):
        for path in sorted(glob.glob(os.path.join(cache, pattern))):
            if os.access(path, os.X_OK):
                return path
    return None


def promtool_check(text: str):
    """(returncode, output) of ``promtool check metrics`` on ``text``."""
    r = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr
