"""A layer of your own in kiln.nn: a gated linear unit, y = (x @ w + b) · σ(x @ v + c),
made of kiln.ops, in a residual block, trained on the UCI digits (Linear 64 → 128,
then x + GLU(x), then Linear 10); prints the test accuracy and the wall time.

    python examples/python/custom_layer.py [examples/data/digits.bin] [--epochs 15]
"""

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np

import kiln
from kiln import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


class GatedLinear(nn.Layer):
    """y = (x @ w + b) · σ(x @ v + c), over [N, features]: the gate learns which units
    pass. Weights are made with Layer.variable, so fit trains them and save keeps them."""

    def __init__(self, units, name=None):
        super().__init__(name)
        self.units = units

    def __call__(self, g, x, rng):
        self.expect_rank(x, (2,), "[N, features]")
        fan_in = x.shape[1]
        bound = np.sqrt(6.0 / (fan_in + self.units))
        w = self.variable(g, rng, "w", rng.uniform(-bound, bound, (fan_in, self.units)))
        v = self.variable(g, rng, "v", rng.uniform(-bound, bound, (fan_in, self.units)))
        b = self.variable(g, rng, "b", np.zeros(self.units))
        c = self.variable(g, rng, "c", np.zeros(self.units))
        return kiln.ops.gemm(x, w, b) * kiln.ops.sigmoid(kiln.ops.gemm(x, v, c))


class Residual(nn.Layer):
    """x + inner(x): layers of the same width, with their own names inside this one."""

    def __init__(self, *inner, name=None):
        super().__init__(name)
        self.inner = inner

    def __call__(self, g, x, rng):
        h = x
        for i, layer in enumerate(self.inner):
            h = self.call(layer, g, h, rng, str(i))  # named "<block>.<i>"
        return x + h


def load_digits(path):
    spec = importlib.util.spec_from_file_location("digits_mlp", HERE / "digits_mlp.py")
    mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mlp)
    return mlp.load_digits(path)


def train(path, epochs=15, verbose=True):
    x_train, y_train, x_test, y_test = load_digits(path)
    model = nn.Sequential(
        [nn.Linear(128), nn.ReLU(), Residual(GatedLinear(128)), nn.Linear(10)], seed=1
    )
    start = time.perf_counter()
    model.fit(x_train, y_train, epochs=epochs, batch_size=64, lr=0.002, verbose=verbose, threads=1)
    _, accuracy = model.evaluate(x_test, y_test)
    return model, accuracy, time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=ROOT / "examples/data/digits.bin")
    ap.add_argument("--epochs", type=int, default=15)
    args = ap.parse_args()
    _, accuracy, seconds = train(args.data, args.epochs)
    print(f"test accuracy {100 * accuracy:.2f} %, trained and tested in {seconds:.2f} s")


if __name__ == "__main__":
    main()
