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


def write_bytes(path, data):
    """Write `data` to `path` atomically (temp file + rename)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def write_idx(path, array):
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += b"".join(struct.pack(">I", d) for d in array.shape)
    write_bytes(path, header + array.tobytes())


def digits_split(n_test=300, seed=0):
    """The digits as uint8 images [N, 8, 8] (0..255) and labels, shuffled by
    a seeded permutation: ((train_images, train_labels), (test_images, test_labels))."""
    from sklearn.datasets import load_digits  # slow to import: only when needed

    d = load_digits()
    images = np.rint(d.images * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    labels = d.target.astype(np.uint8)
    order = np.random.RandomState(seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    return (images[n_test:], labels[n_test:]), (images[:n_test], labels[:n_test])


def write_digits_idx(out_dir, n_test=300, seed=0):
    (tr_x, tr_y), (te_x, te_y) = digits_split(n_test, seed)
    os.makedirs(out_dir, exist_ok=True)
    write_idx(os.path.join(out_dir, "train-images-idx3-ubyte"), tr_x)
    write_idx(os.path.join(out_dir, "train-labels-idx1-ubyte"), tr_y)
    write_idx(os.path.join(out_dir, "t10k-images-idx3-ubyte"), te_x)
    write_idx(os.path.join(out_dir, "t10k-labels-idx1-ubyte"), te_y)
    return len(tr_y), len(te_y)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--test", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    n_train, n_test = write_digits_idx(a.out_dir, a.test, a.seed)
    print(f"wrote {n_train} train and {n_test} test digits to {a.out_dir}")


if __name__ == "__main__":
    main()
