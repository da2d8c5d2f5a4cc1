#!/usr/bin/env bash
# Compile time side by side: `kiln compile` (import + specialize + pass pipeline +
# memory plan, release build, median of N in one process) against onnxruntime's
# InferenceSession creation (median of N, default optimization level) on the same
# models. Also prints each model's memory numbers. Usage: bench/compile-time.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-21}
python=$(scripts/py-env.sh)
${CARGO:-cargo} build --release --quiet --bin kiln
models=target/bench-models
"$python" scripts/onnx-real-models.py --write-only "$models"
run() { # name, shape flags...
  local name=$1; shift
  local out
  out=$(target/release/kiln compile "$models/$name/model.onnx" "$@" --repeat "$n" \
    --memory-report "target/bench-models/$name/memory.json" --memory-chart "target/bench-models/$name/memory.svg")
  echo "$out" | grep -E '^(memory|time)' | sed "s/^/$name: /"
  local kiln_ms ort_ms
  kiln_ms=$(echo "$out" | sed -n 's/.*total \([0-9.]*\) ms.*/\1/p')
  ort_ms=$("$python" - "$models/$name/model.onnx" "$n" <<'PY'
import statistics, sys, time
import onnxruntime as ort
path, n = sys.argv[1], int(sys.argv[2])
times = []
for _ in range(n):
    t = time.perf_counter()
    ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    times.append((time.perf_counter() - t) * 1e3)
print(f"{statistics.median(times):.1f}")
PY
)
  echo "$name: kiln compile $kiln_ms ms, onnxruntime session $ort_ms ms (medians of $n): ratio $(python3 -c "print(f'{$kiln_ms / $ort_ms:.2f}')")"
}
run resnet50 --shape N=1 --shape H=224 --shape W=224
run bert_encoder --shape B=1 --shape S=128
run resnet18 --shape N=1 --shape H=64 --shape W=64
