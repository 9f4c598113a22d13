#!/usr/bin/env python3
"""Build HeteroTrain's real datasets from data that ships on the machine
(nothing is downloaded), into OUT_DIR (`make setup` uses
$HETEROTRAIN_CACHE/data):

  digits-mnist/    scikit-learn's bundled digits (1,797 8x8 greyscale images,
                   10 classes) as MNIST IDX files: 1,497 train, 300 test
                   (the split of digits_to_idx.py: seeded permutation).
  digits-cifar10/  the same digits and split in the CIFAR-10 binary layout:
                   each image upscaled bilinearly to 32x32, grey replicated to
                   3 channels; data_batch_1.bin (train), test_batch.bin (test),
                   batches.meta.txt (class names "0".."9"). Records are
                   1 label byte + 3,072 pixel bytes (R, G, B planes, row-major).
  pystdlib-bytes/  a byte-level text corpus for `gpt` (vocab 256): this
                   Python's standard-library .py sources (no tests, no
                   site-packages): whole files picked in the CRC-32 order of
                   their paths until --text-mib MiB; every 10th picked file
                   (in path order) is held out. train.bin and val.bin are
                   nanoGPT's flat little-endian uint16 token files (each the
                   files joined by newlines). SOURCE.txt lists the files.

Idempotent: a directory whose `.complete` stamp matches this script's
version and options is kept; anything else is rebuilt. Progress is printed.

usage: make_datasets.py OUT_DIR [--seed 0] [--test 300] [--text-mib 4] [--force]
"""
import argparse
import os
import shutil
import sys
import sysconfig
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits_to_idx import digits_split, write_bytes, write_digits_idx  # noqa: E402

# Bump when what is written changes, to rebuild existing caches.
VERSION = "1"
CIFAR_SIDE = 32
# Path parts excluded from the text corpus: tests (large generated data),
# third-party packages, the IDLE GUI, and build configuration.
EXCLUDED_PARTS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"}


def say(msg):
    print(f"    {msg}", flush=True)


def bilinear_matrix(src, dst):
    """[dst, src] weights of bilinear resampling (half-pixel centres, edges
    clamped — PyTorch's align_corners=False)."""
    w = np.zeros((dst, src), dtype=np.float64)
    scale = src / dst
    for i in range(dst):
        x = min(max((i + 0.5) * scale - 0.5, 0.0), src - 1.0)
        lo = int(np.floor(x))
        hi = min(lo + 1, src - 1)
        frac = x - lo
        w[i, lo] += 1.0 - frac
        w[i, hi] += frac
    return w


def upscale(images, side):
    """uint8 [N, h, w] → uint8 [N, side, side], bilinear."""
    _, h, w = images.shape
    rows = bilinear_matrix(h, side)
    cols = bilinear_matrix(w, side)
    out = np.einsum("ih,nhw,jw->nij", rows, images.astype(np.float64), cols)
    return np.rint(out).clip(0, 255).astype(np.uint8)


def cifar_records(images, labels):
    """CIFAR-10 binary records: label byte, then R, G, B planes (grey replicated)."""
    big = upscale(images, CIFAR_SIDE).reshape(len(labels), -1)
    rec = np.concatenate(
        [labels.reshape(-1, 1).astype(np.uint8), big, big, big], axis=1
    )
    assert rec.shape[1] == 1 + 3 * CIFAR_SIDE * CIFAR_SIDE
    return np.ascontiguousarray(rec).tobytes()


def build_digits_cifar(out_dir, n_test, seed):
    (tr_x, tr_y), (te_x, te_y) = digits_split(n_test, seed)
    os.makedirs(out_dir, exist_ok=True)
    write_bytes(os.path.join(out_dir, "data_batch_1.bin"), cifar_records(tr_x, tr_y))
    write_bytes(os.path.join(out_dir, "test_batch.bin"), cifar_records(te_x, te_y))
    write_bytes(
        os.path.join(out_dir, "batches.meta.txt"),
        "".join(f"{d}\n" for d in range(10)).encode(),
    )
    return f"{len(tr_y)} train and {len(te_y)} test images, 3x{CIFAR_SIDE}x{CIFAR_SIDE}"


def stdlib_sources():
    """The standard library's .py files (absolute, relative), sorted by relative path."""
    root = sysconfig.get_paths()["stdlib"]
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        parts = [] if rel_dir == "." else rel_dir.split(os.sep)
        if any(p in EXCLUDED_PARTS or p.startswith("config-") for p in parts):
            dirnames[:] = []
            continue
        for f in filenames:
            # _sysconfigdata* describes this build of Python, not the language.
            if f.endswith(".py") and not f.startswith("_sysconfigdata"):
                rel = "/".join(parts + [f])
                found.append((os.path.join(dirpath, f), rel))
    found.sort(key=lambda t: t[1])
    return root, found


def build_text(out_dir, text_mib):
    budget = int(text_mib * 1024 * 1024)
    root, files = stdlib_sources()
    # A spread over the whole library, the same on every run: files in the
    # order of the CRC-32 of their relative path, until the budget is used.
    picked, total = [], 0
    for path, rel in sorted(files, key=lambda t: (zlib.crc32(t[1].encode()), t[1])):
        if total >= budget:
            break
        with open(path, "rb") as f:
            data = f.read()
        picked.append((rel, data))
        total += len(data) + 1
    picked.sort(key=lambda t: t[0])
    # Every 10th file (in path order) is held out.
    val = [p for i, p in enumerate(picked) if i % 10 == 9]
    train = [p for i, p in enumerate(picked) if i % 10 != 9]
    if not val or sum(len(d) for _, d in val) < 4096:
        raise SystemExit(f"too few .py sources under {root} for a corpus")
    os.makedirs(out_dir, exist_ok=True)
    counts = {}
    for name, part in (("train", train), ("val", val)):
        corpus = b"\n".join(d for _, d in part)
        tokens = np.frombuffer(corpus, dtype=np.uint8).astype("<u2")
        write_bytes(os.path.join(out_dir, f"{name}.bin"), tokens.tobytes())
        counts[name] = len(tokens)
    version = sys.version.split()[0]
    lines = [
        f"# byte-level corpus: {len(picked)} .py files of Python {version}'s standard "
        f"library ({root}), picked in CRC-32 order of their paths up to {text_mib} MiB; "
        "every 10th (in path order) is val.bin, the rest train.bin, each joined by "
        "newlines; tokens are bytes (vocab 256), little-endian uint16"
    ]
    lines += [f"{'val  ' if (rel, d) in val else 'train'} {rel} {len(d)}" for rel, d in picked]
    write_bytes(os.path.join(out_dir, "SOURCE.txt"), ("\n".join(lines) + "\n").encode())
    return (
        f"{len(picked)} files, {counts['train']:,} train and {counts['val']:,} val tokens "
        f"(Python {version})"
    )


def ensure(out_root, name, stamp, build, force):
    d = os.path.join(out_root, name)
    stamp_path = os.path.join(d, ".complete")
    if not force and os.path.exists(stamp_path):
        with open(stamp_path) as f:
            if f.read() == stamp:
                say(f"{name}: present ({d})")
                return
    say(f"{name}: building ...")
    if os.path.isdir(d):
        shutil.rmtree(d)
    what = build(d)
    write_bytes(stamp_path, stamp.encode())
    say(f"{name}: {what} in {d}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--seed", type=int, default=0, help="seed of the digits' train/test split")
    ap.add_argument("--test", type=int, default=300, help="held-out digits")
    ap.add_argument("--text-mib", type=float, default=4.0, help="size of the text corpus, MiB")
    ap.add_argument("--force", action="store_true", help="rebuild even when present")
    a = ap.parse_args()
    if not 0 < a.test < 1797:
        raise SystemExit(f"--test must be between 1 and 1796, got {a.test}")
    if a.text_mib <= 0:
        raise SystemExit(f"--text-mib must be positive, got {a.text_mib}")
    os.makedirs(a.out_dir, exist_ok=True)
    digits = f"v{VERSION} seed={a.seed} test={a.test}\n"

    def idx(d):
        n_train, n_test = write_digits_idx(d, a.test, a.seed)
        return f"{n_train} train and {n_test} test images, 1x8x8"

    ensure(a.out_dir, "digits-mnist", digits, idx, a.force)
    ensure(
        a.out_dir,
        "digits-cifar10",
        digits,
        lambda d: build_digits_cifar(d, a.test, a.seed),
        a.force,
    )
    ensure(
        a.out_dir,
        "pystdlib-bytes",
        f"v{VERSION} mib={a.text_mib} python={sys.version.split()[0]}\n",
        lambda d: build_text(d, a.text_mib),
        a.force,
    )


if __name__ == "__main__":
    main()
