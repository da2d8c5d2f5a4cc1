#!/usr/bin/env bash
# Runs the stages of `make test` (each `make test-<stage>`) in lanes side by side. Each
# argument is one lane: its stages, separated by spaces, run in order; `stage:a,b` also
# waits for stages a and b of another lane. Two lanes keep both cores busy while one of
# them runs something single-threaded (valgrind, pip, a download, the Python generators).
#
# Each stage's output goes to target/stages/<stage>.log and is printed whole when the
# stage ends, so the lanes' outputs do not interleave. After the first failure no stage
# starts (with KEEP_GOING=1 every stage whose needs passed still runs). At the end every
# stage's wall time and start are printed, failed or not, so that the slow stage is
# visible in each CI log.
set -uo pipefail
cd "$(dirname "$0")/.."
dir=target/stages
rm -rf "$dir"
mkdir -p "$dir"
start_all=$(date +%s)

# Runs one lane; writes <stage>.done (ok, FAILED or skipped) and <stage>.time.
lane() {
  local item stage deps dep start status result
  for item in $1; do
    stage=${item%%:*}
    deps=""
    [[ $item == *:* ]] && deps=${item#*:}
    result=""
    for dep in ${deps//,/ }; do
      while [ ! -e "$dir/$dep.done" ]; do sleep 1; done
      [ "$(cat "$dir/$dep.done")" = ok ] || result=skipped
    done
    [ -e "$dir/failed" ] && [ -z "${KEEP_GOING:-}" ] && result=skipped
    if [ -n "$result" ]; then
      echo "0 0" >"$dir/$stage.time"
      echo "$result" >"$dir/$stage.done"
      continue
    fi
    start=$(date +%s)
    make --no-print-directory "test-$stage" >"$dir/$stage.log" 2>&1
    status=$?
    result=ok
    [ $status = 0 ] || { result=FAILED; touch "$dir/failed"; }
    echo "$((start - start_all)) $(($(date +%s) - start))" >"$dir/$stage.time"
    flock "$dir/print.lock" sh -c \
      "echo '== make test-$stage: $result'; cat '$dir/$stage.log'; echo"
    echo "$result" >"$dir/$stage.done"
  done
}

pids=()
for spec in "$@"; do
  lane "$spec" &
  pids+=($!)
done
wait "${pids[@]}"

echo "== stage wall times (make test; lanes side by side, so they overlap)"
printf '%-10s %6s %9s  %s\n' stage wall "starts at" result
for spec in "$@"; do
  for item in $spec; do
    stage=${item%%:*}
    read -r at took <"$dir/$stage.time"
    printf '%-10s %4d s %6d s  %s\n' "$stage" "$took" "$at" "$(cat "$dir/$stage.done")"
  done
done
printf '%-10s %4d s\n' total $(($(date +%s) - start_all))
[ ! -e "$dir/failed" ]
