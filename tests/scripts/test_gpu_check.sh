#!/usr/bin/env bash
# scripts/gpu-check fails loudly on what would make a GPU run prove nothing, and builds a clean
# library path. Runs here without a GPU: nvidia-smi, the Python `nvidia` package and the bundle
# are stand-ins made in a temporary folder; only the script's own logic is under test.
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d /tmp/dprun-gpu-check-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
# Where the stand-ins leave what they were given (not $OUT: gpu-check packs that at the end).
export STANDIN=$T/standin
mkdir -p "$STANDIN"
fails=0
check() {  # description, command...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; fails=$((fails + 1)); fi
}

# A repository copy with the script and a stand-in bundle.
mkdir -p "$T/repo/scripts" "$T/repo/.gpu/data" "$T/bin" "$T/py/nvidia/cudnn/lib" \
  "$T/py2/nvidia/nccl/lib" "$T/stage/bin" "$T/stage/lib" "$T/stage/plugins"
cp "$SRC/scripts/gpu-check" "$SRC/scripts/gpu-record" "$SRC/scripts/catch-name-file" "$T/repo/scripts/"
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
  t10k-labels-idx1-ubyte.gz; do : >"$T/repo/.gpu/data/$f"; done
echo abc1234 >"$T/repo/.gpu/commit"
echo libstandin_cublas.so.13 >"$T/repo/.gpu/dlopened"
: >"$T/py/nvidia/cudnn/lib/libstandin_cublas.so.13"
cat >"$T/bin/nvidia-smi" <<'SMI'
#!/bin/sh
case "$*" in
  -L) echo "GPU 0: Stand-in GPU (UUID: GPU-0)" ;;
  *name,driver_version*) echo "Stand-in GPU, 580.00, 81559 MiB" ;;
  *name*) echo "Stand-in GPU" ;;
  *driver_version*) echo "580.00" ;;
  *memory.total*) echo "81559 MiB" ;;
esac
SMI
chmod +x "$T/bin/nvidia-smi"
# The stand-in test binary reports the library path it was given.
cat >"$T/stage/bin/test_cuda" <<'TC'
#!/bin/sh
echo "$LD_LIBRARY_PATH" >"$STANDIN/ld_library_path"
echo "$1 poison=${DPRUN_CUDA_POISON_SCRATCH:-unset}" >>"$STANDIN/test_cuda_runs"
echo "All tests passed (3 assertions in 1 test case)"
# What a bf16 test prints of its measurement (the record keeps it).
echo "  bf16 LeNet nchw cuda vs cpu after 2 steps: parameters 1e-06, update 1e-04, loss 1e-07 (bounds parameters 6.1e-05, update 0.00391, loss 6.1e-05)"
# One GPU: the multi-GPU part is skipped (noted, exit 77), nothing failed.
if [ -n "${STANDIN_ONE_GPU:-}" ] && [ "$1" = "[comm]" ]; then
  echo "- nccl case: only 1 GPU: multi-GPU NCCL was NOT tested" >>"$DPRUN_SKIP_LOG"; exit 77
fi
TC
chmod +x "$T/stage/bin/test_cuda"
# test_core must be run with its CUDA passes required; it says whether it was. It lists three
# test names (one with a comma, one with a bracket, as Catch2 prints them) and runs a name file
# given with -f (keeping a copy).
cat >"$T/stage/bin/test_core" <<'TC'
#!/bin/sh
if [ "${2:-}" = "--list-test-names-only" ]; then
  [ -n "${STANDIN_CORE_LIST_EMPTY:-}" ] && exit 0
  printf 'a layer, both layouts\nBatchNorm2d [fused] twin\n\nthe checker catches a wrong gradient\n'
  exit 3  # Catch2 v2 exits with the number of tests listed
fi
echo "${DPRUN_REQUIRE_CUDA:-unset}" >"$STANDIN/require_cuda"
prev=""
for a in "$@"; do
  [ "$prev" = "-f" ] && cp "$a" "$STANDIN/shard.$(basename "$a")"
  [ "$prev" = "-w" ] && echo "$a" >"$STANDIN/warn"
  prev=$a
done
if [ -n "${STANDIN_CORE_FAILS:-}" ]; then
  echo "test cases: 2 | 1 passed | 1 failed"; exit "${STANDIN_CORE_RC:-1}"
fi
if [ -n "${STANDIN_CORE_EXPECTED:-}" ]; then
  echo "test cases: 2 | 1 passed | 1 failed as expected"; exit 0
fi
echo "All tests passed (5 assertions in 2 test cases)"
TC
chmod +x "$T/stage/bin/test_core"
# compute-sanitizer: runs the binary after its options, then prints the tool's clean summary.
cat >"$T/bin/compute-sanitizer" <<'CS'
#!/bin/bash
tool=""
while [[ $1 == --* ]]; do
  [[ $1 == --tool ]] && tool=$2
  [[ $1 == --print-limit ]] && echo "$2" >"$STANDIN/print_limit"
  case "$1" in --tool|--error-exitcode|--print-limit) shift ;; esac
  shift
done
# STANDIN_SAN_ERRORS: initcheck prints two errors of one site and one of another, in the real
# tool's form, and fails.
if [[ $tool == initcheck && -n ${STANDIN_SAN_ERRORS:-} ]]; then
  for site in conv conv linear; do
    kernel=$([[ $site == conv ]] && echo "void cudnn::nhwcToNchwKernel<float>(params, const float *, float *)+0x18d0" || echo "gemm_kernel+0x40")
    host=$([[ $site == conv ]] && echo "dp::cuda::CudaBackend::conv_forward_impl(dp::ConvPlan&, dp::Tensor const&)" || echo "dp::cuda::CudaBackend::linear_forward_impl(dp::Tensor const&)")
    cat <<ERR
========= Uninitialized __global__ memory read of size 4 bytes
=========     at $kernel
=========     by thread (96,0,0) in block (0,0,1)
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cuLaunchKernel [0x39fb94] in libcuda.so.1
=========         Host Frame: $host [0x188919] in libdpcore.so
=========         Host Frame: (anonymous namespace)::check_$site(Backends&) [0x3f711] in test_cuda
=========         Host Frame: C_A_T_C_H_T_E_S_T_6() [0x41fdc] in test_cuda
=========         Host Frame: Catch::RunContext::runTest(Catch::TestCase const&) [0xa6c05] in test_cuda
=========         Host Frame: main [0x32fd5] in test_cuda
========= 
ERR
  done
  "$@" >/dev/null
  echo "========= ERROR SUMMARY: 3 errors"
  exit 3
fi
"$@"; rc=$?
if [[ $tool == racecheck ]]; then echo "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
else echo "========= ERROR SUMMARY: 0 errors"; fi
exit $rc
CS
chmod +x "$T/bin/compute-sanitizer"
pack() { tar -C "$T/stage" -cJf "$T/repo/.gpu/bundle.tar.xz" bin lib plugins; }
pack
run() {  # extra environment assignments for gpu-check
  (cd "$T/repo" && env PATH="$T/bin:$PATH" PYTHONPATH="$T/py:$T/py2" OUT="$T/out" \
    DPRUN_GPU_PREFIX="$T/prefix" "$@" \
    bash scripts/gpu-check --phases tests >"$T/log" 2>&1)
}

rm -f "$STANDIN/test_cuda_runs"
# 1. A clean run: the record is written, and the path holds every nvidia lib folder (from both
#    places the namespace package lives) and no empty entry.
rm -rf "$T/out"
run LD_LIBRARY_PATH=""
rc=$?
check "a clean stand-in run passes (exit $rc)" test $rc -eq 0
check "the tests phase writes its record" test -s "$T/out/record-tests.json"
check "\$OUT holds the records and one archive of the rest" \
  bash -c 'cd "$1" && [[ $(ls | tr "\n" " ") == "logs.tar record-tests.json " ]]' _ "$T/out"
check "the archive has the logs" bash -c 'tar tf "$1" | grep -qx test_ops.log' _ "$T/out/logs.tar"
check "the record names the commit and the GPU" \
  grep -q '"commit": "abc1234"' "$T/out/record-tests.json"
path=$(cat "$STANDIN/ld_library_path" 2>/dev/null)
check "LD_LIBRARY_PATH has no empty entry ($path)" \
  bash -c '[[ -n $1 && $1 != :* && $1 != *: && $1 != *::* ]]' _ "$path"
check "LD_LIBRARY_PATH has the cudnn lib folder" bash -c '[[ $1 == *py/nvidia/cudnn/lib* ]]' _ "$path"
check "LD_LIBRARY_PATH has the nccl lib folder" bash -c '[[ $1 == *py2/nvidia/nccl/lib* ]]' _ "$path"
folded=$(python3 "$T/repo/scripts/gpu-record" fold "$T/out")
check "gpu-record folds the parts into bench/results ($folded)" \
  bash -c '[[ $1 == */bench/results/*-stand-in-gpu-abc1234.json && -s $1 ]]' _ "$folded"
check "the folded record keeps the tests phase" grep -q '"group": "ops"' "$folded"
table=$(python3 "$T/repo/scripts/gpu-record" table "$folded" 2>&1)
check "gpu-record prints a table from it" grep -q "tests ops: All tests passed" <<<"$table"
check "the record keeps what the bf16 tests measured" python3 -c '
import json, sys
ops = [t for t in json.load(open(sys.argv[1]))["result"] if t["group"] == "ops"][0]
assert ops["bf16"] == ["bf16 LeNet nchw cuda vs cpu after 2 steps: parameters 1e-06, update "
                       "1e-04, loss 1e-07 (bounds parameters 6.1e-05, update 0.00391, loss 6.1e-05)"], ops
' "$T/out/record-tests.json"
check "gpu-record's table shows the bf16 LeNet distances" \
  grep -q "  - bf16 LeNet nchw cuda vs cpu after 2 steps" <<<"$table"
check "test_core ran with its CUDA passes required" grep -qx 1 "$STANDIN/require_cuda"
check "the ops and algorithms run plain and again with NaN-filled scratch" bash -c '
  [[ $(sort "$1") == "$(printf "%s\n" "[algorithms] poison=1" "[algorithms] poison=unset" \
     "[comm] poison=unset" "[cuda]~[train]~[comm]~[algorithms] poison=1" \
     "[cuda]~[train]~[comm]~[algorithms] poison=unset" "[train] poison=unset" | sort)" ]]' _ "$STANDIN/test_cuda_runs"
check "the record has the poisoned groups" grep -q '"group": "algorithms-poisoned"' "$T/out/record-tests.json"
check "the record has the test_core group" grep -q '"group": "core"' "$T/out/record-tests.json"

# 1a. Exit 77 (nothing failed, a part skipped: one GPU) passes, and says what was skipped.
rm -rf "$T/out"
run LD_LIBRARY_PATH="" STANDIN_ONE_GPU=1
rc=$?
check "a run that skipped a part passes (exit $rc)" test $rc -eq 0
check "the summary names the skipped part" grep -q "tests comm.*skipped: .*multi-GPU NCCL was NOT tested" "$T/log"
check "the record names the skipped part" grep -q '"skipped": ".*multi-GPU NCCL' "$T/out/record-tests.json"

# 1b. The sanitizer phase: four tools over both binaries, clean only when the tests pass too.
sanitize() {
  (cd "$T/repo" && env PATH="$T/bin:$PATH" PYTHONPATH="$T/py:$T/py2" OUT="$T/out" \
    DPRUN_GPU_PREFIX="$T/prefix" "$@" bash scripts/gpu-check --phases sanitize >"$T/log" 2>&1)
}
sanitize; rc=$?
check "a clean stand-in sanitizer run passes (exit $rc)" test $rc -eq 0
for tool in memcheck racecheck initcheck synccheck; do
  check "the sanitize record has $tool, clean" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["result"]
t = [x for x in r["tools"] if x["tool"] == sys.argv[2]][0]
assert t["clean"], t
# three test names in four shards: three runs of test_core, the empty shard not run
assert [x["binary"] for x in t["runs"]] == ["test_cuda", "test_core/1", "test_core/2", "test_core/3"], t
' "$T/out/record-sanitize.json" "$tool"
done
check "the shards run every test_core name once, ',' and '[' escaped for Catch2" python3 -c '
import os, sys
got = [open(os.path.join(sys.argv[1], f"shard.core-tests.{i}.txt")).read() for i in (1, 2, 3)]
assert got == ["a layer\\, both layouts\n", "BatchNorm2d \\[fused] twin\n",
               "the checker catches a wrong gradient\n"], got
' "$STANDIN"
check "test_core's shards ran with their CUDA passes required" grep -qx 1 "$STANDIN/require_cuda"
check "test_core's shards fail on a name that selects nothing (-w NoTests)" grep -qx NoTests "$STANDIN/warn"
check "the sanitizer logs are in the archive, not loose in \$OUT" bash -c '
  cd "$1" && [[ -z $(ls | grep -v -e "^record-.*\.json$" -e "^logs\.tar$") ]] && tar tf logs.tar | grep -qx memcheck.log' _ "$T/out"
sanitize STANDIN_CORE_LIST_EMPTY=1; rc=$?
check "a test_core that lists no layer tests fails the phase (exit $rc)" test $rc -ne 0
check "the failure says so" grep -q "test_core lists no \[layers\],\[batchnorm\] tests" "$T/log"
sanitize STANDIN_CORE_EXPECTED=1; rc=$?
check "the checker's expected failure leaves the run clean (exit $rc)" test $rc -eq 0
check "no run is NOT clean" bash -c '! grep -q "NOT clean" "$1"' _ "$T/log"
check "the output says NCCL's tests are left out" grep -q "do not run under compute-sanitizer" "$T/log"
rm -f "$STANDIN"/shard.*
sanitize STANDIN_CORE_FAILS=1; rc=$?
check "a failing test under a clean sanitizer fails the phase (exit $rc)" test $rc -ne 0
check "the failing run is marked NOT clean" grep -q "memcheck test_core/1.*NOT clean" "$T/log"
sanitize STANDIN_CORE_FAILS=1 STANDIN_CORE_RC=0; rc=$?
check "a failed test summary with exit 0 fails the phase too (exit $rc)" test $rc -ne 0
# Errors are grouped by where they come from (kernel, dprun's frame, the test's frame) in the
# record, so a run says which op and test produced them.
sanitize STANDIN_SAN_ERRORS=1; rc=$?
check "initcheck errors fail the phase (exit $rc)" test $rc -ne 0
check "the print limit is gpu-check's default, 200" grep -qx 200 "$STANDIN/print_limit"
check "the record groups the printed errors by site" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["result"]
t = [x for x in r["tools"] if x["tool"] == "initcheck"][0]
assert not t["clean"], t
sites = t["runs"][0]["printed_sites"]
assert [s["count"] for s in sites] == [2, 1], sites
assert sites[0]["host"] == "dp::cuda::CudaBackend::conv_forward_impl", sites
assert sites[0]["kernel"] == "void cudnn::nhwcToNchwKernel<float>(params, const float *, float *)", sites
assert sites[0]["test"] == "(anonymous namespace)::check_conv(Backends&)", sites
assert sites[1]["host"] == "dp::cuda::CudaBackend::linear_forward_impl", sites
assert sites[0]["what"] == "Uninitialized __global__ memory read of size 4 bytes", sites
mem = [x for x in r["tools"] if x["tool"] == "memcheck"][0]
assert mem["clean"] and mem["runs"][0]["printed_sites"] == [], mem
' "$T/out/record-sanitize.json"
check "the output lists the sites" grep -q "2 printed: Uninitialized .* from dp::cuda::CudaBackend::conv_forward_impl, called by (anonymous namespace)::check_conv" "$T/log"
# --sanitizers: the tools named, no others (a device call fits two or three of them, not four).
sanitize_with() {
  (cd "$T/repo" && env PATH="$T/bin:$PATH" PYTHONPATH="$T/py:$T/py2" OUT="$T/out" \
    DPRUN_GPU_PREFIX="$T/prefix" bash scripts/gpu-check --phases sanitize "$@" >"$T/log" 2>&1)
}
sanitize_with --sanitizers memcheck,synccheck --sanitizer-timeout 60; rc=$?
check "--sanitizers memcheck,synccheck passes (exit $rc)" test $rc -eq 0
check "the sanitize record has exactly memcheck and synccheck" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["result"]
assert [t["tool"] for t in r["tools"]] == ["memcheck", "synccheck"], r["tools"]
assert all(t["clean"] for t in r["tools"])
' "$T/out/record-sanitize.json"
# The tools of two calls (the documented split: three tools, then racecheck) fold into one
# sanitize phase with all of them; a tool run again replaces its earlier run.
mkdir -p "$T/call1" "$T/call2"
cp "$T/out/record-sanitize.json" "$T/call1/"
sanitize_with --sanitizers racecheck,synccheck --sanitizer-shards 2; rc=$?
check "--sanitizer-shards 2 passes (exit $rc)" test $rc -eq 0
cp "$T/out/record-sanitize.json" "$T/call2/"
folded=$(python3 "$T/repo/scripts/gpu-record" fold "$T/call1" "$T/call2")
check "two sanitize calls fold into one phase with every tool" python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))["phases"]["sanitize"]
tools = {t["tool"]: t for t in s["result"]["tools"]}
assert sorted(tools) == ["memcheck", "racecheck", "synccheck"], tools
assert [r["binary"] for r in tools["synccheck"]["runs"]] == ["test_cuda", "test_core/1", "test_core/2"], "the later synccheck"
assert [r["binary"] for r in tools["memcheck"]["runs"]] == ["test_cuda", "test_core/1", "test_core/2", "test_core/3"]
assert len(s["calls"]) == 2, s
' "$folded"
rm -f "$folded"
sanitize_with --sanitizers memcheck,asan; rc=$?
check "an unknown sanitizer is refused (exit $rc)" test $rc -ne 0
check "the refusal names it" grep -q "unknown sanitizer 'asan'" "$T/log"

run LD_LIBRARY_PATH="/opt/x::"
path=$(cat "$STANDIN/ld_library_path" 2>/dev/null)
check "an inherited path with empty entries is cleaned ($path)" \
  bash -c '[[ $1 == */opt/x && $1 != *::* && $1 != *: ]]' _ "$path"

# 1c. bench, pytorch and profile: the same call measures dprun and PyTorch, the record compares
#     them with the keys issue 21 names, and ncu's CSV is summed by category.
mkdir -p "$T/repo/bench"
cp "$SRC/bench/ncu_categories.py" "$T/repo/bench/"
cat >"$T/repo/bench/pytorch_gpu.py" <<'PT'
import json, sys
out = sys.argv[sys.argv.index("--json") + 1]
rows = []
for precision, layout in (("tf32", "nchw"), ("tf32", "nhwc"), ("bf16", "nhwc")):
    for bench in (False, True):
        rows.append({"model": "resnet18", "precision": precision, "layout": layout, "batch": 256,
                     "cudnn_benchmark": bench, "seconds_per_epoch": 3.0 - bench,
                     "median_step_ms": 10.0, "peak_mb": 1200.0 + bench})
json.dump({"device": "Stand-in GPU", "torch": "2.11", "cudnn": 91900, "results": rows},
          open(out, "w"))
print("pytorch_gpu: stand-in")
PT
cat >"$T/stage/bin/bench_gpu" <<'BG'
#!/bin/bash
[[ -n ${BENCH_ARGS_LOG:-} ]] && echo "$*" >>"$BENCH_ARGS_LOG"
if [[ " $* " == *" --list "* ]]; then
  printf '%s\n' resnet18-nchw-tf32-b256 resnet18-nhwc-tf32-b256 lenet-nhwc-bf16-b256
  exit 0
fi
json=""
while (($#)); do [[ $1 == --json ]] && json=$2; shift; done
echo "model ..."
[[ -n $json ]] && cat >"$json" <<'J'
{"device": "Stand-in GPU", "versions": {"cudnn": 91900}, "results": [
 {"config": "resnet18-nchw-tf32-b256", "model": "resnet18", "precision": "tf32", "layout": "nchw", "batch": 256, "graphs": false, "bn": "cudnn", "seconds_per_epoch": 3.3, "peak_mb": 3113},
 {"config": "resnet18-nhwc-tf32-b256", "model": "resnet18", "precision": "tf32", "layout": "nhwc", "batch": 256, "graphs": false, "bn": "ours", "seconds_per_epoch": 1.5, "peak_mb": 2000},
 {"config": "resnet18-nhwc-tf32-b256-cudnn-bn", "model": "resnet18", "precision": "tf32", "layout": "nhwc", "batch": 256, "graphs": false, "bn": "cudnn", "seconds_per_epoch": 10.4, "peak_mb": 2000},
 {"config": "resnet18-nhwc-tf32-b256-graphs", "model": "resnet18", "precision": "tf32", "layout": "nhwc", "batch": 256, "graphs": true, "bn": "ours", "seconds_per_epoch": 1.4, "peak_mb": 2000}]}
J
exit 0
BG
chmod +x "$T/stage/bin/bench_gpu"
cat >"$T/bin/ncu" <<'NCU'
#!/bin/sh
echo "==PROF== Connected to process 1"
echo '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
echo '"0","1","bench_gpu","h","sm90_xmma_fprop_implicit_gemm_tf32f32","1","7","(128, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1,500,000"'
echo '"1","1","bench_gpu","h","void dp::cuda::kernels::(anonymous namespace)::stats_partial_kernel(...)","1","7","(32, 8, 1)","(2, 512, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","250"'
echo '"2","1","bench_gpu","h","nchwToNhwcKernel","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","250000"'
if [ "$DPRUN_CUDNN_LOG" = 1 ]; then
  echo "dprun: cudnn: conv1 batch 256 forward: algo 1, tensor-op math, workspace 0 bytes, measured 0.0500 ms" >&2
fi
NCU
chmod +x "$T/bin/ncu"
pack
rm -rf "$T/out"
(cd "$T/repo" && env PATH="$T/bin:$PATH" PYTHONPATH="$T/py:$T/py2" OUT="$T/out" \
  DPRUN_GPU_PREFIX="$T/prefix" bash scripts/gpu-check --phases bench,pytorch,profile >"$T/log" 2>&1)
rc=$?
check "bench, pytorch and profile pass on stand-ins (exit $rc)" test $rc -eq 0
for phase in bench pytorch profile; do
  check "the $phase phase writes its record" test -s "$T/out/record-$phase.json"
done
check "the profile sums one step by category and keeps the layers' algorithms" python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["result"]["resnet18-nhwc-tf32-b256"]
cats = {c["category"]: c["ms"] for c in r["categories"]}
assert r["kernels"] == 3 and abs(r["total_ms"] - 2.0) < 1e-9, r
assert cats == {"convolution": 1.5, "batch norm": 0.25, "layout transpose": 0.25}, cats
assert r["choices"] == ["dprun: cudnn: conv1 batch 256 forward: algo 1, tensor-op math, "
                        "workspace 0 bytes, measured 0.0500 ms"], r.get("choices")
' "$T/out/record-profile.json"
folded=$(python3 "$T/repo/scripts/gpu-record" fold "$T/out")
check "the folded record compares dprun and PyTorch with the keys issue 21 names" python3 -c '
import json, sys
rows = json.load(open(sys.argv[1]))["comparison"]
keys = {"gpu", "commit", "model", "precision", "layout", "batch", "seconds_per_epoch", "peak_mb",
        "pytorch_seconds_per_epoch", "pytorch_peak_mb"}
assert rows and all(keys <= set(r) for r in rows), rows
by = {(r["precision"], r["layout"]): r for r in rows}
assert by[("tf32", "nhwc")]["seconds_per_epoch"] == 1.5, "graphs or cuDNN BN rows taken"
assert by[("tf32", "nhwc")]["pytorch_seconds_per_epoch"] == 2.0, "not PyTorch best"
assert by[("bf16", "nhwc")]["seconds_per_epoch"] is None, "bf16 has no dprun GPU path"
assert by[("tf32", "nchw")]["commit"] == "abc1234"
' "$folded"
table=$(python3 "$T/repo/scripts/gpu-record" table "$folded" 2>&1)
check "gpu-record prints the comparison" grep -q "| resnet18 | tf32 | nhwc | 256 | 1.500 | 2.000 | 0.75 |" <<<"$table"
# --quick: every configuration at batch 256 (bench_gpu --list) and ResNet-18 NHWC TF32 and bf16
# at 64 and 1024 beside them; PyTorch at every batch.
rm -rf "$T/out"
(cd "$T/repo" && env PATH="$T/bin:$PATH" PYTHONPATH="$T/py:$T/py2" OUT="$T/out" \
  BENCH_ARGS_LOG="$T/bench-args" DPRUN_GPU_PREFIX="$T/prefix" \
  bash scripts/gpu-check --phases bench,pytorch --quick >"$T/log" 2>&1)
rc=$?
check "bench and pytorch --quick pass on stand-ins (exit $rc)" test $rc -eq 0
quick_args=$(grep -v -- "--list" "$T/bench-args")
check "--quick measures batch 256's configurations and ResNet-18 NHWC at 64 and 1024" \
  grep -q -- "--batches 64,256,1024 --config resnet18-nchw-tf32-b256,resnet18-nhwc-tf32-b256,lenet-nhwc-bf16-b256,resnet18-nhwc-tf32-b64,resnet18-nhwc-bf16-b64,resnet18-nhwc-tf32-b1024,resnet18-nhwc-bf16-b1024" <<<"$quick_args"
check "--quick runs PyTorch at every batch" bash -c '! grep -q -- "pytorch_gpu.py.*--batches" "$1"' _ "$T/log"
rm -f "$T/bench-args"
rm -f "$folded" "$T/bin/ncu"
rm -rf "$T/repo/bench"

# 2. An unresolved library is a failure, not a warning.
if command -v cc >/dev/null; then
  printf 'int helper(void){return 1;}\n' >"$T/h.c"
  printf 'int helper(void);\nint main(void){return helper();}\n' >"$T/m.c"
  cc -shared -fPIC -o "$T/libhelper.so" "$T/h.c" && cc -o "$T/stage/bin/needs_helper" "$T/m.c" \
    -L"$T" -lhelper
  pack
  run
  rc=$?
  check "an unresolved library fails the run (exit $rc)" test $rc -ne 0
  check "the failure names the library" grep -q "libhelper.so => not found" "$T/log"
  rm -f "$T/stage/bin/needs_helper"
  pack
else
  echo "FAILED: no C compiler to build the unresolved-library case"; fails=$((fails + 1))
fi

# 2a. A library libdpcore loads itself (.gpu/dlopened) that cannot be found is a failure too.
mv "$T/py/nvidia/cudnn/lib/libstandin_cublas.so.13" "$T/standin_cublas.keep"
run
rc=$?
check "a dlopened library that is not found fails the run (exit $rc)" test $rc -ne 0
check "the failure names it" grep -q "libstandin_cublas.so.13 (which libdpcore loads when a CUDA backend starts) not found" "$T/log"
mv "$T/standin_cublas.keep" "$T/py/nvidia/cudnn/lib/libstandin_cublas.so.13"
# ... and so is one whose own dependencies are not found (cuBLAS needs libcublasLt).
if command -v cc >/dev/null; then
  printf 'int helper(void);\nint uses_helper(void){return helper();}\n' >"$T/u.c"
  cp "$T/py/nvidia/cudnn/lib/libstandin_cublas.so.13" "$T/standin_cublas.keep"
  cc -shared -fPIC -o "$T/py/nvidia/cudnn/lib/libstandin_cublas.so.13" "$T/u.c" -L"$T" -lhelper
  run
  rc=$?
  check "a dlopened library whose dependencies are missing fails the run (exit $rc)" test $rc -ne 0
  check "the failure names the missing dependency" grep -q "libhelper.so => not found" "$T/log"
  mv "$T/standin_cublas.keep" "$T/py/nvidia/cudnn/lib/libstandin_cublas.so.13"
fi

# 3. A bundle without test_core, missing data, a missing nvidia package, no GPU: each a failure
#    with its reason.
mv "$T/stage/bin/test_core" "$T/test_core.keep"
pack
run; rc=$?
check "a bundle without test_core fails the tests phase (exit $rc)" test $rc -ne 0
check "the failure names test_core" grep -q "test_core is not in the bundle" "$T/log"
mv "$T/test_core.keep" "$T/stage/bin/test_core"
pack

rm "$T/repo/.gpu/data/t10k-labels-idx1-ubyte.gz"
run; rc=$?
check "missing Fashion-MNIST fails (exit $rc)" test $rc -ne 0
check "the failure names the data file" grep -q "t10k-labels-idx1-ubyte.gz missing" "$T/log"
: >"$T/repo/.gpu/data/t10k-labels-idx1-ubyte.gz"
(cd "$T/repo" && env PATH="$T/bin:$PATH" PYTHONPATH="$T/nowhere" OUT="$T/out" DPRUN_GPU_PREFIX="$T/prefix" \
  bash scripts/gpu-check --phases tests >"$T/log" 2>&1)
rc=$?
check "no CUDA libraries in Python fails (exit $rc)" test $rc -ne 0
check "the failure says where it looked" grep -q "Python 'nvidia' package" "$T/log"
printf '#!/bin/sh\nexit 9\n' >"$T/bin/nvidia-smi"
run; rc=$?
check "a machine whose nvidia-smi sees no GPU fails (exit $rc)" test $rc -ne 0
check "an unknown phase is refused" bash -c "cd '$T/repo' && ! bash scripts/gpu-check --phases test >/dev/null 2>&1"

if ((fails)); then
  echo "--- last gpu-check output:"; cat "$T/log"
  exit 1
fi
echo "all gpu-check checks passed"
