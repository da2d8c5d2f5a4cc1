"""Trains a 64-128-10 MLP on the UCI digits from Python with kiln.nn (Linear → ReLU →
Linear, softmax cross-entropy, kiln.optim.Adam); prints the loss per epoch, the test
accuracy and the wall time. The same data file and model as examples/c/train_digits.c.

    python examples/python/digits_mlp.py [examples/data/digits.bin] [--epochs 30]
"""

import argparse
import struct
import time
from pathlib import Path

import numpy as np

import kiln
from kiln import nn

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


def train(path, epochs=30, batch=64, lr=0.003, seed=0, verbose=True):
    """(test accuracy, seconds) of the MLP trained on the digits file at ``path``."""
    x_train, y_train, x_test, y_test = load_digits(path)
    # 64 → 128 → ReLU → 10, He-uniform weights as the C example's.
    model = nn.Sequential([nn.Linear(128), nn.ReLU(), nn.Linear(10)], seed=seed)
    start = time.perf_counter()
    model.fit(x_train, y_train, epochs=epochs, batch_size=batch, optimizer=kiln.optim.Adam(),
              lr=lr, loss="cross_entropy", verbose=verbose, threads=1)
    _, accuracy = model.evaluate(x_test, y_test)
    return accuracy, time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=ROOT / "examples/data/digits.bin")
    ap.add_argument("--epochs", type=int, default=30)
    args = ap.parse_args()
    accuracy, seconds = train(args.data, args.epochs)
    print(f"test accuracy {100 * accuracy:.2f} %, trained and tested in {seconds:.2f} s")


if __name__ == "__main__":
    main()
