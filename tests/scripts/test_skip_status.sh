#!/usr/bin/env bash
# The exit status of a test executable, which is what ctest reads: 0 passed, 77 skipped (with
# the reason in $DPRUN_SKIP_LOG, under the test's name), 1 failed. A failure count of exactly 77
# (Catch2's own exit status) must still read as failed. Usage: test_skip_status.sh TEST_DATA_BIN
set -uo pipefail
bin=$1
T=$(mktemp -d /tmp/dprun-skip-status.XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
expect() {  # tag, wanted exit status
  DPRUN_SKIP_LOG=$T/log "$bin" "[$1]" >"$T/out" 2>&1
  local rc=$?
  if [[ $rc == "$2" ]]; then echo "ok: [$1] exits $rc"
  else echo "FAILED: [$1] exits $rc, wanted $2"; tail -n 5 "$T/out"; fails=$((fails + 1)); fi
}
expect passes 0
expect skips 77
expect fails77 1
expect skips-and-fails 1
if grep -qx -- "- skip status: a case that skips a part: the planted skip of test_skip_status.sh, one line" "$T/log"; then
  echo "ok: the skip log names the test and the reason"
else
  echo "FAILED: the skip log lacks the test and the reason:"; cat "$T/log"; fails=$((fails + 1))
fi
((fails == 0)) && echo "all skip-status checks passed"
((fails == 0))
