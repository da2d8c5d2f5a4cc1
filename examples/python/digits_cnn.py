"""Trains a small CNN on the UCI digits with kiln.nn (Conv 16 → ReLU → MaxPool → Conv 32
→ ReLU → Flatten → Linear 10, as examples/c/train_digits.c), validating each epoch;
prints the test accuracy and the wall time.

    python examples/python/digits_cnn.py [examples/data/digits.bin] [--epochs 10]
"""

import argparse
import importlib.util
import time
from pathlib import Path

import kiln
from kiln import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def load_digits(path):
    spec = importlib.util.spec_from_file_location("digits_mlp", HERE / "digits_mlp.py")
    mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mlp)
    return mlp.load_digits(path)


def train(path, epochs=10, verbose=True):
    x_train, y_train, x_test, y_test = load_digits(path)
    x_train, x_test = x_train.reshape(-1, 1, 8, 8), x_test.reshape(-1, 1, 8, 8)
    model = nn.Sequential(
        [nn.Conv(16), nn.ReLU(), nn.Pool(2), nn.Conv(32), nn.ReLU(), nn.Flatten(), nn.Linear(10)]
    )
    start = time.perf_counter()
    model.fit(x_train, y_train, epochs=epochs, batch_size=64, optimizer=kiln.optim.Adam(),
              lr=0.002, validation_data=(x_test, y_test), verbose=verbose, threads=1)
    _, accuracy = model.evaluate(x_test, y_test)
    return model, accuracy, time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data", nargs="?", default=ROOT / "examples/data/digits.bin")
    ap.add_argument("--epochs", type=int, default=10)
    args = ap.parse_args()
    _, accuracy, seconds = train(args.data, args.epochs)
    print(f"test accuracy {100 * accuracy:.2f} %, trained and tested in {seconds:.2f} s")


if __name__ == "__main__":
    main()
