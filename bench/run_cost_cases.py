"""Writes the cases `bench/run-cost` times: one-op graphs, and the small recurrent zoo
models with their own test inputs, each as OUT/<name>/model.onnx and OUT/<name>/<k>.npy.
Prints one NAME=MODEL:IN0.npy,… argument per line.

Usage: run_cost_cases.py ZOO_DIR OUT_DIR
"""
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Runs of 40–200 µs where the per-run and per-step cost decides (issue 42).
ZOO = ["silero_vad_16k_sequence", "silero_vad_op18_ifless", "silero_vad_openvino_16k",
       "faster_whisper_silero_v6", "onnxscript_vocoder"]


def one_op(op, shapes, out_shape):
    ins = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, s) for i, s in enumerate(shapes)]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)
    node = helper.make_node(op, [i.name for i in ins], ["y"])
    g = helper.make_graph([node], op.lower(), ins, [out])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), shapes


def write(out, name, model, arrays):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "model.onnx")
    if isinstance(model, str):
        shutil.copyfile(model, path)
    else:
        onnx.save(model, path)
    npys = []
    for k, a in enumerate(arrays):
        npys.append(os.path.join(d, f"{k}.npy"))
        np.save(npys[-1], a)
    print(f"{name}={path}:{','.join(npys)}")


def main():
    zoo, out = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    for name, op, shapes in [("add_1x16", "Add", [[1, 16], [1, 16]]),
                             ("relu_1x1024", "Relu", [[1, 1024]])]:
        model, shapes = one_op(op, shapes, shapes[0])
        write(out, name, model, [rng.standard_normal(s).astype(np.float32) for s in shapes])
    for m in ZOO:
        d = os.path.join(zoo, m)
        if not os.path.isfile(os.path.join(d, "model.onnx")):
            print(f"run_cost_cases: {m} is not in {zoo}", file=sys.stderr)
            continue
        n = len(onnx.load(os.path.join(d, "model.onnx"), load_external_data=False).graph.input)
        arrays = []
        for k in range(n):
            t = onnx.TensorProto()
            with open(os.path.join(d, "test_data_set_0", f"input_{k}.pb"), "rb") as f:
                t.ParseFromString(f.read())
            arrays.append(numpy_helper.to_array(t))
        write(out, m, os.path.join(d, "model.onnx"), arrays)


if __name__ == "__main__":
    main()
