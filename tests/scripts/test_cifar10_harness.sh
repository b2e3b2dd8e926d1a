#!/usr/bin/env bash
# scripts/bench-cifar10, the CIFAR-10 comparison scripts/gpu-check runs on a GPU, runs its whole
# harness here on the CPU on a few synthetic examples: bench/make_cifar10.py writes the files,
# dprun trains on them with crop + flip + normalisation, bench/cifar10_pytorch.py does the same
# (after checking its batched crop and flip against a naive one) and the record is written. The
# numbers mean nothing here; the harness must not first break on the GPU machine. Exits 77
# (ctest: skipped, with the reason) only when no Python here imports torch.
# usage: test_cifar10_harness.sh BUILD_DIR
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$1" && pwd)
T=$(mktemp -d /tmp/dprun-cifar10-harness.XXXXXX)
trap 'rm -rf "$T"' EXIT

py=""
for candidate in "${DPRUN_TEST_PYTHON:-}" /usr/bin/python3 python3; do
  [[ -n $candidate ]] || continue
  if "$candidate" -c "import torch, numpy" 2>/dev/null; then py=$candidate; break; fi
done
if [[ -z $py ]]; then
  msg="no python3 here imports torch and numpy (Debian: apt-get install python3-torch): scripts/bench-cifar10 was not run"
  echo "cifar10_harness: $msg"
  [[ -n ${DPRUN_SKIP_LOG:-} ]] && echo "- cifar10_harness: $msg" >>"$DPRUN_SKIP_LOG"
  exit 77
fi

DPRUN_DATA="" "$SRC/scripts/bench-cifar10" --dprun "$BUILD/bin/dprun" --plugins "$BUILD/plugins" \
  --device cpu --epochs 2 --batch 8 --limit 24 --test-limit 8 --python "$py" --out "$T/out" \
  >"$T/log" 2>&1
rc=$?
cat "$T/log"
[[ $rc == 0 ]] || { echo "FAILED: bench-cifar10 exited $rc"; exit 1; }
grep -q "equals the naive crop and flip" "$T/log" || { echo "FAILED: the augmentation check did not run"; exit 1; }
"$py" - "$T/out/record-cifar10.json" <<'PY' || exit 1
import json, sys
r = json.load(open(sys.argv[1]))
assert r["data"] == "synthetic", r["data"]
d, p = r["dprun"], r["pytorch"]
assert [e["epoch"] for e in d["epochs"]] == [1, 2], d
assert all(e["seconds"] >= 0 and e["examples_per_second"] >= 0 for e in d["epochs"]), d
assert [e["epoch"] for e in p["epochs"]] == [1, 2], p
assert p["train_examples"] == 24 and p["test_examples"] == 8, p
assert d["median_seconds_per_epoch"] >= 0 and p["median_seconds_per_epoch"] > 0
print("ok: dprun and PyTorch each ran 2 epochs; the record holds both")
PY
echo "cifar10 harness passed"
