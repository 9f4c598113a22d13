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

Lookahead. A ``DataLoader`` with worker processes asks its batch sampler
for the indices of later steps before they are trained (``num_workers *
prefetch_factor`` batches ahead). So a plan agreed at the start of step s
comes into force at step ``s + L``, where the lookahead L is one more than
the deepest prefetch of any rank (agreed once, as a MAX over the ranks);
the plans of steps up to ``s + L`` are then fixed and every index list the
sampler hands out is final. ``batches()`` fetches in the training loop
itself and uses L = 0: a plan agreed at step s is in force from step s.
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
from .plan import BatchPlan, PlanError, PlanGate
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
        seed: Optional[int] = None,
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
        if total_steps is None:
            total_steps = _env_int(env.MAX_STEPS)
        if epochs is None:
            epochs = _env_int(env.EPOCHS)
        if seed is None:
            seed = _env_int(env.SEED)
        self.seed = seed or 0
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
        #: The plan in force at the current step.
        self.plan = BatchPlan.equal(0, global_batch_size, self.world_size)
        #: Agreed plans, ``(first step, plan)`` in step order; the last one is
        #: the newest, in force from its step on.
        self._schedule: List[Tuple[int, BatchPlan]] = [(1, self.plan)]
        #: The last step whose plan is agreed (fixed for good).
        self._horizon = 0
        #: Plans come into force this many steps after the step that agreed
        #: them (see the module docstring); agreed over the ranks at the start.
        self._lookahead_local = 0
        self.lookahead = 0
        self._started = False
        #: The next step whose indices the batch sampler hands out.
        self._next_fetch = 1
        self._hook_attached = False
        #: What attach() was given to skip a left-out rank's steps (see
        #: ``_exchange_for``): the DDP model, the objects whose state a
        #: re-admitted rank copies from rank 0, and whether every rank can.
        self._ddp = None
        self._sync_objects: List[Any] = []
        self._skip_local = False
        self._skip_refusal = "attach() was not called"
        self._skip = False
        self._skip_from = 0
        self._subgroups: Dict[Tuple[int, ...], Any] = {}
        #: Ranks whose steps were skipped since their state was last copied.
        self._stale: set = set()
        #: Steps this rank skipped (left out, with attach(optimizer=)).
        self.skipped_steps = 0
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

    @property
    def _latest(self) -> BatchPlan:
        return self._schedule[-1][1]

    def _agree(self, from_step: int) -> bool:
        """Poll (rank 0) and agree with every rank on stopping and on the plan
        in force from step ``from_step``; returns whether to stop."""
        latest = self._latest
        if self.source is not None:
            text = self.source.poll()
            if text is not None:
                p = self.gate.consider(text, latest, self.world_size)
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
        if gen != latest.generation or sizes != latest.batch_sizes:
            if self.rank == 0:
                new = proposed
            else:
                new = BatchPlan(generation=gen, global_batch_size=w[2], batch_sizes=sizes,
                                policy="agreed", reason="from rank 0")
            self._schedule = [(f, p) for f, p in self._schedule if f < from_step] + [(from_step, new)]
            if self.rank == 0:
                when = f"from step {from_step}"
                if from_step > self.step + 1:
                    when += f" (agreed before step {self.step + 1}; lookahead {self.lookahead})"
                print(f"heterotrain: plan generation {latest.generation} -> {new.generation} "
                      f"{new.batch_sizes} {when}"
                      + (f" ({new.policy}: {new.reason})" if new.policy or new.reason else ""),
                      file=sys.stderr, flush=True)
        self._horizon = max(self._horizon, from_step)
        return w[0] > 0

    def _start(self) -> None:
        """Once, before the first batch is fetched: agree on the lookahead
        (MAX over the ranks) and on the plan of the first steps."""
        if self._started:
            return
        self._started = True
        # The lookahead is a MAX over the ranks; skipping a left-out rank's
        # steps needs every rank's consent (MAX of "cannot").
        la = torch.tensor([self._lookahead_local, 0 if self._skip_local else 1], dtype=torch.int64)
        dist.all_reduce(la, op=dist.ReduceOp.MAX, group=self._control_group)
        self.lookahead = int(la[0].item())
        self._skip = int(la[1].item()) == 0
        first = self.step + 1
        # DDP rebuilds its buckets in the forward after its first backward,
        # with a broadcast over every rank: no rank skips before that.
        self._skip_from = first + 2
        self._schedule = [(first, self._latest)]
        if self._agree(first):
            self._stop_requested.set()
        # The plans of steps first .. first + L - 1 are now fixed; step s's
        # agreement fixes step s + L.
        self._horizon = first + max(self.lookahead, 1) - 1

    def plan_for(self, step: int) -> BatchPlan:
        """The plan in force at ``step``; it must be agreed already (at most
        ``lookahead`` steps after the current one)."""
        if step > self._horizon:
            raise RuntimeError(
                f"heterotrain: the indices of step {step} were asked for before its plan was agreed "
                f"(agreed up to step {self._horizon}, lookahead {self.lookahead}): the DataLoader "
                f"prefetches deeper than the lookahead; iterate with ht.steps(loader), or give "
                f"batch_sampler(..., lookahead=) at least num_workers * prefetch_factor + 1")
        for first, p in reversed(self._schedule):
            if first <= step:
                return p
        return self._schedule[0][1]

    def _enter(self, step: int) -> None:
        """Make the plan in force at ``step`` the current one."""
        new = self.plan_for(step)
        self._schedule = [(f, p) for i, (f, p) in enumerate(self._schedule)
                          if i + 1 == len(self._schedule) or self._schedule[i + 1][0] > step]
        if new is not self.plan:
            self.plan = new
            self.hook_state.weight = self.local_batch / self.global_batch_size
            self.metrics.set_plan(new.generation, self.local_batch)
            if self.left_out and not self._skip:
                _warn_once(self, "left-out",
                           f"heterotrain: rank {self.rank}: the plan leaves this rank out from step {step}; "
                           "it trains a one-sample stand-in weighted 0 (forward and backward still run, "
                           "the gradient exchange carries zeros): " + self._why_no_skip())
        self._exchange_for(step)

    def _skip_this(self, step: int) -> bool:
        """This rank is left out of ``step`` and skips it: the step closes at
        once, without a forward, a backward or a gradient exchange."""
        if not (self.left_out and self._skipping(step)):
            return False
        self.skipped_steps += 1
        self.step_done()
        return True

    def _why_no_skip(self) -> str:
        if self._ddp is None:
            return ("frameworks that average gradients over every rank (scale(), Lightning, FSDP) need "
                    "every rank in each exchange; with plain DDP, attach(model, optimizer=opt) skips the step")
        if not self._skip_local:
            return self._skip_refusal
        return "some rank attached without optimizer=, so no rank skips"

    def _skipping(self, step: int) -> bool:
        """Whether left-out ranks skip ``step`` (identical on every rank)."""
        return self._skip and step >= self._skip_from and 0 in self.plan.batch_sizes

    def _exchange_for(self, step: int) -> None:
        """Point the hook at the ranks that train ``step``. When left-out
        ranks skip it, the others reduce on a process group of their own
        (built once per membership, by every rank in the same order); when a
        rank that skipped steps trains again, it first copies the model and
        the attached optimizer's (and scheduler's) state from rank 0."""
        if not self._skip:
            return
        sizes = self.plan.batch_sizes
        back = sorted(r for r in self._stale if sizes[r] > 0)
        if back:
            self._copy_from_rank0(back)
        if self._skipping(step):
            active = tuple(r for r, b in enumerate(sizes) if b > 0)
            if active not in self._subgroups:
                self._subgroups[active] = dist.new_group(ranks=list(active), backend=dist.get_backend())
            self.hook_state.group = self._subgroups[active]
            self._stale.update(r for r, b in enumerate(sizes) if b == 0)
        else:
            self.hook_state.group = None

    def _copy_from_rank0(self, ranks: List[int]) -> None:
        """Every rank: broadcast rank 0's parameters, buffers and attached
        state; ``ranks`` (which skipped steps) take them."""
        module = self._ddp.module
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)
        states = [o.state_dict() if self.rank == 0 else None for o in self._sync_objects]
        dist.broadcast_object_list(states, src=0)
        if self.rank in ranks:
            for o, st in zip(self._sync_objects, states):
                o.load_state_dict(st)
        self._stale.difference_update(ranks)
        if self.rank == 0:
            print(f"heterotrain: ranks {ranks} train again: model and optimizer state copied from rank 0",
                  file=sys.stderr, flush=True)
    def begin_step(self) -> Optional[int]:
        """Start the next step: agree on the plan and on stopping with every
        rank. Returns the step number (from 1), or None when the run is over
        (all steps done, or some rank asked to stop)."""
        if self.current_step is not None:
            self.step_done()
        if self._total_steps is not None and self.step >= self._total_steps:
            return None
        self._t_start = time.perf_counter()
        self._start()
        s = self.step + 1
        stop = self._agree(s + self.lookahead)
        self._control_seconds = time.perf_counter() - self._t_start
        if stop:
            self.stopped = True
            return None
        self._enter(s)
        self.current_step = s
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
        return self.sampler.rank_indices(s, self.plan_for(s), self.rank)

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
            if self._skip_this(step):
                continue
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

    def attach(self, ddp_model, optimizer=None, scheduler=None):
        """Install the b_r/B-weighted SUM hook on a DDP model; returns it.

        With ``optimizer`` (and the LR ``scheduler``, if any), a rank the
        plan leaves out skips the step altogether: ``steps()`` and
        ``batches()`` do not yield it on that rank (no forward, no backward,
        no gradient bytes), the others exchange gradients among themselves,
        and when the rank trains again it first copies the model and these
        objects' state from rank 0. The loop body then does not run on a
        left-out rank, so it must not call collectives of its own. Needs the
        DDP model on the default process group, no ``find_unused_parameters``
        or ``static_graph``, and no buffers to broadcast
        (``broadcast_buffers=False`` for models with BatchNorm); otherwise,
        and without ``optimizer``, a left-out rank trains a stand-in sample
        weighted 0, with a warning saying why."""
        register(ddp_model, self.hook_state)
        self._hook_attached = True
        self._ddp = ddp_model
        self._sync_objects = [o for o in (optimizer, scheduler) if o is not None]
        self._skip_refusal = _skip_refusal(ddp_model) if optimizer is not None else \
            "attach() was not given the optimizer, whose state a re-admitted rank must copy"
        self._skip_local = self._skip_refusal == ""
        if self._started:
            self._skip_local = False
            self._skip_refusal = "attach() came after the first step"
        return ddp_model

    @property
    def loss_weight(self) -> float:
        """``W * b_r / B``: the factor that turns this rank's mean loss into
        its share of the global-batch loss when gradients are *averaged*
        over the W ranks (DDP without ``attach()``, FSDP, Accelerate,
        Lightning). 0 for a rank the plan leaves out."""
        return self.world_size * self.local_batch / self.global_batch_size

    def scale(self, loss):
        """``loss * loss_weight``: call on this rank's mean loss before
        ``backward()`` when the framework averages gradients over the ranks;
        the averaged gradient is then exactly the global batch's. Not with
        ``attach()``, whose hook weights the gradients already."""
        if self._hook_attached:
            raise RuntimeError("heterotrain: scale() with attach(): the communication hook already weights "
                               "each rank's gradient by b_r/B; use one or the other")
        if self.current_step is None:
            raise RuntimeError("heterotrain: scale() outside a step: call it inside the training loop")
        return loss * self.loss_weight

    # -- the DataLoader ------------------------------------------------------

    def batch_sampler(self, dataset, lookahead: Optional[int] = None) -> "HeteroBatchSampler":
        """A batch sampler for the script's own ``DataLoader``:
        ``DataLoader(dataset, batch_sampler=ht.batch_sampler(dataset),
        num_workers=..., pin_memory=..., collate_fn=...)``. Each iteration
        runs over the rest of the current epoch and yields, step by step,
        this rank's slice of the global batch under the plan in force at that
        step. ``dataset`` is a map-style dataset or its length.

        ``lookahead``: how many steps ahead a plan is agreed; at least the
        DataLoader's prefetch depth plus one (``num_workers *
        prefetch_factor + 1``). ``ht.steps(loader)`` sets it from the loader;
        without it the default is 9 (up to 4 workers at prefetch_factor 2)."""
        from .loader import HeteroBatchSampler, dataset_length

        n = dataset_length(dataset)
        if self.sampler is None:
            self._make_sampler(n)
        elif self.sampler.n != n:
            raise ValueError(f"heterotrain: dataset has {n} samples, the sampler {self.sampler.n}")
        if lookahead is not None:
            self._set_lookahead(lookahead)
        elif self._lookahead_local == 0:
            self._set_lookahead(9)
        return HeteroBatchSampler(self)

    def _set_lookahead(self, lookahead: int) -> None:
        if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 1:
            raise ValueError(f"heterotrain: lookahead must be an integer >= 1, got {lookahead!r}")
        if self._started and lookahead > self.lookahead:
            raise RuntimeError(f"heterotrain: lookahead {lookahead} asked for after the run started with "
                               f"{self.lookahead}: create the sampler and call steps(loader) before training")
        if not self._started:
            self._lookahead_local = lookahead

    def steps(self, loader) -> Iterator[Tuple[int, Any]]:
        """Yield ``(step, batch)`` from a ``DataLoader`` built on
        ``ht.batch_sampler()``, epoch after epoch, until the last step or a
        stop; agrees plan and stop with every rank before each step and
        closes the step the loop body left open. Sets the lookahead from the
        loader's ``num_workers`` and ``prefetch_factor``."""
        from .loader import HeteroBatchSampler, prefetch_depth

        bs = getattr(loader, "batch_sampler", None)
        if not isinstance(bs, HeteroBatchSampler) or bs.ht is not self:
            raise TypeError("heterotrain: steps(loader) needs DataLoader(dataset, batch_sampler=ht.batch_sampler(dataset), ...)")
        if not self._started:
            self._lookahead_local = prefetch_depth(loader) + 1
        self._start()
        while True:
            last = self.current_step or self.step
            if self._total_steps is not None and last >= self._total_steps:
                self.step_done()
                return
            yielded = False
            for batch in loader:
                step = self.begin_step()
                if step is None:
                    return
                yielded = True
                if self._skip_this(step):
                    continue
                yield step, batch
            if not yielded:
                raise RuntimeError("heterotrain: the DataLoader yielded no batch for a whole epoch")

    # -- resuming ------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """Where the run stands, for the script's checkpoint (next to the
        model's and the optimizer's state). Inside a step (after
        ``optimizer.step()``) the current step counts as done."""
        step = self.current_step if self.current_step is not None else self.step
        latest = self._latest
        return {
            "version": 1,
            "step": step,
            "global_batch_size": self.global_batch_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "dataset_size": self.sampler.n if self.sampler is not None else None,
            "plan": {"generation": latest.generation, "batch_sizes": list(latest.batch_sizes),
                     "policy": latest.policy, "reason": latest.reason},
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue a run from ``state_dict()``'s output: the next step is the
        one after the saved step, with the same sample order. Call it on every
        rank before the first step; a different global batch, seed, shuffle
        or dataset size is refused (the sample order would change)."""
        if self._started or self.current_step is not None:
            raise RuntimeError("heterotrain: load_state_dict() after training started: call it before the first step")
        if not isinstance(state, dict) or state.get("version") != 1:
            raise ValueError("heterotrain: not a heterotrain state (version 1 expected)")
        for key, mine in (("global_batch_size", self.global_batch_size), ("seed", self.seed),
                          ("shuffle", self.shuffle)):
            if state.get(key) != mine:
                raise ValueError(f"heterotrain: the checkpoint was written with {key} = {state.get(key)!r}, "
                                 f"this run has {mine!r}; the sample order would differ")
        saved_n = state.get("dataset_size")
        if saved_n is not None and self.sampler is not None and saved_n != self.sampler.n:
            raise ValueError(f"heterotrain: the checkpoint was written with a dataset of {saved_n} samples, "
                             f"this run has {self.sampler.n}")
        if saved_n is not None and self.sampler is None:
            self._make_sampler(saved_n)
        step = state.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"heterotrain: the checkpoint's step {step!r} is not a step number")
        p = state.get("plan") or {}
        sizes = p.get("batch_sizes")
        gen = int(p.get("generation", 0))
        plan = BatchPlan(generation=gen, global_batch_size=self.global_batch_size,
                         batch_sizes=list(sizes or []), policy=p.get("policy", ""), reason=p.get("reason", ""))
        try:
            plan.validate_for(self.world_size, self.global_batch_size)
            self.gate.current_is_default = False
        except PlanError as e:
            print(f"warning: heterotrain: the checkpoint's plan does not fit this run ({e}); "
                  f"starting on the equal split", file=sys.stderr, flush=True)
            plan = BatchPlan.equal(gen, self.global_batch_size, self.world_size)
        self.step = step
        self._next_fetch = step + 1
        self.plan = plan
        self._proposed = plan
        self._schedule = [(step + 1, plan)]
        self.hook_state.weight = self.local_batch / self.global_batch_size
        self.metrics.set_plan(plan.generation, self.local_batch)
        self.metrics.set_position(step, self.epoch if self.sampler else 0, self._total_steps or 0)

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


def load_checkpoint(path: str, map_location="cpu"):
    """Rank 0 reads the checkpoint at ``path`` and every rank gets its
    contents (None on every rank when rank 0 has none). Under the operator
    only rank 0 mounts the checkpoint storage; this gives the other ranks
    the same model, optimizer and heterotrain state, so the gang resumes
    as one. Call it on every rank, after the process group is up."""
    box = [None]
    if dist.get_rank() == 0 and os.path.exists(path):
        box[0] = torch.load(path, map_location=map_location)
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _env_int(name: str) -> Optional[int]:
    """A non-negative integer from the environment, or None when unset."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"heterotrain: ${name} is {text!r}, not an integer") from None
    if value < 0:
        raise ValueError(f"heterotrain: ${name} is {value}, not a non-negative integer")
    return value


def _skip_refusal(ddp_model) -> str:
    """Why this DDP model cannot let a left-out rank skip its steps ("" if it can)."""
    if getattr(ddp_model, "process_group", None) not in (None, dist.group.WORLD, dist.distributed_c10d._get_default_group()):
        return "the DDP model reduces on a process group other than the default one"
    if getattr(ddp_model, "find_unused_parameters", False):
        return "find_unused_parameters=True all-reduces over every rank in backward"
    if getattr(ddp_model, "static_graph", False):
        return "static_graph=True"
    if getattr(ddp_model, "broadcast_buffers", False) and any(True for _ in ddp_model.module.buffers()):
        return "the model has buffers that DDP broadcasts in forward; build DDP with broadcast_buffers=False"
    return ""


def _warn_once(ht, key: str, message: str) -> None:
    seen = ht.__dict__.setdefault("_warned", set())
    if key not in seen:
        seen.add(key)
        print(f"warning: {message}", file=sys.stderr, flush=True)


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
