"""One rank of the DataLoader test (not a test module itself).

    python loader_worker.py CONFIG.json

The script a user keeps: its own ``DataLoader`` (worker processes) over a
map-style dataset with ``batch_sampler=ht.batch_sampler(dataset)``, plain
DDP (no communication hook) and ``ht.scale(loss)``. Rank 0 writes the plan
file after the steps named in ``writes`` (as an operator would). With
``stop_after`` the run saves a checkpoint (model, optimizer, heterotrain)
after that step and ends there; with ``resume`` it starts from one.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import heterotrain  # noqa: E402
from ddp_worker import model_and_data, optimizer, write_atomic  # noqa: E402


class Samples(torch.utils.data.Dataset):
    """A map-style dataset read sample by sample (as most are)."""

    def __init__(self, ds):
        self.x, self.y = ds.tensors

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main(cfg):
    model, ds = model_and_data(cfg)
    dataset = Samples(ds)
    ht = heterotrain.init(cfg["b"], total_steps=cfg["steps"], seed=cfg["seed"],
                          plan_file=cfg["plan_file"], metrics_port=0)
    ddp = DDP(model)
    opt = optimizer(ddp.parameters())
    loader = DataLoader(dataset, batch_sampler=ht.batch_sampler(dataset),
                        num_workers=cfg["workers"], pin_memory=False)
    if cfg.get("resume"):
        ckpt = torch.load(cfg["resume"])
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        ht.load_state_dict(ckpt["heterotrain"])
    def checkpoint_and_stop(step):
        if step != cfg.get("stop_after"):
            return False
        if ht.rank == 0:
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "heterotrain": ht.state_dict()}, cfg["checkpoint"])
        return True

    log = train(ht, ddp, opt, loader, cfg, stop=checkpoint_and_stop)
    ht.finish()
    finish(cfg, ht, model, {"log": log, "step": ht.step}, save_model=not cfg.get("stop_after"))


def train(ht, model, opt, loader, cfg, stop=None):
    """The user's loop over ``ht.steps(loader)`` with ``ht.scale(loss)``;
    rank 0 writes the plan file after the steps named in ``writes``; ends
    after a step for which ``stop(step)`` is true. Returns each step's record."""
    log = []
    for step, (x, y) in ht.steps(loader):
        log.append({"step": step, "epoch": ht.epoch, "generation": ht.plan.generation,
                    "sizes": ht.plan.batch_sizes, "indices": ht.local_indices(step),
                    "rows": int(x.shape[0]), "lookahead": ht.lookahead})
        opt.zero_grad()
        loss = ht.scale(F.cross_entropy(model(x), y))
        loss.backward()
        opt.step()
        text = cfg.get("writes", {}).get(str(step))
        if ht.rank == 0 and text is not None:
            write_atomic(cfg["plan_file"], text)
        if stop is not None and stop(step):
            break
    return log


def finish(cfg, ht, model, result, save_model=True):
    """Write this rank's ``result`` (and rank 0's parameters) under the
    run's ``out``, then leave the process group with every rank."""
    out = cfg["out"]
    with open(os.path.join(out, f"rank{ht.rank}.json"), "w") as f:
        json.dump(result, f)
    if ht.rank == 0 and save_model:
        torch.save(model.state_dict(), os.path.join(out, "hetero.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        main(json.load(f))
