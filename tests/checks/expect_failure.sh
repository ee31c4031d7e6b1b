#!/usr/bin/env bash
# Runs a command that must fail, with each extended regular expression matching some line of its
# output: exits 0 when it does, 1 when the command succeeds or says something else. Used by ctest
# to prove that the checks of tools/checks/ can fail.
# Usage: expect_failure.sh REGEX... -- COMMAND [ARGS...]
set -uo pipefail
patterns=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  patterns+=("$1")
  shift
done
shift  # --
output=$("$@" 2>&1)
status=$?
printf '%s\n' "$output"
if [ $status -eq 0 ]; then
  echo "expect_failure: the command must fail, got exit status 0" >&2
  exit 1
fi
for pattern in "${patterns[@]}"; do
  if ! grep -Eq -- "$pattern" <<<"$output"; then
    echo "expect_failure: the output must match '$pattern', got the output above" >&2
    exit 1
  fi
done
echo "expect_failure: failed as expected (exit status $status)"
