"""Writes tests/onnx/control_flow.onnx: If, Loop (nested in a branch) and Scan, whose
bodies read outer-scope values (captures), checked here against onnxruntime.

    target/py/bin/python tests/onnx/control_flow.py
"""
import os

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h


def vi(name, elem, shape):
    return h.make_tensor_value_info(name, elem, shape)


# Loop body: acc += x (x from two scopes up); the running sums are a scan output.
loop_body = h.make_graph(
    [
        h.make_node("Add", ["acc_in", "x"], ["acc_out"]),
        h.make_node("Identity", ["cond_in"], ["cond_out"]),
        h.make_node("Identity", ["acc_out"], ["seen"]),
    ],
    "loop_body",
    # The carried value has no shape, as exporters often write it.
    [vi("i", T.INT64, []), vi("cond_in", T.BOOL, []), vi("acc_in", T.FLOAT, None)],
    [vi("cond_out", T.BOOL, []), vi("acc_out", T.FLOAT, [3]), vi("seen", T.FLOAT, [3])],
)
then_branch = h.make_graph(
    [h.make_node("Mul", ["x", "two"], ["doubled"])],
    "then",
    [],
    [vi("doubled", T.FLOAT, [3])],
)
else_branch = h.make_graph(
    [h.make_node("Loop", ["n", "", "x"], ["summed", "sums"], body=loop_body)],
    "else",
    [],
    [vi("summed", T.FLOAT, [3])],
)
scan_body = h.make_graph(
    [h.make_node("Add", ["s_in", "row"], ["s_out"]), h.make_node("Mul", ["s_out", "two"], ["twice"])],
    "scan_body",
    [vi("s_in", T.FLOAT, [3]), vi("row", T.FLOAT, [3])],
    [vi("s_out", T.FLOAT, [3]), vi("twice", T.FLOAT, [3])],
)
graph = h.make_graph(
    [
        h.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch),
        h.make_node("Scan", ["x", "m"], ["s", "partial"], body=scan_body, num_scan_inputs=1),
    ],
    "control_flow",
    [vi("x", T.FLOAT, [3]), vi("n", T.INT64, []), vi("c", T.BOOL, []), vi("m", T.FLOAT, [2, 3])],
    [vi("y", T.FLOAT, [3]), vi("s", T.FLOAT, [3]), vi("partial", T.FLOAT, [2, 3])],
    [h.make_tensor("two", T.FLOAT, [], [2.0])],
)
model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], producer_name="kiln-tests")
onnx.checker.check_model(model)
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "control_flow.onnx")
onnx.save(model, path)

import onnxruntime as ort  # noqa: E402

s = ort.InferenceSession(path)
x = np.array([1, 2, 3], np.float32)
m = np.array([[1, 1, 1], [2, 2, 2]], np.float32)
for c, want in [(True, [2, 4, 6]), (False, [3, 6, 9])]:
    y, s_, p = s.run(None, {"x": x, "n": np.array(2, np.int64), "c": np.array(c), "m": m})
    assert (y == want).all(), y
    assert (s_ == [4, 5, 6]).all() and (p == [[4, 6, 8], [8, 10, 12]]).all(), (s_, p)
print("wrote", path)
