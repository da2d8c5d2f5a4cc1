#!/usr/bin/env bash
# Fills fuzz/corpus/<target> with seed inputs taken from the repository, so the fuzzers
# start from real models and graphs rather than from empty input. Nothing here is
# committed: the corpora are rebuilt from what the repository (and, when they have been
# generated, the ONNX node tests, real models, contrib-op cases and zoo under target/) hold.
#
#   fuzz/seeds.sh                 # all targets
#   ONNX_NODE_SAMPLE=500 fuzz/seeds.sh
#   MAX_SEED_BYTES=4000000 fuzz/seeds.sh   # larger generated models too (default 2 MB)
#
# The generated models are looked for in this checkout's target/ and then in
# $KILN_MODELS_TARGET (e.g. the main checkout's target/ when run from a worktree);
# `make test` generates them (scripts/onnx-node-tests.sh, scripts/onnx-real-models.py,
# the contrib cases and the zoo).
set -euo pipefail

fuzz_dir="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$fuzz_dir/.." && pwd)"
corpus="$fuzz_dir/corpus"
sample="${ONNX_NODE_SAMPLE:-300}"

# Copies a file to a corpus directory under a name that keeps where it came from.
seed() {
    local dir="$1" file="$2" name
    name="$(realpath -s --relative-to="$3" "$file" | tr '/' '_')"
    cp "$file" "$corpus/$dir/$name"
}

mkdir -p "$corpus/onnx_import" "$corpus/onnx_compile" "$corpus/kir_parse"

# ONNX models: the ones the repository ships...
onnx=()
while IFS= read -r f; do onnx+=("$f"); done < <(
    find "$repo/examples" "$repo/tests" -name '*.onnx' -type f | sort
)
# ...and the generated ones, when present, each looked for in this checkout's target/
# and then in $KILN_MODELS_TARGET: the real models, the contrib-op cases, the zoo, an even
# sample of the ONNX node tests (one model per op and variant) and, besides the sample,
# every node test that has a subgraph or a sequence, optional or string value (If, Loop,
# Scan, SequenceMap, functions expanded with a Loop, the ai.onnx.ml ops): the importer's
# newest and most nested paths. Files over $MAX_SEED_BYTES are left out: libFuzzer
# mutates and re-runs whole inputs, and a model of many megabytes starves it.
generated_dir() {
    local target
    for target in "$repo/target" "${KILN_MODELS_TARGET:-}"; do
        if [ -n "$target" ] && [ -d "$target/$1" ]; then
            echo "$target/$1"
            return
        fi
    done
}
max_bytes="${MAX_SEED_BYTES:-2000000}"
small_models() {
    [ -n "$1" ] && find -L "$1" -name model.onnx -type f -size -"${max_bytes}"c | sort
}
for dir in real-models contrib-cases zoo; do
    while IFS= read -r f; do onnx+=("$f"); done < <(small_models "$(generated_dir "$dir")")
done
node_dir="$(generated_dir onnx-node)"
if [ -n "$node_dir" ]; then
    mapfile -t node < <(small_models "$node_dir")
    if [ "${#node[@]}" -gt 0 ] && [ "$sample" -gt 0 ]; then
        step=$(( (${#node[@]} + sample - 1) / sample ))
        for ((i = 0; i < ${#node[@]}; i += step)); do onnx+=("${node[$i]}"); done
    fi
    # By name (the containers and string ops), and by content: a graph attribute's
    # name is plain text in the protobuf.
    names='(^|_)(if|loop[0-9]*|scan[0-9]*|seq|sequence|opt|optional|string|strnormalizer|label_encoder|tree_ensemble|regex|tfidfvectorizer)(_|$)|^test_ai_onnx_ml_'
    for f in "${node[@]}"; do
        case_name="$(basename "$(dirname "$f")")"
        if [[ "${case_name,,}" =~ $names ]] || grep -q -a -E 'then_branch|else_branch|body' "$f"; then
            onnx+=("$f")
        fi
    done
fi
# Without generated node tests, the pinned Python environment (scripts/py-env.sh) can
# write the same sample of node models straight from onnx's test loader.
node_models_written=0
if [ -z "$node_dir" ] && [ "$sample" -gt 0 ]; then
    for python in "$repo/target/py/bin/python" "${KILN_MODELS_TARGET:-/nonexistent}/py/bin/python"; do
        [ -x "$python" ] || continue
        node_models_written=$("$python" - "$corpus" "$sample" <<'PY'
import os, sys, warnings
import onnx
from onnx.backend.test.loader import load_node_model_tests

warnings.simplefilter("ignore")
corpus, sample = sys.argv[1], int(sys.argv[2])
cases = sorted(load_node_model_tests(), key=lambda c: c.name)
step = max(1, -(-len(cases) // sample))
picked = cases[::step]
for case in picked:
    for target in ("onnx_import", "onnx_compile"):
        onnx.save(case.model, os.path.join(corpus, target, f"onnx-node_{case.name}.onnx"))
print(len(picked))
PY
        )
        break
    done
fi

for f in "${onnx[@]}"; do
    root="$(dirname "$(dirname "$(dirname "$f")")")" # generated: <dir>_<case>_model.onnx
    case "$f" in "$repo"/target/*) ;; "$repo"/*) root="$repo" ;; esac
    seed onnx_import "$f" "$root"
    seed onnx_compile "$f" "$root"
done

# `.kir` graphs: the checked-in ones, and the optimized graphs of the pass snapshots
# (they hold the passes' own ops, `Fused` bodies and blocked layouts, that no
# hand-written graph does). A snapshot is a YAML header, then the text.
while IFS= read -r f; do seed kir_parse "$f" "$repo"; done < <(
    find "$repo/examples" "$repo/tests" -name '*.kir' -type f | sort
)
for f in "$repo"/tests/snapshots/*.snap; do
    [ -e "$f" ] || continue
    if grep -q '^graph ' "$f"; then
        awk 'n >= 2 { print } /^---$/ { n++ }' "$f" >"$corpus/kir_parse/$(basename "$f" .snap).kir"
    fi
done

[ "$node_models_written" -eq 0 ] || echo "wrote $node_models_written ONNX node-test models from onnx's loader"
for t in onnx_import onnx_compile kir_parse; do
    echo "$t: $(find "$corpus/$t" -type f | wc -l) seeds"
done
