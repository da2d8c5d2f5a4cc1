#!/usr/bin/env bash
# A private Python (target/py) with the pinned packages the ONNX tests need, so that
# neither the system's Python nor PEP 668 is in the way. Prints the interpreter's path.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/py
pins=(onnx==1.23.2 onnxruntime==1.32.0 numpy)
if ! "$venv/bin/python" -c "
import importlib.metadata as m, sys
sys.exit(m.version('onnx') != '1.23.2' or m.version('onnxruntime') != '1.32.0')" 2>/dev/null; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${pins[@]}" >&2
fi
echo "$venv/bin/python"
