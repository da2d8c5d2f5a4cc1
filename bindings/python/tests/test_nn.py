"""kiln.nn against NumPy: each layer's forward (inference and training form), gradients
against finite differences, the losses, fit's history and progress, save/load, and
the examples that use it."""

import io
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln import nn

ROOT = Path(__file__).resolve().parents[3]


def build(layers, sample_shape, training=False, dtype="f32", seed=0):
    """The compiled graph of ``layers`` (output "y"), the model that named them."""
    model = nn.Sequential(layers, seed=seed, dtype=dtype)
    g, y, trainable, state = model.build_graph(sample_shape, training=training)
    g.output("y", y)
    return g.compile(threads=1), trainable, state


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def lstm_numpy(x, w, r, b, return_sequences):
    """The reference LSTM, gates in the order i, f, g, o, from zero state."""
    n, steps, _ = x.shape
    u = r.shape[0]
    h, c, hs = np.zeros((n, u)), np.zeros((n, u)), []
    for t in range(steps):
        z = x[:, t] @ w + h @ r + b
        i, f, g, o = (z[:, k * u : (k + 1) * u] for k in range(4))
        c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        hs.append(h)
    return np.stack(hs, axis=1) if return_sequences else h


def test_linear_forward_on_matrices_and_sequences():
    rng = np.random.default_rng(0)
    for shape in [(5, 4), (3, 6, 4)]:
        x = rng.standard_normal(shape).astype(np.float32)
        exe, _, _ = build([nn.Linear(3)], shape[1:])
        w, b = exe.read_variable("linear0.w"), exe.read_variable("linear0.b")
        exe.write_variables({"linear0.b": rng.standard_normal(3).astype(np.float32)})
        b = exe.read_variable("linear0.b")
        np.testing.assert_allclose(exe(x=x)["y"], x @ w + b, rtol=1e-5, atol=1e-5)


def test_batchnorm_inference_uses_the_running_statistics():
    rng = np.random.default_rng(1)
    for shape in [(6, 3), (4, 3, 5, 5)]:
        x = rng.standard_normal(shape).astype(np.float32) * 2 + 1
        exe, trainable, state = build([nn.BatchNorm(epsilon=1e-3)], shape[1:])
        assert [v.name for v in trainable] == ["batchnorm0.scale", "batchnorm0.bias"]
        assert [v.name for v in state] == ["batchnorm0.mean", "batchnorm0.var"]
        values = {
            "batchnorm0.scale": rng.uniform(0.5, 2, 3),
            "batchnorm0.bias": rng.standard_normal(3),
            "batchnorm0.mean": rng.standard_normal(3),
            "batchnorm0.var": rng.uniform(0.5, 2, 3),
        }
        exe.write_variables({k: v.astype(np.float32) for k, v in values.items()})
        per = (1, 3) + (1,) * (len(shape) - 2)
        s, b, m, v = (values[f"batchnorm0.{k}"].reshape(per) for k in ("scale", "bias", "mean", "var"))
        want = (x - m) / np.sqrt(v + 1e-3) * s + b
        np.testing.assert_allclose(exe(x=x)["y"], want, rtol=1e-4, atol=1e-4)


def test_batchnorm_training_normalizes_the_batch_and_updates_running_statistics():
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((8, 3, 4, 4)) * [[[[1.0]], [[2.0]], [[3.0]]]] + 5).astype(np.float32)
    exe, _, _ = build([nn.BatchNorm(momentum=0.8)], (3, 4, 4), training=True)
    y = exe(x=x)["y"]
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    var = x.var(axis=(0, 2, 3), keepdims=True)  # biased, as it normalizes with
    np.testing.assert_allclose(y, (x - mean) / np.sqrt(var + 1e-5), rtol=1e-4, atol=1e-4)
    # running = 0.8·running + 0.2·batch, from mean 0 and var 1.
    np.testing.assert_allclose(exe.read_variable("batchnorm0.mean"), 0.2 * mean.ravel(), rtol=1e-5)
    np.testing.assert_allclose(exe.read_variable("batchnorm0.var"), 0.8 + 0.2 * var.ravel(), rtol=1e-5)
    exe(x=x)
    np.testing.assert_allclose(exe.read_variable("batchnorm0.mean"), 0.36 * mean.ravel(), rtol=1e-5)


def test_dropout_is_the_identity_in_inference_and_drops_rate_in_training():
    x = np.ones((200, 500), np.float32)
    exe, _, _ = build([nn.Dropout(0.3)], (500,))
    np.testing.assert_array_equal(exe(x=x)["y"], x)
    exe, trainable, state = build([nn.Dropout(0.3)], (500,), training=True)
    assert trainable == [] and state == []  # the mask counter is neither trained nor saved
    first, second = exe(x=x)["y"], exe(x=x)["y"]
    for y in (first, second):
        assert abs((y == 0).mean() - 0.3) < 0.01
        np.testing.assert_allclose(y[y != 0], 1 / 0.7, rtol=1e-6)
    assert (first != second).mean() > 0.3  # a fresh mask every step
    again, _, _ = build([nn.Dropout(0.3)], (500,), training=True)
    np.testing.assert_array_equal(again(x=x)["y"], first)  # reproducible from the seed
    with pytest.raises(kiln.InvalidArgument, match="rate"):
        nn.Dropout(1.0)


@pytest.mark.parametrize("return_sequences", [False, True])
def test_lstm_forward_matches_a_numpy_lstm(return_sequences):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6, 3)).astype(np.float32)
    exe, trainable, _ = build([nn.LSTM(5, return_sequences=return_sequences)], (6, 3))
    assert [v.name for v in trainable] == ["lstm0.w", "lstm0.r", "lstm0.b"]
    exe.write_variables({"lstm0.b": rng.standard_normal(20).astype(np.float32)})
    w, r, b = (exe.read_variable(f"lstm0.{k}").astype(np.float64) for k in "wrb")
    y = exe(x=x)["y"]
    assert y.shape == ((4, 6, 5) if return_sequences else (4, 5))
    np.testing.assert_allclose(y, lstm_numpy(x, w, r, b, return_sequences), rtol=1e-4, atol=1e-5)


def test_layers_say_when_the_input_has_the_wrong_rank():
    with pytest.raises(kiln.InvalidArgument, match=r"conv0 \(Conv\): expects an input \[N, C, H, W\], got rank 2"):
        build([nn.Conv(4)], (8,))
    with pytest.raises(kiln.InvalidArgument, match=r"LSTM.*\[N, time, features\], got rank 2"):
        build([nn.LSTM(4)], (8,))
    with pytest.raises(kiln.InvalidArgument, match=r"linear0 \(Linear\): expects an input \[N, ..., features\], got rank 1"):
        nn.Sequential([nn.Linear(3)]).build_graph(())
    with pytest.raises(kiln.InvalidArgument, match=r"batchnorm0 \(BatchNorm\): expects an input \[N, C\].*got rank 1"):
        build([nn.BatchNorm()], ())


def finite_difference_check(layers, x, seed=0, per_variable=8):
    """kiln.grad of sum(output · k) against central differences in float64, on up to
    ``per_variable`` elements of each trainable variable."""
    model = nn.Sequential(layers, seed=seed, dtype="f64")
    g, y, trainable, _ = model.build_graph(x.shape[1:], training=True)
    rng = np.random.default_rng(seed)
    k = g.constant(rng.standard_normal([x.shape[0]] + list(y.shape[1:])))
    loss = kiln.ops.reduce_sum(y * k, keepdims=0)
    grads = kiln.grad(loss, trainable)
    g.output("loss", loss)
    for v, d in zip(trainable, grads):
        g.output("d." + v.name, d)
    exe = g.compile(threads=1)
    analytic = exe(x=x)
    eps = 1e-6
    for v in trainable:
        base = exe.read_variable(v.name).copy()
        flat_idx = rng.choice(base.size, min(per_variable, base.size), replace=False)
        for i in flat_idx:
            losses = []
            for sign in (1, -1):
                w = base.copy()
                w.flat[i] += sign * eps
                exe.write_variables({v.name: w})
                losses.append(float(exe(x=x)["loss"]))
            exe.write_variables({v.name: base})
            numeric = (losses[0] - losses[1]) / (2 * eps)
            got = analytic["d." + v.name].flat[i]
            assert abs(got - numeric) <= 1e-6 + 1e-5 * abs(numeric), (v.name, i, got, numeric)


def test_gradients_through_lstm_and_batchnorm_match_finite_differences():
    x = np.random.default_rng(4).standard_normal((5, 4, 3))
    finite_difference_check([nn.LSTM(4), nn.BatchNorm(), nn.Tanh(), nn.Linear(2)], x)


def test_gradients_through_conv_batchnorm_match_finite_differences():
    x = np.random.default_rng(5).standard_normal((3, 2, 5, 5))
    finite_difference_check([nn.Conv(3), nn.BatchNorm(), nn.Tanh(), nn.Flatten(), nn.Linear(2)], x)


def sequence_task(n, steps=8, seed=0):
    """Is the sequence's first value positive? The LSTM must remember it to the end."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, steps, 1)).astype(np.float32)
    return x, (x[:, 0, 0] > 0).astype(np.int64)


def test_an_lstm_learns_a_sequence_task():
    x, y = sequence_task(512)
    x_val, y_val = sequence_task(256, seed=1)
    model = nn.Sequential([nn.LSTM(12), nn.Linear(2)], seed=0)
    history = model.fit(x, y, epochs=8, batch_size=32, lr=0.01, validation_data=(x_val, y_val),
                        verbose=False, threads=1)
    assert history["loss"][-1] < 0.5 * history["loss"][0], history["loss"]
    assert history["val_accuracy"][-1] >= 0.9, history["val_accuracy"]


def test_losses_in_the_graph_agree_with_numpy():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((16, 5)).astype(np.float32)
    cases = [
        ("cross_entropy", rng.integers(0, 3, 16), 3),
        (nn.MSE(), rng.standard_normal((16, 3)).astype(np.float32), 3),
        ("bce", (rng.random((16, 1)) > 0.5).astype(np.float32), 1),
    ]
    for loss, y, units in cases:
        model = nn.Sequential([nn.Linear(units)])
        model.fit(x, y, epochs=1, batch_size=16, lr=0.0, loss=loss, verbose=False, threads=1)
        # lr 0: the one step changed nothing, so the graph's loss is evaluate's.
        out = model._train.run({"x": x, "targets": model.loss.targets(y, "f32"), "lr": np.float32(0)})
        value, score = model.evaluate(x, y)
        np.testing.assert_allclose(float(out["loss"]), value, rtol=1e-5)
        logits = model.predict(x).astype(np.float64)
        if units == 1:  # BCE: -y log σ(z) - (1 - y) log(1 - σ(z))
            p = sigmoid(logits)
            np.testing.assert_allclose(value, -(y * np.log(p) + (1 - y) * np.log(1 - p)).mean(), rtol=1e-6)
            assert score == ((logits > 0) == (y > 0.5)).mean()
        elif isinstance(loss, nn.MSE):
            assert score == pytest.approx(np.abs(logits - y).mean())
    with pytest.raises(kiln.InvalidArgument, match="loss"):
        nn.Sequential([nn.Linear(1)]).fit(x, y, loss="hinge", verbose=False)


def test_fit_with_mse_and_bce_learns():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((256, 4)).astype(np.float32)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    model = nn.Sequential([nn.Linear(2)])
    history = model.fit(x, x @ w, epochs=20, batch_size=32, lr=0.05, loss="mse", verbose=False, threads=1)
    assert sorted(history) == ["loss", "mae"]
    assert history["loss"][-1] < 0.01 * history["loss"][0]
    labels = (x @ w[:, :1] > 0).astype(np.float32)
    model = nn.Sequential([nn.Linear(1)])
    history = model.fit(x, labels, epochs=10, batch_size=32, lr=0.05, loss=nn.BinaryCrossEntropy(),
                        validation_data=(x, labels), verbose=False, threads=1)
    assert history["val_accuracy"][-1] >= 0.95


def test_fit_reports_history_and_progress(monkeypatch, capsys):
    x, y = sequence_task(64, steps=3)
    model = nn.Sequential([nn.Flatten(), nn.Linear(8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(2)])
    history = model.fit(x, y, epochs=3, batch_size=16, validation_data=(x[:32], y[:32]), threads=1)
    assert sorted(history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert all(len(v) == 3 for v in history.values())
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and lines[-1].startswith("epoch 3/3: loss ")
    assert f"val_accuracy {history['val_accuracy'][-1]:.4f}" in lines[-1]

    # On a terminal without tqdm: a plain counter of the batches.
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm fails
    assert list(nn._progress(range(3), True, "epoch 1/1")) == [0, 1, 2]
    assert "\repoch 1/1 3/3" in term.getvalue()
    assert nn._progress(range(3), False, "quiet") == range(3)
    # With tqdm installed: tqdm's bar, labelled with the epoch.
    calls = []
    fake = type(sys)("tqdm")
    fake.tqdm = lambda items, desc, leave: calls.append(desc) or items
    monkeypatch.setitem(sys.modules, "tqdm", fake)
    assert list(nn._progress(range(2), True, "epoch 2/5")) == [0, 1] and calls == ["epoch 2/5"]


def test_fit_updates_the_running_statistics_and_a_refit_keeps_the_weights():
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((512, 3)) * [1.0, 2.0, 0.5] + [3.0, -1.0, 0.0]).astype(np.float32)
    y = (x[:, 0] > 3).astype(np.int64)
    model = nn.Sequential([nn.BatchNorm(momentum=0.5), nn.Linear(2)])
    model.fit(x, y, epochs=2, batch_size=64, verbose=False, threads=1)
    values = model._values()
    np.testing.assert_allclose(values["batchnorm0.mean"], [3.0, -1.0, 0.0], atol=0.3)
    np.testing.assert_allclose(values["batchnorm0.var"], [1.0, 4.0, 0.25], rtol=0.3)
    # Another optimizer builds a new training graph that starts from the trained weights.
    model.fit(x, y, epochs=1, optimizer=kiln.optim.SGD(), lr=0.0, verbose=False, threads=1)
    np.testing.assert_array_equal(model._values()["linear1.w"], values["linear1.w"])


def test_save_and_load_keep_predictions_and_running_statistics(tmp_path):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((64, 2, 6, 6)).astype(np.float32)
    y = (x.mean(axis=(1, 2, 3)) > 0).astype(np.int64)

    def layers():
        return [nn.Conv(4), nn.BatchNorm(), nn.ReLU(), nn.Flatten(), nn.Dropout(0.2), nn.Linear(2)]

    model = nn.Sequential(layers(), seed=3)
    model.fit(x, y, epochs=2, batch_size=16, verbose=False, threads=1)
    model.save(tmp_path / "model.npz")
    saved = np.load(tmp_path / "model.npz")
    assert {"batchnorm1.mean", "batchnorm1.var", "conv0.w", "linear5.b"} <= set(saved.files)
    assert "dropout4.counter" not in saved.files
    assert np.abs(saved["batchnorm1.mean"]).max() > 0.01  # training moved them
    again = nn.Sequential(layers(), seed=99).load(tmp_path / "model.npz")
    np.testing.assert_array_equal(again.predict(x), model.predict(x))
    assert again.evaluate(x, y) == model.evaluate(x, y)
    # Training goes on from the loaded values, not from seed 99's.
    again.fit(x, y, epochs=1, batch_size=64, lr=0.0, verbose=False, threads=1)
    again.predict(x)  # brings the trained values over to inference
    np.testing.assert_array_equal(again._values()["conv0.w"], saved["conv0.w"])
    with pytest.raises(kiln.InvalidArgument, match="has no"):
        nn.Sequential([nn.Flatten(), nn.Linear(2)]).load(tmp_path / "model.npz")


def run_example(name, *args):
    out = subprocess.run([sys.executable, str(ROOT / "examples/python" / name), *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_the_onnx_session_example_agrees_with_onnxruntime():
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    out = run_example("onnx_session.py", "--runs", "20")
    diff = float(re.search(r"max \|kiln - onnxruntime\| = (\S+)", out).group(1))
    assert diff < 1e-4, out
    assert re.search(r"kiln +[\d.]+ ms/run", out) and re.search(r"onnxruntime +[\d.]+ ms/run", out), out


def test_the_custom_layer_example_trains_on_the_digits():
    out = run_example("custom_layer.py")
    accuracy = float(re.search(r"test accuracy ([\d.]+) %", out).group(1))
    assert accuracy >= 98.0, out
