"""The DDP communication hook: weight each rank's gradient by b_r / B and SUM.

With each rank's loss the mean over its own b_r samples, rank r's gradient
is the gradient of that mean; ``sum_r (b_r / B) * grad(mean_r)`` is exactly
the gradient of the mean loss over the whole global batch of B samples,
whatever the split. DDP's built-in hook divides by the world size (right
only for equal splits); ``register_comm_hook`` replaces it with this one.

A rank the plan leaves out (b_r = 0) skips the step when ``attach()`` was
given the optimizer: the others reduce on a process group of their own
(``state.group``). Otherwise it still joins every all-reduce, with a bucket
of zeros, so DDP's collectives stay matched across ranks and the rank adds
nothing to the gradient (whatever its stand-in batch computed).
"""

import threading
import time
from typing import Optional

import torch
import torch.distributed as dist


# (No `from __future__ import annotations` here: DDP checks the hook's
# annotations as objects.)


class HeteroHookState:
    """The weight of this rank's gradient in the current plan, and when this
    step's buckets were handed over / came back (to tell the exposed
    all-reduce wait from compute)."""

    def __init__(self, weight: float = 1.0, group=None):
        self.weight = float(weight)
        self.group = group
        self._lock = threading.Lock()
        #: Gradient bytes this rank has sent into all-reduces, over all steps.
        self.bytes_total = 0
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.last_call: Optional[float] = None
            self.last_done: Optional[float] = None
            self.buckets = 0

    def _called(self, nbytes: int = 0) -> None:
        with self._lock:
            self.last_call = time.perf_counter()
            self.buckets += 1
            self.bytes_total += nbytes

    def _done(self) -> None:
        now = time.perf_counter()
        with self._lock:
            self.last_done = now if self.last_done is None else max(self.last_done, now)

    def exposed_seconds(self) -> float:
        """Seconds from the last bucket handed over (about the end of local
        backward compute) to the last all-reduce done: the wait for the
        network and for slower ranks that backward could not hide."""
        with self._lock:
            if self.last_call is None or self.last_done is None:
                return 0.0
            return max(0.0, self.last_done - self.last_call)


def hetero_allreduce_hook(state: HeteroHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """``bucket *= b_r / B`` (zeros when b_r = 0), then a SUM all-reduce."""
    buf = bucket.buffer()
    state._called(buf.numel() * buf.element_size())
    if state.weight == 0.0:
        buf.zero_()
    elif state.weight != 1.0:
        buf.mul_(state.weight)
    fut = dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=state.group, async_op=True).get_future()

    def done(f):
        state._done()
        return f.value()[0]

    return fut.then(done)


def register(ddp_model, state: HeteroHookState) -> HeteroHookState:
    """Install the hook on a ``DistributedDataParallel`` model (once, before
    its first backward). The hook reduces over the model's own process group."""
    if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError("heterotrain: attach() needs a torch.nn.parallel.DistributedDataParallel model")
    state.group = getattr(ddp_model, "process_group", None)
    ddp_model.register_comm_hook(state, hetero_allreduce_hook)
    return state
