#!/usr/bin/env bash
# A private Python with the locked packages, so that neither the system's Python nor
# PEP 668 is in the way, and every install gets the same versions of everything,
# transitively (scripts/requirements/*.txt, installed with --require-hashes; rewrite them
# with scripts/lock-python.sh). Prints the interpreter's path.
#   scripts/py-env.sh          target/py: what the tests generate their models and
#                              expectations with (tests.txt)
#   scripts/py-env.sh bench    target/py-bench: the benchmarks' peers as well (bench.txt)
# A venv is made anew when its lock file changes; downloads are cached in target/pip-cache.
set -euo pipefail
cd "$(dirname "$0")/.."
lock_name=${1:-tests}
case "$lock_name" in
  tests) venv=target/py ;;
  bench) venv=target/py-bench ;;
  *) echo "py-env: unknown lock '$lock_name' (tests or bench)" >&2; exit 2 ;;
esac
lock=scripts/requirements/$lock_name.txt
digest=$(sha256sum "$lock" | cut -d' ' -f1)
if [ "$(cat "$venv/.lock-sha256" 2>/dev/null)" != "$digest" ]; then
  python3 -m venv --clear "$venv" >&2
  PIP_CACHE_DIR=$PWD/target/pip-cache "$venv/bin/pip" install --quiet --require-hashes --no-deps -r "$lock" >&2
  echo "$digest" >"$venv/.lock-sha256"
fi
echo "$venv/bin/python"
