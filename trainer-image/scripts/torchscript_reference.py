#!/usr/bin/env python3
"""The PyTorch side of tests/torchscript.rs.

usage:
  torchscript_reference.py make DIR
      a model defined here, scripted (DIR/model.pt), and a learnable
      synthetic task as DIR/train.safetensors and DIR/eval.safetensors
  torchscript_reference.py train DIR OUT --steps S --batch-size B --lr LR
                                 --momentum M --weight-decay WD
      the reference: one process, eager PyTorch (the Python class, with the
      scripted module's initial weights), global batch B, samples in order
      (an epoch is floor(N/B) steps, the tail dropped), mean cross-entropy,
      torch.optim.SGD; the parameters after S steps go to OUT (safetensors)
  torchscript_reference.py check MODEL_PT WEIGHTS DIR
      MODEL_PT (a TorchScript module) has exactly the parameters of WEIGHTS
      (safetensors) and maps DIR/eval.safetensors' x to finite logits;
      prints a JSON summary
"""
import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

CLASSES = 4
TRAIN, EVAL = 400, 64


class Net(nn.Module):
    """conv -> tanh -> LayerNorm -> residual MLP block -> logits; [B, 2, 6, 6] -> [B, 4]."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.norm = nn.LayerNorm(64)
        self.block = nn.Sequential(nn.Linear(64, 32), nn.GELU(), nn.Linear(32, 64))
        self.head = nn.Linear(64, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(torch.tanh(self.conv(x)).flatten(1))
        h = h + self.block(h)
        return self.head(h)


def make(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(7)
    torch.jit.script(Net()).save(os.path.join(out, "model.pt"))
    protos = torch.randn(CLASSES, 2, 6, 6)

    def split(n):
        y = torch.randint(0, CLASSES, (n,), dtype=torch.int64)
        x = 0.35 * protos[y] + torch.randn(n, 2, 6, 6)
        return {"x": x.contiguous(), "y": y}

    save_file(split(TRAIN), os.path.join(out, "train.safetensors"))
    save_file(split(EVAL), os.path.join(out, "eval.safetensors"))


def train(a):
    torch.set_num_threads(1)
    scripted = torch.jit.load(os.path.join(a.dir, "model.pt"))
    model = Net()
    model.load_state_dict(scripted.state_dict())
    model.train()
    data = load_file(os.path.join(a.dir, "train.safetensors"))
    x, y = data["x"], data["y"]
    per_epoch = len(y) // a.batch_size
    opt = torch.optim.SGD(
        model.parameters(), lr=a.lr, momentum=a.momentum, weight_decay=a.weight_decay
    )
    loss = torch.tensor(float("nan"))
    for step in range(a.steps):
        k = step % per_epoch
        xb = x[k * a.batch_size : (k + 1) * a.batch_size]
        yb = y[k * a.batch_size : (k + 1) * a.batch_size]
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    save_file(
        {n: p.detach().contiguous() for n, p in model.named_parameters()}, a.out
    )
    print(json.dumps({"steps": a.steps, "per_epoch": per_epoch, "loss": loss.item()}))


def check(a):
    m = torch.jit.load(a.model)
    w = load_file(a.weights)
    params = dict(m.named_parameters())
    assert sorted(params) == sorted(w), f"{sorted(params)} != {sorted(w)}"
    diff = max((params[n].detach() - w[n]).abs().max().item() for n in w)
    x = load_file(os.path.join(a.dir, "eval.safetensors"))["x"]
    with torch.no_grad():
        logits = m(x)
    assert list(logits.shape) == [len(x), CLASSES], logits.shape
    assert torch.isfinite(logits).all()
    print(json.dumps({"params": len(w), "max_diff": diff, "logits": list(logits.shape)}))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    t = sub.add_parser("train")
    t.add_argument("dir")
    t.add_argument("out")
    t.add_argument("--steps", type=int, required=True)
    t.add_argument("--batch-size", type=int, required=True)
    t.add_argument("--lr", type=float, required=True)
    t.add_argument("--momentum", type=float, required=True)
    t.add_argument("--weight-decay", type=float, required=True)
    c = sub.add_parser("check")
    c.add_argument("model")
    c.add_argument("weights")
    c.add_argument("dir")
    a = ap.parse_args()
    if a.cmd == "make":
        make(a.dir)
    elif a.cmd == "train":
        train(a)
    else:
        check(a)


if __name__ == "__main__":
    main()
