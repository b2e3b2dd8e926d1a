#!/usr/bin/env bash
# bench/pytorch_gpu.py, the PyTorch side of the GPU comparison, runs its whole harness on the CPU
# (--device cpu: every model, precision, layout and cuDNN setting, one small step each) and
# writes the rows scripts/gpu-record compares. The numbers mean nothing here; the harness must
# not first break on the GPU machine. Exits 77 (ctest: skipped, with the reason) only when no
# Python here imports torch.
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d /tmp/dprun-pytorch-harness.XXXXXX)
trap 'rm -rf "$T"' EXIT
DATA=${DPRUN_TEST_DATA:-/usr/share/datasets/fashion-mnist}

py=""
for candidate in "${DPRUN_TEST_PYTHON:-}" /usr/bin/python3 python3; do
  [[ -n $candidate ]] || continue
  if "$candidate" -c "import torch, numpy" 2>/dev/null; then py=$candidate; break; fi
done
skip() {
  echo "pytorch_harness: $1"
  [[ -n ${DPRUN_SKIP_LOG:-} ]] && echo "- pytorch_harness: $1" >>"$DPRUN_SKIP_LOG"
  exit 77
}
[[ -n $py ]] || skip "no python3 here imports torch and numpy (Debian: apt-get install python3-torch): bench/pytorch_gpu.py was not run"
[[ -f $DATA/train-images-idx3-ubyte.gz ]] || skip "Fashion-MNIST not found in $DATA (set DPRUN_TEST_DATA): bench/pytorch_gpu.py was not run"

# One batch size: the loop over batches is the same code for each, and ResNet-18's bf16 steps on
# the CPU take seconds each (half of this test's time went to a second batch size).
"$py" "$SRC/bench/pytorch_gpu.py" --device cpu --data "$DATA" --batches 4 --steps 1 --warmup 1 \
  --json "$T/out.json" >"$T/log" 2>&1
rc=$?
cat "$T/log"
[[ $rc == 0 ]] || { echo "FAILED: pytorch_gpu.py exited $rc"; exit 1; }
"$py" - "$T/out.json" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
rows = d["results"]
want = {(m, p, l, b, c) for m in ("lenet", "resnet18") for b in (4,)
        for p, l in (("tf32", "nchw"), ("tf32", "nhwc"), ("fp32", "nchw"), ("bf16", "nhwc"))
        for c in (False, True)}
got = {(r["model"], r["precision"], r["layout"], r["batch"], r["cudnn_benchmark"]) for r in rows}
assert got == want, f"configurations: missing {want - got}, extra {got - want}"
errors = [r for r in rows if "error" in r]
assert not errors, f"configurations failed: {errors}"
for r in rows:
    assert r["seconds_per_epoch"] > 0 and r["median_step_ms"] > 0, r
    # ceil(60000 / batch) steps of the median step
    steps = -(-60000 // r["batch"])
    assert abs(r["seconds_per_epoch"] - steps * r["median_step_ms"] / 1000) < 1e-6 * steps, r
print(f"ok: {len(rows)} configurations, each with its projected epoch")
PY
echo "pytorch harness passed"
