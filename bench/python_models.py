"""ResNet-50 and the BERT layer from Python against `kiln bench` on the same model, in
one run: alternating rounds of the CLI's median (its own `--json` timing) and the
median of as many `InferenceSession.run` calls; the ratio of the rounds' medians.

    python bench/python_models.py [--rounds 5] [--threads 1] [--seconds 2]

Needs the locked benchmark environment with the `kiln` wheel added to it, nothing unpinned:
`scripts/test-python.sh` (builds the wheel with the locked maturin and writes its hash
line), `python=$(scripts/py-env.sh bench)` (onnxruntime, onnx, jax, ... from
scripts/requirements/bench.txt), then
`target/py-bench/bin/pip install --require-hashes --no-deps -r target/py-kiln/kiln-wheel.txt`;
run it with `target/py-bench/bin/python`.
Also `target/release/kiln` and the benchmark models that `bash bench/compare` writes to
target/bench-models.
"""

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np

import kiln

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "target/bench-models"
CASES = [("resnet50", "x.npy"), ("bert", "ids.npy")]


def cli_median_ms(model, inputs, threads, seconds):
    out = subprocess.run(
        [str(ROOT / "target/release/kiln"), "bench", str(model), "--inputs", str(inputs),
         "--threads", str(threads), "--seconds", str(seconds), "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])["median_ms"]


def python_median_ms(sess, feeds, seconds):
    for _ in range(3):
        sess.run(None, feeds)
    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 10:
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    print(f"{args.rounds} alternating rounds, {args.threads} thread(s), medians")
    print("| model | kiln bench ms | Python ms | Python / kiln bench |")
    print("|---|---|---|---|")
    for name, x in CASES:
        model, inputs = MODELS / name / "model.onnx", MODELS / name / x
        sess = kiln.InferenceSession(model, threads=args.threads)
        feeds = {sess.get_inputs()[0].name: np.load(inputs)}
        cli, py = [], []
        for _ in range(args.rounds):
            cli.append(cli_median_ms(model, inputs, args.threads, args.seconds))
            py.append(python_median_ms(sess, feeds, args.seconds))
        c, p = statistics.median(cli), statistics.median(py)
        print(f"| {name} | {c:.2f} | {p:.2f} | {p / c:.3f} |")


if __name__ == "__main__":
    main()
