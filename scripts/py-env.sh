#!/usr/bin/env bash
# A private Python (target/py) with the pinned packages the ONNX tests need, so that
# neither the system's Python nor PEP 668 is in the way (scikit-learn and skl2onnx make the
# zoo's tabular models, scripts/model-zoo.py; sympy, onnxruntime's transformer optimizer). Prints the interpreter's path.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/py
pins=(onnx==1.23.2 onnxruntime==1.32.0 scikit-learn==1.9.1 skl2onnx==1.20.0 sympy==1.14.0 numpy)
if ! "$venv/bin/python" -c "
import importlib.metadata as m, sys
pins = [p.split('==') for p in sys.argv[1:] if '==' in p]
sys.exit(any(m.version(p) != v for p, v in pins))" "${pins[@]}" 2>/dev/null; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${pins[@]}" >&2
fi
echo "$venv/bin/python"
