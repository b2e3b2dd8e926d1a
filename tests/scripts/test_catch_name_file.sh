#!/usr/bin/env bash
# scripts/catch-name-file against a real Catch2 binary: every test name it lists, passed back
# through -f, selects exactly that test (test_core's names have commas, brackets, quotes).
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$1
T=$(mktemp -d /tmp/dprun-catch-names.XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
check() {
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAILED: $what"; fails=$((fails + 1)); fi
}
for spec in "" "[layers],[batchnorm]"; do
  "$SRC/scripts/catch-name-file" "$BIN" "$spec" >"$T/names" || { echo "FAILED: catch-name-file '$spec'"; exit 1; }
  args=(--list-test-names-only); [[ -n $spec ]] && args=("$spec" --list-test-names-only)
  "$BIN" "${args[@]}" | grep -v '^$' >"$T/expected"
  "$BIN" -w NoTests -f "$T/names" --list-test-names-only | grep -v '^$' >"$T/got"
  check "'$spec': $(wc -l <"$T/expected") names, each selected through -f" cmp -s "$T/expected" "$T/got"
  check "'$spec': the list is not empty" test -s "$T/expected"
done
check "a name with a comma is among them" grep -q ',' "$T/expected"
# One name per file: each selects one test, itself.
head -n 5 "$T/names" >"$T/five"
check "five names select five tests" bash -c '[[ $("$1" -f "$2" --list-test-names-only | grep -vc "^$") == 5 ]]' _ "$BIN" "$T/five"
check "a spec that selects nothing is refused" bash -c '! "$1" "$2" "[no-such-tag]" >/dev/null 2>&1' _ "$SRC/scripts/catch-name-file" "$BIN"
((fails)) && { diff "$T/expected" "$T/got" | head; exit 1; }
echo "all catch-name-file checks passed"
