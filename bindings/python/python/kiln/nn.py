"""Layers and models in the style of neon and Keras, built on Kiln graphs:
``Sequential([Conv(16), ReLU(), Pool(2), Flatten(), Linear(10)])`` with ``fit``,
``evaluate``, ``predict``, ``save`` and ``load``. ``fit`` builds one training graph (the
layers, the loss, ``kiln.grad`` and an optimizer from :mod:`kiln.optim`, the learning
rate an input) and an inference graph over the same variables, each compiled once.
"""

import sys
import time

import numpy as _np

from . import _kiln, ops, optim


class Layer:
    """A layer adds its nodes to a graph: ``__call__(graph, x, rng) -> y``. Layers with
    weights create them as graph variables named ``<layer name>.<weight>``."""

    def __init__(self, name=None):
        self.name = name
        self.created = []  # the variables of the graph being built

    def _variable(self, g, rng, weight, value):
        v = g.variable(f"{self.name}.{weight}", value.astype(_np.float32))
        self.created.append(v)
        return v


def _he_uniform(rng, shape, fan_in):
    bound = _np.sqrt(6.0 / fan_in)
    return rng.uniform(-bound, bound, shape)


class Linear(Layer):
    """``y = x @ w + b`` over the last axis of a 2-D input (``Affine`` in neon)."""

    def __init__(self, units, name=None):
        super().__init__(name)
        self.units = units

    def __call__(self, g, x, rng):
        fan_in = x.shape[-1]
        w = self._variable(g, rng, "w", _he_uniform(rng, (fan_in, self.units), fan_in))
        b = self._variable(g, rng, "b", _np.zeros(self.units))
        return ops.gemm(x, w, b)


Affine = Linear


class Conv(Layer):
    """A 2-D convolution of NCHW input: ``filters`` outputs, a square ``kernel``,
    ``stride``, zero padding that keeps the size at stride 1 (``padding="same"``) or
    none (``"valid"``)."""

    def __init__(self, filters, kernel=3, stride=1, padding="same", name=None):
        super().__init__(name)
        self.filters, self.kernel, self.stride, self.padding = filters, kernel, stride, padding

    def __call__(self, g, x, rng):
        channels, k = x.shape[1], self.kernel
        fan_in = channels * k * k
        w = self._variable(g, rng, "w", _he_uniform(rng, (self.filters, channels, k, k), fan_in))
        b = self._variable(g, rng, "b", _np.zeros(self.filters))
        pad = k // 2 if self.padding == "same" else 0
        return ops.conv(x, w, b, strides=[self.stride] * 2, pads=[pad] * 4, kernel_shape=[k, k])


class Pool(Layer):
    """Max (``kind="max"``) or average pooling over ``size`` × ``size`` windows."""

    def __init__(self, size=2, kind="max", name=None):
        super().__init__(name)
        self.size, self.kind = size, kind

    def __call__(self, g, x, rng):
        op = {"max": ops.max_pool, "avg": ops.average_pool}[self.kind]
        y = op(x, kernel_shape=[self.size] * 2, strides=[self.size] * 2)
        return y[0] if isinstance(y, tuple) else y  # MaxPool's second output: indices


class Flatten(Layer):
    """``[N, ...] -> [N, prod(...)]``."""

    def __call__(self, g, x, rng):
        return ops.flatten(x)


class Activation(Layer):
    """An elementwise activation by its catalogue name (``"Relu"``, ``"Tanh"``, …)."""

    def __init__(self, op, name=None):
        super().__init__(name)
        self.op = op

    def __call__(self, g, x, rng):
        return getattr(ops, self.op)(x)


def ReLU(name=None):
    return Activation("Relu", name)


def Tanh(name=None):
    return Activation("Tanh", name)


def Sigmoid(name=None):
    return Activation("Sigmoid", name)


class Sequential:
    """Layers applied in order to one input; a classifier trained with softmax
    cross-entropy on integer labels."""

    def __init__(self, layers, seed=0):
        self.layers = list(layers)
        for i, layer in enumerate(self.layers):
            layer.name = layer.name or f"{type(layer).__name__.lower()}{i}"
        self.seed = seed
        self._train = self._infer = None
        self._weights = []

    def _graph(self, name, sample_shape, training):
        rng = _np.random.default_rng(self.seed)
        g = _kiln.Graph(name)
        x = g.parameter("x", "f32", [_kiln.Axis("batch", "N")] + list(sample_shape))
        h, created = x, []
        for layer in self.layers:
            layer.created = created
            h = layer(g, h, rng)
        if not training:
            g.output("logits", h)
            return g, None, created
        labels = g.parameter("labels", "i64", [_kiln.Axis("batch", "N")])
        lr = g.parameter("lr", "f32", [])
        loss, _ = ops.softmax_cross_entropy_loss(h, labels)
        return g, (loss, lr), created

    def _build(self, sample_shape, optimizer, threads):
        g, (loss, lr), variables = self._graph("train", sample_shape, True)
        self._weights = [v.name for v in variables]
        (optimizer or optim.Adam()).minimize(loss, variables, lr)
        g.output("loss", loss)
        self._train = g.compile(threads=threads)
        self._infer = self._graph("infer", sample_shape, False)[0].compile(threads=threads)
        self._sample_shape = tuple(sample_shape)

    def _sync(self):
        self._infer.write_variables({n: self._train.read_variable(n) for n in self._weights})

    def fit(self, x, y, epochs=10, batch_size=64, optimizer=None, lr=0.003,
            validation_data=None, verbose=True, threads=0):
        """Trains on ``x`` (float32, ``[N, ...]``) and ``y`` (int labels); returns the
        per-epoch history: loss, and validation loss and accuracy when
        ``validation_data=(x, y)`` is given."""
        x = _np.ascontiguousarray(x, _np.float32)
        y = _np.ascontiguousarray(y, _np.int64)
        if self._train is None or self._sample_shape != x.shape[1:]:
            self._build(x.shape[1:], optimizer, threads)
        rng = _np.random.default_rng(self.seed)
        rate = _np.float32(lr)
        history = {"loss": [], "val_loss": [], "val_accuracy": []}
        for epoch in range(epochs):
            start, total = time.perf_counter(), 0.0
            order = rng.permutation(len(x))
            batches = range(0, len(order), batch_size)
            for i in _progress(batches, verbose, f"epoch {epoch + 1}/{epochs}"):
                rows = order[i : i + batch_size]
                out = self._train.run({"x": x[rows], "labels": y[rows], "lr": rate})
                total += float(out["loss"]) * len(rows)
            history["loss"].append(total / len(x))
            line = f"epoch {epoch + 1}/{epochs}: loss {history['loss'][-1]:.4f}"
            if validation_data is not None:
                val_loss, val_acc = self.evaluate(*validation_data)
                history["val_loss"].append(val_loss)
                history["val_accuracy"].append(val_acc)
                line += f", val_loss {val_loss:.4f}, val_accuracy {val_acc:.4f}"
            if verbose:
                print(f"{line} ({time.perf_counter() - start:.2f} s)", file=sys.stderr)
        return history

    def predict(self, x):
        """The logits for ``x``."""
        if self._infer is None:
            raise _kiln.InvalidArgument("predict: the model has not been fitted or loaded")
        self._sync()
        return self._infer.run({"x": _np.ascontiguousarray(x, _np.float32)})["logits"]

    def evaluate(self, x, y):
        """(mean softmax cross-entropy, accuracy) on ``x``, ``y``."""
        logits = self.predict(x).astype(_np.float64)
        y = _np.asarray(y, _np.int64)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - _np.log(_np.exp(shifted).sum(axis=1, keepdims=True))
        loss = -log_probs[_np.arange(len(y)), y].mean()
        return float(loss), float((logits.argmax(axis=1) == y).mean())

    def save(self, path):
        """The weights and the sample shape, as a NumPy ``.npz`` file."""
        weights = {n: self._train.read_variable(n) for n in self._weights}
        _np.savez(path, __sample_shape__=_np.array(self._sample_shape), **weights)

    def load(self, path, threads=0):
        """Weights saved by :meth:`save` into a model of the same layers."""
        with _np.load(path) as data:
            self._build(tuple(data["__sample_shape__"]), None, threads)
            self._train.write_variables({n: data[n] for n in self._weights})
        return self


def _progress(items, enabled, label):
    """``tqdm`` when it is installed, else a plain counter on a terminal's stderr."""
    if not enabled or not sys.stderr.isatty():
        return items
    try:
        from tqdm import tqdm

        return tqdm(items, desc=label, leave=False)
    except ImportError:
        return _plain(items, label)


def _plain(items, label):
    n = len(items)
    for k, item in enumerate(items):
        print(f"\r{label} {k + 1}/{n}", end="", file=sys.stderr)
        yield item
    print("\r", end="", file=sys.stderr)
