#!/usr/bin/env bash
# Generates the ONNX node test suite (pinned onnx, see py-env.sh) into target/onnx-node, once.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/onnx-node
stamp="$out/.onnx-1.23.2"
[ -f "$stamp" ] && exit 0
python=$(scripts/py-env.sh)
rm -rf "$out"
"$python" scripts/onnx-node-tests.py "$out"
touch "$stamp"
