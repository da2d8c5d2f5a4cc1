#!/usr/bin/env bash
# Redraws the pictures under docs/pictures/ that the README shows, from ResNet-50 as
# scripts/test-onnx-models.sh exports it: the optimized graph (`kiln viz --optimized`),
# the cpu execution plan with measured step times (`kiln compile --plan-view`) and a
# profile trace of two runs at 2 threads (`kiln bench --trace`, drawn by `kiln
# timeline`), each screenshotted by headless Chromium. Run by hand after a change to
# what they show; needs graphviz and chromium (`scripts/ensure-deps.sh --pictures`).
set -euo pipefail
cd "$(dirname "$0")/.."
model=target/real-models/resnet50/model.onnx
[ -f "$model" ] || { echo "docs-pictures: $model is missing (scripts/test-onnx-models.sh writes it)" >&2; exit 1; }
cargo build --release --quiet --bin kiln
kiln=target/release/kiln
out=docs/pictures
tmp=target/docs-pictures
mkdir -p "$out" "$tmp"
shapes=(--shape N=1 --shape H=224 --shape W=224)
shot() { # page png width,height
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$tmp/chromium" \
    --virtual-time-budget=5000 --window-size="$3" --screenshot="$2" "file://$PWD/$1" 2>/dev/null
  echo "wrote $2"
}
# The graph is tall (a chain of blocks): graphviz draws its PNG whole.
"$kiln" viz "$model" --optimized "${shapes[@]}" -o "$out/resnet50-optimized.svg"
"$kiln" viz "$model" --optimized "${shapes[@]}" -o "$tmp/resnet50-optimized.dot" >/dev/null
dot -Tpng -Gdpi=56 "$tmp/resnet50-optimized.dot" -o "$out/resnet50-optimized.png"
echo "wrote $out/resnet50-optimized.png"
"$kiln" compile "$model" "${shapes[@]}" --plan-view "$tmp/resnet50-plan.html" --plan-view-runs 5 | tail -1
shot "$tmp/resnet50-plan.html" "$out/resnet50-plan.png" 1600,1000
"$kiln" bench "$model" "${shapes[@]}" --threads 2 --warmup 1 --iterations 2 --trace "$tmp/resnet50-trace.json" | tail -1
"$kiln" timeline "$tmp/resnet50-trace.json" -o "$tmp/resnet50-timeline.html"
shot "$tmp/resnet50-timeline.html" "$out/resnet50-trace.png" 1600,400
