"""One rank of the Lightning test (not a test module itself).

    python lightning_worker.py CONFIG.json

A LightningModule whose ``training_step`` returns its plain mean loss,
``Trainer(**heterotrain.lightning.trainer_kwargs(ht))``, the script's own
``DataLoader(num_workers=2)`` on ``ht.batch_sampler``. Rank 0 writes the
plan file after the steps named in ``writes``.
"""

import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import lightning.pytorch as pl  # noqa: E402

import heterotrain  # noqa: E402
import heterotrain.lightning  # noqa: E402
from ddp_worker import model_and_data, optimizer, write_atomic  # noqa: E402
from loader_worker import Samples, finish  # noqa: E402


class Module(pl.LightningModule):
    def __init__(self, model, ht, cfg):
        super().__init__()
        self.model, self.ht, self.cfg = model, ht, cfg
        self.log_rows = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        ht = self.ht
        step = ht.current_step
        self.log_rows.append({"step": step, "generation": ht.plan.generation, "sizes": ht.plan.batch_sizes,
                              "indices": ht.local_indices(step), "rows": int(x.shape[0]),
                              "lookahead": ht.lookahead})
        text = self.cfg.get("writes", {}).get(str(step))
        if ht.rank == 0 and text is not None:
            write_atomic(self.cfg["plan_file"], text)
        return F.cross_entropy(self.model(x), y)

    def configure_optimizers(self):
        return optimizer(self.model.parameters())


def main(cfg):
    model, ds = model_and_data(cfg)
    dataset = Samples(ds)
    ht = heterotrain.init(cfg["b"], total_steps=cfg["steps"], seed=cfg["seed"],
                          plan_file=cfg["plan_file"], metrics_port=0)
    loader = DataLoader(dataset, batch_sampler=ht.batch_sampler(dataset), num_workers=cfg["workers"])
    module = Module(model, ht, cfg)
    trainer = pl.Trainer(**heterotrain.lightning.trainer_kwargs(ht), accelerator="cpu",
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=cfg["out"])
    trainer.fit(module, loader)
    finish(cfg, ht, model, {"log": module.log_rows, "step": ht.step, "global_step": trainer.global_step})


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        main(json.load(f))
