"""The Hugging Face ``Trainer``: ``heterotrain.hf.HeteroTrainer(ht, ...)``.

    ht = heterotrain.init(B)
    trainer = heterotrain.hf.HeteroTrainer(ht, model=model, args=TrainingArguments(...),
                                           train_dataset=dataset, data_collator=collate)
    trainer.train()

``HeteroTrainer`` is the ``transformers.Trainer`` with four changes:

- its training ``DataLoader`` is built on ``ht.batch_sampler()`` (with the
  arguments' ``dataloader_num_workers``, ``dataloader_pin_memory`` and the
  trainer's collator) and is not handed to Accelerate, whose sharding would
  take every W-th batch of it: each rank gets its slice of every global
  batch, sized by the plan;
- ``compute_loss`` returns ``ht.scale(loss)``: Accelerate's DDP averages
  gradients over the W ranks, and the average of ``W·b_r/B`` × each rank's
  mean loss gradient is the global batch's. The model's own loss is kept a
  mean over its batch (``model_accepts_loss_kwargs`` is turned off, and
  ``average_tokens_across_devices`` with it), since a loss summed over
  tokens counted across devices would be weighted twice;
- ``max_steps`` is ``ht.total_steps`` (``HT_MAX_STEPS``, or the epochs over
  the dataset) unless the arguments set it;
- a callback agrees plan and stop with every rank between steps (the next
  step is begun at the end of the previous one, so a stop ends every rank
  after the same step), closes each step for the metrics with its loss, and
  sets the plan lookahead from the loader (the Trainer fetches a batch
  ahead of the loader's own prefetch).

A rank the plan leaves out trains a one-sample stand-in weighted 0: the
Trainer's DDP averages over every rank, so every rank takes part in each
exchange (a warning says so when it happens). Not yet: resuming through the
Trainer's own checkpoints (``resume_from_checkpoint``).
"""

from __future__ import annotations

from typing import Any, Optional

try:
    import transformers
    from transformers import Trainer, TrainerCallback
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("heterotrain.hf needs Hugging Face transformers: pip install transformers accelerate") from e

from torch.utils.data import DataLoader

from .core import HeteroTrain
from .loader import HeteroBatchSampler, prefetch_depth


class HeteroTrainCallback(TrainerCallback):
    """Drives heterotrain's step boundary from the Trainer's step events."""

    def __init__(self, ht: HeteroTrain, trainer: "HeteroTrainer"):
        self.ht = ht
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        loader = self.trainer._ht_loader
        if loader is not None:
            # The Trainer holds one batch beyond the loader's own prefetch.
            self.ht._set_lookahead(prefetch_depth(loader) + 2)
        return control

    def on_step_begin(self, args, state, control, **kwargs):
        if self.ht.current_step is None and self.ht.begin_step() is None:
            control.should_training_stop = True
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self.ht.step_done(self.trainer._ht_last_loss)
        self.trainer._ht_last_loss = None
        if self.ht.begin_step() is None:
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        self.ht.finish()
        return control


class HeteroTrainer(Trainer):
    """``transformers.Trainer`` on heterotrain's plan (see the module doc)."""

    def __init__(self, ht: HeteroTrain, *args, **kwargs):
        if not isinstance(ht, HeteroTrain):
            raise TypeError("heterotrain: HeteroTrainer(ht, ...) needs the HeteroTrain of heterotrain.init()")
        super().__init__(*args, **kwargs)
        if self.args.gradient_accumulation_steps != 1:
            raise ValueError(
                "heterotrain: gradient_accumulation_steps must be 1: each step already trains the whole "
                "global batch B (the sum of the ranks' local batches); raise B instead")
        self.ht = ht
        self._ht_loader: Optional[DataLoader] = None
        self._ht_last_loss: Any = None
        # The model's loss stays the mean over this rank's batch: scale()
        # turns it into the rank's share of the global batch's.
        self.model_accepts_loss_kwargs = False
        if getattr(self.args, "average_tokens_across_devices", False):
            self.args.average_tokens_across_devices = False
        if self.args.max_steps is None or self.args.max_steps <= 0:
            if ht.total_steps is None and self.train_dataset is not None:
                ht._make_sampler(len(self.train_dataset))
            if ht.total_steps is not None:
                self.args.max_steps = ht.total_steps
        self.add_callback(HeteroTrainCallback(ht, self))

    def get_train_dataloader(self) -> DataLoader:
        if self.train_dataset is None:
            raise ValueError("heterotrain: HeteroTrainer needs a train_dataset")
        sampler = self.ht.batch_sampler(self.train_dataset)
        workers = self.args.dataloader_num_workers
        loader = DataLoader(
            self.train_dataset,
            batch_sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=workers,
            pin_memory=self.args.dataloader_pin_memory,
            persistent_workers=self.args.dataloader_persistent_workers if workers > 0 else False,
            **({"prefetch_factor": self.args.dataloader_prefetch_factor}
               if workers > 0 and self.args.dataloader_prefetch_factor is not None else {}),
        )
        if not isinstance(loader.batch_sampler, HeteroBatchSampler):  # pragma: no cover - a DataLoader invariant
            raise TypeError("heterotrain: the training DataLoader lost its batch sampler")
        self._ht_loader = loader
        return loader

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = super().compute_loss(model, inputs, return_outputs=return_outputs)
        loss, outputs = out if return_outputs else (out, None)
        self._ht_last_loss = loss.detach()
        loss = self.ht.scale(loss)
        return (loss, outputs) if return_outputs else loss


__all__ = ["HeteroTrainer", "HeteroTrainCallback", "transformers"]
