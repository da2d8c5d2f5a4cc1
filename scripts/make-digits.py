#!/usr/bin/env python3
"""Writes examples/data/digits.bin: the UCI handwritten digits (the 1,797 8x8 images that
scikit-learn bundles, sklearn.datasets.load_digits; no network) with a fixed train/test
split, for examples/c/train_digits.c and examples/cpp/train_digits.cpp.

    $(scripts/py-env.sh) scripts/make-digits.py [out-path]

(scikit-learn comes locked in scripts/requirements/tests.txt.)

The split: numpy.random.RandomState(0).permutation(1797) (the legacy generator, whose
stream numpy keeps stable across versions); its first 1,437 indices are the training set,
the last 360 the test set, each in permutation order.

The file (116,829 bytes), all integers little-endian:
    offset  size            field
         0     8            magic "KDIGITS1"
         8     4            u32 n_train (1437)
        12     4            u32 n_test (360)
        16     4            u32 rows (8)
        20     4            u32 cols (8)
        24     n_train*64   training pixels, u8 0..16, image after image, row-major
         …     n_train      training labels, u8 0..9
         …     n_test*64    test pixels
         …     n_test       test labels
"""
import struct
import sys

import numpy as np
from sklearn.datasets import load_digits

SEED = 0
N_TRAIN = 1437


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "examples/data/digits.bin"
    digits = load_digits()
    images = digits.images.astype(np.uint8)  # (1797, 8, 8), values 0..16
    labels = digits.target.astype(np.uint8)
    assert images.shape == (1797, 8, 8) and images.max() == 16 and labels.max() == 9
    assert np.array_equal(images, digits.images), "pixels are whole numbers 0..16"
    order = np.random.RandomState(SEED).permutation(len(labels))
    train, test = order[:N_TRAIN], order[N_TRAIN:]
    with open(out, "wb") as f:
        f.write(b"KDIGITS1")
        f.write(struct.pack("<4I", len(train), len(test), 8, 8))
        for part in (train, test):
            f.write(images[part].tobytes())
            f.write(labels[part].tobytes())
    print(f"{out}: {len(train)} train + {len(test)} test images (seed {SEED})")


if __name__ == "__main__":
    main()
