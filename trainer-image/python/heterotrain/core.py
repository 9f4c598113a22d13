"""``HeteroTrain``: the plan, the sampler, the hook and the metrics of one rank.

Step-boundary agreement (v1: a blocking tiny collective per step). Before
every step each rank SUM-all-reduces a small int64 control word
``[stop, generation, B, b_0 .. b_{n-1}]`` on a Gloo group: rank 0 writes the
plan it has accepted (from its plan source, polled right before), every
rank writes its stop request (SIGTERM), others write zeros in the plan part.
Every rank decodes the same word, so all switch plans — and stop — before
the same step. The word is a few dozen bytes; the cost is one small-message
latency per step, which the gradient all-reduce has already paid to line
the ranks up.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist

from . import env
from .hook import HeteroHookState, register
from .metrics import TrainerMetrics
from .plan import BatchPlan, PlanGate
from .sampler import HeteroSampler
from .sources import ConfigMapPlanSource, FilePlanSource


class HeteroTrain:
    """One rank's view of a heterogeneous run. Build it with
    :func:`heterotrain.init` after (or instead of) ``init_process_group``."""

    def __init__(
        self,
        global_batch_size: Optional[int] = None,
        dataset_size: Optional[int] = None,
        total_steps: Optional[int] = None,
        epochs: Optional[int] = None,
        seed: int = 0,
        shuffle: bool = True,
        plan_file: Optional[str] = None,
        plan_configmap: Optional[str] = None,
        namespace: Optional[str] = None,
        metrics_port: Optional[int] = None,
        serve_metrics: bool = True,
        handle_sigterm: bool = True,
        poll_interval: float = 2.0,
        device: Any = None,
        backend: Optional[str] = None,
    ):
        if not dist.is_initialized():
            dist.init_process_group(backend=backend or "gloo")
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if global_batch_size is None:
            global_batch_size = int(os.environ.get(env.BATCH_SIZE) or 0)
        if global_batch_size < 1:
            raise ValueError(f"heterotrain: global batch size must be >= 1 (argument or {env.BATCH_SIZE})")
        if global_batch_size < self.world_size:
            raise ValueError(f"heterotrain: global batch {global_batch_size} < WORLD_SIZE {self.world_size}")
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.shuffle = shuffle
        self._total_steps = total_steps
        self._epochs = epochs
        self.sampler: Optional[HeteroSampler] = None
        if dataset_size is not None:
            self._make_sampler(dataset_size)

        # The control word rides on Gloo (CPU tensors), whatever DDP uses.
        self._control_group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")

        self.metrics = TrainerMetrics()
        self.metrics.set_device(device if device is not None else torch.device("cpu"))
        self.plan = BatchPlan.equal(0, global_batch_size, self.world_size)
        self.hook_state = HeteroHookState(weight=self.local_batch / global_batch_size)
        self.metrics.set_plan(self.plan.generation, self.local_batch)
        self.metrics.set_position(0, 0, self._total_steps or 0)
        self._proposed = self.plan
        self.gate = PlanGate(on_reject=self.metrics.plan_rejected_inc)
        self.source = None
        if self.rank == 0:
            plan_file = plan_file or os.environ.get(env.PLAN_FILE)
            plan_configmap = plan_configmap or os.environ.get(env.PLAN_CONFIGMAP)
            if plan_file:
                self.source = FilePlanSource(plan_file)
            elif plan_configmap:
                try:
                    self.source = ConfigMapPlanSource(
                        plan_configmap, namespace=namespace, interval=poll_interval).start()
                except ValueError as e:
                    print(f"warning: heterotrain: {e}; training on the equal split",
                          file=sys.stderr, flush=True)
        self.metrics_port = self.metrics.serve(port=metrics_port) if serve_metrics else None

        #: Last finished step (steps are numbered from 1).
        self.step = 0
        #: The step begun and not yet finished, if any.
        self.current_step: Optional[int] = None
        #: Some rank asked to stop and every rank stopped at the same boundary.
        self.stopped = False
        self._stop_requested = threading.Event()
        self._phases: Dict[str, float] = {}
        self._t_start = 0.0
        self._control_seconds = 0.0
        self._data_seconds = 0.0
        self._closed = False
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    # -- configuration -------------------------------------------------------

    def _make_sampler(self, n: int) -> None:
        self.sampler = HeteroSampler(n, self.global_batch_size, seed=self.seed, shuffle=self.shuffle)
        if self._total_steps is None:
            self._total_steps = self.sampler.steps_per_epoch * (self._epochs or 1)
        if hasattr(self, "metrics"):
            self.metrics.total_steps.set(self._total_steps)

    @property
    def total_steps(self) -> Optional[int]:
        return self._total_steps

    @property
    def local_batch(self) -> int:
        """This rank's local batch under the current plan (0: left out)."""
        return self.plan.batch_sizes[self.rank]

    @property
    def left_out(self) -> bool:
        """The current plan gives this rank no samples."""
        return self.local_batch == 0

    @property
    def epoch(self) -> int:
        s = self.current_step or max(self.step, 1)
        return self.sampler.position(s)[0] if self.sampler else 0

    # -- stopping ------------------------------------------------------------

    def _on_sigterm(self, signum, frame) -> None:
        print(f"heterotrain: rank {self.rank}: SIGTERM, stopping at the next step boundary",
              file=sys.stderr, flush=True)
        self._stop_requested.set()

    def request_stop(self) -> None:
        """Ask every rank to stop at the next step boundary (what SIGTERM does)."""
        self._stop_requested.set()

    # -- the step boundary ---------------------------------------------------

    def _agree(self) -> bool:
        """Poll (rank 0) and agree on plan and stop; returns whether to stop."""
        if self.source is not None:
            text = self.source.poll()
            if text is not None:
                p = self.gate.consider(text, self.plan, self.world_size)
                if p is not None:
                    self._proposed = p
        proposed = self._proposed
        word = torch.zeros(3 + self.world_size, dtype=torch.int64)
        word[0] = 1 if self._stop_requested.is_set() else 0
        if self.rank == 0:
            word[1] = proposed.generation
            word[2] = proposed.global_batch_size
            word[3:] = torch.tensor(proposed.batch_sizes, dtype=torch.int64)
        dist.all_reduce(word, op=dist.ReduceOp.SUM, group=self._control_group)
        w = word.tolist()
        gen, sizes = w[1], w[3:]
        if gen != self.plan.generation or sizes != self.plan.batch_sizes:
            if self.rank == 0:
                new = proposed
            else:
                new = BatchPlan(generation=gen, global_batch_size=w[2], batch_sizes=sizes,
                                policy="agreed", reason="from rank 0")
            old = self.plan
            self.plan = new
            self.hook_state.weight = self.local_batch / self.global_batch_size
            self.metrics.set_plan(new.generation, self.local_batch)
            if self.rank == 0:
                print(f"heterotrain: plan generation {old.generation} -> {new.generation} "
                      f"{new.batch_sizes} from step {self.step + 1}"
                      + (f" ({new.policy}: {new.reason})" if new.policy or new.reason else ""),
                      file=sys.stderr, flush=True)
        return w[0] > 0

    def begin_step(self) -> Optional[int]:
        """Start the next step: agree on the plan and on stopping with every
        rank. Returns the step number (from 1), or None when the run is over
        (all steps done, or some rank asked to stop)."""
        if self.current_step is not None:
            self.step_done()
        if self._total_steps is not None and self.step >= self._total_steps:
            return None
        self._t_start = time.perf_counter()
        stop = self._agree()
        self._control_seconds = time.perf_counter() - self._t_start
        if stop:
            self.stopped = True
            return None
        self.current_step = self.step + 1
        self._phases = {}
        self._data_seconds = 0.0
        self.hook_state.reset()
        if self.sampler is not None:
            epoch, _ = self.sampler.position(self.current_step)
            self.metrics.epoch.set(epoch)
        return self.current_step

    def local_indices(self, step: Optional[int] = None) -> List[int]:
        """This rank's sample indices of ``step`` (default: the current one)
        under the current plan; empty when the plan leaves this rank out."""
        if self.sampler is None:
            raise RuntimeError("heterotrain: no dataset size given (init(dataset_size=...) or batches(dataset))")
        s = step if step is not None else (self.current_step or self.step + 1)
        return self.sampler.rank_indices(s, self.plan, self.rank)

    def global_indices(self, step: int) -> List[int]:
        """All B sample indices of ``step`` (the one-process batch)."""
        if self.sampler is None:
            raise RuntimeError("heterotrain: no dataset size given")
        return self.sampler.global_indices(step)

    def batches(self, dataset, collate_fn=None) -> Iterator[Tuple[int, Any]]:
        """Yield ``(step, batch)`` for this rank until the last step or a
        stop. A ``TensorDataset`` is sliced directly; anything else is indexed
        sample by sample and collated (``default_collate`` unless given).

        A rank the plan leaves out gets a one-sample stand-in batch (the
        step's first sample) so the model's forward and backward run as
        usual; the hook sends zeros for it and its samples are not counted.
        The next iteration closes the step with ``step_done()`` if the loop
        body did not."""
        if self.sampler is None:
            self._make_sampler(len(dataset))
        elif self.sampler.n != len(dataset):
            raise ValueError(f"heterotrain: dataset has {len(dataset)} samples, the sampler {self.sampler.n}")
        while True:
            step = self.begin_step()
            if step is None:
                return
            t0 = time.perf_counter()
            idx = self.local_indices(step)
            if not idx:
                idx = self.sampler.global_indices(step)[:1]
            batch = fetch(dataset, idx, collate_fn)
            self._data_seconds += time.perf_counter() - t0
            yield step, batch

    @contextlib.contextmanager
    def phase(self, name: str):
        """Time a phase of the current step: ``forward``, ``backward``,
        ``optimizer`` (``data`` and ``allreduce`` are measured here)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._phases[name] = self._phases.get(name, 0.0) + time.perf_counter() - t0

    def step_done(self, loss=None) -> None:
        """Close the current step (after ``optimizer.step()``): metrics, and
        ``loss`` (a tensor or number: this rank's mean loss) as the loss gauge."""
        if self.current_step is None:
            return
        step, self.current_step = self.current_step, None
        wall = time.perf_counter() - self._t_start
        exposed = self.hook_state.exposed_seconds()
        phases = dict(self._phases)
        phases["data"] = phases.get("data", 0.0) + self._data_seconds
        if "backward" in phases:
            phases["backward"] = max(0.0, phases["backward"] - exposed)
        phases["allreduce"] = self._control_seconds + exposed
        compute = max(0.0, wall - phases["allreduce"])
        value = math.nan
        if loss is not None and not self.left_out:
            value = float(loss.detach().item() if isinstance(loss, torch.Tensor) else loss)
        epoch = self.sampler.position(step)[0] if self.sampler else 0
        self.metrics.observe_step(step, epoch, self.local_batch, phases, wall, compute, value)
        self.step = step

    # -- the model -----------------------------------------------------------

    def attach(self, ddp_model):
        """Install the b_r/B-weighted SUM hook on a DDP model; returns it."""
        register(ddp_model, self.hook_state)
        return ddp_model

    # -- the end -------------------------------------------------------------

    def set_eval(self, accuracy: float, loss: float) -> None:
        self.metrics.set_eval(accuracy, loss)

    @property
    def finished(self) -> bool:
        return self._total_steps is not None and self.step >= self._total_steps

    def finish(self) -> None:
        """Close the last step, mark the run finished (when every step ran),
        stop watching plans. The metrics endpoint stays up until the process
        exits; ``close()`` takes it down."""
        if self.current_step is not None:
            self.step_done()
        if self.finished:
            self.metrics.set_finished()
        elif self.stopped:
            _note_stop(self.step)
        if self.source is not None:
            self.source.close()

    def close(self) -> None:
        self.finish()
        self.metrics.close()


def _note_stop(step: int, path: str = "/dev/termination-log") -> None:
    """In a pod, say in the termination message that the coming exit 0 is a
    stop on SIGTERM, not the end of training: the operator then recreates
    the gang without counting it toward ``backoffLimit``."""
    if not os.path.exists(path):
        return
    try:
        with open(path, "w") as f:
            f.write(f"heterotrain: stopped by signal after step {step}")
    except OSError as e:
        print(f"heterotrain: cannot write {path}: {e}", file=sys.stderr, flush=True)


def fetch(dataset, idx: List[int], collate_fn=None):
    """The samples ``idx`` of ``dataset`` as one batch."""
    tensors = getattr(dataset, "tensors", None)
    if collate_fn is None and isinstance(tensors, tuple) and isinstance(dataset, torch.utils.data.TensorDataset):
        i = torch.tensor(idx, dtype=torch.int64)
        return tuple(t[i] for t in tensors)
    if collate_fn is None:
        from torch.utils.data import default_collate

        collate_fn = default_collate
    return collate_fn([dataset[i] for i in idx])
