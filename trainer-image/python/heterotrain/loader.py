"""The batch sampler for the script's own ``DataLoader``.

``DataLoader(dataset, batch_sampler=ht.batch_sampler(dataset), num_workers=…)``
keeps everything a ``DataLoader`` does (worker processes, ``pin_memory``,
``collate_fn``) and only decides which indices each batch holds: at step s,
this rank's slice of the global batch of step s under the plan in force at
s (the seeded permutation and slice rule of :mod:`heterotrain.sampler`).

The ``DataLoader`` asks for indices ahead of training. The sampler hands
out a step's indices only once that step's plan is agreed for good (see the
lookahead in :mod:`heterotrain.core`), so a batch fetched ahead never
belongs to a plan that changed after it was fetched.

Map-style datasets only (``len()`` and ``__getitem__``): an
``IterableDataset`` decides its own order, so no sampler can give each rank
its slice of a seeded global batch; it is refused with a clear error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, List

import torch

if TYPE_CHECKING:  # pragma: no cover
    from .core import HeteroTrain


def dataset_length(dataset) -> int:
    """Number of samples of a map-style dataset (or the number itself)."""
    if isinstance(dataset, bool):
        raise TypeError("heterotrain: batch_sampler() needs a map-style dataset or its length")
    if isinstance(dataset, int):
        n = dataset
    elif isinstance(dataset, torch.utils.data.IterableDataset):
        raise TypeError(
            "heterotrain: an IterableDataset decides its own sample order, so the ranks cannot "
            "each take their slice of one seeded global batch; use a map-style dataset "
            "(__len__ and __getitem__), e.g. by materialising the stream's index or shards")
    else:
        try:
            n = len(dataset)
        except TypeError:
            raise TypeError("heterotrain: batch_sampler() needs a map-style dataset (with __len__) "
                            "or its length") from None
    if n < 1:
        raise ValueError(f"heterotrain: the dataset is empty ({n} samples)")
    return n


def prefetch_depth(loader) -> int:
    """How many batches a ``DataLoader`` asks its sampler for before the one
    it returns: ``num_workers * prefetch_factor`` (0 without workers)."""
    workers = int(getattr(loader, "num_workers", 0) or 0)
    if workers == 0:
        return 0
    factor = getattr(loader, "prefetch_factor", None)
    return workers * int(factor if factor is not None else 2)


class HeteroBatchSampler:
    """Yields this rank's index list of each step, over the rest of the
    current epoch (or up to the last step). Build it with
    ``ht.batch_sampler(dataset)``."""

    def __init__(self, ht: "HeteroTrain"):
        self.ht = ht
        #: ``(first, last)`` step of the iteration under way, if any: its
        #: length stays what it was when it began (Lightning compares the
        #: batches it fetched with it), however far ahead the loader fetches.
        self._active = None

    def _range(self):
        ht = self.ht
        # The step after the last one handed out: the loader fetches ahead of
        # training, and how far ahead a new epoch's iterator starts depends
        # on the loop around it (``ht.steps`` or Lightning), not on the step
        # that trains now.
        first = max(ht._next_fetch, ht.step + 1)
        spe = ht.sampler.steps_per_epoch
        end = ((first - 1) // spe + 1) * spe
        if ht.total_steps is not None:
            end = min(end, ht.total_steps)
        return first, end

    def __len__(self) -> int:
        first, end = self._active or self._range()
        return max(0, end - first + 1)

    def __iter__(self) -> Iterator[List[int]]:
        ht = self.ht
        ht._start()
        first, end = self._active = self._range()
        try:
            yield from self._indices(first, end)
        finally:
            self._active = None

    def _indices(self, first: int, end: int) -> Iterator[List[int]]:
        ht = self.ht
        for step in range(first, end + 1):
            plan = ht.plan_for(step)
            idx = ht.sampler.rank_indices(step, plan, ht.rank)
            if not idx:
                # Left out: a one-sample stand-in, weighted 0 (hook or scale()).
                idx = ht.sampler.global_indices(step)[:1]
            ht._next_fetch = step + 1
            yield idx
