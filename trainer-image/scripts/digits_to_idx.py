#!/usr/bin/env python3
"""Convert scikit-learn's bundled `digits` (1,797 8x8 images, real data that
ships inside the package, nothing downloaded) into MNIST-format IDX files:
train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
t10k-labels-idx1-ubyte. The split is deterministic (seeded permutation).

usage: digits_to_idx.py OUT_DIR [--test 300] [--seed 0]
"""
import argparse
import os
import struct

import numpy as np
from sklearn.datasets import load_digits


def write_idx(path, array):
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += b"".join(struct.pack(">I", d) for d in array.shape)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header)
        f.write(array.tobytes())
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--test", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    d = load_digits()
    images = np.rint(d.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    labels = d.target.astype(np.uint8)
    order = np.random.RandomState(a.seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    n_test = a.test
    os.makedirs(a.out_dir, exist_ok=True)
    write_idx(os.path.join(a.out_dir, "train-images-idx3-ubyte"), images[n_test:])
    write_idx(os.path.join(a.out_dir, "train-labels-idx1-ubyte"), labels[n_test:])
    write_idx(os.path.join(a.out_dir, "t10k-images-idx3-ubyte"), images[:n_test])
    write_idx(os.path.join(a.out_dir, "t10k-labels-idx1-ubyte"), labels[:n_test])
    print(f"wrote {len(labels) - n_test} train and {n_test} test digits to {a.out_dir}")


if __name__ == "__main__":
    main()
