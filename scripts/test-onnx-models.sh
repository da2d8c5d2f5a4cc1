#!/usr/bin/env bash
# Exporter-style models (MLP, small CNN, ResNet-18, 2-layer BERT-base encoder) through
# the release `kiln` CLI on every backend, compared with onnxruntime. Part of `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/py-env.sh)
${CARGO:-cargo} build --release --quiet --bin kiln
"$python" scripts/onnx-real-models.py target/release/kiln target/real-models interp cpu
