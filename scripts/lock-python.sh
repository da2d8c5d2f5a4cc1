#!/usr/bin/env bash
# Rewrites the Python lock files (scripts/requirements/*.txt) from their inputs (*.in):
# every package pinned, transitively, with the sha256 of each of its files, for any
# Python >= 3.11 on any platform. Run it after changing a *.in file, and commit both.
# The installs (scripts/py-env.sh, scripts/test-python.sh) use --require-hashes, so the
# suite's generated expectations no longer depend on the day of the install.
set -euo pipefail
cd "$(dirname "$0")/requirements"
tool=../../target/uv-py
# uv itself is pinned by hash too (its x86-64 Linux wheel, this project's machines).
if [ ! -x "$tool/bin/uv" ]; then
  python3 -m venv "$tool"
  echo "uv==0.13.9 --hash=sha256:d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19" >"$tool/uv.txt"
  "$tool/bin/pip" install --quiet --require-hashes --no-deps -r "$tool/uv.txt"
fi
for input in *.in; do
  "$tool/bin/uv" pip compile --quiet --universal --python-version 3.11 --generate-hashes \
    "$input" -o "${input%.in}.txt"
done
