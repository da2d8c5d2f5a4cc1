#!/usr/bin/env bash
# The Python package's tests (part of `make test`): installs bindings/python into a
# fresh venv (as the README's install does, but every wheel hash-locked, the package's
# own included, so nothing unlocked comes in), runs its pytest
# suite (against NumPy and onnxruntime), then a loop of its calls under valgrind twice,
# 5 and 40 rounds: the bytes definitely lost must not grow with the rounds (CPython and
# NumPy lose a constant amount at exit), and no invalid access may go through the
# extension module.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/py-kiln
python3 -m venv --clear "$venv"
# Downloads stay under target/; the extension builds in the workspace's target/, against
# the release library the other stages built.
export PIP_CACHE_DIR=$PWD/target/pip-cache
# What the package builds with and is tested against, locked (scripts/requirements/
# python-package.in); then the package itself: its wheel built by that maturin, installed
# by the hash of the file just built.
"$venv/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps -r scripts/requirements/python-package.txt
rm -rf "$venv/wheel"
"$venv/bin/maturin" build --quiet --release -m bindings/python/Cargo.toml -i "$venv/bin/python" --out "$venv/wheel"
wheel=$(ls "$PWD/$venv"/wheel/kiln-*.whl)
echo "kiln @ file://$wheel --hash=sha256:$(sha256sum "$wheel" | cut -d' ' -f1)" >"$venv/kiln-wheel.txt"
"$venv/bin/pip" install --quiet --disable-pip-version-check --require-hashes --no-deps -r "$venv/kiln-wheel.txt"
# A skipped test says why (-rs); under CI (or KILN_REQUIRE=all) a skip fails the run.
(cd bindings/python && "../../$venv/bin/python" -m pytest -q -rs tests) | tee "$venv/pytest.log"
if { [ -n "${CI:-}" ] || [ "${KILN_REQUIRE:-}" = all ]; } && grep -q "^SKIPPED" "$venv/pytest.log"; then
  echo "test-python: a test was skipped and every test is required here" >&2
  exit 1
fi

lost() {
  PYTHONMALLOC=malloc valgrind --leak-check=full --show-leak-kinds=definite \
    "$venv/bin/python" bindings/python/tests/leak_check.py "$1" >"target/py-kiln/valgrind-$1.log" 2>&1
  if grep -E "Invalid (read|write|free)" -A12 "target/py-kiln/valgrind-$1.log" | grep -q "_kiln"; then
    echo "test-python: invalid access in the extension module (target/py-kiln/valgrind-$1.log)" >&2
    exit 1
  fi
  grep -o "definitely lost: [0-9,]* bytes" "target/py-kiln/valgrind-$1.log" | tr -dc 0-9
}
few=$(lost 5)
many=$(lost 40)
echo "test-python: definitely lost after 5 rounds: ${few:-0} bytes, after 40: ${many:-0} bytes"
if [ "${many:-0}" -gt "${few:-0}" ]; then
  echo "test-python: memory lost grows with the rounds" >&2
  exit 1
fi
