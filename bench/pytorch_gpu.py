#!/usr/bin/env python3
"""PyTorch with dprun's models on the same GPU, in the same call as bench_gpu (scripts/gpu-check's
`pytorch` phase), so the two are compared on one machine at one time.

    bench/pytorch_gpu.py [--data DIR] [--models lenet,resnet18] [--batches 64,256,1024]
                         [--steps 30] [--warmup 10] [--json FILE] [--device cuda|cpu]

For each model and batch, every configuration PyTorch users reach for, as bench_gpu measures
dprun: the training data on the device (uint8, converted per batch), batches of random indices,
SGD with momentum 0.9, a host synchronisation after every step; the median step, projected to an
epoch of 60000 examples (ceil(60000 / batch) steps), and the peak memory PyTorch's allocator
held (torch.cuda.max_memory_allocated, from a reset before the configuration).

  tf32  NCHW and channels-last, fp32 weights with TF32 convolutions and matmuls (dprun's default)
  fp32  NCHW, TF32 off (dprun's allow_tf32 = false)
  bf16  channels-last, autocast to bfloat16 (fp32 master weights; dprun's precision = "bf16")
each eager and with torch.backends.cudnn.benchmark (cuDNN times its algorithms, as dprun's
measured choice does). --device cpu runs the same harness on the CPU with whatever it can (for
the harness's own test in CI: the numbers mean nothing there).

Prints a table and, with --json, writes {"device", "torch", "cudnn", "results": [rows]}, each row
{"model", "precision", "layout", "batch", "cudnn_benchmark", "seconds_per_epoch",
"median_step_ms", "peak_mb"} or {"...", "error"}.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from torch_models import MODELS, load_fashion_mnist  # noqa: E402

EPOCH_EXAMPLES = 60000

# (precision, layout) pairs measured for every model and batch.
CONFIGS = [("tf32", "nchw"), ("tf32", "nhwc"), ("fp32", "nchw"), ("bf16", "nhwc")]


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(model_name, precision, layout, batch, benchmark, images, labels, args, device):
    torch.backends.cudnn.benchmark = benchmark
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    net = MODELS[model_name]().to(device)
    memory_format = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    net = net.to(memory_format=memory_format)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator(device="cpu").manual_seed(7)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()

    def step():
        idx = torch.randint(0, images.shape[0], (batch,), generator=gen).to(device)
        x = (images[idx].float() / 255).contiguous(memory_format=memory_format)
        y = labels[idx]
        opt.zero_grad(set_to_none=True)
        if precision == "bf16":
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = loss_fn(net(x), y)
        else:
            loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        synchronize(device)

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
    return {"seconds_per_epoch": median * math.ceil(EPOCH_EXAMPLES / batch),
            "median_step_ms": median * 1000, "peak_mb": peak}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=os.environ.get("DPRUN_DATA",
                                                    "/usr/share/datasets/fashion-mnist"))
    p.add_argument("--models", default="lenet,resnet18")
    p.add_argument("--batches", default="64,256,1024")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--json")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("pytorch_gpu: torch sees no CUDA device (torch.cuda.is_available() is False)")
    device = torch.device(args.device)
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            sys.exit(f"pytorch_gpu: unknown model {m}; known: {', '.join(MODELS)}")
    batches = [int(b) for b in args.batches.split(",") if b]
    images, labels = load_fashion_mnist(args.data, "train")
    images = torch.from_numpy(np.array(images)).to(device)  # a writable copy
    labels = torch.from_numpy(labels).to(device)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    cudnn = torch.backends.cudnn.version() if device.type == "cuda" else None
    print(f"pytorch_gpu: PyTorch {torch.__version__}, cuDNN {cudnn}, {name}; "
          f"{args.warmup} warm-up + {args.steps} timed steps per configuration", flush=True)

    rows = []
    for model_name in models:
        for batch in batches:
            for precision, layout in CONFIGS:
                for benchmark in (False, True):
                    row = {"model": model_name, "precision": precision, "layout": layout,
                           "batch": batch, "cudnn_benchmark": benchmark}
                    try:
                        row.update(measure(model_name, precision, layout, batch, benchmark,
                                           images, labels, args, device))
                    except Exception as e:  # a configuration this PyTorch or device lacks
                        row["error"] = f"{type(e).__name__}: {e}"[:300]
                    rows.append(row)
                    if "error" in row:
                        print(f"{model_name:9} {batch:5} {precision:5} {layout:5} "
                              f"benchmark={int(benchmark)} FAILED {row['error']}", flush=True)
                    else:
                        peak = "-" if row["peak_mb"] is None else f"{row['peak_mb']:.0f}"
                        print(f"{model_name:9} {batch:5} {precision:5} {layout:5} "
                              f"benchmark={int(benchmark)} {row['median_step_ms']:9.3f} ms/step "
                              f"{row['seconds_per_epoch']:8.3f} s/epoch {peak:>7} MB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "cudnn": cudnn,
                       "results": rows}, f, indent=1)
            f.write("\n")
    failed = [r for r in rows if "error" in r]
    return 1 if failed and len(failed) == len(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
