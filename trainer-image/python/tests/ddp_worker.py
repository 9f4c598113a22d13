"""One process of the DDP equivalence test (not a test module itself).

    python ddp_worker.py CONFIG.json

``mode: "hetero"``: a rank of a real Gloo job (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT from the environment) training with heterotrain; rank 0 writes
the plan file after the steps named in ``writes`` (as an operator would).
``mode: "reference"``: one plain PyTorch process, global batch B, no
torch.distributed. Both write what they did under ``out``.
"""

import json
import os
import sys
import urllib.request

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def model_and_data(cfg):
    torch.manual_seed(1234)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    g = torch.Generator().manual_seed(7)
    x = torch.randn(cfg["n"], 8, generator=g)
    y = torch.randint(0, 4, (cfg["n"],), generator=g)
    return model, torch.utils.data.TensorDataset(x, y)


def optimizer(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def hetero(cfg):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import heterotrain

    model, ds = model_and_data(cfg)
    ht = heterotrain.init(cfg["b"], total_steps=cfg["steps"], seed=cfg["seed"],
                          plan_file=cfg["plan_file"], metrics_port=0)
    ddp = DDP(model)
    opt = optimizer(ddp.parameters())
    if cfg.get("hook", True):
        # With the optimizer, a left-out rank skips its steps.
        ht.attach(ddp, optimizer=opt)
    forwards = []
    model.register_forward_pre_hook(lambda m, args: forwards.append(ht.current_step))
    log = []
    for step, (x, y) in ht.batches(ds):
        log.append({"step": step, "epoch": ht.epoch, "generation": ht.plan.generation,
                    "sizes": ht.plan.batch_sizes, "indices": ht.local_indices(step),
                    "rows": int(x.shape[0])})
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        ht.step_done(loss)
        text = cfg.get("writes", {}).get(str(step))
        if ht.rank == 0 and text is not None:
            write_atomic(cfg["plan_file"], text)
    ht.finish()
    out = cfg["out"]
    # A generous timeout: the endpoint is a thread of this process, which a
    # loaded machine may leave waiting for the CPU.
    with urllib.request.urlopen(f"http://127.0.0.1:{ht.metrics_port}/metrics", timeout=60) as r:
        metrics = r.read().decode()
    with open(os.path.join(out, f"metrics{ht.rank}.txt"), "w") as f:
        f.write(metrics)
    with open(os.path.join(out, f"rank{ht.rank}.json"), "w") as f:
        json.dump({"log": log, "step": ht.step, "stopped": ht.stopped, "forwards": forwards,
                   "gradient_bytes": ht.hook_state.bytes_total, "skipped": ht.skipped_steps,
                   "parameter_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}, f)
    if ht.rank == 0:
        torch.save(model.state_dict(), os.path.join(out, "hetero.pt"))
    dist.barrier()
    dist.destroy_process_group()


def reference(cfg):
    model, ds = model_and_data(cfg)
    x_all, y_all = ds.tensors
    opt = optimizer(model.parameters())
    n, b = cfg["n"], cfg["b"]
    spe = n // b
    log = []
    for step in range(1, cfg["steps"] + 1):
        epoch, k = divmod(step - 1, spe)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(cfg["seed"] + epoch))
        idx = perm[k * b:(k + 1) * b]
        log.append(idx.tolist())
        opt.zero_grad()
        F.cross_entropy(model(x_all[idx]), y_all[idx]).backward()
        opt.step()
    torch.save(model.state_dict(), os.path.join(cfg["out"], "reference.pt"))
    with open(os.path.join(cfg["out"], "reference.json"), "w") as f:
        json.dump(log, f)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        config = json.load(f)
    (hetero if config["mode"] == "hetero" else reference)(config)
