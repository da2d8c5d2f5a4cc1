"""Layers and models in the style of neon and Keras, built on Kiln graphs.

``Sequential([Conv(16), BatchNorm(), ReLU(), Pool(2), Flatten(), Dropout(0.2),
Linear(10)])`` with ``fit``, ``evaluate``, ``predict``, ``save`` and ``load``.

* Layers: :class:`Linear` (``Affine``), :class:`Conv`, :class:`Pool`, :class:`Flatten`,
  :class:`BatchNorm`, :class:`Dropout`, :class:`LSTM` and the activations
  (:func:`ReLU`, :func:`Tanh`, :func:`Sigmoid`, any elementwise op by name with
  :class:`Activation`). A layer of your own subclasses :class:`Layer` and adds
  catalogue ops (:mod:`kiln.ops`) to the graph in ``__call__(graph, x, rng)``.
* Losses, as objects or names (``fit(..., loss="mse")``): :class:`CrossEntropy`
  (softmax cross-entropy on integer labels, the default), :class:`MSE` and
  :class:`BinaryCrossEntropy` (on logits, with 0/1 targets).

``fit`` builds one training graph (the layers in training mode, the loss,
``kiln.grad`` and an optimizer from :mod:`kiln.optim`, the learning rate an input) and
an inference graph over the same variables, each compiled once; BatchNorm's running
statistics and Dropout's mask counter are graph variables that ``Assign`` nodes update
on every training step. ``save`` writes the weights and running statistics to an
``.npz`` file; ``load`` reads them into a model of the same layers.
"""

import sys
import time
import zlib

import numpy as _np

from . import _kiln, ops, optim

_NP_DTYPES = {"f32": _np.float32, "f64": _np.float64}


class Layer:
    """A layer adds its nodes to a graph: ``__call__(graph, x, rng) -> y``. Layers with
    weights create them with :meth:`variable`, as graph variables named
    ``<layer name>.<weight>``.

    The model sets, before each call: ``training`` (True while building the training
    graph: Dropout drops and BatchNorm uses batch statistics only then) and ``dtype``
    (``"f32"`` or ``"f64"``, the dtype of the model's values)."""

    training = False
    dtype = "f32"

    def __init__(self, name=None):
        self.name = name
        self.created = []  # the trainable variables of the graph being built
        self.state = []  # its other variables worth saving (running statistics)

    def variable(self, g, rng, weight, value, trainable=True):
        """A variable of ``g`` named ``<layer name>.<weight>`` starting at ``value`` (in
        the model's dtype): trained by ``fit`` (``trainable``) or only saved."""
        v = g.variable(f"{self.name}.{weight}", _np.asarray(value, _NP_DTYPES[self.dtype]))
        (self.created if trainable else self.state).append(v)
        return v

    def constant(self, g, value, dtype=None):
        """A constant of ``g`` (in the model's dtype unless ``dtype`` is given)."""
        return g.constant(_np.asarray(value, dtype or _NP_DTYPES[self.dtype]))

    def call(self, layer, g, x, rng, name):
        """Calls ``layer`` on ``x`` inside this layer (a block made of layers): it is
        named ``<this layer's name>.<name>`` and shares this layer's training mode,
        dtype and variable lists."""
        layer.name = f"{self.name}.{name}"
        layer.created, layer.state = self.created, self.state
        layer.training, layer.dtype = self.training, self.dtype
        return layer(g, x, rng)

    def expect_rank(self, x, ranks, layout):
        """A clear error when ``x`` has another rank than the layer takes."""
        rank = len(x.shape)
        if rank not in ranks:
            raise _kiln.InvalidArgument(
                f"{self.name or type(self).__name__} ({type(self).__name__}): expects "
                f"an input {layout}, got rank {rank} ({x.type})"
            )


def _he_uniform(rng, shape, fan_in):
    bound = _np.sqrt(6.0 / fan_in)
    return rng.uniform(-bound, bound, shape)


def _glorot_uniform(rng, shape, fan_in, fan_out):
    bound = _np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, shape)


class Linear(Layer):
    """``y = x @ w + b`` over the last axis of an input of rank 2 or more (``Affine``
    in neon)."""

    def __init__(self, units, name=None):
        super().__init__(name)
        self.units = units

    def __call__(self, g, x, rng):
        self.expect_rank(x, range(2, 9), "[N, ..., features]")
        fan_in = x.shape[-1]
        w = self.variable(g, rng, "w", _he_uniform(rng, (fan_in, self.units), fan_in))
        b = self.variable(g, rng, "b", _np.zeros(self.units))
        if len(x.shape) == 2:
            return ops.gemm(x, w, b)
        return ops.mat_mul(x, w) + b  # Gemm takes matrices only


Affine = Linear


class Conv(Layer):
    """A 2-D convolution of NCHW input: ``filters`` outputs, a square ``kernel``,
    ``stride``, zero padding that keeps the size at stride 1 (``padding="same"``) or
    none (``"valid"``)."""

    def __init__(self, filters, kernel=3, stride=1, padding="same", name=None):
        super().__init__(name)
        self.filters, self.kernel, self.stride, self.padding = filters, kernel, stride, padding

    def __call__(self, g, x, rng):
        self.expect_rank(x, (4,), "[N, C, H, W]")
        channels, k = x.shape[1], self.kernel
        fan_in = channels * k * k
        w = self.variable(g, rng, "w", _he_uniform(rng, (self.filters, channels, k, k), fan_in))
        b = self.variable(g, rng, "b", _np.zeros(self.filters))
        pad = k // 2 if self.padding == "same" else 0
        return ops.conv(x, w, b, strides=[self.stride] * 2, pads=[pad] * 4, kernel_shape=[k, k])


class Pool(Layer):
    """Max (``kind="max"``) or average pooling over ``size`` × ``size`` windows."""

    def __init__(self, size=2, kind="max", name=None):
        super().__init__(name)
        self.size, self.kind = size, kind

    def __call__(self, g, x, rng):
        self.expect_rank(x, (4,), "[N, C, H, W]")
        op = {"max": ops.max_pool, "avg": ops.average_pool}[self.kind]
        y = op(x, kernel_shape=[self.size] * 2, strides=[self.size] * 2)
        return y[0] if isinstance(y, tuple) else y  # MaxPool's second output: indices


class Flatten(Layer):
    """``[N, ...] -> [N, prod(...)]``."""

    def __call__(self, g, x, rng):
        self.expect_rank(x, range(2, 9), "[N, ...]")
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


class BatchNorm(Layer):
    """Batch normalization over axis 1: the channels of NCHW input (after ``Conv``) or
    the features of ``[N, features]`` (after ``Linear``). Training normalizes with the
    batch's mean and biased variance over every other axis and updates the running
    statistics, ``running = momentum · running + (1 − momentum) · batch``; inference
    normalizes with the running ones. ``y = scale · x̂ + bias``, both learned."""

    def __init__(self, momentum=0.9, epsilon=1e-5, name=None):
        super().__init__(name)
        if not 0.0 <= momentum <= 1.0:
            raise _kiln.InvalidArgument(f"BatchNorm: momentum {momentum} is not in [0, 1]")
        self.momentum, self.epsilon = momentum, epsilon

    def __call__(self, g, x, rng):
        self.expect_rank(x, (2, 3, 4, 5), "[N, C] or [N, C, ...] (channels on axis 1)")
        rank, c = len(x.shape), x.shape[1]
        if not isinstance(c, int):
            raise _kiln.InvalidArgument(
                f"{self.name} (BatchNorm): the channel axis (1) must have a fixed size, got {x.type}"
            )
        scale = self.variable(g, rng, "scale", _np.ones(c))
        bias = self.variable(g, rng, "bias", _np.zeros(c))
        mean = self.variable(g, rng, "mean", _np.zeros(c), trainable=False)
        var = self.variable(g, rng, "var", _np.ones(c), trainable=False)
        if not self.training:
            return ops.batch_normalization(x, scale, bias, mean, var, epsilon=self.epsilon)
        # Kiln's BatchNormalization has no training mode (training_mode 0 only): built
        # from plain ops, kiln.grad differentiates through the batch statistics too.
        axes = self.constant(g, [0] + list(range(2, rank)), _np.int64)
        batch_mean = ops.reduce_mean(x, axes, keepdims=1)
        centered = x - batch_mean
        batch_var = ops.reduce_mean(centered * centered, axes, keepdims=1)
        normalized = centered / ops.sqrt(batch_var + self.epsilon)
        per_channel = self.constant(g, [1, -1] + [1] * (rank - 2), _np.int64)
        y = normalized * ops.reshape(scale, per_channel) + ops.reshape(bias, per_channel)
        # The variables have static dims: the batch statistics reshaped to [C].
        flat = self.constant(g, [c], _np.int64)
        for running, batch in ((mean, batch_mean), (var, batch_var)):
            updated = running * self.momentum + ops.reshape(batch, flat) * (1.0 - self.momentum)
            g.op("Assign", [running, updated])
        return y


class Dropout(Layer):
    """Zeroes each element with probability ``rate`` and scales the others by
    ``1 / (1 − rate)`` in training; the identity in inference. Each training step draws
    a fresh mask (a counter variable feeds the Dropout op), reproducibly from ``seed``
    (by default one derived from the layer's name)."""

    def __init__(self, rate, seed=None, name=None):
        super().__init__(name)
        if not 0.0 <= rate < 1.0:
            raise _kiln.InvalidArgument(f"Dropout: rate {rate} is not in [0, 1)")
        self.rate, self.seed = rate, seed

    def __call__(self, g, x, rng):
        if not self.training or self.rate == 0.0:
            return x
        seed = self.seed if self.seed is not None else zlib.crc32(self.name.encode()) & 0x7FFFFFFF
        ratio = self.constant(g, self.rate)
        mode = self.constant(g, True, _np.bool_)
        counter = g.variable(f"{self.name}.counter", _np.array(0, _np.int64))
        y, _mask = ops.dropout(x, ratio, mode, counter, seed=int(seed))
        g.op("Assign", [counter, counter + self.constant(g, 1, _np.int64)])
        return y


class LSTM(Layer):
    """A long short-term memory layer over ``[N, time, features]`` input (the time
    axis of fixed length: the graph unrolls over it), from zero initial state:

        z = x_t @ w + h @ r + b;  i, f, g, o = split(z, 4)
        c = σ(f)·c + σ(i)·tanh(g);  h = σ(o)·tanh(c)

    ``w`` is ``[features, 4·units]``, ``r`` ``[units, 4·units]``, ``b`` ``[4·units]``
    (gates in the order i, f, g, o; the forget bias starts at 1). Outputs the last
    ``h`` (``[N, units]``) or, with ``return_sequences``, every one
    (``[N, time, units]``). Unrolled from MatMul, Sigmoid and Tanh, it trains with
    ``kiln.grad`` like any other layer."""

    def __init__(self, units, return_sequences=False, name=None):
        super().__init__(name)
        self.units, self.return_sequences = units, return_sequences

    def __call__(self, g, x, rng):
        self.expect_rank(x, (3,), "[N, time, features]")
        _, steps, features = x.shape
        if not isinstance(steps, int) or not isinstance(features, int):
            raise _kiln.InvalidArgument(
                f"{self.name} (LSTM): the time and feature axes must have fixed sizes "
                f"(the graph is unrolled over time), got {x.type}"
            )
        u = self.units
        w = self.variable(g, rng, "w", _glorot_uniform(rng, (features, 4 * u), features, 4 * u))
        r = self.variable(g, rng, "r", _glorot_uniform(rng, (u, 4 * u), u, 4 * u))
        b0 = _np.zeros(4 * u)
        b0[u : 2 * u] = 1.0  # forget gate open at first: gradients flow back in time
        b = self.variable(g, rng, "b", b0)
        # The input projection of all steps at once; the recurrence only adds h @ r.
        xw = ops.mat_mul(x, w) + b
        pieces = ops.split(xw, axis=1, num_outputs=steps) if steps > 1 else (xw,)
        time_axis = self.constant(g, [1], _np.int64)
        h = c = None
        outputs = []
        for piece in pieces:
            z = ops.squeeze(piece, time_axis)
            if h is not None:
                z = z + ops.mat_mul(h, r)
            i, f, cand, o = ops.split(z, axis=1, num_outputs=4)
            i, f, o, cand = ops.sigmoid(i), ops.sigmoid(f), ops.sigmoid(o), ops.tanh(cand)
            c = i * cand if c is None else f * c + i * cand  # c starts at zero
            h = o * ops.tanh(c)
            outputs.append(h)
        if not self.return_sequences:
            return h
        if len(outputs) == 1:
            return ops.unsqueeze(h, time_axis)
        return ops.concat(*[ops.unsqueeze(o, time_axis) for o in outputs], axis=1)


class Loss:
    """A training loss of the model's output and the targets: ``graph(output,
    targets)`` adds the scalar loss to the graph; ``numpy(output, targets)`` is the
    same in NumPy (float64) for ``evaluate``; ``metric`` names the second number
    ``evaluate`` reports and ``score(output, targets)`` computes it."""

    name = metric = ""

    def target_dtype(self, dtype):
        return dtype

    def target_shape(self, output):
        return [_kiln.Axis("batch", "N")] + list(output.shape[1:])

    def targets(self, y, dtype):
        return _np.ascontiguousarray(y, _NP_DTYPES[dtype])


class CrossEntropy(Loss):
    """Softmax cross-entropy of ``[N, classes]`` logits against integer labels
    ``[N]``; the metric is accuracy."""

    name, metric = "cross_entropy", "accuracy"

    def target_dtype(self, dtype):
        return "i64"

    def target_shape(self, output):
        if len(output.shape) != 2:
            raise _kiln.InvalidArgument(
                f"CrossEntropy: the model's output must be [N, classes] logits, got {output.type}"
            )
        return [_kiln.Axis("batch", "N")]

    def targets(self, y, dtype):
        return _np.ascontiguousarray(y, _np.int64)

    def graph(self, output, targets):
        return ops.softmax_cross_entropy_loss(output, targets)[0]  # (loss, log_prob)

    def numpy(self, output, y):
        shifted = output - output.max(axis=1, keepdims=True)
        log_probs = shifted - _np.log(_np.exp(shifted).sum(axis=1, keepdims=True))
        return float(-log_probs[_np.arange(len(y)), y].mean())

    def score(self, output, y):
        return float((output.argmax(axis=1) == y).mean())


class MSE(Loss):
    """Mean squared error against targets of the output's shape; the metric is the
    mean absolute error."""

    name, metric = "mse", "mae"

    def graph(self, output, targets):
        return ops.mse_loss(output, targets, reduction="mean")

    def numpy(self, output, y):
        return float(((output - y) ** 2).mean())

    def score(self, output, y):
        return float(_np.abs(output - y).mean())


class BinaryCrossEntropy(Loss):
    """Binary cross-entropy of logits ``z`` against 0/1 targets of the same shape:
    mean(softplus(z) − y·z), which is −y·log σ(z) − (1 − y)·log(1 − σ(z)) without
    overflow; the metric is accuracy (``z > 0`` against ``y > 0.5``)."""

    name, metric = "binary_cross_entropy", "accuracy"

    def graph(self, output, targets):
        return ops.reduce_mean(ops.softplus(output) - targets * output, keepdims=0)

    def numpy(self, output, y):
        return float((_np.logaddexp(0.0, output) - y * output).mean())

    def score(self, output, y):
        return float(((output > 0) == (y > 0.5)).mean())


_LOSSES = {
    "cross_entropy": CrossEntropy,
    "crossentropy": CrossEntropy,
    "mse": MSE,
    "binary_cross_entropy": BinaryCrossEntropy,
    "bce": BinaryCrossEntropy,
}


def _loss(loss):
    if isinstance(loss, Loss):
        return loss
    if isinstance(loss, str) and loss.lower() in _LOSSES:
        return _LOSSES[loss.lower()]()
    raise _kiln.InvalidArgument(
        f"loss: expected a kiln.nn.Loss or one of {sorted(_LOSSES)}, got {loss!r}"
    )


class Sequential:
    """Layers applied in order to one input. ``dtype`` (``"f32"`` or ``"f64"``) is the
    dtype of the input, the weights and the output."""

    def __init__(self, layers, seed=0, dtype="f32"):
        self.layers = list(layers)
        if dtype not in _NP_DTYPES:
            raise _kiln.InvalidArgument(f"dtype: expected one of {list(_NP_DTYPES)}, got {dtype!r}")
        names = set()
        for i, layer in enumerate(self.layers):
            if not callable(layer):
                raise _kiln.InvalidArgument(f"layer {i} ({layer!r}) is not a kiln.nn.Layer")
            layer.name = layer.name or f"{type(layer).__name__.lower()}{i}"
            if layer.name in names:
                raise _kiln.InvalidArgument(f"two layers are named {layer.name!r}")
            names.add(layer.name)
        self.seed, self.dtype = seed, dtype
        self.loss = CrossEntropy()
        self._train = self._infer = None
        self._train_key = self._optimizer = None  # what the training graph was built for
        self._sample_shape = None
        self._state = []  # the names of the saved variables: weights, running statistics
        self._newest = None  # "train" or "infer": which executable holds the latest values

    def build_graph(self, sample_shape, training=False, name="model"):
        """A new graph of the layers over an input ``"x"`` of shape ``[N,
        *sample_shape]``: ``(graph, output value, trainable variables, other saved
        variables)``. ``training`` builds the layers' training form."""
        rng = _np.random.default_rng(self.seed)
        g = _kiln.Graph(name)
        x = g.parameter("x", self.dtype, [_kiln.Axis("batch", "N")] + list(sample_shape))
        h, created, state = x, [], []
        for layer in self.layers:
            layer.created, layer.state = created, state
            layer.training, layer.dtype = training, self.dtype
            h = layer(g, h, rng)
        return g, h, created, state

    def _build_infer(self, sample_shape, threads):
        g, h, created, state = self.build_graph(sample_shape, False, "infer")
        g.output("output", h)
        self._infer = g.compile(threads=threads)
        self._state = [v.name for v in created + state]
        self._sample_shape = tuple(sample_shape)

    def _build_train(self, sample_shape, loss, optimizer, threads):
        values = self._values() if self._sample_shape == tuple(sample_shape) else None
        g, h, created, _ = self.build_graph(sample_shape, True, "train")
        targets = g.parameter("targets", loss.target_dtype(self.dtype), loss.target_shape(h))
        lr = g.parameter("lr", self.dtype, [])
        value = loss.graph(h, targets)
        optimizer.minimize(value, created, lr)
        g.output("loss", value)
        g.output("output", h)
        self._train = g.compile(threads=threads)
        self._build_infer(sample_shape, threads)
        if values is not None:  # a rebuild (another loss, optimizer) keeps the weights
            self._train.write_variables(values)
            self._infer.write_variables(values)
        self._newest = "train"

    def _values(self):
        """The saved variables' latest values (None before the first build)."""
        exe = {"train": self._train, "infer": self._infer}.get(self._newest)
        return None if exe is None else {n: exe.read_variable(n) for n in self._state}

    def fit(self, x, y, epochs=10, batch_size=64, optimizer=None, lr=0.003, loss=None,
            validation_data=None, verbose=True, threads=0):
        """Trains on ``x`` (``[N, ...]``) and ``y`` (the targets ``loss`` takes: integer
        labels for cross-entropy, the default). ``loss``: a :class:`Loss` or its name;
        ``optimizer``: from :mod:`kiln.optim` (Adam by default). Returns the per-epoch
        history: ``loss`` and the loss's metric on the training batches (as they were
        during the epoch), and ``val_loss`` and ``val_<metric>`` when
        ``validation_data=(x, y)`` is given."""
        self.loss = _loss(loss) if loss is not None else self.loss
        dt = _NP_DTYPES[self.dtype]
        x = _np.ascontiguousarray(x, dt)
        y = self.loss.targets(y, self.dtype)
        if len(x) != len(y):
            raise _kiln.InvalidArgument(f"fit: {len(x)} samples but {len(y)} targets")
        # A new sample shape, loss or optimizer needs a new training graph; otherwise
        # training goes on with the optimizer's state (moments, step count).
        key = (x.shape[1:], self.loss.name)
        if self._train is None or key != self._train_key or (
            optimizer is not None and optimizer is not self._optimizer
        ):
            self._optimizer = optimizer or optim.Adam()
            self._build_train(x.shape[1:], self.loss, self._optimizer, threads)
            self._train_key = key
        rng = _np.random.default_rng(self.seed)
        rate = dt(lr)
        metric = self.loss.metric
        history = {"loss": [], metric: []}
        if validation_data is not None:
            history.update({"val_loss": [], f"val_{metric}": []})
        for epoch in range(epochs):
            start, total, scored = time.perf_counter(), 0.0, 0.0
            order = rng.permutation(len(x))
            batches = range(0, len(order), batch_size)
            for i in _progress(batches, verbose, f"epoch {epoch + 1}/{epochs}"):
                rows = order[i : i + batch_size]
                out = self._train.run({"x": x[rows], "targets": y[rows], "lr": rate})
                total += float(out["loss"]) * len(rows)
                scored += self.loss.score(out["output"], y[rows]) * len(rows)
            self._newest = "train"
            history["loss"].append(total / len(x))
            history[metric].append(scored / len(x))
            line = f"epoch {epoch + 1}/{epochs}: loss {history['loss'][-1]:.4f}, {metric} {history[metric][-1]:.4f}"
            if validation_data is not None:
                val_loss, val_score = self.evaluate(*validation_data)
                history["val_loss"].append(val_loss)
                history[f"val_{metric}"].append(val_score)
                line += f", val_loss {val_loss:.4f}, val_{metric} {val_score:.4f}"
            if verbose:
                print(f"{line} ({time.perf_counter() - start:.2f} s)", file=sys.stderr)
        return history

    def predict(self, x):
        """The model's output (logits for the classification losses) for ``x``."""
        if self._infer is None:
            raise _kiln.InvalidArgument("predict: the model has not been fitted or loaded")
        x = _np.ascontiguousarray(x, _NP_DTYPES[self.dtype])
        if x.shape[1:] != self._sample_shape:
            raise _kiln.InvalidArgument(
                f"predict: samples of shape {x.shape[1:]}, the model takes {self._sample_shape}"
            )
        if self._newest == "train":
            self._infer.write_variables(self._values())
            self._newest = "infer"
        return self._infer.run({"x": x})["output"]

    def evaluate(self, x, y):
        """(mean loss, metric) on ``x``, ``y``: for cross-entropy the metric is
        accuracy, for MSE the mean absolute error (see :class:`Loss`)."""
        output = self.predict(x).astype(_np.float64)
        y = self.loss.targets(y, "f64")
        return self.loss.numpy(output, y), self.loss.score(output, y)

    def save(self, path):
        """The weights, BatchNorm's running statistics, the sample shape and the loss's
        name, as a NumPy ``.npz`` file."""
        values = self._values()
        if values is None:
            raise _kiln.InvalidArgument("save: the model has not been fitted or loaded")
        _np.savez(path, __sample_shape__=_np.array(self._sample_shape, _np.int64),
                  __loss__=_np.array(self.loss.name), **values)

    def load(self, path, threads=0):
        """Values saved by :meth:`save` into a model of the same layers; returns it."""
        with _np.load(path) as data:
            self._build_infer(tuple(int(d) for d in data["__sample_shape__"]), threads)
            missing = [n for n in self._state if n not in data]
            if missing:
                raise _kiln.InvalidArgument(
                    f"load: {path} has no {', '.join(missing)} (saved from other layers?)"
                )
            self._infer.write_variables({n: data[n] for n in self._state})
            if "__loss__" in data and str(data["__loss__"]) in _LOSSES:
                self.loss = _LOSSES[str(data["__loss__"])]()
        self._newest = "infer"
        self._train = self._train_key = None  # built by the next fit, from these values
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
