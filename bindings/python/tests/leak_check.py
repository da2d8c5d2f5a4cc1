"""A short loop of the package's calls for valgrind (scripts/test-python.sh runs it
with PYTHONMALLOC=malloc): runs, errors, graph builds, DLPack capsules (consumed or
not) and an op defined in Python (registered, run, differentiated, unregistered), whose
memory must all be freed."""

import sys
from pathlib import Path

import numpy as np

import kiln

ROOT = Path(__file__).resolve().parents[3]
# Two f32[N] inputs and their sum: the smallest graph a run can take.
ADD = (Path(__file__).parent / "add.kir").read_text()

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
sess = kiln.InferenceSession(ROOT / "examples/data/digits_cnn.onnx", threads=2)
x = np.load(ROOT / "examples/data/digits_test16.npy")
exe = kiln.parse(ADD).compile()
a = np.ones(8, np.float32)
for _ in range(runs):
    assert sess.run(["label"], {"input": x})[0].shape == (16,)
    exe(a=a, b=a[::-1])
    for bad in ({"a": a}, {"a": np.ones(8), "b": a}):
        try:
            exe.run(bad)
        except kiln.RunBadInput:
            pass
    try:
        kiln.parse("graph {")
    except kiln.ParseError:
        pass
    double = kiln.custom_op("leak", "Double", gradient=lambda xs, ys, gys: [2 * gys[0]])(
        lambda x: 2 * x
    )
    g = kiln.Graph()
    p = g.parameter("p", "f32", [8])
    (grad,) = kiln.grad(kiln.ops.reduce_sum(double(p), keepdims=0), [p])
    g.output("grad", grad)
    assert g.compile(threads=1)(p=a)["grad"][0] == 2
    double.unregister()
    t = kiln.Tensor(a[::2])  # strided: a copy in Kiln's memory
    exe(a=t, b=t)
    assert np.from_dlpack(t)[0] == 1.0 and kiln.from_dlpack(a).shape == (8,)
    unconsumed = (t.__dlpack__(max_version=(1, 0)), t.__dlpack__())
    del t, unconsumed
    try:
        kiln.Tensor(np.ones(2, np.complex64))
    except kiln.Unsupported:
        pass
print("ok")
