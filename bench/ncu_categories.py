#!/usr/bin/env python3
"""Per-kernel GPU time of one profiled training step, by category, from Nsight Compute's CSV.

    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --print-units base \\
        bench_gpu --config resnet18-nhwc-tf32-b256 --profile > step.csv
    bench/ncu_categories.py step.csv [--json FILE] [--top 15] [--choices LOG]

bench_gpu --profile brackets one step (after its warm-up) with cudaProfilerStart/Stop, so the
CSV holds exactly the kernels of one step. Each kernel is put in the first category whose
pattern its name matches (CATEGORIES, in order); the table gives each category's time, share
and kernel count, then the most expensive kernels, so the next speed-up is chosen from data.
--json writes {"total_ms", "kernels", "categories": [{"category", "ms", "count", "share"}],
"top": [{"name", "ms", "count"}]}; with --choices, also "choices": the lines of LOG that
DPRUN_CUDNN_LOG=1 printed ("dprun: cudnn: <layer> batch N <direction>: algo A, ... math,
workspace W bytes, measured T ms"), so each convolution's kernel can be traced to its layer.
"""
import argparse
import csv
import io
import json
import re
import sys

# (category, pattern) in the order they are tried; names are matched lower-cased.
CATEGORIES = [
    ("layout transpose", r"nchwtonhwc|nhwctonchw|kcrs_to_krsc|krsc_to_kcrs|transpose"),
    ("convolution (fft)", r"fft|cgemm"),
    ("convolution (winograd)", r"winograd"),
    ("convolution", r"conv|fprop|dgrad|wgrad|implicit_gemm|implicit_convolve|xmma_.*_nhwc"),
    ("batch norm", r"bn_|batch_?norm|stats_partial|stats_finalize|infer_scale|backward_partial"
                   r"|backward_finalize|backward_apply|apply4?_kernel"),
    ("gemm (linear)", r"gemm|gemv|cublas"),
    ("pooling", r"pool"),
    ("bias and reductions", r"bias|channel_sum|reduce"),
    ("elementwise (relu, add, scale)", r"relu|add_kernel|scale_kernel|fill|elementwise|vectorized"),
    ("loss", r"softmax|cross_entropy|count_correct"),
    ("optimizer", r"sgd|adamw|multi_tensor"),
    ("data", r"gather"),
    ("collectives", r"nccl|sum_across_ranks"),
]

UNITS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
         "second": 1e3, "s": 1e3}


def category(name):
    lowered = name.lower()
    for label, pattern in CATEGORIES:
        if re.search(pattern, lowered):
            return label
    return "other"


def kernel_times(text):
    """[(kernel name, ms)] of every gpu__time_duration row in an ncu --csv output."""
    # ncu prints its own lines (==PROF== ...) before the CSV; the CSV starts at its header.
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        raise ValueError("no ncu CSV header (\"ID\",...) found: was ncu run with --csv?")
    out = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = (row.get("Metric Unit") or "nsecond").strip().lower()
        if unit not in UNITS:
            raise ValueError(f"unknown time unit {unit!r} for {row.get('Kernel Name')}")
        value = float(row["Metric Value"].replace(",", ""))
        out.append((row["Kernel Name"], value * UNITS[unit]))
    if not out:
        raise ValueError("the CSV has no gpu__time_duration.sum rows (--metrics "
                         "gpu__time_duration.sum; was a step profiled?)")
    return out


def summarise(times, top=15):
    total = sum(ms for _, ms in times)
    by_category, by_kernel = {}, {}
    for name, ms in times:
        c = by_category.setdefault(category(name), [0.0, 0])
        c[0] += ms
        c[1] += 1
        k = by_kernel.setdefault(name, [0.0, 0])
        k[0] += ms
        k[1] += 1
    categories = [{"category": c, "ms": ms, "count": n, "share": ms / total if total else 0.0}
                  for c, (ms, n) in sorted(by_category.items(), key=lambda kv: -kv[1][0])]
    kernels = [{"name": k, "ms": ms, "count": n}
               for k, (ms, n) in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:top]]
    return {"total_ms": total, "kernels": len(times), "categories": categories, "top": kernels}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--json")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--choices", help="a log with DPRUN_CUDNN_LOG=1's lines")
    args = p.parse_args()
    try:
        with open(args.csv) as f:
            summary = summarise(kernel_times(f.read()), args.top)
    except (OSError, ValueError) as e:
        sys.exit(f"ncu_categories: {args.csv}: {e}")
    if args.choices:
        try:
            with open(args.choices) as f:
                summary["choices"] = [line.rstrip("\n") for line in f
                                      if line.startswith("dprun: cudnn: ")]
        except OSError as e:
            sys.exit(f"ncu_categories: {args.choices}: {e}")
    print(f"{summary['kernels']} kernels, {summary['total_ms']:.3f} ms of GPU time")
    for c in summary["categories"]:
        print(f"  {c['category']:32} {c['ms']:9.3f} ms {100 * c['share']:5.1f} %  "
              f"{c['count']:4} kernels")
    print("most expensive kernels:")
    for k in summary["top"]:
        print(f"  {k['ms']:9.3f} ms x{k['count']:<4} {k['name'][:110]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
