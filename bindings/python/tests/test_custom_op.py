"""Ops defined in Python (`kiln.custom_op`): run by the interpreter and the CPU backend,
imported from ONNX, differentiated and trained through, run from several threads, and
failing with errors that say what went wrong."""

import threading

import numpy as np
import pytest

import kiln
from kiln import ops


def swish_grad(inputs, outputs, output_grads):
    (x,), (y,), (gy,) = inputs, outputs, output_grads
    s = 1 / (1 + np.exp(-x))
    return [gy * (s + y * (1 - s))]


@pytest.fixture(scope="module")
def swish():
    @kiln.custom_op("test.py", "Swish", gradient=swish_grad)
    def swish(x, beta=1.0):
        return x / (1 + np.exp(-beta * x))

    yield swish
    assert swish.unregister()


def reference_swish(x):
    return x / (1 + np.exp(-x))


@pytest.mark.parametrize("backend", ["cpu", "interp"])
def test_a_python_op_runs_between_kiln_kernels(swish, backend):
    g = kiln.Graph()
    x = g.parameter("x", "f32", ["N", 8])
    g.output("y", ops.relu(swish(x * 2.0)) + 1.0)
    x_value = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    (y,) = g.compile(backend=backend, threads=1).run_list(None, {"x": x_value})
    np.testing.assert_allclose(y, np.maximum(reference_swish(x_value * 2), 0) + 1, rtol=1e-6)
    assert y.dtype == np.float32


def test_attributes_reach_the_function_as_keywords(swish):
    g = kiln.Graph()
    x = g.parameter("x", "f64", [4])
    g.output("y", swish(x, beta=2.0))
    x_value = np.linspace(-2, 2, 4)
    (y,) = g.compile().run_list(None, {"x": x_value})
    np.testing.assert_allclose(y, x_value / (1 + np.exp(-2 * x_value)))


def test_called_on_arrays_it_is_the_plain_function(swish):
    x = np.array([0.5, -1.0])
    np.testing.assert_allclose(swish(x), reference_swish(x))


def test_its_gradient_matches_finite_differences(swish):
    g = kiln.Graph()
    x = g.parameter("x", "f64", [6])
    loss = ops.reduce_sum(swish(x) * swish(x), keepdims=0)
    (dx,) = kiln.grad(loss, [x])
    g.output("loss", loss)
    g.output("dx", dx)
    exe = g.compile(threads=1)
    x_value = np.random.default_rng(1).standard_normal(6)
    got = exe.run({"x": x_value})["dx"]
    eps = 1e-6
    numeric = np.array(
        [
            (exe.run({"x": x_value + eps * e})["loss"] - exe.run({"x": x_value - eps * e})["loss"])
            / (2 * eps)
            for e in np.eye(6)
        ]
    )
    np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-8)


def test_a_model_trains_through_it(swish):
    rng = np.random.default_rng(2)
    x_data = rng.standard_normal((64, 3)).astype(np.float32)
    target = reference_swish(x_data @ np.array([[1.0], [-2.0], [0.5]], np.float32))
    g = kiln.Graph()
    x = g.parameter("x", "f32", [64, 3])
    t = g.parameter("t", "f32", [64, 1])
    w = g.variable("w", np.zeros((3, 1), np.float32))
    diff = swish(x @ w) - t
    loss = ops.reduce_mean(diff * diff, keepdims=0)
    kiln.optim.SGD().minimize(loss, [w], lr=0.5)
    g.output("loss", loss)
    exe = g.compile(threads=1)
    losses = [float(exe.run({"x": x_data, "t": target})["loss"]) for _ in range(200)]
    assert losses[-1] < 1e-3 * losses[0]
    np.testing.assert_allclose(exe.read_variable("w").ravel(), [1.0, -2.0, 0.5], atol=0.02)


def test_onnx_nodes_of_its_domain_import_to_it(swish):
    onnx = pytest.importorskip("onnx", reason="the onnx package builds the model")
    from onnx import TensorProto, helper

    node = helper.make_node("Swish", ["x"], ["y"], domain="test.py")
    graph = helper.make_graph(
        [node],
        "swish",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.py", 1)]
    )
    session = kiln.InferenceSession(model.SerializeToString(), threads=1)
    x_value = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    (y,) = session.run(None, {"x": x_value})
    np.testing.assert_allclose(y, reference_swish(x_value), rtol=1e-6)


def test_infer_gives_new_shapes_and_several_outputs():
    def infer(x):
        (n, k), dtype = x
        return [((n,), dtype), ((n,), "int64")]

    @kiln.custom_op("test.py", "MaxAndArgmax", infer=infer, outputs=2)
    def max_and_argmax(x):
        return x.max(axis=1), x.argmax(axis=1)

    try:
        g = kiln.Graph()
        x = g.parameter("x", "f32", ["N", 4])
        m, i = max_and_argmax(x)
        assert m.type == "f32[N]" and i.type == "i64[N]"
        g.output("m", m)
        g.output("i", i)
        x_value = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)
        out = g.compile().run({"x": x_value})
        np.testing.assert_array_equal(out["m"], x_value.max(axis=1))
        np.testing.assert_array_equal(out["i"], x_value.argmax(axis=1))
    finally:
        max_and_argmax.unregister()


def test_threads_run_a_python_op_at_once(swish):
    g = kiln.Graph()
    x = g.parameter("x", "f32", [256])
    g.output("y", swish(x))
    exe = g.compile(threads=1)
    errors = []

    def work(seed):
        x_value = np.random.default_rng(seed).standard_normal(256).astype(np.float32)
        for _ in range(50):
            if not np.allclose(exe.run({"x": x_value})["y"], reference_swish(x_value), rtol=1e-6):
                errors.append(seed)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_errors_say_what_went_wrong(swish):
    @kiln.custom_op("test.py", "Broken")
    def broken(x):
        raise ValueError("the kernel is broken")

    @kiln.custom_op("test.py", "WrongShape")
    def wrong_shape(x):
        return x[:1]

    @kiln.custom_op("test.py", "BadInfer", infer=lambda x: "not a type")
    def bad_infer(x):
        return x

    try:
        g = kiln.Graph()
        x = g.parameter("x", "f32", [3])
        g.output("a", broken(x, name="broken_node"))
        with pytest.raises(kiln.RunFailed, match="broken_node.*ValueError: the kernel is broken"):
            g.compile().run({"x": np.zeros(3, np.float32)})

        g = kiln.Graph()
        x = g.parameter("x", "f32", [3])
        g.output("b", wrong_shape(x))
        with pytest.raises(kiln.RunFailed, match=r"output 0 has shape \[1\]"):
            g.compile().run({"x": np.zeros(3, np.float32)})

        with pytest.raises(kiln.KilnError, match="infer raised InvalidArgument: infer must give"):
            bad_infer(x)

        with pytest.raises(kiln.InvalidArgument, match="already registered|taken"):
            kiln.custom_op("test.py", "Swish")(lambda x: x)
        with pytest.raises(kiln.InvalidArgument):
            kiln.custom_op("bad domain!", "Op")(lambda x: x)
    finally:
        for op in (broken, wrong_shape, bad_infer):
            op.unregister()


def test_without_a_gradient_grad_says_so():
    @kiln.custom_op("test.py", "NoGrad")
    def no_grad(x):
        return x * 2

    try:
        g = kiln.Graph()
        x = g.parameter("x", "f32", [3])
        loss = ops.reduce_sum(no_grad(x), keepdims=0)
        with pytest.raises(kiln.KilnError, match="test.py::NoGrad"):
            kiln.grad(loss, [x])
    finally:
        no_grad.unregister()
