#!/usr/bin/env bash
# Generates the ONNX node test suite (pinned onnx) into target/onnx-node, once.
set -euo pipefail
cd "$(dirname "$0")/.."
ONNX_VERSION=1.23.2
out=target/onnx-node
stamp="$out/.onnx-$ONNX_VERSION"
[ -f "$stamp" ] && exit 0
# A private virtualenv, so that neither the system's Python nor PEP 668 is in the way.
venv=target/py
if ! "$venv/bin/python" -c "import onnx, sys; sys.exit(onnx.__version__ != '$ONNX_VERSION')" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "onnx==$ONNX_VERSION" numpy
fi
rm -rf "$out"
"$venv/bin/python" scripts/onnx-node-tests.py "$out"
touch "$stamp"
