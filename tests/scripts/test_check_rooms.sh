#!/usr/bin/env bash
# scripts/check-rooms bites: on a small made-up runner/ it passes what keeps to its rooms.txt and
# fails, naming file:line, each kind of break (an include that runs back up, one of a room not
# listed, a header named without its room, a file outside the rooms, a long function or file
# without its reason, a rooms.txt that lists a room below).
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d /tmp/dprun-check-rooms.XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
check() {  # description, command...
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; fails=$((fails + 1)); fi
}
fresh() {
  rm -rf "$T/r" && mkdir -p "$T/r/runner/base" "$T/r/runner/sweep" "$T/r/runner/trial" "$T/r/runner/cli"
  printf 'base:\nsweep: base\ntrial: base\ncli: trial sweep base\n' >"$T/r/runner/rooms.txt"
  printf '#pragma once\nint helper();\n' >"$T/r/runner/base/os.hpp"
  printf '#include "base/os.hpp"\nint helper() { return 1; }\n' >"$T/r/runner/base/os.cpp"
  printf '#pragma once\n#include "base/os.hpp"\n' >"$T/r/runner/sweep/run.hpp"
  printf '#pragma once\n#include "base/os.hpp"\n' >"$T/r/runner/trial/main.hpp"
  printf '#include "sweep/run.hpp"\n#include "trial/main.hpp"\n' >"$T/r/runner/cli/cli.cpp"
}
run() { python3 "$SRC/scripts/check-rooms" --root "$T/r" >"$T/out" 2>&1; }

fresh; run; rc=$?
check "a tree that keeps to its rooms passes (exit $rc)" test $rc -eq 0

fresh; printf '#include "cli/cli.hpp"\n' >>"$T/r/runner/base/os.cpp"; : >"$T/r/runner/cli/cli.hpp"; run; rc=$?
check "an include that runs back up fails (exit $rc)" test $rc -ne 0
check "... naming the file, the line and why" grep -q "runner/base/os.cpp:3: base includes cli/cli.hpp: it runs back up" "$T/out"

fresh; printf '#include "sweep/run.hpp"\n' >>"$T/r/runner/trial/main.hpp"; run; rc=$?
check "trial including sweep (above it, not listed) fails (exit $rc)" test $rc -ne 0
check "... saying rooms.txt does not list it" grep -q "trial does not list sweep" "$T/out"

fresh; printf '#include "os.hpp"\n' >>"$T/r/runner/base/os.cpp"; run; rc=$?
check "a header named without its room fails (exit $rc)" test $rc -ne 0
check "... naming it with its room" grep -q '"base/os.hpp"' "$T/out"

fresh; printf 'int x;\n' >"$T/r/runner/stray.cpp"; run; rc=$?
check "a file outside the rooms fails (exit $rc)" test $rc -ne 0

fresh
{ printf 'int long_one() {\n'; for i in $(seq 1 85); do printf '  int v%d = %d;\n' "$i" "$i"; done; printf '  return 0;\n}\n'; } >>"$T/r/runner/base/os.cpp"
run; rc=$?
check "a function over 80 lines fails (exit $rc)" test $rc -ne 0
check "... naming its first line" grep -q "runner/base/os.cpp:3: a function of 88 lines" "$T/out"
sed -i 's|^int long_one() {|// long function: a made-up table\nint long_one() {|' "$T/r/runner/base/os.cpp"
run; rc=$?
check "... and passes with its reason written above it (exit $rc)" test $rc -eq 0

fresh
{ printf '// a big file\n'; for i in $(seq 1 610); do printf 'int g%d;\n' "$i"; done; } >"$T/r/runner/base/big.cpp"
run; rc=$?
check "a file over 600 lines fails (exit $rc)" test $rc -ne 0
sed -i '1s|.*|// long file: made up for the test|' "$T/r/runner/base/big.cpp"
run; rc=$?
check "... and passes with its reason at its top (exit $rc)" test $rc -eq 0

fresh; printf 'sweep: base\nbase:\ntrial: base\ncli: trial sweep base\n' >"$T/r/runner/rooms.txt"; run; rc=$?
check "rooms.txt listing a room below the one that lists it fails (exit $rc)" test $rc -ne 0

if ((fails)); then
  echo "--- last check-rooms output:"; cat "$T/out"
  exit 1
fi
echo "all check-rooms checks passed"
