"""The heterogeneous sampler.

Steps are numbered 1, 2, ... over the whole run. With N samples and global
batch B an epoch has ``N // B`` steps (the incomplete tail is dropped, so
every step trains on exactly B samples); step s is step ``(s-1) % spe`` of
epoch ``(s-1) // spe``. That step takes the next B indices of the epoch's
order — ``torch.randperm(N)`` from a ``torch.Generator`` seeded with
``seed + epoch`` (the same on every rank), or ``0..N-1`` with shuffling off —
and rank r takes the slice that starts at ``b_0 + ... + b_{r-1}`` and is
``b_r`` long. The union over ranks is exactly the one-process batch,
whatever the split.
"""

from __future__ import annotations

from typing import List, Tuple

import torch

from .plan import BatchPlan


def steps_per_epoch(n: int, global_batch: int) -> int:
    return n // max(global_batch, 1)


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True) -> torch.Tensor:
    """Index order of one epoch over ``n`` samples (int64 tensor)."""
    if not shuffle:
        return torch.arange(n, dtype=torch.int64)
    g = torch.Generator()
    g.manual_seed(int(seed) + int(epoch))
    return torch.randperm(n, generator=g)


class HeteroSampler:
    """Per-rank view of the epoch orders (caches the current epoch's)."""

    def __init__(self, n: int, global_batch: int, seed: int = 0, shuffle: bool = True):
        self.n = n
        self.global_batch = global_batch
        self.seed = seed
        self.shuffle = shuffle
        self.steps_per_epoch = steps_per_epoch(n, global_batch)
        if self.steps_per_epoch == 0:
            raise ValueError(f"dataset of {n} samples is smaller than the global batch {global_batch}")
        self._epoch = -1
        self._order = torch.empty(0, dtype=torch.int64)

    def position(self, step: int) -> Tuple[int, int]:
        """(epoch, step within the epoch) of global step ``step`` (1-based)."""
        if step < 1:
            raise ValueError(f"steps are numbered from 1, got {step}")
        return divmod(step - 1, self.steps_per_epoch)

    def global_indices(self, step: int) -> List[int]:
        """All B indices of step ``step``."""
        epoch, k = self.position(step)
        if epoch != self._epoch:
            self._order = epoch_order(self.n, self.seed, epoch, self.shuffle)
            self._epoch = epoch
        b = self.global_batch
        return self._order[k * b:(k + 1) * b].tolist()

    def rank_indices(self, step: int, plan: BatchPlan, rank: int) -> List[int]:
        """Rank ``rank``'s slice of step ``step`` under ``plan`` (may be empty)."""
        if plan.global_batch_size != self.global_batch:
            raise ValueError(
                f"plan's global batch {plan.global_batch_size} is not the sampler's {self.global_batch}"
            )
        off = plan.offset_of(rank)
        return self.global_indices(step)[off:off + plan.batch_sizes[rank]]
