#!/usr/bin/env python3
"""PyTorch DDP baseline for `make bench-trainer`: the same models (mlp as
fc1/fc2/fc3, resnet18 = torchvision's architecture), synthetic 3x32x32 data,
SGD with momentum, Gloo backend. Launch with torchrun; rank 0 prints one
JSON line with the measured global samples/s.

usage: torchrun --nproc_per_node 2 ddp_bench.py --model resnet18 --batch-size 64 \
           --steps 20 --warmup 3 --threads 1
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Mlp(nn.Module):
    def __init__(self, inputs, hidden, classes):
        super().__init__()
        self.fc1 = nn.Linear(inputs, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x):
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    """torchvision.models.resnet18 (BasicBlock, [2, 2, 2, 2])."""

    def __init__(self, classes):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        chans, layers, cin = [64, 128, 256, 512], [], 64
        for i, c in enumerate(chans):
            stride = 1 if i == 0 else 2
            layers.append(nn.Sequential(BasicBlock(cin, c, stride), BasicBlock(c, c, 1)))
            cin = c
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "resnet18"], default="mlp")
    ap.add_argument("--batch-size", type=int, default=64, help="global batch")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.01)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Mlp(3 * 32 * 32, a.hidden, 10) if a.model == "mlp" else ResNet18(10)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9)
    local = a.batch_size // world
    g = torch.Generator().manual_seed(rank)
    n = 256 if a.model == "resnet18" else 4096
    xs = torch.randn(n, 3, 32, 32, generator=g)
    ys = torch.randint(0, 10, (n,), generator=g)
    times = []
    for step in range(a.warmup + a.steps):
        i = (step * local) % (n - local)
        x, y = xs[i : i + local], ys[i : i + local]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    t = torch.tensor([sum(times[a.warmup :])], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        sps = a.batch_size * a.steps / t.item()
        print(json.dumps({"impl": "ddp", "model": a.model, "samples_per_second": sps}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
