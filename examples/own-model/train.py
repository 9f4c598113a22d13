"""Your own model under HeteroTrain: a plain PyTorch DDP script plus the
`heterotrain` library (trainer-image/python). The lines marked `# ht` are
all it adds; the script keeps its own DataLoader (worker processes and all).

    torchrun --nproc_per_node 2 examples/own-model/train.py --steps 50 --batch-size 64

Each rank trains a local batch sized by the plan (the operator's plan
ConfigMap named by $HETEROTRAIN_PLAN_CONFIGMAP, or --plan-file /
$HT_PLAN_FILE; an equal split until one arrives), the gradient is exactly
that of the global batch, and /metrics serves the trainer's series on
$HT_METRICS_PORT (default 9400). On SIGTERM every rank finishes the step it
is in, stops at the same step and exits 0. With --checkpoint-dir the run
saves model, optimizer and heterotrain's position every --checkpoint-every
steps, and a restarted run continues from the newest checkpoint with the
same sample order.

Everything is local: a small CNN and a synthetic dataset (no downloads).
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

# The library, from this repository when it is not pip-installed.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "trainer-image", "python"))
import heterotrain  # noqa: E402  # ht


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10, width: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8 * width, 3, padding=1)
        self.conv2 = nn.Conv2d(8 * width, 16 * width, 3, padding=1)
        self.fc = nn.Linear(16 * width * 4 * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def synthetic_dataset(n: int, seed: int) -> TensorDataset:
    """16x16 one-channel images whose class is where a bright blob sits."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (n,), generator=g)
    x = 0.3 * torch.randn(n, 1, 16, 16, generator=g)
    for i, c in enumerate(y.tolist()):
        r, col = divmod(c, 5)
        x[i, 0, 2 + 6 * r:6 + 6 * r, 1 + 3 * col:4 + 3 * col] += 1.0
    return TensorDataset(x, y)


def save(path: str, state: dict) -> None:
    """Write a checkpoint so that a crash mid-write never leaves a torn file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=int(os.environ.get("HT_MAX_STEPS") or 200),
                    help="optimizer steps in all (default: $HT_MAX_STEPS, the job's training.maxSteps; else 200)")
    ap.add_argument("--batch-size", type=int, default=int(os.environ.get("HT_BATCH_SIZE", 64)),
                    help="global batch B (sum of the ranks' local batches)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--width", type=int, default=1, help="channel multiplier of the CNN (more compute per sample)")
    ap.add_argument("--samples", type=int, default=4096, help="size of the synthetic dataset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plan-file", default=None, help="plan JSON to follow (default: $HT_PLAN_FILE / the ConfigMap)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    ap.add_argument("--checkpoint-dir", default=os.environ.get("HT_CHECKPOINT_DIR"),
                    help="save and resume here (default: $HT_CHECKPOINT_DIR; none: no checkpoints)")
    ap.add_argument("--checkpoint-every", type=int, default=int(os.environ.get("HT_CHECKPOINT_EVERY") or 20),
                    help="steps between checkpoints (default: $HT_CHECKPOINT_EVERY; 0: only at the end)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    dist.init_process_group(backend="gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment
    rank = dist.get_rank()

    torch.manual_seed(args.seed)
    dataset = synthetic_dataset(args.samples, args.seed)
    model = DDP(SmallCNN(width=args.width))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    ht = heterotrain.init(args.batch_size, total_steps=args.steps, seed=args.seed,  # ht
                          plan_file=args.plan_file)  # ht
    ht.attach(model)  # ht
    loader = DataLoader(dataset, batch_sampler=ht.batch_sampler(dataset),  # ht (was: batch_size=, sampler=)
                        num_workers=args.workers)

    ckpt = os.path.join(args.checkpoint_dir, "latest.pt") if args.checkpoint_dir else None
    state = heterotrain.load_checkpoint(ckpt) if ckpt else None  # ht (rank 0 reads, every rank gets it)
    if state is not None:
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        ht.load_state_dict(state["heterotrain"])  # ht
        print(f"rank {rank}: resumed from {ckpt} after step {ht.step}", flush=True)

    started = time.time()
    for step, (x, y) in ht.steps(loader):  # ht (was: for x, y in loader)
        optimizer.zero_grad()
        with ht.phase("forward"):  # ht (optional: phase timings)
            loss = F.cross_entropy(model(x), y)
        with ht.phase("backward"):  # ht
            loss.backward()
        with ht.phase("optimizer"):  # ht
            optimizer.step()
        if ckpt and rank == 0 and args.checkpoint_every > 0 and step % args.checkpoint_every == 0:
            save(ckpt, {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "heterotrain": ht.state_dict()})  # ht (heterotrain's position)
        ht.step_done(loss)  # ht
        if rank == 0 and (step % args.log_every == 0 or step == 1):
            print(f"step {step}/{args.steps} epoch {ht.epoch} loss {loss.item():.4f} "
                  f"plan {ht.plan.generation} {ht.plan.batch_sizes}", flush=True)
    ht.finish()  # ht
    if ckpt and rank == 0:  # the end, or a stop on SIGTERM: keep what was trained
        save(ckpt, {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "heterotrain": ht.state_dict()})

    how = "stopped (SIGTERM)" if ht.stopped else "finished"
    print(f"rank {rank}: {how} after step {ht.step} in {time.time() - started:.1f}s", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
