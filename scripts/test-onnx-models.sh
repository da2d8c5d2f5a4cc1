#!/usr/bin/env bash
# Exporter-style models (MLP, small CNN, ResNet-18, ResNet-50, 2-layer BERT-base encoder)
# through the release `kiln` CLI on the interpreter and on cpu (the pass pipeline, then
# the interpreter), compared with onnxruntime. Part of `make test`, before `cargo test`,
# whose compiler tests read the models it leaves in target/real-models.
set -euo pipefail
cd "$(dirname "$0")/.."
python=$(scripts/py-env.sh)
${CARGO:-cargo} build --release --quiet --bin kiln
"$python" scripts/onnx-real-models.py target/release/kiln target/real-models interp cpu
