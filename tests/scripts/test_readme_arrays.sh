#!/usr/bin/env bash
# The README's arrays script, as written there: run it with Debian's python3 (numpy) in a fresh
# folder, then train LeNet on the two files it writes with dprun train --dataset arrays.
# Exits 77 (skipped) where no python3 here imports numpy.
# usage: test_readme_arrays.sh DPRUN SOURCE_DIR
set -uo pipefail
DPRUN=$1 SRC=$2
T=$(mktemp -d /tmp/dprun-readme-arrays.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

python=""
for p in "${DPRUN_TEST_PYTHON:-}" /usr/bin/python3 python3; do
  if [[ -n $p ]] && "$p" -c "import numpy" 2>/dev/null; then python=$p; break; fi
done
if [[ -z $python ]]; then
  echo "skipped: no python3 here imports numpy (Debian: apt-get install python3-numpy)"
  exit 77
fi
# The first python block of the section "## Your own data".
awk '/^## Your own data/ { in_section = 1 } in_section && /^```python$/ { on = 1; next }
     on && /^```$/ { exit } on { print }' "$SRC/README.md" >"$T/write_arrays.py"
[[ -s $T/write_arrays.py ]] || fail "no python block in the README's section \"Your own data\""
(cd "$T" && "$python" write_arrays.py) || fail "the README's script failed"
for f in train.safetensors test.safetensors; do [[ -s $T/$f ]] || fail "the script wrote no $f"; done
out=$("$DPRUN" train --model lenet --dataset arrays --data "$T" --epochs 1 --batch-size 100 \
  --backend cpu --threads 2 2>&1) || { echo "$out"; fail "dprun train on the script's files"; }
grep -qE "^ +1 " <<<"$out" || { echo "$out"; fail "no epoch line"; }
echo "$out"
echo "the README's arrays script writes files dprun trains on"
