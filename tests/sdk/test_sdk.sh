#!/usr/bin/env bash
# The plugin SDK end to end: install dprun from this build tree into a temporary prefix, build
# tests/sdk/mynet against the installed package (find_package(dprun) + dprun_add_plugin, as a
# user would), and train it for one epoch with the installed dprun and --plugins.
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
echo "the plugin SDK works"
