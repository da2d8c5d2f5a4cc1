"""The digits from Python, Kiln's `kiln.nn` against JAX, side by side in one run: the
64-128-10 MLP (He-uniform weights, Adam lr 0.003, batch 64, 30 epochs, softmax
cross-entropy; `examples/python/digits_mlp.py`) trained by each, and Kiln's CNN
(`examples/python/digits_cnn.py`). JAX's MLP is `jax.jit` of `jax.value_and_grad` plus
Adam written out (the formulas of `kiln.optim`), fed the same shuffled batches, the last
one partial, as `fit` does.

Each measurement is a fresh worker process pinned to one CPU (`taskset -c 0`; XLA told
to use one thread) that times training plus the test-set evaluation, compiling
included, after its imports; rounds alternate which side goes first. Prints each
side's test accuracy and the median wall time.

    python bench/python_digits.py [--rounds 5]

Needs the locked benchmark environment with the `kiln` wheel added to it, nothing unpinned:
`scripts/test-python.sh` (builds the wheel with the locked maturin and writes its hash
line), `python=$(scripts/py-env.sh bench)` (onnxruntime, onnx, jax, ... from
scripts/requirements/bench.txt), then
`target/py-bench/bin/pip install --require-hashes --no-deps -r target/py-kiln/kiln-wheel.txt`;
run it with `target/py-bench/bin/python`.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "examples/data/digits.bin"
EPOCHS, BATCH, LR = 30, 64, 0.003


def load_digits():
    sys.path.insert(0, str(ROOT / "examples/python"))
    from digits_mlp import load_digits as load

    return load(DIGITS)


def kiln_mlp():
    sys.path.insert(0, str(ROOT / "examples/python"))
    import digits_mlp

    return digits_mlp.train(DIGITS, epochs=EPOCHS, batch=BATCH, lr=LR, verbose=False)


def kiln_cnn():
    sys.path.insert(0, str(ROOT / "examples/python"))
    import digits_cnn

    _, accuracy, seconds = digits_cnn.train(DIGITS, verbose=False)
    return accuracy, seconds


def jax_mlp():
    import jax
    import jax.numpy as jnp
    import numpy as np

    x_train, y_train, x_test, y_test = load_digits()
    start = time.perf_counter()
    rng = np.random.default_rng(0)

    def he(shape, fan_in):
        bound = np.sqrt(6.0 / fan_in)
        return jnp.asarray(rng.uniform(-bound, bound, shape).astype(np.float32))

    params = {"w1": he((64, 128), 64), "b1": jnp.zeros(128), "w2": he((128, 10), 128),
              "b2": jnp.zeros(10)}

    def logits(p, x):
        return jnp.maximum(x @ p["w1"] + p["b1"], 0) @ p["w2"] + p["b2"]

    def loss(p, x, y):
        z = logits(p, x)
        return jnp.mean(jax.nn.logsumexp(z, axis=1) - jnp.take_along_axis(z, y[:, None], 1)[:, 0])

    @jax.jit
    def step(p, m, v, t, x, y):
        value, g = jax.value_and_grad(loss)(p, x, y)
        t = t + 1
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, v, g)
        c1, c2 = 1 - 0.9**t, 1 - 0.999**t
        p = jax.tree.map(lambda p, m, v: p - LR * (m / c1) / (jnp.sqrt(v / c2) + 1e-8), p, m, v)
        return p, m, v, t, value

    m = jax.tree.map(jnp.zeros_like, params)
    v = jax.tree.map(jnp.zeros_like, params)
    t = jnp.zeros((), jnp.float32)
    for _ in range(EPOCHS):
        order = rng.permutation(len(x_train))
        for i in range(0, len(order), BATCH):
            rows = order[i : i + BATCH]
            params, m, v, t, _ = step(params, m, v, t, x_train[rows], y_train[rows])
    predicted = np.asarray(jnp.argmax(jax.jit(logits)(params, x_test), axis=1))
    accuracy = float(np.mean(predicted == y_test))
    return accuracy, time.perf_counter() - start


WORKERS = {"kiln-mlp": kiln_mlp, "jax-mlp": jax_mlp, "kiln-cnn": kiln_cnn}


def measure(worker):
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_multi_thread_eigen=false")
    out = subprocess.run(
        ["taskset", "-c", "0", sys.executable, __file__, "--worker", worker],
        check=True, capture_output=True, text=True, env=env,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--worker", choices=WORKERS)
    args = ap.parse_args()
    if args.worker:
        accuracy, seconds = WORKERS[args.worker]()
        print(json.dumps({"accuracy": accuracy, "seconds": seconds}))
        return
    try:
        import jax  # noqa: F401

        workers = list(WORKERS)
    except ImportError:
        print("jax is not installed: Kiln only", file=sys.stderr)
        workers = ["kiln-mlp", "kiln-cnn"]
    results = {w: [] for w in workers}
    for r in range(args.rounds):
        for w in workers if r % 2 == 0 else workers[::-1]:
            results[w].append(measure(w))
    print(f"| worker | test accuracy | wall time, median of {args.rounds} (s) |")
    print("| --- | --- | --- |")
    for w, runs in results.items():
        accuracy = statistics.median(r["accuracy"] for r in runs)
        seconds = statistics.median(r["seconds"] for r in runs)
        print(f"| {w} | {100 * accuracy:.2f} % | {seconds:.3f} |")
    if "jax-mlp" in results:
        kiln_s = statistics.median(r["seconds"] for r in results["kiln-mlp"])
        jax_s = statistics.median(r["seconds"] for r in results["jax-mlp"])
        print(f"\nKiln MLP / JAX MLP wall time: {kiln_s / jax_s:.2f}")


if __name__ == "__main__":
    main()
