"""Per-call overhead of `run` from Python: Kiln's `InferenceSession` against
onnxruntime's on the same one-op model (Add of two float32[4]), and on a real model
(the digits CNN, batch 16), alternating rounds; medians.

    python bench/python_overhead.py [--rounds 7] [--calls 20000]

Needs the locked benchmark environment with the `kiln` wheel added to it, nothing unpinned:
`scripts/test-python.sh` (builds the wheel with the locked maturin and writes its hash
line), `python=$(scripts/py-env.sh bench)` (onnxruntime, onnx, jax, ... from
scripts/requirements/bench.txt), then
`target/py-bench/bin/pip install --require-hashes --no-deps -r target/py-kiln/kiln-wheel.txt`;
run it with `target/py-bench/bin/python`.
"""

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import kiln

ROOT = Path(__file__).resolve().parents[1]


def add_model():
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "add", [a, b], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    return m.SerializeToString()


def per_call_us(sess, feeds, calls):
    sess.run(None, feeds)
    t = time.perf_counter()
    for _ in range(calls):
        sess.run(None, feeds)
    return (time.perf_counter() - t) / calls * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    cases = []
    model = add_model()
    x = np.ones(4, np.float32)
    cases.append(("Add f32[4]", model, {"a": x, "b": x}, args.calls))
    digits = (ROOT / "examples/data/digits_cnn.onnx").read_bytes()
    cases.append(("digits CNN, batch 16", digits, {"input": np.load(ROOT / "examples/data/digits_test16.npy")}, args.calls // 10))
    print(f"onnxruntime {ort.__version__}, 1 thread, {args.rounds} alternating rounds, medians")
    print("| model | Kiln µs/call | onnxruntime µs/call | Kiln / onnxruntime |")
    print("|---|---|---|---|")
    for name, data, feeds, calls in cases:
        k = kiln.InferenceSession(data, threads=1)
        o = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        ks, os_ = [], []
        for _ in range(args.rounds):
            ks.append(per_call_us(k, feeds, calls))
            os_.append(per_call_us(o, feeds, calls))
        km, om = statistics.median(ks), statistics.median(os_)
        print(f"| {name} | {km:.2f} | {om:.2f} | {km / om:.2f} |")


if __name__ == "__main__":
    main()
