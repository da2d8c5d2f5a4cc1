"""Trains a 64-128-10 MLP on the UCI digits from Python, the graph built with
kiln.ops and trained with kiln.optim.Adam; prints the loss per epoch, the test accuracy
and the wall time. The same data file and model as examples/c/train_digits.c.

    python examples/python/digits_mlp.py [examples/data/digits.bin] [--epochs 20]
"""

import argparse
import struct
import time
from pathlib import Path

import numpy as np

import kiln

ROOT = Path(__file__).resolve().parents[2]


def load_digits(path):
    """(x_train, y_train, x_test, y_test): pixels scaled to [0, 1], i64 labels. The
    layout is documented in scripts/make-digits.py."""
    data = Path(path).read_bytes()
    magic, n_train, n_test, rows, cols = struct.unpack_from("<8sIIII", data)
    if magic != b"KDIGITS1" or (rows, cols) != (8, 8):
        raise ValueError(f"{path}: not a digits file")
    offset, splits = 24, []
    for n in (n_train, n_test):
        pixels = np.frombuffer(data, np.uint8, n * 64, offset).reshape(n, 64)
        labels = np.frombuffer(data, np.uint8, n, offset + n * 64)
        splits += [pixels.astype(np.float32) / 16.0, labels.astype(np.int64)]
        offset += n * 65
    return splits


def mlp(g, x, rng):
    """64 → 128 → ReLU → 10, weights as variables (He-uniform, as the C example)."""

    def weight(name, shape, fan_in):
        bound = np.sqrt(6.0 / fan_in) if fan_in else 0.0
        return g.variable(name, rng.uniform(-bound, bound, shape).astype(np.float32))

    w1, b1 = weight("w1", (64, 128), 64), weight("b1", (128,), 0)
    w2, b2 = weight("w2", (128, 10), 128), weight("b2", (10,), 0)
    h = kiln.ops.relu(kiln.ops.gemm(x, w1, b1))
    return kiln.ops.gemm(h, w2, b2), [w1, b1, w2, b2]


def train(path, epochs=20, batch=64, lr=0.003, seed=0, verbose=True):
    x_train, y_train, x_test, y_test = load_digits(path)
    rng = np.random.default_rng(seed)
    g = kiln.Graph("digits_mlp")
    x = g.parameter("x", "f32", [kiln.Axis("batch", "N"), 64])
    labels = g.parameter("labels", "i64", [kiln.Axis("batch", "N")])
    rate = g.parameter("lr", "f32", [])
    logits, weights = mlp(g, x, rng)
    loss, _ = kiln.ops.softmax_cross_entropy_loss(logits, labels)  # (loss, log_prob)
    kiln.optim.Adam().minimize(loss, weights, rate)
    g.output("loss", loss)
    step = g.compile(threads=1)
    # Inference: the same layers over the trained values, copied in by name.
    infer = kiln.Graph("digits_mlp_infer")
    xi = infer.parameter("x", "f32", [kiln.Axis("batch", "N"), 64])
    infer.output("logits", mlp(infer, xi, rng)[0])
    predict = infer.compile(threads=1)
    lr_value = np.float32(lr)
    start = time.perf_counter()
    for epoch in range(epochs):
        order = rng.permutation(len(x_train))
        losses = []
        for i in range(0, len(order), batch):
            rows = order[i : i + batch]
            out = step(x=x_train[rows], labels=y_train[rows], lr=lr_value)
            losses.append(float(out["loss"]) * len(rows))
        if verbose:
            print(f"epoch {epoch + 1:2d}: loss {sum(losses) / len(order):.4f}")
    predict.write_variables({n: step.read_variable(n) for n in ("w1", "b1", "w2", "b2")})
    accuracy = (predict(x=x_test)["logits"].argmax(axis=1) == y_test).mean()
    seconds = time.perf_counter() - start
    return accuracy, seconds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=ROOT / "examples/data/digits.bin")
    ap.add_argument("--epochs", type=int, default=20)
    args = ap.parse_args()
    accuracy, seconds = train(args.data, args.epochs)
    print(f"test accuracy {100 * accuracy:.2f} %, trained and tested in {seconds:.2f} s")


if __name__ == "__main__":
    main()
