"""Export your own PyTorch model and data for HeteroTrain.

Writes into --out:
  model.pt            the model, scripted with torch.jit.script (what
                      `--model torchscript --model-file` / `spec.model.file` load)
  train.safetensors   x: float32 [N, 1, 8, 8], y: int64 [N]  (`--dataset tensors`)
  eval.safetensors    the held-out part, same layout

The data are scikit-learn's bundled 8x8 digits (1,797 images, 10 classes),
scaled to [0, 1] and split at random (fixed seed). The model is a small
convolutional network with LayerNorm (no BatchNorm), defined here in Python:
HeteroTrain trains it as it is, without knowing its architecture.

Run with the project venv's python (torch 2.11, safetensors, scikit-learn):
  ~/.cache/heterotrain/venv/bin/python examples/own-model/export.py --out /tmp/own-model
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file
from sklearn.datasets import load_digits


class DigitsNet(nn.Module):
    """conv 3x3 -> GELU -> max-pool -> LayerNorm -> linear: [B, 1, 8, 8] -> [B, 10] logits."""

    def __init__(self, channels: int = 16, classes: int = 10):
        super().__init__()
        self.conv = nn.Conv2d(1, channels, 3, padding=1)
        self.norm = nn.LayerNorm(channels * 4 * 4)
        self.head = nn.Linear(channels * 4 * 4, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.gelu(self.conv(x)), 2)
        return self.head(self.norm(h.flatten(1)))


def digits(eval_fraction: float, seed: int):
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.int64)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[order].contiguous(), y[order].contiguous()
    n_eval = round(len(y) * eval_fraction)
    n_train = len(y) - n_eval
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="own-model", help="output directory")
    ap.add_argument("--eval-fraction", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0, help="data split and initial weights")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    torch.manual_seed(args.seed)
    model = torch.jit.script(DigitsNet())
    model.save(os.path.join(args.out, "model.pt"))

    (tx, ty), (ex, ey) = digits(args.eval_fraction, args.seed)
    save_file({"x": tx, "y": ty}, os.path.join(args.out, "train.safetensors"))
    save_file({"x": ex, "y": ey}, os.path.join(args.out, "eval.safetensors"))
    params = sum(p.numel() for p in model.parameters())
    print(
        f"wrote {args.out}/model.pt ({params} parameters), "
        f"train.safetensors ({len(ty)} samples), eval.safetensors ({len(ey)} samples)"
    )


if __name__ == "__main__":
    main()
