#!/usr/bin/env python3
"""Loads a dprun checkpoint into the d2l PyTorch model and evaluates it on Fashion-MNIST.

The model is written as d2l writes it (torch.nn.Sequential, d2l's Residual), not derived from
dprun: the load is load_state_dict(strict=True), so a missing, extra, misnamed or misshapen
tensor fails. The checkpoint is the trial's last one, found in the dprun database with the
test accuracy dprun recorded for its epoch; the accuracy PyTorch computes on the same test
examples must agree within --tolerance, be at least --min-accuracy (a floor well above chance,
0.10 on Fashion-MNIST's 10 balanced classes: agreement alone passes a model that predicts one
class, whatever its weights), and the predictions must cover at least --min-classes distinct
classes (such a model is caught directly).

The file is read with safetensors.torch.load_file when the safetensors package is installed,
else with the small reader below, written from the format's documentation (an 8-byte
little-endian header length, a JSON header of dtype, shape and data_offsets, then the bytes).

The last line of the output is for the test to read: "result: accuracy=A recorded=R classes=C
examples=N".

Exit status: 0 all checks hold, 1 a check fails (each failure says why on stderr) or the load
fails, 77 PyTorch missing.
"""
import argparse
import gzip
import hashlib
import json
import os
import sqlite3
import struct
import sys

try:
    import numpy as np
    import torch
    from torch import nn
except ImportError as e:  # the test says why it skips
    print(f"PyTorch is not importable here: {e}", file=sys.stderr)
    sys.exit(77)

# ---- the d2l models ---------------------------------------------------------------------------


def lenet():
    # dprun's LeNet plugin (d2l's "Training on Multiple GPUs" LeNet, as nn.Sequential).
    return nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3), nn.ReLU(), nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(), nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))


class Residual(nn.Module):
    """d2l.Residual (d2l 1.0, PyTorch), with the input channels given instead of lazy modules."""

    def __init__(self, in_channels, num_channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, num_channels, kernel_size=3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(num_channels, num_channels, kernel_size=3, padding=1)
        self.conv3 = (nn.Conv2d(in_channels, num_channels, kernel_size=1, stride=strides)
                      if use_1x1conv else None)
        self.bn1 = nn.BatchNorm2d(num_channels)
        self.bn2 = nn.BatchNorm2d(num_channels)

    def forward(self, X):
        Y = torch.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        Y += X
        return torch.relu(Y)


def resnet18(num_classes=10, in_channels=1, width=64):
    """d2l's small-image ResNet-18 ("Concise Implementation for Multiple GPUs"); width 64 is
    d2l's, other widths scale every stage as dprun's plugin option does."""

    def resnet_block(in_ch, out_ch, num_residuals, first_block=False):
        blk = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(Residual(in_ch, out_ch, use_1x1conv=True, strides=2))
            else:
                blk.append(Residual(out_ch, out_ch))
        return nn.Sequential(*blk)

    w = width
    net = nn.Sequential(
        nn.Conv2d(in_channels, w, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(w), nn.ReLU())
    net.add_module("resnet_block1", resnet_block(w, w, 2, first_block=True))
    net.add_module("resnet_block2", resnet_block(w, 2 * w, 2))
    net.add_module("resnet_block3", resnet_block(2 * w, 4 * w, 2))
    net.add_module("resnet_block4", resnet_block(4 * w, 8 * w, 2))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(8 * w, num_classes)))
    return net

# ---- safetensors ------------------------------------------------------------------------------


DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        array = np.frombuffer(body[begin:end], dtype=DTYPES[entry["dtype"]]).copy()
        tensors[name] = torch.from_numpy(array.reshape(entry["shape"]))
    return tensors


def load_file(path):
    try:
        from safetensors.torch import load_file as st_load
        return st_load(path), "safetensors.torch.load_file"
    except ImportError:
        return read_safetensors(path), "the test's reader of the safetensors format"

# ---- data -------------------------------------------------------------------------------------


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def find(folder, stem):
    for name in (stem, stem + ".gz"):
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    sys.exit(f"{folder}: no {stem}[.gz]")

# ---- main -------------------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--db", required=True)
    p.add_argument("--trial", type=int, required=True)
    p.add_argument("--data", required=True, help="the Fashion-MNIST folder")
    p.add_argument("--model", choices=["lenet", "resnet18"], required=True)
    p.add_argument("--width", type=int, default=64, help="resnet18's width option")
    p.add_argument("--tolerance", type=float, default=0.002,
                   help="largest difference to dprun's recorded test accuracy")
    p.add_argument("--min-accuracy", type=float, required=True,
                   help="the floor of PyTorch's test accuracy")
    p.add_argument("--min-classes", type=int, default=5,
                   help="the fewest distinct classes the predictions may cover (of 10)")
    a = p.parse_args()

    db = sqlite3.connect(f"file:{a.db}?mode=ro", uri=True)
    row = db.execute("SELECT path, sha256, epoch FROM checkpoints WHERE trial_id = ? AND "
                     "role = 'last'", (a.trial,)).fetchone()
    if row is None:
        sys.exit(f"trial {a.trial} has no last checkpoint in {a.db}")
    path, sha256, epoch = row
    if not os.path.isabs(path):
        path = os.path.join(os.path.dirname(os.path.abspath(a.db)), path)
    (recorded,) = db.execute("SELECT test_acc FROM epochs WHERE trial_id = ? AND epoch = ?",
                             (a.trial, epoch)).fetchone()
    test_limit, layout = db.execute("SELECT test_limit, layout FROM trials WHERE id = ?",
                                    (a.trial,)).fetchone()
    with open(path, "rb") as f:
        if hashlib.sha256(f.read()).hexdigest() != sha256:
            sys.exit(f"{path}: sha256 differs from the database's record")

    state, reader = load_file(path)
    net = lenet() if a.model == "lenet" else resnet18(width=a.width)
    net.load_state_dict(state, strict=True)  # raises on any missing, extra or misshapen tensor
    net.eval()

    images = read_idx(find(a.data, "t10k-images-idx3-ubyte"))
    labels = read_idx(find(a.data, "t10k-labels-idx1-ubyte"))
    n = test_limit if 0 < test_limit < len(labels) else len(labels)
    x = torch.from_numpy(images[:n].astype(np.float32) / 255.0).unsqueeze(1)  # as ToTensor()
    y = torch.from_numpy(labels[:n].astype(np.int64))
    with torch.no_grad():
        predicted = torch.cat([net(x[i:i + 500]).argmax(dim=1) for i in range(0, n, 500)])
    accuracy = (predicted == y).sum().item() / n
    counts = torch.bincount(predicted, minlength=10).tolist()
    classes = sum(1 for c in counts if c > 0)
    # Per class: how often it is predicted, and how often it is right (recall).
    per_class = ", ".join(
        f"{k}: {counts[k]} predicted, {((predicted == k) & (y == k)).sum().item()}/"
        f"{(y == k).sum().item()} right" for k in range(10))
    print(f"{a.model} ({layout}) epoch {epoch}: {len(state)} tensors read with {reader}, loaded "
          f"strict; PyTorch {torch.__version__} test accuracy {accuracy:.4f} on {n} examples, "
          f"dprun recorded {recorded:.4f}; predictions cover {classes} of 10 classes "
          f"({per_class})")
    failures = []
    if abs(accuracy - recorded) > a.tolerance:
        failures.append(f"PyTorch's test accuracy {accuracy:.4f} and dprun's recorded "
                        f"{recorded:.4f} differ by {abs(accuracy - recorded):.4f} > "
                        f"{a.tolerance}: the checkpoint is not the model dprun evaluated")
    if accuracy < a.min_accuracy:
        failures.append(f"PyTorch's test accuracy {accuracy:.4f} is below the floor "
                        f"{a.min_accuracy:.4f}: chance is 0.10 on 10 classes, and a model that "
                        f"predicts one class gets about that, so agreeing with dprun says little")
    if classes < a.min_classes:
        failures.append(f"the predictions cover only {classes} of 10 classes (at least "
                        f"{a.min_classes} expected), predicted counts per class {counts}: a "
                        f"collapsed model")
    for f in failures:
        print(f"FAILED: {a.model} ({layout}): {f}", file=sys.stderr)
    print(f"result: accuracy={accuracy:.6f} recorded={recorded:.6f} classes={classes} "
          f"examples={n}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
