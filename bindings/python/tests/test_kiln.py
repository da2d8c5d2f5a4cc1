"""The Python package against NumPy and onnxruntime: sessions, the native API, errors,
threads. Run by `make test` (scripts/test-python.sh) in a fresh venv."""

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

ADD = """graph "add" {
  %0 "a" = Parameter : f32[n:N]
  %1 "b" = Parameter : f32[n:N]
  %2 "sum" = Add(%0, %1) : f32[n:N]
  return "sum" = %2
}
"""


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


def test_text_round_trip():
    g = kiln.parse(ADD)
    text = g.to_text()
    assert kiln.parse(text).to_text() == text
    out = g.compile()(a=np.arange(5, dtype=np.float32), b=np.ones(5, np.float32))
    np.testing.assert_array_equal(out["sum"], np.arange(1, 6, dtype=np.float32))


def test_outputs_are_handed_over_not_copied():
    exe = kiln.parse(ADD).compile()
    (y,) = exe.run_list(None, {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)})
    # The array does not own its data: its base is the Rust buffer's keeper.
    assert y.base is not None and not isinstance(y.base, np.ndarray)
    assert y.flags.writeable and y.flags.c_contiguous
    y[0] = 5.0
    assert y[0] == 5.0


def test_contiguous_inputs_are_read_in_place():
    # Peak memory of a run on two 128 MiB inputs: the output's 128 MiB, not two copies.
    exe = kiln.parse(ADD).compile(threads=1)
    n = 32 << 20
    a, b = np.ones(n, np.float32), np.full(n, 2.0, np.float32)
    exe.run_list(None, {"a": a, "b": b})  # the first run of a shape builds its program

    def status_kib(key):
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith(key + ":"))

    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak (VmHWM) to the current RSS
    before = status_kib("VmRSS")
    (y,) = exe.run_list(None, {"a": a, "b": b})
    grown = status_kib("VmHWM") - before
    assert y[0] == 3.0 and y[-1] == 3.0
    assert grown < 1.5 * a.nbytes / 1024, f"the run grew the peak RSS by {grown} KiB"


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
