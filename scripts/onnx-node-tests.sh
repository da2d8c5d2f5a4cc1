#!/usr/bin/env bash
# Generates the ONNX node test suite (the locked onnx, numpy and ml_dtypes of py-env.sh)
# into target/onnx-node, again whenever the generator or the lock changes.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/onnx-node
stamp="$out/.generated"
sum=$(cat scripts/onnx-node-tests.py scripts/requirements/tests.txt | sha256sum | cut -d' ' -f1)
[ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ] && exit 0
python=$(scripts/py-env.sh)
rm -rf "$out"
"$python" scripts/onnx-node-tests.py "$out"
echo "$sum" >"$stamp"
