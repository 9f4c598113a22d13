"""The trainer's Prometheus metrics, with the names, types, labels and help
of the Rust trainer's (the contract the operator's scraper and the
dashboards read), served by ``prometheus_client`` on ``/metrics``.

Counters are registered without their ``_total`` suffix and exposed with it
(``heterotrain_samples_total`` and so on), as the Rust exposition does; the
``_created`` series are switched off (``disable_created_metrics``) so the
exposition carries the same series. The hardware-profile and GPU series of
the Rust trainer are not exported (this library does not profile).
"""

from __future__ import annotations

import math
import os
import platform
import sys
from typing import Dict, Optional

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from . import env

PHASES = ("data", "forward", "backward", "allreduce", "optimizer")

PHASE_SECONDS_TOTAL = "heterotrain_phase_seconds_total"
STEP_SECONDS = "heterotrain_step_seconds"
SAMPLES_TOTAL = "heterotrain_samples_total"
STEPS_TOTAL = "heterotrain_steps_total"
COMPUTE_SECONDS_TOTAL = "heterotrain_compute_seconds_total"
COMPUTE_SECONDS_PER_SAMPLE = "heterotrain_compute_seconds_per_sample"
LAST_STEP_COMPUTE_SECONDS = "heterotrain_last_step_compute_seconds"
LOCAL_BATCH_SIZE = "heterotrain_local_batch_size"
PLAN_GENERATION = "heterotrain_plan_generation"
PLAN_REJECTED_TOTAL = "heterotrain_plan_rejected_total"
STEP = "heterotrain_step"
EPOCH = "heterotrain_epoch"
TOTAL_STEPS = "heterotrain_total_steps"
LOSS = "heterotrain_loss"
EVAL_ACCURACY_RATIO = "heterotrain_eval_accuracy_ratio"
EVAL_LOSS = "heterotrain_eval_loss"
FINISHED = "heterotrain_finished"
DEVICE_INFO = "heterotrain_device_info"

STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _base(counter_name: str) -> str:
    return counter_name[: -len("_total")] if counter_name.endswith("_total") else counter_name


class TrainerMetrics:
    """Every series a rank exports, in its own registry."""

    def __init__(self, registry: Optional[CollectorRegistry] = None):
        prometheus_client.disable_created_metrics()
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.phase_seconds = Counter(
            _base(PHASE_SECONDS_TOTAL),
            "Seconds spent per training phase (all-reduce = waiting for the other ranks)",
            ["phase"], registry=r)
        for p in PHASES:  # present from the start, so rates exist before the first step
            self.phase_seconds.labels(phase=p)
        self.step_seconds = Histogram(
            STEP_SECONDS, "Wall-clock seconds per training step", buckets=STEP_BUCKETS, registry=r)
        self.samples = Counter(_base(SAMPLES_TOTAL), "Samples this rank trained on", registry=r)
        self.steps = Counter(_base(STEPS_TOTAL), "Optimizer steps taken", registry=r)
        self.compute_seconds = Counter(
            _base(COMPUTE_SECONDS_TOTAL),
            "Compute seconds (data, forward, backward, optimizer; no all-reduce wait)", registry=r)
        self.compute_per_sample = Gauge(
            COMPUTE_SECONDS_PER_SAMPLE, "Smoothed compute seconds per sample on this rank", registry=r)
        self.last_step_compute = Gauge(
            LAST_STEP_COMPUTE_SECONDS, "Compute seconds of the last step", registry=r)
        self.local_batch = Gauge(LOCAL_BATCH_SIZE, "Current local batch size", registry=r)
        self.plan_generation = Gauge(PLAN_GENERATION, "Generation of the plan in use", registry=r)
        self.plan_rejected = Counter(
            _base(PLAN_REJECTED_TOTAL), "Proposed plans refused as invalid, by reason", ["reason"], registry=r)
        self.step = Gauge(STEP, "Current global step", registry=r)
        self.epoch = Gauge(EPOCH, "Current epoch", registry=r)
        self.total_steps = Gauge(TOTAL_STEPS, "Steps the run trains in all", registry=r)
        self.loss = Gauge(LOSS, "Training loss of the last step (this rank's slice)", registry=r)
        self.eval_accuracy = Gauge(EVAL_ACCURACY_RATIO, "Held-out accuracy at the last evaluation", registry=r)
        self.eval_loss = Gauge(EVAL_LOSS, "Held-out loss at the last evaluation", registry=r)
        self.finished = Gauge(FINISHED, "1 when training finished on this rank", registry=r)
        self.device_info = Gauge(
            DEVICE_INFO, "The device this rank trains on (value 1)",
            ["kind", "name", "threads", "compute_capability", "driver_version"], registry=r)
        # process_cpu_seconds_total and process_resident_memory_bytes, as the
        # Rust trainer exports (plus the collector's other process_* series).
        ProcessCollector(registry=r)
        self._ema: Optional[float] = None
        self.server = None
        self.port: Optional[int] = None

    def observe_step(self, step: int, epoch: int, local_batch: int, phases: Dict[str, float],
                     step_seconds: float, compute_seconds: float, loss: float) -> None:
        """One finished step (``phases``: seconds per phase name)."""
        for p, s in phases.items():
            if p in PHASES and math.isfinite(s) and s >= 0:
                self.phase_seconds.labels(phase=p).inc(s)
        if math.isfinite(step_seconds) and step_seconds >= 0:
            self.step_seconds.observe(step_seconds)
        self.samples.inc(local_batch)
        self.steps.inc()
        compute = compute_seconds if math.isfinite(compute_seconds) else 0.0
        self.compute_seconds.inc(max(compute, 0.0))
        self.last_step_compute.set(compute)
        if local_batch > 0:
            per = compute / local_batch
            self._ema = per if self._ema is None else 0.8 * self._ema + 0.2 * per
            self.compute_per_sample.set(self._ema)
        self.local_batch.set(local_batch)
        self.step.set(step)
        self.epoch.set(epoch)
        if loss is not None and math.isfinite(loss):
            self.loss.set(loss)

    def set_plan(self, generation: int, local_batch: int) -> None:
        self.plan_generation.set(generation)
        self.local_batch.set(local_batch)

    def set_position(self, step: int, epoch: int, total_steps: int) -> None:
        self.step.set(step)
        self.epoch.set(epoch)
        self.total_steps.set(total_steps)

    def plan_rejected_inc(self, reason: str) -> None:
        self.plan_rejected.labels(reason=reason).inc()

    def set_eval(self, accuracy: float, loss: float) -> None:
        self.eval_accuracy.set(accuracy)
        self.eval_loss.set(loss)

    def set_finished(self) -> None:
        self.finished.set(1)

    def set_device(self, device) -> None:
        import torch

        kind, name, cc, driver = "cpu", platform.processor() or platform.machine(), "", ""
        if getattr(device, "type", str(device)) == "cuda" and torch.cuda.is_available():
            kind = "cuda"
            idx = device.index if getattr(device, "index", None) is not None else torch.cuda.current_device()
            name = torch.cuda.get_device_name(idx)
            major, minor = torch.cuda.get_device_capability(idx)
            cc = f"{major}.{minor}"
            driver = str(torch.version.cuda or "")
        self.device_info.labels(kind=kind, name=name, threads=str(torch.get_num_threads()),
                                compute_capability=cc, driver_version=driver).set(1)

    def text(self) -> str:
        """The exposition in the Prometheus text format 0.0.4."""
        return prometheus_client.generate_latest(self.registry).decode("utf-8")

    def serve(self, port: Optional[int] = None, addr: Optional[str] = None) -> Optional[int]:
        """Serve ``/metrics`` from a daemon thread on ``addr:port`` (default:
        ``$POD_IP`` else 0.0.0.0, ``$HT_METRICS_PORT`` else 9400; port 0 picks
        a free one). Returns the bound port; a bind failure is a warning and
        training goes on without an endpoint (returns None)."""
        if port is None:
            port = int(os.environ.get(env.METRICS_PORT) or env.DEFAULT_METRICS_PORT)
        if addr is None:
            addr = os.environ.get(env.POD_IP) or "0.0.0.0"
        try:
            server, _thread = prometheus_client.start_http_server(port, addr=addr, registry=self.registry)
        except OSError as e:
            print(f"warning: heterotrain: cannot serve /metrics on {addr}:{port}: {e}; training without it",
                  file=sys.stderr, flush=True)
            return None
        self.server = server
        self.port = server.server_port
        return self.port

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
