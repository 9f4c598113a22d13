"""Where rank 0 finds proposed plans: a plan file, or the plan ConfigMap read
through the Kubernetes API with the pod's service-account token.

Both answer ``poll()`` with the plan text when it changed since the last
poll, else None. Judging the text is the gate's job (plan.PlanGate).
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Optional

from . import env


class FilePlanSource:
    """A plan file, read at every poll (a few hundred bytes; the poll runs on
    rank 0 at each step boundary, so a change made before boundary t is in
    force from step t on every rank). A missing or unreadable file is no
    proposal. Writers should replace the file atomically (write, rename)."""

    def __init__(self, path: str):
        self.path = path
        self._last: Optional[str] = None

    def poll(self) -> Optional[str]:
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            return None
        if text == self._last:
            return None
        self._last = text
        return text

    def close(self) -> None:
        pass


class ConfigMapPlanSource:
    """The plan ConfigMap, fetched by a background thread every
    ``interval`` seconds with a plain HTTPS GET of
    ``/api/v1/namespaces/<ns>/configmaps/<name>`` (service-account token as
    the bearer, the cluster CA from the service-account directory). API
    errors are warned about (at most every 30 s) and retried; training never
    waits for them."""

    def __init__(
        self,
        name: str,
        namespace: Optional[str] = None,
        interval: float = 2.0,
        base_url: Optional[str] = None,
        sa_dir: str = env.SERVICE_ACCOUNT_DIR,
        timeout: float = 5.0,
    ):
        self.name = name
        self.sa_dir = sa_dir
        if namespace is None:
            namespace = os.environ.get(env.NAMESPACE) or _read(os.path.join(sa_dir, "namespace"))
        if not namespace:
            raise ValueError(
                f"plan ConfigMap {name}: no namespace ({env.NAMESPACE} unset and "
                f"no {sa_dir}/namespace)"
            )
        self.namespace = namespace.strip()
        if base_url is None:
            host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ValueError(f"plan ConfigMap {name}: KUBERNETES_SERVICE_HOST is unset (not in a pod?)")
            if ":" in host and not host.startswith("["):
                host = f"[{host}]"
            base_url = f"https://{host}:{port}"
        self.url = (
            f"{base_url.rstrip('/')}/api/v1/namespaces/{urllib.parse.quote(self.namespace, safe='')}"
            f"/configmaps/{urllib.parse.quote(name, safe='')}"
        )
        self.interval = interval
        self.timeout = timeout
        self._lock = threading.Lock()
        self._pending: Optional[str] = None
        self._last: Optional[str] = None
        self._stop = threading.Event()
        self._warned_at = 0.0
        self._thread: Optional[threading.Thread] = None

    def _context(self) -> Optional[ssl.SSLContext]:
        if not self.url.startswith("https://"):
            return None
        ca = os.path.join(self.sa_dir, "ca.crt")
        return ssl.create_default_context(cafile=ca if os.path.exists(ca) else None)

    def fetch(self) -> Optional[str]:
        """One GET: the ConfigMap's ``plan.json`` text, or None when the
        ConfigMap or the key is absent. Other failures raise."""
        req = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        token = _read(os.path.join(self.sa_dir, "token"))
        if token:
            req.add_header("Authorization", f"Bearer {token.strip()}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context()) as r:
                body = r.read()
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise
        data = json.loads(body).get("data") or {}
        return data.get(env.PLAN_KEY)

    def _offer(self, text: Optional[str]) -> None:
        if text is None:
            return
        with self._lock:
            if text != self._last:
                self._last = text
                self._pending = text

    def _warn(self, msg: str) -> None:
        now = time.monotonic()
        if now - self._warned_at >= 30.0:
            self._warned_at = now
            print(f"warning: heterotrain: plan ConfigMap {self.namespace}/{self.name}: {msg}; retrying",
                  file=sys.stderr, flush=True)

    def start(self, initial: bool = True) -> "ConfigMapPlanSource":
        """Fetch once now (so a plan already written applies from the first
        step), then keep polling in a daemon thread."""
        if initial:
            try:
                self._offer(self.fetch())
            except Exception as e:  # noqa: BLE001 - any API failure is retried
                self._warn(str(e))
        self._thread = threading.Thread(target=self._run, name="heterotrain-plan-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._offer(self.fetch())
            except Exception as e:  # noqa: BLE001
                self._warn(str(e))

    def poll(self) -> Optional[str]:
        with self._lock:
            text, self._pending = self._pending, None
        return text

    def close(self) -> None:
        self._stop.set()


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None
