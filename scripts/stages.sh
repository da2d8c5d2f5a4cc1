#!/usr/bin/env bash
# Runs `make test-<stage>` for each stage named, in order, stopping at the first that
# fails (or, with KEEP_GOING=1, running the rest too), and prints every stage's wall time
# at the end either way, so that the slow stage is visible in each CI log. Used by
# `make test`.
set -uo pipefail
cd "$(dirname "$0")/.."
report=()
status=0
failed=0
start_all=$(date +%s)
for stage in "$@"; do
  echo "== make test-$stage"
  start=$(date +%s)
  make --no-print-directory "test-$stage"
  status=$?
  report+=("$(printf '%-10s %4d s  %s' "$stage" $(($(date +%s) - start)) "$([ $status = 0 ] && echo ok || echo FAILED)")")
  [ $status = 0 ] || failed=1
  [ $status = 0 ] || [ -n "${KEEP_GOING:-}" ] || break
done
echo
echo "== stage wall times (make test)"
printf '%s\n' "${report[@]}"
printf '%-10s %4d s\n' total $(($(date +%s) - start_all))
exit $failed
