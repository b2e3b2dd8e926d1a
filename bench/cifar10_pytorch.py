#!/usr/bin/env python3
"""PyTorch training dprun's small-image ResNet-18 on CIFAR-10 with crop+flip on the GPU: the
PyTorch side of scripts/bench-cifar10, which runs dprun on the same files right before it.

    bench/cifar10_pytorch.py --data DIR [--epochs 3] [--batch 256] [--lr 0.1]
        [--layout nchw|nhwc] [--precision tf32|fp32|bf16] [--cudnn-benchmark]
        [--limit N] [--test-limit N] [--device cuda|cpu] [--json FILE] [--check-augment]

What it does is what experiments/cifar10.toml asks of dprun, the way a PyTorch user who cares
about speed writes it (no DataLoader workers: the whole training set lives on the device as
uint8, as dprun keeps it):
  - each epoch a permutation from a seeded generator; batches of `--batch` in its order;
  - per batch, on the device and for the whole batch at once: zero padding of 4, a random 32x32
    crop and a horizontal flip with probability 1/2 per example (torchvision's RandomCrop(32,
    padding=4) then RandomHorizontalFlip, as one gather), then /255 and per-channel
    normalisation with CIFAR-10's mean and std; the test set is normalised only;
  - SGD with momentum 0.9 and weight decay 5e-4, cross-entropy, a host synchronisation at the end
    of each epoch (not after each step).
Reports per epoch the training seconds (evaluation excluded), the test accuracy and loss, and
the peak memory PyTorch's allocator held (torch.cuda.max_memory_allocated). The epoch time to
compare is the median of the epochs after the first (the first pays cuDNN's planning).

DIR holds CIFAR-10's binary batches (data_batch_1.bin .. data_batch_5.bin, test_batch.bin), or
a folder above them named cifar-10-batches-bin (bench/make_cifar10.py writes synthetic ones).
--device cpu with --limit runs the same harness on a few examples (its own test in CI).
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from torch_models import resnet18  # noqa: E402

# CIFAR-10's per-channel mean and standard deviation (of the training set, /255), as
# experiments/cifar10.toml gives them.
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
PAD = 4


def find_folder(data):
    for d in (data, os.path.join(data, "cifar-10-batches-bin"),
              os.path.join(data, "cifar10", "cifar-10-batches-bin")):
        if os.path.isfile(os.path.join(d, "test_batch.bin")):
            return d
    sys.exit(f"cifar10_pytorch: no CIFAR-10 binary batches (test_batch.bin) in {data} or "
             f"{data}/cifar-10-batches-bin (bench/make_cifar10.py writes synthetic ones)")


def read_batches(files):
    raw = np.concatenate([np.fromfile(f, np.uint8) for f in files])
    if raw.size % 3073:
        sys.exit(f"cifar10_pytorch: {files}: not whole 3073-byte records")
    records = raw.reshape(-1, 3073)
    return records[:, 1:].reshape(-1, 3, 32, 32).copy(), records[:, 0].astype(np.int64)


def augment(x8, gen, device):
    """x8 (B,3,32,32) uint8 -> (B,3,32,32) uint8: a random crop of the zero-padded image, then a
    horizontal flip with probability 1/2, per example, as one gather on the device."""
    b = x8.shape[0]
    padded = F.pad(x8, (PAD, PAD, PAD, PAD))
    dy = torch.randint(0, 2 * PAD + 1, (b,), generator=gen, device=device)
    dx = torch.randint(0, 2 * PAD + 1, (b,), generator=gen, device=device)
    flip = torch.randint(0, 2, (b,), generator=gen, device=device).bool()
    ar = torch.arange(32, device=device)
    rows = dy[:, None] + ar
    cols = dx[:, None] + torch.where(flip[:, None], 31 - ar, ar)
    n = torch.arange(b, device=device)[:, None, None, None]
    c = torch.arange(3, device=device)[None, :, None, None]
    return padded[n, c, rows[:, None, :, None], cols[:, None, None, :]]


def check_augment(device):
    """augment() against a naive per-example crop and flip (the harness's own test)."""
    gen = torch.Generator(device=device).manual_seed(3)
    x8 = torch.randint(0, 256, (64, 3, 32, 32), generator=gen, device=device).to(torch.uint8)
    state = gen.get_state()
    got = augment(x8, gen, device)
    gen.set_state(state)
    dy = torch.randint(0, 2 * PAD + 1, (64,), generator=gen, device=device).tolist()
    dx = torch.randint(0, 2 * PAD + 1, (64,), generator=gen, device=device).tolist()
    flip = torch.randint(0, 2, (64,), generator=gen, device=device).tolist()
    for i in range(64):
        want = torch.zeros(3, 32 + 2 * PAD, 32 + 2 * PAD, dtype=torch.uint8, device=device)
        want[:, PAD:PAD + 32, PAD:PAD + 32] = x8[i]
        want = want[:, dy[i]:dy[i] + 32, dx[i]:dx[i] + 32]
        if flip[i]:
            want = want.flip(2)
        if not torch.equal(got[i], want):
            sys.exit(f"cifar10_pytorch: augment() differs from the naive crop and flip at "
                     f"example {i} (dy {dy[i]}, dx {dx[i]}, flip {flip[i]})")
    print("cifar10_pytorch: augment() equals the naive crop and flip on 64 examples")


def normalise(x8, mean, std, memory_format):
    return ((x8.float() / 255 - mean) / std).contiguous(memory_format=memory_format)


def evaluate(net, images, labels, args, mean, std, memory_format):
    net.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, images.shape[0], args.batch):
            x = normalise(images[i:i + args.batch], mean, std, memory_format)
            with torch.autocast(x.device.type, dtype=torch.bfloat16,
                                enabled=args.precision == "bf16"):
                out = net(x)
            y = labels[i:i + args.batch]
            loss += F.cross_entropy(out.float(), y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
    net.train()
    return correct / images.shape[0], loss / images.shape[0]


def train(args, device):
    folder = find_folder(args.data)
    train_x, train_y = read_batches([os.path.join(folder, f"data_batch_{i}.bin")
                                     for i in range(1, 6)])
    test_x, test_y = read_batches([os.path.join(folder, "test_batch.bin")])
    if args.limit:
        train_x, train_y = train_x[:args.limit], train_y[:args.limit]
    if args.test_limit:
        test_x, test_y = test_x[:args.test_limit], test_y[:args.test_limit]
    images = torch.from_numpy(train_x).to(device)
    labels = torch.from_numpy(train_y).to(device)
    test_images = torch.from_numpy(test_x).to(device)
    test_labels = torch.from_numpy(test_y).to(device)
    mean = torch.tensor(MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=device).view(1, 3, 1, 1)

    tf32 = args.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    torch.manual_seed(0)
    memory_format = torch.channels_last if args.layout == "nhwc" else torch.contiguous_format
    net = resnet18(channels=3).to(device).to(memory_format=memory_format)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator(device=device).manual_seed(0)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    count = images.shape[0]
    epochs = []
    for epoch in range(1, args.epochs + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        perm = torch.randperm(count, generator=gen, device=device)
        loss_sum = torch.zeros((), device=device)
        for i in range(0, count, args.batch):
            idx = perm[i:i + args.batch]
            x = normalise(augment(images[idx], gen, device), mean, std, memory_format)
            y = labels[idx]
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16,
                                enabled=args.precision == "bf16"):
                loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            loss_sum += loss.detach() * y.shape[0]
        train_loss = (loss_sum / count).item()  # waits for the epoch's last step
        seconds = time.perf_counter() - start
        acc, test_loss = evaluate(net, test_images, test_labels, args, mean, std, memory_format)
        row = {"epoch": epoch, "seconds": seconds, "train_loss": train_loss, "test_acc": acc,
               "test_loss": test_loss, "examples_per_second": count / seconds}
        epochs.append(row)
        print(f"cifar10_pytorch: epoch {epoch}: {seconds:.3f} s ({count / seconds:.0f} ex/s), "
              f"train loss {train_loss:.4f}, test acc {acc:.4f}", flush=True)
    later = [e["seconds"] for e in epochs[1:]] or [epochs[0]["seconds"]]
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
    return {"epochs": epochs, "median_seconds_per_epoch": statistics.median(later),
            "peak_mb": peak, "train_examples": count, "test_examples": test_images.shape[0]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--layout", default="nchw", choices=["nchw", "nhwc"])
    p.add_argument("--precision", default="tf32", choices=["tf32", "fp32", "bf16"])
    p.add_argument("--cudnn-benchmark", action="store_true")
    p.add_argument("--limit", type=int, default=0, help="train on the first N examples only")
    p.add_argument("--test-limit", type=int, default=0)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--json")
    p.add_argument("--check-augment", action="store_true",
                   help="first compare the batched crop+flip with a naive one")
    args = p.parse_args()
    if args.epochs < 1 or args.batch < 1:
        sys.exit("cifar10_pytorch: --epochs and --batch must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("cifar10_pytorch: torch sees no CUDA device (torch.cuda.is_available() is False)")
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    cudnn = torch.backends.cudnn.version() if device.type == "cuda" else None
    print(f"cifar10_pytorch: PyTorch {torch.__version__}, cuDNN {cudnn}, {name}; ResNet-18, "
          f"batch {args.batch}, {args.precision} {args.layout}, cudnn.benchmark="
          f"{int(args.cudnn_benchmark)}, crop+flip+normalise on the device", flush=True)
    if args.check_augment:
        check_augment(device)
    result = train(args, device)
    result.update({"device": name, "torch": torch.__version__, "cudnn": cudnn,
                   "batch": args.batch, "precision": args.precision, "layout": args.layout,
                   "cudnn_benchmark": args.cudnn_benchmark})
    print(f"cifar10_pytorch: median {result['median_seconds_per_epoch']:.3f} s per epoch "
          f"(epochs after the first)" +
          ("" if result["peak_mb"] is None else f", peak {result['peak_mb']:.0f} MB"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
