#!/usr/bin/env python3
"""dprun's CPU backend against Debian's PyTorch, side by side on this machine.

    bench/compare_pytorch.py [--reps 5] [--threads 2] [--isa native,avx2] [--dprun PATH]
                             [--data DIR] [--lenet-examples 60000] [--resnet-steps 3]
                             [--layouts nchw,nhwc] [--skip-lenet] [--skip-resnet]

Two measurements, each of the same model in both (the d2l recipes dprun's plugins build):
  LeNet     one training epoch on Fashion-MNIST, batch 256, lr 0.2: conv3x3-20, ReLU, avg-pool 2,
            conv5x5-50, ReLU, avg-pool 2, linear 800-128, ReLU, linear 10; weights N(0, 0.01^2),
            biases 0 (plugins/lenet/lenet.cpp). Seconds of the epoch's training, as dprun
            reports them (evaluation excluded); both start their first epoch here.
  ResNet-18 one training step of batch 256: the small-image ResNet-18 (conv3x3-64, BN, ReLU,
            4 stages of 2 residual blocks, 64..512 channels, global average pool, linear 10;
            plugins/resnet18/resnet18.cpp). dprun: an epoch of --resnet-steps steps divided by
            the steps (its plans are made at setup); PyTorch: the mean of --resnet-steps steps
            after one warm-up step (its first step creates its oneDNN primitives).
With each instruction-set cap: "native" (what the CPU has) and "avx2" (standing for older
CPUs): ONEDNN_MAX_CPU_ISA=AVX2 for dprun's oneDNN; for PyTorch the same (its oneDNN 2.6.3 also
reads DNNL_MAX_CPU_ISA) and ATEN_CPU_CAPABILITY=avx2 for its own kernels.

Every run is its own process (the caps are read when the libraries load). The runs are
interleaved, dprun and PyTorch in turns with the order alternating per repetition, so a busy
machine slows both alike; the table gives medians, the spread (min-max), and the ratios to
PyTorch (of the medians, of the minima, and within each repetition). On a shared machine the
spread is the honest part: rerun on a quiet one. With more runnable processes than cores,
every OpenMP parallel region waits for its second thread to be scheduled (bench_cpu_ops
--threads 2 shows ~12 ms for ops of 0.2 ms there), which swamps 2-thread timings;
--threads 1 compares the per-core cost, which load distorts far less.

Needs python3-torch (apt-get install python3-torch) and a built dprun (cmake --build --preset
cpu, or the release preset). PyTorch runs under /usr/bin/python3, Debian's, wherever this
script was started from.
"""
import argparse
import glob
import os
import re
import statistics
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEBIAN_PYTHON = "/usr/bin/python3"

# The PyTorch side, run as `python3 -c TORCH_SCRIPT model threads examples_or_steps data bench/`.
# Prints one line "seconds <float>" (LeNet: the epoch; ResNet: per step) and "info <text>".
TORCH_SCRIPT = textwrap.dedent(r'''
    import sys, time
    sys.path.insert(0, sys.argv[5])  # bench/: the models (torch_models.py)
    import torch
    from torch import nn
    from torch_models import lenet, load_fashion_mnist, resnet18

    model, threads, amount, data = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(threads)
    torch.manual_seed(0)

    def load(split, count):
        images, labels = load_fashion_mnist(data, split, count)
        return torch.from_numpy(images.astype("float32") / 255), torch.from_numpy(labels)

    loss_fn = nn.CrossEntropyLoss()
    if model == "lenet":
        X, Y = load("train", amount)
        net = lenet()
        opt = torch.optim.SGD(net.parameters(), lr=0.2)
        start = time.perf_counter()
        perm = torch.randperm(len(X))
        for i in range(0, len(X), 256):
            idx = perm[i:i + 256]
            opt.zero_grad()
            loss_fn(net(X[idx]), Y[idx]).backward()
            opt.step()
        seconds = time.perf_counter() - start
    else:
        X, Y = load("train", 256)
        net = resnet18()
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        def step():
            opt.zero_grad()
            loss_fn(net(X), Y).backward()
            opt.step()
        step()  # warm-up: PyTorch creates its oneDNN primitives on first use
        start = time.perf_counter()
        for _ in range(amount):
            step()
        seconds = (time.perf_counter() - start) / amount
    capability = [l.strip() for l in torch.__config__.show().splitlines() if "CPU capability" in l]
    print(f"seconds {seconds}")
    print(f"info PyTorch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{capability[0] if capability else ''}")
''')


def machine():
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(l.split(":", 1) for l in out.splitlines() if ":" in l)
    flags = fields.get("Flags", "").split()
    wanted = ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile"]
    return (f"{fields.get('Model name', '?').strip()} (family {fields.get('CPU family', '?').strip()}"
            f", model {fields.get('Model', '?').strip()}), {os.cpu_count()} CPUs, flags: "
            + " ".join(f for f in wanted if f in flags)
            + f"; load average {os.getloadavg()[0]:.1f}")


def find_dprun(given):
    if given:
        return given
    # The most recently built of the build folders' dprun: an older build left beside a fresh
    # one (build-cpu and build, say) would otherwise measure stale code.
    found = [p for p in glob.glob(os.path.join(ROOT, "build*", "bin", "dprun")) if os.path.exists(p)]
    if found:
        return max(found, key=os.path.getmtime)
    sys.exit("compare_pytorch: no dprun found under build*/bin: build first (cmake --build "
             "--preset cpu), or pass --dprun")


def isa_env(isa, for_torch):
    env = dict(os.environ)
    # What a new user gets: OpenBLAS chooses its own core (this does not touch dprun's default
    # oneDNN kernels, but keeps a BLAS fallback honest).
    env.pop("OPENBLAS_CORETYPE", None)
    if isa == "avx2":
        env["ONEDNN_MAX_CPU_ISA"] = "AVX2"
        if for_torch:
            env["DNNL_MAX_CPU_ISA"] = "AVX2"
            env["ATEN_CPU_CAPABILITY"] = "avx2"
    return env


def run_dprun(args, model, isa, layout):
    cmd = [args.dprun, "train", "--model", model, "--backend", "cpu", "--threads",
           str(args.threads), "--epochs", "1", "--data", args.data, "--layout", layout,
           "--seed", "0"]
    if model == "lenet":
        cmd += ["--batch-size", "256", "--lr", "0.2", "--train-limit", str(args.lenet_examples),
                "--test-limit", "256"]
    else:
        cmd += ["--batch-size", "256", "--lr", "0.05", "--train-limit",
                str(256 * args.resnet_steps), "--test-limit", "256"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=isa_env(isa, False))
    if out.returncode != 0:
        sys.exit(f"compare_pytorch: {' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    info = next((l for l in out.stdout.splitlines() if " on cpu: " in l), "?")
    row = next(l for l in out.stdout.splitlines() if re.match(r"\s+1\s", l))
    seconds = float(row.split()[4])
    if model == "resnet18":
        seconds /= args.resnet_steps
    return seconds, "dprun " + info.split(" (plugin")[0].split(": ", 1)[1]


def run_torch(args, model, isa):
    amount = args.lenet_examples if model == "lenet" else args.resnet_steps
    cmd = [DEBIAN_PYTHON, "-c", TORCH_SCRIPT, model, str(args.threads), str(amount), args.data,
           os.path.join(ROOT, "bench")]
    out = subprocess.run(cmd, capture_output=True, text=True, env=isa_env(isa, True))
    if out.returncode != 0:
        sys.exit(f"compare_pytorch: PyTorch {model} failed (apt-get install python3-torch?):\n"
                 f"{out.stderr}")
    lines = dict(l.split(" ", 1) for l in out.stdout.splitlines() if " " in l)
    return float(lines["seconds"]), lines.get("info", "?")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--isa", default="native,avx2")
    p.add_argument("--layouts", default="nchw,nhwc", help="dprun's activation layouts to run")
    p.add_argument("--dprun")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--lenet-examples", type=int, default=60000)
    p.add_argument("--resnet-steps", type=int, default=3)
    p.add_argument("--skip-lenet", action="store_true")
    p.add_argument("--skip-resnet", action="store_true")
    args = p.parse_args()
    args.dprun = find_dprun(args.dprun)
    layouts = args.layouts.split(",")
    print(f"machine: {machine()}")
    print(f"dprun: {args.dprun}; {args.threads} threads; {args.reps} interleaved repetitions\n")

    models = [m for m, skip in (("lenet", args.skip_lenet), ("resnet18", args.skip_resnet))
              if not skip]
    results, infos = {}, {}
    for isa in args.isa.split(","):
        for model in models:
            runners = [(f"dprun {l}", lambda l=l: run_dprun(args, model, isa, l)) for l in layouts]
            runners.append(("pytorch", lambda: run_torch(args, model, isa)))
            for rep in range(args.reps):
                order = runners if rep % 2 == 0 else runners[::-1]
                for name, run in order:
                    seconds, info = run()
                    results.setdefault((isa, model, name), []).append(seconds)
                    infos[(isa, name)] = info
                    print(f"  {isa:6} {model:8} {name:10} rep {rep + 1}: {seconds:8.3f} s",
                          flush=True)

    print("\nwhat ran:")
    for (isa, name), info in sorted(infos.items()):
        print(f"  {isa:6} {name:10} {info}")
    # Ratios three ways: of the medians; of the minima (noise only ever adds time, so the
    # fastest run is the least disturbed); and the median of the ratios within each repetition
    # (dprun against the PyTorch run next to it, robust to a load that drifts between
    # repetitions), with their range.
    what = {"lenet": "LeNet epoch (s)", "resnet18": "ResNet-18 step of 256 (s)"}
    print(f"\n{'isa':6} {'measure':26} {'runner':10} {'median':>8} {'min':>8} {'max':>8} "
          f"{'ratio of medians':>16} {'of minima':>9} {'paired (range)':>20}")
    for isa in args.isa.split(","):
        for model in models:
            t = results[(isa, model, "pytorch")]
            for name in [f"dprun {l}" for l in layouts] + ["pytorch"]:
                v = results[(isa, model, name)]
                m = statistics.median(v)
                paired = [a / b for a, b in zip(v, t)]
                print(f"{isa:6} {what[model]:26} {name:10} {m:8.3f} {min(v):8.3f} {max(v):8.3f} "
                      f"{m / statistics.median(t):16.2f} {min(v) / min(t):9.2f} "
                      f"{statistics.median(paired):8.2f} ({min(paired):.2f}-{max(paired):.2f})")


if __name__ == "__main__":
    main()
