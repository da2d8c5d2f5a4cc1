"""onnxruntime's time for single-Conv models, to set beside `cargo bench --bench conv`.

Each shape is one argument `name:x=1,256,512,1:w=512,256,5,1:s=1,1:p=0,0,0,0:d=1,1:g=1`
(x and w dims; strides, pads begin then end, dilations, group; an optional epilogue
`e=prelu|clip|hardsigmoid` after the conv). Prints, per shape and
thread count, onnxruntime's median milliseconds and GFLOP/s.

    target/py/bin/python bench/conv_ort.py --threads 1 2 SHAPE...
"""
import argparse
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper


def parse(spec):
    name, *fields = spec.split(":")
    pairs = [x.split("=") for x in fields]
    epilogue = next((v for k, v in pairs if k == "e"), None)
    f = {k: [int(v) for v in vals.split(",")] for k, vals in pairs if k != "e"}
    rank = len(f["x"]) - 2
    return name, f["x"], f["w"], f.get("s", [1] * rank), f.get("p", [0] * 2 * rank), \
        f.get("d", [1] * rank), f.get("g", [1])[0], epilogue


def epilogue_nodes(which, channels, rank, rng):
    """The nodes and initializers after the conv (as benches/conv.rs builds them)."""
    if which is None:
        return [], []
    if which == "prelu":
        slope = helper.make_tensor("slope", TensorProto.FLOAT, [channels] + [1] * (rank - 1),
                                   rng.standard_normal(channels).astype(np.float32))
        return [helper.make_node("PRelu", ["c", "slope"], ["y"])], [slope]
    if which == "clip":
        lo = helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0])
        hi = helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])
        return [helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], [lo, hi]
    if which == "hardsigmoid":
        return [helper.make_node("HardSigmoid", ["c"], ["y"])], []
    raise SystemExit(f"unknown epilogue {which}")


def model(x, w, strides, pads, dilations, group, epilogue):
    rng = np.random.default_rng(0)
    weight = helper.make_tensor("w", TensorProto.FLOAT, w,
                                rng.standard_normal(w).astype(np.float32).ravel())
    bias = helper.make_tensor("b", TensorProto.FLOAT, [w[0]],
                              rng.standard_normal(w[0]).astype(np.float32))
    after, extra = epilogue_nodes(epilogue, w[0], len(x) - 1, rng)
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c" if after else "y"], kernel_shape=w[2:],
                            strides=strides, pads=pads, dilations=dilations, group=group)
    graph = helper.make_graph([conv] + after, "conv", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, x)], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight, bias] + extra)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def flops(x, w, y_shape, group):
    return 2.0 * np.prod(y_shape) * (x[1] // group) * np.prod(w[2:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--seconds", type=float, default=0.5, help="timing budget per shape")
    ap.add_argument("shapes", nargs="+")
    a = ap.parse_args()
    for spec in a.shapes:
        name, x, w, s, p, d, g, e = parse(spec)
        m = model(x, w, s, p, d, g, e).SerializeToString()
        xv = np.random.default_rng(1).standard_normal(x).astype(np.float32)
        for threads in a.threads:
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            sess = ort.InferenceSession(m, opts, providers=["CPUExecutionProvider"])
            y = sess.run(None, {"x": xv})[0]
            times = []
            start = time.perf_counter()
            while len(times) < 5 or (time.perf_counter() - start < a.seconds and len(times) < 1000):
                t0 = time.perf_counter()
                sess.run(None, {"x": xv})
                times.append(time.perf_counter() - t0)
            ms = float(np.median(times)) * 1e3
            gflops = flops(x, w, y.shape, g) / ms / 1e6
            print(f"{name:32} t{threads}  onnxruntime {ms:9.3f} ms  {gflops:7.1f} GFLOP/s")


if __name__ == "__main__":
    main()
