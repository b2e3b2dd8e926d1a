#!/usr/bin/env bash
# scripts/check-readme-claims fails when the README, the claims list and the tests disagree:
# each planted disagreement, on a copy of the three, must be reported.
set -uo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d /tmp/dprun-claims-test.XXXXXX)
trap 'rm -rf "$T"' EXIT
fails=0
fresh() {
  rm -rf "$T/root"
  mkdir -p "$T/root/tests"
  cp "$SRC/README.md" "$T/root/"
  cp -r "$SRC/tests/." "$T/root/tests/"
}
expect() {  # description, wanted message
  local out rc
  out=$(python3 "$SRC/scripts/check-readme-claims" --root "$T/root" 2>&1); rc=$?
  if ((rc != 0)) && grep -qF -- "$2" <<<"$out"; then echo "ok: $1"
  else echo "FAILED: $1 (exit $rc, wanted a message with: $2)"; echo "$out" | tail -n 5; fails=$((fails + 1)); fi
}
fresh
if python3 "$SRC/scripts/check-readme-claims" --root "$T/root" >/dev/null; then echo "ok: the tree as it is passes"
else echo "FAILED: the tree as it is"; fails=$((fails + 1)); fi

fresh
sed -i 's/runs diverged ones again from the start/runs diverged ones again/' "$T/root/README.md"
expect "a claim reworded in the README" "the claim is not in README.md"

fresh
sed -i 's/"a diverged trial is run again from the start on the next run"/"a diverged trial is run again"/' \
  "$T/root/tests/runner/test_run_behaviour.cpp"
expect "a listed test renamed" "no test case or ctest entry named 'a diverged trial is run again from the start on the next run'"

fresh
sed -i 's/TEST_CASE("plan and --dry-run read the database without creating it", "\[cli\]")/TEST_CASE("plan and --dry-run read the database without creating it", "[cli][readme]")/' \
  "$T/root/tests/runner/test_cli.cpp"
expect "a [readme] test that holds no listed claim" "is tagged [readme] but holds no listed claim"

fresh
sed -i 's/^- A NaN or infinite loss marks the trial `diverged`; the epochs before it stay./- A NaN or infinite loss marks the trial `diverged`; the epochs before it stay.\n- A new promise with no test./' "$T/root/README.md"
expect "a new bullet in How a run behaves without a claim" "no claim listed for the bullet 'A new promise with no test."

fresh
printf 'claim: The runner process never initialises CUDA; trial processes do.\n' >>"$T/root/tests/readme_claims.txt"
expect "a claim without a test" "the claim names no test"

((fails == 0)) && echo "all check-readme-claims checks passed"
((fails == 0))
