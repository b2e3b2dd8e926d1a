#!/usr/bin/env python3
"""Writes synthetic data in CIFAR-10's binary format, for benchmarks where the real files are
absent (the GPU machine reaches no network): the same files, sizes and record layout as
https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz unpacks to.

    bench/make_cifar10.py OUTDIR [--train 50000] [--test 10000] [--seed 0]

writes OUTDIR/cifar-10-batches-bin/data_batch_1.bin .. data_batch_5.bin (the training examples
split over five files as evenly as possible), test_batch.bin and batches.meta.txt. Each record
is a label byte then a 32x32 image as red, green and blue planes (3073 bytes). The images are
not noise: each class has its own colour and stripe direction, under noise, so a model learns
them (the accuracies printed are about this synthetic set, never about CIFAR-10). Throughput is
what these files are for: it depends on the shapes, not on the pixels.
"""
import argparse
import os
import sys

import numpy as np

CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
           "truck"]


def records(count, rng):
    labels = rng.integers(0, 10, size=count, dtype=np.uint8)
    yy, xx = np.mgrid[0:32, 0:32]
    base = np.empty((10, 3, 32, 32), np.float32)
    for c in range(10):
        colour = np.array([(c * 37) % 256, (c * 91) % 256, (c * 53) % 256], np.float32)
        angle = np.pi * c / 10
        stripes = 60 * np.sin((xx * np.cos(angle) + yy * np.sin(angle)) / 3.0)
        base[c] = colour[:, None, None] * 0.6 + stripes[None]
    out = np.empty((count, 3073), np.uint8)
    out[:, 0] = labels
    chunk = 5000  # the noise of 50000 images at once would take 600 MB
    for begin in range(0, count, chunk):
        end = min(begin + chunk, count)
        noise = rng.normal(0, 40, size=(end - begin, 3, 32, 32)).astype(np.float32)
        images = np.clip(base[labels[begin:end]] + 64 + noise, 0, 255).astype(np.uint8)
        out[begin:end, 1:] = images.reshape(end - begin, 3072)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir")
    p.add_argument("--train", type=int, default=50000)
    p.add_argument("--test", type=int, default=10000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.train < 5 or args.test < 1:
        sys.exit("make_cifar10: --train must be at least 5 (five files) and --test at least 1")
    folder = os.path.join(args.outdir, "cifar-10-batches-bin")
    os.makedirs(folder, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    train = records(args.train, rng)
    for i, part in enumerate(np.array_split(train, 5)):
        part.tofile(os.path.join(folder, f"data_batch_{i + 1}.bin"))
    records(args.test, rng).tofile(os.path.join(folder, "test_batch.bin"))
    with open(os.path.join(folder, "batches.meta.txt"), "w") as f:
        f.write("\n".join(CLASSES) + "\n")
    print(f"make_cifar10: {args.train} training and {args.test} test records (synthetic) "
          f"in {folder}")


if __name__ == "__main__":
    main()
