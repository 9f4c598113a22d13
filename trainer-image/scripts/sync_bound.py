"""One rank of the synchronisation bound (see sync_bound.sh --help).

simple_cnn's layers in plain PyTorch, one thread, random CIFAR-shaped rows.
Each step: gather the batch, forward, backward, SGD with momentum, then
MODE's synchronisation: none (solo), a one-number all-reduce (barrier) or
the whole gradient all-reduced after backward (grads). Writes the rank's
steps per second over the second half of the steps as JSON to OUT.
"""

import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main() -> None:
    if len(sys.argv) != 5 or sys.argv[1] not in ("solo", "barrier", "grads"):
        sys.exit("usage: sync_bound.py solo|barrier|grads BATCH STEPS OUT")
    mode, batch, steps, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2048, 128), nn.ReLU(), nn.Linear(128, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rows = torch.randn(4096, 3, 32, 32)
    labels = torch.randint(0, 10, (4096,))
    if mode != "solo":
        dist.init_process_group("gloo")
    one = torch.zeros(1)
    ends = []
    for _ in range(steps):
        idx = torch.randint(0, rows.shape[0], (batch,))
        opt.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(model(rows[idx]), labels[idx])
        loss.backward()
        if mode == "barrier":
            dist.all_reduce(one)
        elif mode == "grads":
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            dist.all_reduce(flat)
        opt.step()
        ends.append(time.monotonic())
    half = ends[len(ends) // 2:]
    with open(out, "w") as f:
        json.dump({"batch": batch, "steps_per_second": (len(half) - 1) / (half[-1] - half[0])}, f)
    if mode != "solo":
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
