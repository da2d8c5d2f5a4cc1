#!/usr/bin/env bash
# Generates the com.microsoft contrib-op cases (onnxruntime's outputs, see py-env.sh) into
# target/contrib-cases, again whenever the generator or the lock changes.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/contrib-cases
stamp="$out/.generator"
sum=$(cat scripts/contrib-cases.py scripts/requirements/tests.txt | sha256sum | cut -d' ' -f1)
[ -f "$stamp" ] && [ "$(cat "$stamp")" = "$sum" ] && exit 0
python=$(scripts/py-env.sh)
"$python" scripts/contrib-cases.py "$out"
echo "$sum" > "$stamp"
