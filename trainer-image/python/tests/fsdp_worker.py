"""One rank of the FSDP test (not a test module itself).

    python fsdp_worker.py CONFIG.json

The script's own ``DataLoader(num_workers=2)`` on ``ht.batch_sampler()``,
the model sharded with FSDP2's ``fully_shard`` on a CPU device mesh (Gloo),
and ``ht.scale(loss)``: FSDP averages the gradients it reduce-scatters over
the ranks, so each rank's mean loss is weighted by W·b_r/B. Rank 0 writes
the plan file after the steps named in ``writes``.
"""

import json
import os
import sys

import torch
from torch.utils.data import DataLoader

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

import heterotrain  # noqa: E402
from ddp_worker import model_and_data, optimizer  # noqa: E402
from loader_worker import Samples, train  # noqa: E402


def main(cfg):
    model, ds = model_and_data(cfg)
    dataset = Samples(ds)
    ht = heterotrain.init(cfg["b"], total_steps=cfg["steps"], seed=cfg["seed"],
                          plan_file=cfg["plan_file"], metrics_port=0)
    mesh = init_device_mesh("cpu", (ht.world_size,))
    for layer in model:
        if any(True for _ in layer.parameters()):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = optimizer(model.parameters())
    loader = DataLoader(dataset, batch_sampler=ht.batch_sampler(dataset),
                        num_workers=cfg["workers"], pin_memory=False)
    log = train(ht, model, opt, loader, cfg)
    ht.finish()
    # Every rank gathers the full parameters (a collective); rank 0 saves them.
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    out = cfg["out"]
    with open(os.path.join(out, f"rank{ht.rank}.json"), "w") as f:
        json.dump({"log": log, "step": ht.step}, f)
    if ht.rank == 0:
        torch.save(full, os.path.join(out, "hetero.pt"))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        main(json.load(f))
