"""Kiln vs JAX/XLA training steps, side by side in one run (issue 7): forward, backward
and an Adam update of the MLP 784-512-512-10 and of the small CNN of bench/models.py,
batch 64, mean softmax cross-entropy, Adam (lr 1e-3, betas 0.9/0.999, eps 1e-8), f32.

Usage: train_compare.py KILN_TRAIN_STEP [--threads 1,2] [--rounds 7] [--steps N]
                        [--warmup 2] [--cases mlp,cnn] [--check-steps 5] [--out DIR]
                        [--json FILE]

Both sides start from the same weights and see the same batch: this script writes them
as .npy files (OUT/<case>/) which Kiln's bench binary (benches/train_step.rs) reads and
the JAX worker loads. Each side is one long-lived worker process per (case, threads),
compiled before any timing, answering `steps N` on stdin with N per-step times; every
request first resets the weights and Adam's state to the initial ones (untimed), so
every round times the same N steps. JAX's step is `jax.jit` of `jax.value_and_grad`
plus Adam written out (the same formulas as kiln::optim), its state donated so the
update is in place like Kiln's.

Threads: both workers run under `taskset` on the first `threads` CPUs; Kiln gets
`--threads`, XLA sizes its pools from the affinity mask and, at one thread, also gets
XLA_FLAGS=--xla_cpu_multi_thread_eigen=false (no Eigen pool for its matmuls and
convolutions).

The rounds alternate (Kiln first in even rounds, JAX first in odd ones), with a pause
before each so that neither side's idle pool threads steal cores; a round's time is the
median of its steps after `warmup`, a case's time the median over rounds. Before the
rounds, `check-steps` steps from the initial weights compare the two sides' losses
(relative difference, printed). Prints a Markdown table (case, threads, Kiln ms, JAX ms,
Kiln / JAX; below 1 Kiln is faster) and writes everything as JSON.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

PAUSE_S = 0.5
LR, BETA1, BETA2, EPS = 1e-3, 0.9, 0.999, 1e-8
BATCH = 64
STEPS = {"mlp": 30, "cnn": 10}

# Weight names and shapes, in the order of tests/common/train_models.rs (Gemm weights
# [out, in] as ONNX's transB=1, conv filters OIHW).
WEIGHTS = {
    "mlp": [("fc1_w", (512, 784)), ("fc1_b", (512,)), ("fc2_w", (512, 512)), ("fc2_b", (512,)),
            ("fc3_w", (10, 512)), ("fc3_b", (10,))],
    "cnn": [("conv1_w", (32, 1, 3, 3)), ("conv1_b", (32,)), ("conv2_w", (64, 32, 3, 3)),
            ("conv2_b", (64,)), ("fc1_w", (128, 3136)), ("fc1_b", (128,)), ("fc2_w", (10, 128)),
            ("fc2_b", (10,))],
}
SAMPLE = {"mlp": (784,), "cnn": (1, 28, 28)}


def write_data(case, d):
    """Initial weights uniform in ±1/sqrt(fan_in) (a bias takes its layer's fan_in), a
    standard normal batch and uniform labels, fixed seeds."""
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(7)
    fan_in = 1
    for name, shape in WEIGHTS[case]:
        if len(shape) > 1:
            fan_in = int(np.prod(shape[1:]))
        bound = 1.0 / np.sqrt(fan_in)
        np.save(os.path.join(d, f"{name}.npy"), rng.uniform(-bound, bound, shape).astype(np.float32))
    np.save(os.path.join(d, "x.npy"), rng.standard_normal((BATCH, *SAMPLE[case])).astype(np.float32))
    np.save(os.path.join(d, "labels.npy"), rng.integers(0, 10, BATCH).astype(np.int64))


# ---- the JAX worker (runs in its own process, under taskset) ----

def jax_worker(case, d):
    import jax
    import jax.numpy as jnp
    from jax import lax

    names = [n for n, _ in WEIGHTS[case]]
    params0 = {n: np.load(os.path.join(d, f"{n}.npy")) for n in names}
    x = jax.device_put(np.load(os.path.join(d, "x.npy")))
    y = jax.device_put(np.load(os.path.join(d, "labels.npy")).astype(np.int32))
    lr = jnp.float32(LR)

    def dense(h, w, b):
        return h @ w.T + b

    def conv(h, w, b):
        out = lax.conv_general_dilated(h, w, (1, 1), ((1, 1), (1, 1)),
                                       dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return out + b[None, :, None, None]

    def pool(h):
        return lax.reduce_window(h, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def scores(p, x):
        if case == "mlp":
            h = jax.nn.relu(dense(x, p["fc1_w"], p["fc1_b"]))
            h = jax.nn.relu(dense(h, p["fc2_w"], p["fc2_b"]))
            return dense(h, p["fc3_w"], p["fc3_b"])
        h = pool(jax.nn.relu(conv(x, p["conv1_w"], p["conv1_b"])))
        h = pool(jax.nn.relu(conv(h, p["conv2_w"], p["conv2_b"])))
        h = h.reshape(h.shape[0], -1)
        h = jax.nn.relu(dense(h, p["fc1_w"], p["fc1_b"]))
        return dense(h, p["fc2_w"], p["fc2_b"])

    def loss_fn(p, x, y):
        logp = jax.nn.log_softmax(scores(p, x), axis=1)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    def step(state, x, y, lr):
        p, m, v, t = state
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        t = t + 1.0
        m = jax.tree.map(lambda m, g: BETA1 * m + (1 - BETA1) * g, m, g)
        v = jax.tree.map(lambda v, g: BETA2 * v + (1 - BETA2) * (g * g), v, g)
        c1, c2 = 1 - BETA1 ** t, 1 - BETA2 ** t
        p = jax.tree.map(lambda p, m, v: p - lr * ((m / c1) / (jnp.sqrt(v / c2) + EPS)), p, m, v)
        return (p, m, v, t), loss

    step = jax.jit(step, donate_argnums=0)

    def fresh():
        zeros = {n: np.zeros_like(a) for n, a in params0.items()}
        state = jax.device_put(({n: a.copy() for n, a in params0.items()}, zeros,
                                {n: a.copy() for n, a in zeros.items()}, np.float32(0)))
        return jax.block_until_ready(state)

    t0 = time.perf_counter()
    state, loss = step(fresh(), x, y, lr)
    jax.block_until_ready((state, loss))
    compile_ms = (time.perf_counter() - t0) * 1e3
    header = {"jax": jax.__version__, "backend": jax.default_backend(), "compile_ms": compile_ms,
              "xla_flags": os.environ.get("XLA_FLAGS", ""), "cpus": sorted(os.sched_getaffinity(0))}
    print(json.dumps(header), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words == ["quit"]:
            break
        if len(words) != 2 or words[0] != "steps":
            print(json.dumps({"error": f"unknown command '{line.strip()}' (steps N | quit)"}), flush=True)
            continue
        state = fresh()
        times, losses = [], []
        for _ in range(int(words[1])):
            t = time.perf_counter()
            state, loss = step(state, x, y, lr)
            jax.block_until_ready((state, loss))
            times.append((time.perf_counter() - t) * 1e3)
            losses.append(float(loss))
        print(json.dumps({"times_ms": times, "losses": losses}), flush=True)


# ---- the driver ----

class Worker:
    def __init__(self, argv, env=None):
        self.argv = argv
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.header = self._reply()

    def _reply(self):
        line = self.p.stdout.readline()
        if not line:
            code = self.p.wait()
            raise SystemExit(f"worker {' '.join(self.argv)} ended (exit {code}) without answering")
        reply = json.loads(line)
        if "error" in reply:
            raise SystemExit(f"worker {' '.join(self.argv)}: {reply['error']}")
        return reply

    def steps(self, n):
        self.p.stdin.write(f"steps {n}\n")
        self.p.stdin.flush()
        return self._reply()

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        self.p.wait()


def pinned(threads):
    cpus = sorted(os.sched_getaffinity(0))
    if threads > len(cpus):
        raise SystemExit(f"{threads} threads asked for, {len(cpus)} CPUs available")
    return ["taskset", "-c", ",".join(str(c) for c in cpus[:threads])]


def jax_env(threads):
    env = dict(os.environ)
    if threads == 1:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    return env


def relative_gaps(a, b):
    """|a - b| / |b| per step; a missing (non-finite) loss is an infinite gap."""
    return [abs(x - y) / max(abs(y), 1e-30) if x is not None and y is not None else float("inf")
            for x, y in zip(a, b)]


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--jax-worker":
        return jax_worker(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln", help="the built benches/train_step.rs binary")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=0, help="timed steps per round (default per case)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps of a round left out")
    ap.add_argument("--cases", default="mlp,cnn")
    ap.add_argument("--check-steps", type=int, default=5)
    ap.add_argument("--tolerance", type=float, default=1e-4, help="loss relative difference allowed")
    ap.add_argument("--out", default="target/train-compare")
    ap.add_argument("--json", default=None, help="default: OUT/results.json")
    args = ap.parse_args()
    rows, failed = [], []
    for case in args.cases.split(","):
        d = os.path.join(args.out, case)
        write_data(case, d)
        n = (args.steps or STEPS[case]) + args.warmup
        for threads in [int(t) for t in args.threads.split(",")]:
            pin = pinned(threads)
            kiln = Worker(pin + [args.kiln, "--model", case, "--batch", str(BATCH), "--threads", str(threads),
                                 "--data", d, "--lr", str(LR), "--serve"])
            jax = Worker(pin + [sys.executable, os.path.abspath(__file__), "--jax-worker", case, d],
                         env=jax_env(threads))
            print(f"{case} {threads} thr: kiln {kiln.header.get('executor')} (compile {kiln.header['compile_ms']:.0f} ms), "
                  f"jax {jax.header['jax']} (compile {jax.header['compile_ms']:.0f} ms, cpus {jax.header['cpus']}, "
                  f"XLA_FLAGS '{jax.header['xla_flags']}')", file=sys.stderr)
            kl = kiln.steps(args.check_steps)["losses"]
            jl = jax.steps(args.check_steps)["losses"]
            gaps = relative_gaps(kl, jl)
            ok = max(gaps) <= args.tolerance
            if not ok:
                failed.append(f"{case} {threads} thr")
            print(f"  losses over {args.check_steps} steps (kiln / jax): "
                  + ", ".join(f"{a}/{b}" for a, b in zip(kl, jl))
                  + f"; max relative gap {max(gaps):.2e} ({'ok' if ok else 'TOO LARGE'})", file=sys.stderr)
            k_rounds, j_rounds = [], []
            for r in range(args.rounds):
                order = [("kiln", kiln, k_rounds), ("jax", jax, j_rounds)]
                for _, w, out in order if r % 2 == 0 else order[::-1]:
                    time.sleep(PAUSE_S)
                    out.append(w.steps(n)["times_ms"][args.warmup:])
                print(f"  round {r + 1}: kiln {statistics.median(k_rounds[-1]):.3f} ms, "
                      f"jax {statistics.median(j_rounds[-1]):.3f} ms", file=sys.stderr)
            kiln.close()
            jax.close()
            k = statistics.median(statistics.median(t) for t in k_rounds)
            j = statistics.median(statistics.median(t) for t in j_rounds)
            rows.append({"case": case, "threads": threads, "kiln_ms": k, "jax_ms": j, "ratio": k / j,
                         "kiln_executor": kiln.header.get("executor"), "kiln_memory": kiln.header.get("memory"),
                         "kiln_memory_preview": kiln.header.get("memory_preview"),
                         "kiln_compile_ms": kiln.header["compile_ms"], "jax_compile_ms": jax.header["compile_ms"],
                         "jax": jax.header["jax"], "xla_flags": jax.header["xla_flags"], "cpus": jax.header["cpus"],
                         "check_losses_kiln": kl, "check_losses_jax": jl, "check_max_relative_gap": max(gaps),
                         "kiln_round_ms": k_rounds, "jax_round_ms": j_rounds})
    print(f"| case | threads | Kiln ms | JAX ms | Kiln / JAX | loss gap ({args.check_steps} steps) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        note = "" if r["kiln_executor"] == "kernels" else f" (Kiln on the {r['kiln_executor']})"
        print(f"| {r['case']}{note} | {r['threads']} | {r['kiln_ms']:.3f} | {r['jax_ms']:.3f} | {r['ratio']:.2f} "
              f"| {r['check_max_relative_gap']:.1e} |")
    path = args.json or os.path.join(args.out, "results.json")
    with open(path, "w") as f:
        json.dump({"rounds": args.rounds, "warmup": args.warmup, "rows": rows}, f, indent=1)
    print(f"wrote {path}", file=sys.stderr)
    if failed:
        raise SystemExit(f"losses differ by more than {args.tolerance:g} relative: {', '.join(failed)}")


if __name__ == "__main__":
    main()
