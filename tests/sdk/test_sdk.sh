#!/usr/bin/env bash
# The plugin SDK end to end: install dprun from this build tree into a temporary prefix, build
# tests/sdk/mynet (a model) and examples/dataset-plugin (a dataset) against the installed package
# (find_package(dprun) + dprun_add_plugin, as a user would), list both with the installed dprun,
# and train: mynet on Fashion-MNIST where it is installed, LeNet on the plugin's dataset always.
# usage: test_sdk.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
BUILD=$1 SRC=$2
T=$(mktemp -d /tmp/dprun-sdk-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

cmake --install "$BUILD" --prefix "$T/prefix" >"$T/install.log" 2>&1 ||
  { cat "$T/install.log"; fail "cmake --install"; }
for f in bin/dprun lib/libdpcore.so include/dp/plugin.hpp lib/cmake/dprun/dprunConfig.cmake \
  lib/dprun/plugins/libdprun_lenet.so; do
  [[ -e $T/prefix/$f ]] || fail "the install lacks $f"
done
# Every installed library finds what it links on its own (its RUNPATH), as the user's own
# program loading a plugin would need: not only inside a dprun that already loaded libdpcore.
for lib in "$T"/prefix/lib/dprun/plugins/*.so "$T/prefix/bin/dprun"; do
  missing=$(env -u LD_LIBRARY_PATH ldd "$lib" | grep "not found")
  [[ -z $missing ]] || fail "$lib: unresolved libraries: $missing"
done
# Nothing of the build tree may leak into the installed files' search paths.
if grep -rq "$BUILD" "$T/prefix/lib/cmake/dprun"; then fail "the CMake package names the build tree"; fi

cmake -S "$SRC/tests/sdk/mynet" -B "$T/mynet" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$T/prefix" >"$T/configure.log" 2>&1 || { cat "$T/configure.log"; fail "configuring the plugin"; }
cmake --build "$T/mynet" >"$T/build.log" 2>&1 || { cat "$T/build.log"; fail "building the plugin"; }
[[ -f $T/mynet/libdprun_mynet.so ]] || fail "no libdprun_mynet.so"

# The installed dprun finds its own plugins, and the user's through --plugins.
out=$("$T/prefix/bin/dprun" plugins --plugins "$T/mynet" 2>&1) || { echo "$out"; fail "dprun plugins"; }
grep -q "mynet" <<<"$out" || { echo "$out"; fail "dprun plugins does not list mynet"; }
grep -q "lenet" <<<"$out" || { echo "$out"; fail "the installed dprun does not find its own plugins"; }
if [[ -n ${DPRUN_TEST_DATA:-} ]]; then
  out=$("$T/prefix/bin/dprun" train --plugins "$T/mynet" --model mynet --epochs 1 \
    --batch-size 64 --lr 0.1 --train-limit 512 --test-limit 256 --backend cpu --threads 2 2>&1) ||
    { echo "$out"; fail "training mynet"; }
  grep -qE "^ +1 " <<<"$out" || { echo "$out"; fail "no epoch line"; }
  echo "$out"
else
  echo "Fashion-MNIST not found: the plugin was built and listed, not trained"
fi

# The example dataset plugin: built the same way, listed, trained for an epoch.
cmake -S "$SRC/examples/dataset-plugin" -B "$T/stripes" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$T/prefix" >"$T/configure-stripes.log" 2>&1 ||
  { cat "$T/configure-stripes.log"; fail "configuring the dataset plugin"; }
cmake --build "$T/stripes" >"$T/build-stripes.log" 2>&1 ||
  { cat "$T/build-stripes.log"; fail "building the dataset plugin"; }
[[ -f $T/stripes/libdprun_stripes.so ]] || fail "no libdprun_stripes.so"
out=$("$T/prefix/bin/dprun" plugins --plugins "$T/stripes" 2>&1) ||
  { echo "$out"; fail "dprun plugins (stripes)"; }
grep -q "^stripes: example plugin" <<<"$out" || { echo "$out"; fail "stripes is not listed"; }
grep -qF "yields 1x?x?, 3 classes" <<<"$out" || { echo "$out"; fail "what stripes yields is not said"; }
grep -q "train_count" <<<"$out" || { echo "$out"; fail "the dataset's options are not listed"; }
out=$("$T/prefix/bin/dprun" train --plugins "$T/stripes" --model lenet --dataset stripes \
  --data-option train_count=256 --data-option test_count=128 --epochs 1 --batch-size 64 \
  --lr 0.1 --backend cpu --threads 2 2>&1) || { echo "$out"; fail "training LeNet on stripes"; }
grep -qE "^ +1 " <<<"$out" || { echo "$out"; fail "no epoch line (stripes)"; }
echo "$out"
# In an experiment file: [data] dataset = "stripes" with [data.stripes] options, recorded.
printf '%s\n' '[experiment]' 'name = "stripes"' '[data]' 'dataset = "stripes"' '[data.stripes]' \
  'train_count = 256' 'test_count = 128' '[train]' 'model = "lenet"' 'epochs = 1' \
  'batch_size = 64' 'backend = "cpu"' >"$T/stripes.toml"
out=$(cd "$T" && "$T/prefix/bin/dprun" run stripes.toml --plugins "$T/stripes" \
  --db "$T/stripes.db" --threads 2 2>&1) || { echo "$out"; fail "dprun run on stripes"; }
rows=$("$T/prefix/bin/dprun" query --db "$T/stripes.db" --format csv \
  "SELECT status, dataset, data_options FROM trials" 2>&1)
grep -q 'done,stripes,.*train_count.*256' <<<"$rows" ||
  { echo "$rows"; fail "the stripes trial is not recorded done with its options"; }
echo "the plugin SDK works"
