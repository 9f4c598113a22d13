"""PyTorch Lightning: ``Trainer(**heterotrain.lightning.trainer_kwargs(ht))``.

    ht = heterotrain.init(B, total_steps=steps)
    loader = DataLoader(dataset, batch_sampler=ht.batch_sampler(dataset), num_workers=2)
    trainer = lightning.Trainer(**heterotrain.lightning.trainer_kwargs(ht), accelerator="cpu")
    trainer.fit(module, loader)

What the keyword arguments set up:

- ``strategy``: DDP over the process group ``heterotrain.init`` joined
  (Lightning finds it initialised and keeps it), ranks from torchrun's
  environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, as the operator
  sets them). The callback installs heterotrain's communication hook on the
  DDP model (Lightning's own ``ddp_comm_hook`` applies on CUDA only), which
  weights each rank's gradient by b_r/B: the module's ``training_step``
  returns its usual mean loss.
- ``devices = LOCAL_WORLD_SIZE`` (default 1: one rank per pod, as the
  operator starts them) and ``num_nodes = WORLD_SIZE / devices``: one rank
  per process, processes started outside Lightning.
- ``use_distributed_sampler = False``: Lightning keeps the loader's batch
  sampler (``ht.batch_sampler``) instead of putting a DistributedSampler in.
- ``max_steps = ht.total_steps``, ``max_epochs = -1``: the run's length is
  heterotrain's (steps over epochs, epoch boundaries where the sampler puts
  them).
- ``callbacks``: :class:`HeteroTrainCallback`, which agrees plan and stop
  with every rank between batches, closes each step for the metrics, sets
  the lookahead from the loader (Lightning fetches one batch ahead of the
  loader's own prefetch) and stops every rank after the same step on
  SIGTERM.

Not yet: resuming through Lightning's own checkpoints (``ckpt_path``).
"""

from __future__ import annotations

import os
from typing import Any, Dict

try:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.environments import TorchElasticEnvironment
    from lightning.pytorch.strategies import DDPStrategy
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("heterotrain.lightning needs PyTorch Lightning: pip install lightning") from e

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .core import HeteroTrain
from .hook import register
from .loader import HeteroBatchSampler, prefetch_depth


class HeteroTrainCallback(pl.Callback):
    """Drives heterotrain's step boundary from Lightning's batch hooks. The
    next step is begun at the end of the previous batch, so a stop agreed
    there ends the run before another batch trains."""

    def __init__(self, ht: HeteroTrain):
        self.ht = ht

    def on_train_start(self, trainer, pl_module) -> None:
        loader = trainer.train_dataloader
        sampler = getattr(loader, "batch_sampler", None)
        if not isinstance(sampler, HeteroBatchSampler) or sampler.ht is not self.ht:
            raise TypeError("heterotrain: the training DataLoader needs batch_sampler=ht.batch_sampler(dataset)")
        # Lightning's data fetcher holds one batch beyond the loader's prefetch.
        self.ht._set_lookahead(prefetch_depth(loader) + 2)
        # Lightning registers a DDPStrategy's communication hook on CUDA only:
        # heterotrain installs its own, whatever the device.
        model = trainer.strategy.model
        if not isinstance(model, DistributedDataParallel):
            raise TypeError(f"heterotrain: Lightning's model is a {type(model).__name__}, not DistributedDataParallel: "
                            "use trainer_kwargs(ht)'s strategy")
        register(model, self.ht.hook_state)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.ht.current_step is None and self.ht.begin_step() is None:
            trainer.should_stop = True

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        self.ht.step_done(loss)
        if self.ht.begin_step() is None:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        self.ht.finish()


def trainer_kwargs(ht: HeteroTrain, **strategy_kwargs) -> Dict[str, Any]:
    """Keyword arguments for ``lightning.Trainer`` (see the module doc);
    ``strategy_kwargs`` go to ``DDPStrategy``."""
    if not dist.is_initialized():
        raise RuntimeError("heterotrain: call heterotrain.init() before trainer_kwargs()")
    local = os.environ.get("LOCAL_WORLD_SIZE")
    devices = int(local) if local else 1
    if not local and int(os.environ.get("LOCAL_RANK", "0")) != 0:
        raise ValueError("heterotrain: LOCAL_RANK is set but LOCAL_WORLD_SIZE is not: set it to the ranks on this host")
    if devices < 1 or ht.world_size % devices:
        raise ValueError(f"heterotrain: LOCAL_WORLD_SIZE {devices} does not divide WORLD_SIZE {ht.world_size}")
    ht._hook_attached = True
    strategy = DDPStrategy(
        cluster_environment=TorchElasticEnvironment(),
        process_group_backend=dist.get_backend(),
        **strategy_kwargs,
    )
    return {
        "strategy": strategy,
        "num_nodes": ht.world_size // devices,
        "devices": devices,
        "use_distributed_sampler": False,
        "max_steps": ht.total_steps if ht.total_steps is not None else -1,
        "max_epochs": -1,
        "callbacks": [HeteroTrainCallback(ht)],
    }
