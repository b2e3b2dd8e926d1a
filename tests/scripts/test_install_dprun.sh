#!/usr/bin/env bash
# scripts/install-dprun (README's first command): installs this build into a prefix, from where
# dprun runs and finds its plugins; says so in one line; refuses a build folder without dprun.
# usage: test_install_dprun.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
BUILD=$1 SRC=$2
T=$(mktemp -d /tmp/dprun-install-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
check() { local what=$1; shift; if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; fails=$((fails + 1)); fi; }

out=$(DPRUN_BUILD_DIR=$BUILD "$SRC/scripts/install-dprun" "$T/prefix" 2>&1); rc=$?
echo "$out"
check "install-dprun exits 0 ($rc)" test $rc -eq 0
check "one line says where dprun went" grep -q "^install-dprun: [0-9]* files into $T/prefix: $T/prefix/bin/dprun" <<<"$out"
check "it says the prefix is not on PATH" grep -q "add $T/prefix/bin to PATH" <<<"$out"
plugins=$(env -u LD_LIBRARY_PATH DPRUN_PLUGIN_PATH= "$T/prefix/bin/dprun" plugins 2>&1)
check "the installed dprun finds its installed plugins" grep -q "file: $T/prefix/lib/dprun/plugins/libdprun_lenet.so" <<<"$plugins"
out=$(PATH="$T/prefix/bin:$PATH" DPRUN_BUILD_DIR=$BUILD "$SRC/scripts/install-dprun" "$T/prefix" 2>&1)
check "installed again on PATH: no note" bash -c '! grep -q "note:" <<<"$1"' _ "$out"
out=$(DPRUN_BUILD_DIR=$T/nothing "$SRC/scripts/install-dprun" "$T/prefix2" 2>&1); rc=$?
check "a build folder without dprun is refused with exit 2 ($rc)" test $rc -eq 2
check "the refusal says how to build" grep -q "cmake --build --preset app" <<<"$out"
((fails == 0)) && echo "all install-dprun checks passed"
((fails == 0))
