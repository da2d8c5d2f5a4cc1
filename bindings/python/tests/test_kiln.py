"""The Python package against NumPy and onnxruntime: sessions, the native API, errors,
threads. Run by `make test` (scripts/test-python.sh) in a fresh venv."""

import ast
import os
import threading
from pathlib import Path

import numpy as np
import pytest

import kiln

ROOT = Path(__file__).resolve().parents[3]
DIGITS = ROOT / "examples/data/digits_cnn.onnx"
DIGITS_X = ROOT / "examples/data/digits_test16.npy"
MLP = ROOT / "examples/graphs/mlp.kir"
LABELS = [7, 9, 4, 7, 0, 2, 6, 1, 3, 1, 3, 7, 3, 6, 7, 1]

# Two f32[N] inputs and their sum: the smallest graph a run can take.
ADD = (Path(__file__).parent / "add.kir").read_text()


def ort_session(path):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the reference")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_session_matches_onnxruntime_on_the_digits_cnn():
    x = np.load(DIGITS_X)
    sess = kiln.InferenceSession(DIGITS, threads=1)
    logits, probs, label = sess.run(None, {"input": x})
    ref = ort_session(DIGITS).run(None, {"input": x})
    np.testing.assert_allclose(logits, ref[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(probs, ref[1], rtol=1e-4, atol=1e-5)
    assert label.dtype == np.int64
    assert label.tolist() == ref[2].tolist() == LABELS


def test_session_from_bytes_and_selected_outputs():
    x = np.load(DIGITS_X)
    sess = kiln.InferenceSession(DIGITS.read_bytes())
    (label, logits) = sess.run(["label", "logits"], {"input": x})
    assert label.tolist() == LABELS
    assert logits.shape == (16, 10)


def test_session_signature_reads_like_onnxruntime():
    sess = kiln.InferenceSession(DIGITS)
    (inp,) = sess.get_inputs()
    assert (inp.name, inp.type) == ("input", "tensor(float)")
    assert inp.shape == ["batch", 1, 8, 8]
    outs = sess.get_outputs()
    assert [o.name for o in outs] == ["logits", "probs", "label"]
    assert [o.type for o in outs] == ["tensor(float)", "tensor(float)", "tensor(int64)"]
    ref = ort_session(DIGITS)
    assert [o.name for o in ref.get_outputs()] == [o.name for o in outs]
    assert [o.type for o in ref.get_outputs()] == [o.type for o in outs]


def test_native_load_compile_run_and_call():
    g = kiln.load(MLP)
    assert g.name == "mlp"
    exe = g.compile(backend="cpu", threads=1)
    x = np.load(ROOT / "examples/graphs/mlp_input.npy")
    out = exe.run({"x": x})
    assert sorted(out) == ["logits", "probs"]
    ref = kiln.load(MLP).compile(backend="interp").run({"x": x})
    np.testing.assert_allclose(out["logits"], ref["logits"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["probs"].sum(axis=1), 1.0, rtol=1e-5)
    again = exe(x=x)
    np.testing.assert_array_equal(again["logits"], out["logits"])


def test_compile_options_are_the_same_keys_as_everywhere():
    x = np.load(ROOT / "examples/graphs/mlp_input.npy")
    want = kiln.load(MLP).compile(threads=1)(x=x)["logits"]
    # The C API's and the command line's keys and values; True is 1.
    exe = kiln.load(MLP).compile(options={"threads": 1, "verify": True, "passes": ""})
    np.testing.assert_allclose(exe(x=x)["logits"], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(kiln.InvalidArgument, match="unknown option 'colour'"):
        kiln.load(MLP).compile(options={"colour": 1})
    with pytest.raises(kiln.InvalidArgument, match="threads: expected a count"):
        kiln.load(MLP).compile(options={"threads": "many"})


def test_text_round_trip():
    g = kiln.parse(ADD)
    text = g.to_text()
    assert kiln.parse(text).to_text() == text
    out = g.compile()(a=np.arange(5, dtype=np.float32), b=np.ones(5, np.float32))
    np.testing.assert_array_equal(out["sum"], np.arange(1, 6, dtype=np.float32))


def test_to_dot():
    g = kiln.Graph("pic")
    x = g.parameter('x "q"\\', "f32", ["N", 4])
    y = g.op("Relu", [x], name="/enc/layer.0/Relu")
    g.output("y", y)
    dot = g.to_dot()
    assert dot.startswith('digraph "pic" {')
    assert 'x \\"q\\"\\\\' in dot  # the name's quote and backslash escaped
    assert "n0 [" in dot and "n1 [" in dot and "n0 -> n1" in dot
    assert dot == g.to_dot()


def test_outputs_are_handed_over_not_copied():
    exe = kiln.parse(ADD).compile()
    (y,) = exe.run_list(None, {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)})
    # The array does not own its data: its base is the Rust buffer's keeper.
    assert y.base is not None and not isinstance(y.base, np.ndarray)
    assert y.flags.writeable and y.flags.c_contiguous
    y[0] = 5.0
    assert y[0] == 5.0


def test_contiguous_inputs_are_read_in_place():
    # Peak memory of runs on two 128 MiB inputs: no copy of either.
    exe = kiln.parse(ADD).compile(threads=1)
    n = 32 << 20
    a, b = np.ones(n, np.float32), np.full(n, 2.0, np.float32)

    def status_kib(key):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(key + ":"))

    # The first run of a shape builds its program and touches its arena (the sum's
    # planned buffer, then copied out): two buffers, where copies of the inputs would
    # add two more. The next run only allocates the output.
    for run, buffers in (("first", 2.5), ("second", 1.5)):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak (VmHWM) to the current RSS
        before = status_kib("VmRSS")
        (y,) = exe.run_list(None, {"a": a, "b": b})
        grown = status_kib("VmHWM") - before
        assert y[0] == 3.0 and y[-1] == 3.0
        assert grown < buffers * a.nbytes / 1024, f"the {run} run grew the peak RSS by {grown} KiB"
        del y


class OnlyDLPack:
    """A foreign tensor: it offers nothing but the DLPack protocol."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_dlpack_both_ways():
    exe = kiln.parse(ADD).compile()
    a = np.arange(6, dtype=np.float32)
    (y,) = exe.run_list(None, {"a": OnlyDLPack(a), "b": OnlyDLPack(a)})
    np.testing.assert_array_equal(y, 2 * a)
    viewed = kiln.from_dlpack(OnlyDLPack(y))
    assert viewed.__array_interface__["data"][0] == y.__array_interface__["data"][0]
    # Outputs hand their buffer on: versioned capsules (DLPack 1.0) and legacy ones.
    assert np.from_dlpack(y).__array_interface__["data"][0] == y.__array_interface__["data"][0]
    assert "dltensor_versioned" in repr(y.__dlpack__(max_version=(1, 0)))  # NumPy >= 2.1
    assert "dltensor" in repr(y.__dlpack__())
    assert y.__dlpack_device__() == (1, 0)  # kDLCPU, device 0


def test_strided_and_list_inputs_are_read_correctly():
    exe = kiln.parse(ADD).compile()
    a = np.arange(10, dtype=np.float32)[::2]  # not contiguous: copied, not mis-read
    b = [1.0, 1.0, 1.0, 1.0, 1.0]
    (y,) = exe.run_list(None, {"a": a, "b": b})
    np.testing.assert_array_equal(y, a + 1)


def test_errors_are_kiln_errors_with_the_library_message(tmp_path):
    exe = kiln.parse(ADD).compile()
    ones = np.ones(3, np.float32)
    with pytest.raises(kiln.RunBadInput, match="input 'a' is tensor\\(float\\).*float64"):
        exe.run({"a": np.ones(3), "b": ones})
    with pytest.raises(kiln.RunBadInput, match="missing input 'b'"):
        exe.run({"a": ones})
    with pytest.raises(kiln.RunBadInput, match="'c' is not an input"):
        exe.run({"a": ones, "b": ones, "c": ones})
    with pytest.raises(kiln.RunBadInput):
        exe.run({"a": ones, "b": np.ones(4, np.float32)})
    with pytest.raises(kiln.InvalidArgument, match="'nope' is not an output"):
        exe.run_list(["nope"], {"a": ones, "b": ones})
    with pytest.raises(kiln.KilnError):
        kiln.InferenceSession(b"\x08\x07garbage that is not a model")
    with pytest.raises(kiln.IoError):
        kiln.load(tmp_path / "missing.onnx")
    with pytest.raises(kiln.ParseError, match="<string>:"):
        kiln.parse("graph {")
    with pytest.raises(kiln.DeviceUnavailable):
        kiln.parse(ADD).compile(backend="cuda:0")
    with pytest.raises(kiln.InvalidArgument, match="unknown device"):
        kiln.parse(ADD).compile(backend="tpu")
    with pytest.raises(kiln.InvalidArgument):
        kiln.InferenceSession(42)
    assert issubclass(kiln.RunBadInput, kiln.KilnError)
    assert issubclass(kiln.KilnError, Exception)


def test_threads_run_one_executable_at_once():
    x = np.load(DIGITS_X)
    sess = kiln.InferenceSession(DIGITS, threads=1)
    want = sess.run(["logits"], {"input": x})[0]
    errors = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            rows = rng.permutation(16)
            (got,) = sess.run(["logits"], {"input": x[rows]})
            if not np.allclose(got, want[rows], rtol=1e-5, atol=1e-5):
                errors.append(seed)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_the_gil_is_released_while_running():
    # While one thread runs a long graph, another thread's Python code makes progress.
    x = np.load(DIGITS_X).repeat(64, axis=0)
    sess = kiln.InferenceSession(DIGITS, threads=1)
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(1)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        for _ in range(5):
            sess.run(["label"], {"input": x})
    finally:
        done.set()
        t.join()
    assert len(ticks) > 100


def test_rss_stays_flat_over_many_runs():
    exe = kiln.parse(ADD).compile(threads=1)
    a = np.ones(16, np.float32)

    def rss_kib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024

    for _ in range(10_000):
        exe.run_list(None, {"a": a, "b": a})
    before = rss_kib()
    for _ in range(100_000):
        exe.run_list(None, {"a": a, "b": a})
    assert rss_kib() - before < 1024


def test_graphs_built_in_python_run_like_numpy():
    g = kiln.Graph("mlp")
    x = g.parameter("x", "f32", [kiln.Axis("batch", "N"), kiln.Axis("C", 4)])
    assert x.type == "f32[batch:N, C:4]" and x.shape == ["N", 4]
    rng = np.random.default_rng(0)
    w_np = rng.standard_normal((4, 3)).astype(np.float32)
    w = g.constant(w_np, name="w")
    h = kiln.ops.relu(x @ w + 0.5)
    y = kiln.ops.Softmax(-h * 2.0, axis=-1)
    g.output("y", y)
    g.output("big", h > 1.0)
    exe = g.compile(threads=1)
    xv = rng.standard_normal((5, 4)).astype(np.float32)
    out = exe(x=xv)
    hv = np.maximum(xv @ w_np + 0.5, 0)
    e = np.exp(-2 * hv - (-2 * hv).max(axis=1, keepdims=True))
    np.testing.assert_allclose(out["y"], e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["big"], hv > 1.0)
    # The built graph prints and parses back to the same text.
    assert kiln.parse(g.to_text()).to_text() == g.to_text()


def test_grad_matches_the_analytic_gradient():
    g = kiln.Graph()
    x = g.parameter("x", "f32", [3, 4])
    w = g.parameter("w", "f32", [4, 2])
    y = x @ w
    loss = kiln.ops.ReduceSum(y * y, keepdims=0)
    (dw,) = kiln.grad(loss, [w])
    g.output("loss", loss)
    g.output("dw", dw)
    rng = np.random.default_rng(1)
    xv = rng.standard_normal((3, 4)).astype(np.float32)
    wv = rng.standard_normal((4, 2)).astype(np.float32)
    out = g.compile()(x=xv, w=wv)
    np.testing.assert_allclose(out["dw"], 2 * xv.T @ (xv @ wv), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["loss"], ((xv @ wv) ** 2).sum(), rtol=1e-5)


def test_variables_are_read_and_written_from_numpy():
    g = kiln.Graph()
    x = g.parameter("x", "f32", [2])
    v = g.variable("v", np.array([1.0, 2.0], np.float32))
    g.output("y", x + v)
    exe = g.compile()
    assert [a.name for a in exe.variables] == ["v"]
    np.testing.assert_array_equal(exe.read_variable("v"), [1.0, 2.0])
    exe.write_variables({"v": [10.0, 20.0]})
    np.testing.assert_array_equal(exe(x=np.ones(2, np.float32))["y"], [11.0, 21.0])
    with pytest.raises(kiln.InvalidArgument):
        exe.write_variables({"v": np.zeros(3, np.float32)})
    with pytest.raises(kiln.InvalidArgument, match="no variable 'w'"):
        exe.read_variable("w")


def test_ops_come_from_the_catalogue():
    names = [entry[0] for entry in kiln.catalogue()]
    assert len(names) > 150 and "Conv" in names
    assert kiln.ops.conv is kiln.ops.Conv and kiln.ops.mat_mul is kiln.ops.MatMul
    assert kiln.ops.Conv.__doc__.startswith("Conv(X, W, B?) -> (Y)")
    assert all(callable(getattr(kiln.ops, n)) for n in names)


def test_the_op_stubs_are_the_catalogues():
    # Regenerate with: python -c "import kiln.ops as o; print(o._stub_text(), end='')"
    # > bindings/python/python/kiln/ops.pyi
    stub = ROOT / "bindings/python/python/kiln/ops.pyi"
    assert stub.read_text() == kiln.ops._stub_text()
    ast.parse(stub.read_text())


def test_building_errors_name_the_node():
    g = kiln.Graph()
    x = g.parameter("x", "f32", [2, 3])
    with pytest.raises(kiln.InvalidGraph, match="MatMul"):
        x @ x
    with pytest.raises(kiln.UnknownOp):
        g.op("NoSuchOp", [x])
    with pytest.raises(kiln.KilnError, match="axis"):
        kiln.ops.Softmax(x, axis="last")
    other = kiln.Graph().parameter("z", "f32", [2, 3])
    with pytest.raises(kiln.InvalidArgument, match="another graph"):
        g.op("Add", [x, other])
    with pytest.raises(kiln.InvalidArgument):
        g.parameter("y", "f33", [1])
    with pytest.raises(kiln.InvalidArgument, match="dim"):
        g.parameter("y", "f32", [-1])
    with pytest.raises(kiln.InvalidGraph):
        g.parameter("x", "f32", [1])  # the name is taken


def test_the_digits_mlp_example_trains_to_its_accuracy():
    import importlib.util

    spec = importlib.util.spec_from_file_location("digits_mlp", ROOT / "examples/python/digits_mlp.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    accuracy, _ = example.train(ROOT / "examples/data/digits.bin", verbose=False)
    assert accuracy >= 0.983


def test_optimizers_step_variables():
    g = kiln.Graph()
    w = g.variable("w", np.array([1.0, -2.0], np.float32))
    lr = g.parameter("lr", "f32", [])
    loss = kiln.ops.ReduceSum(w * w, keepdims=0)
    (dw,) = kiln.optim.SGD().minimize(loss, [w], lr)
    g.output("loss", loss)
    exe = g.compile()
    exe(lr=np.float32(0.25))
    np.testing.assert_allclose(exe.read_variable("w"), [0.5, -1.0])  # w - 0.25 * 2w
    with pytest.raises(kiln.InvalidArgument, match="unknown optimizer"):
        kiln._kiln.add_optimizer("lion", [w], [dw], lr)
    with pytest.raises(kiln.InvalidArgument, match="variables"):
        kiln.optim.Adam().minimize(loss, [lr], lr)


def test_the_digits_cnn_example_trains_with_kiln_nn(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("digits_cnn", ROOT / "examples/python/digits_cnn.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model, accuracy, _ = example.train(ROOT / "examples/data/digits.bin", verbose=False)
    assert accuracy >= 0.985
    # save / load: a fresh model of the same layers predicts the same logits.
    x = np.load(DIGITS_X)
    model.save(tmp_path / "cnn.npz")
    from kiln import nn

    again = nn.Sequential(
        [nn.Conv(16), nn.ReLU(), nn.Pool(2), nn.Conv(32), nn.ReLU(), nn.Flatten(), nn.Linear(10)],
        seed=7,
    ).load(tmp_path / "cnn.npz")
    np.testing.assert_allclose(again.predict(x), model.predict(x), rtol=1e-5, atol=1e-5)
    assert again.predict(x).argmax(axis=1).tolist() == LABELS
    with pytest.raises(kiln.InvalidArgument, match="not been fitted"):
        nn.Sequential([nn.Linear(10)]).predict(x)


def test_checkpoints_save_and_restore_variables(tmp_path):
    g = kiln.Graph()
    w = g.variable("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    g.output("y", w * 2.0)
    exe = g.compile(threads=1)
    exe.save_checkpoint(tmp_path / "w.ckpt")
    exe.write_variables({"w": np.zeros((2, 3), np.float32)})
    exe.load_checkpoint(tmp_path / "w.ckpt")
    np.testing.assert_array_equal(exe.read_variable("w"), np.arange(6).reshape(2, 3))

    other = kiln.Graph()
    other.output("v", other.variable("v", np.zeros(2, np.float32)) + 1.0)
    with pytest.raises(kiln.InvalidArgument, match="'w'"):
        other.compile(threads=1).load_checkpoint(tmp_path / "w.ckpt")
    (tmp_path / "bad.ckpt").write_bytes(b"KILNCKPT garbage")
    with pytest.raises(kiln.IoError):
        exe.load_checkpoint(tmp_path / "bad.ckpt")
    np.testing.assert_array_equal(exe.read_variable("w"), np.arange(6).reshape(2, 3))
