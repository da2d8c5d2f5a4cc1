"""Builds a small ONNX model with the onnx package's helper API (a conv net over
[batch, 3, 16, 16] images: Conv → Relu → MaxPool → Conv → Relu → GlobalAveragePool →
Flatten → Gemm → Softmax, random weights), runs it with kiln.InferenceSession and
with onnxruntime on the same batch, and prints the largest difference and the time of
one run of each.

    python examples/python/onnx_session.py [--batch 32] [--runs 50]
"""

import argparse
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import kiln


def build_model(seed=0):
    rng = np.random.default_rng(seed)

    def init(name, *shape):
        scale = 1.0 / np.sqrt(np.prod(shape[1:]) or 1)
        return numpy_helper.from_array(rng.normal(0, scale, shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "w3", "b3"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10])],
        initializer=[
            init("w1", 16, 3, 3, 3), init("b1", 16),
            init("w2", 32, 16, 3, 3), init("b2", 32),
            init("w3", 10, 32), init("b3", 10),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def ms_per_run(run, runs):
    run()  # the first run of a shape builds Kiln's program
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    model = build_model()
    x = np.random.default_rng(1).standard_normal((args.batch, 3, 16, 16)).astype(np.float32)

    sess = kiln.InferenceSession(model, threads=args.threads)  # the model's bytes or a path
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    ref = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

    (ours,) = sess.run(None, {"x": x})
    (theirs,) = ref.run(None, {"x": x})
    kiln_ms = ms_per_run(lambda: sess.run(None, {"x": x}), args.runs)
    ort_ms = ms_per_run(lambda: ref.run(None, {"x": x}), args.runs)
    print(f"inputs {[(i.name, i.shape) for i in sess.get_inputs()]}, batch {args.batch}")
    print(f"kiln        {kiln_ms:8.3f} ms/run")
    print(f"onnxruntime {ort_ms:8.3f} ms/run")
    print(f"max |kiln - onnxruntime| = {np.abs(ours - theirs).max():.3g}")


if __name__ == "__main__":
    main()
