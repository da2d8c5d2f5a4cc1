"""Kiln vs onnxruntime (and OpenVINO when installed), side by side in one run: the same model file and the same inputs,
the two timed alternately in rounds so that drift on a noisy machine hits both.

Usage: compare.py KILN MODELS_DIR [--threads 1,2] [--rounds 5] [--iterations N] [--cases a,b]

Each round times N runs of onnxruntime (after a warm-up), N of OpenVINO, and then
`kiln bench` with N iterations, each after a 1 s pause (the peers' pools spin after a
run and would steal a 2-core machine's cores from the next); a case's latency is the
median over its rounds' medians. Prints a Markdown
table with the ratios kiln/onnxruntime and kiln/OpenVINO (below 1: Kiln is faster).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort

CASES = ["mlp", "cnn", "resnet18", "resnet50", "bert"]
ITERATIONS = {"mlp": 200, "cnn": 40, "resnet18": 20, "resnet50": 10, "bert": 15}


# The peers' worker threads spin for a while after a run (onnxruntime's default); on a
# small machine they would steal the cores from whoever runs next. Each round starts
# after a pause long enough for every pool to go idle.
PAUSE_S = 1.0


def ort_round(sess, feeds, n):
    time.sleep(PAUSE_S)
    for _ in range(2):
        sess.run(None, feeds)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def openvino_session(model, threads):
    try:
        import openvino as ov
    except ImportError:
        return None
    config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_PRECISION_HINT": "f32"}
    req = ov.Core().compile_model(model, "CPU", config).create_infer_request()

    class Session:
        def run(self, _, feeds):
            return req.infer(feeds)

    return Session()


def kiln_round(kiln, model, inputs, threads, n):
    time.sleep(PAUSE_S)
    out = subprocess.run(
        [kiln, "bench", model, "--inputs", *inputs, "--threads", str(threads), "--iterations", str(n),
         "--warmup", "2", "--json"],
        check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln")
    ap.add_argument("models")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=0)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    rows = []
    print(f"onnxruntime {ort.__version__}; {args.rounds} alternating rounds per case", file=sys.stderr)
    for case in args.cases.split(","):
        d = os.path.join(args.models, case)
        model = os.path.join(d, "model.onnx")
        inputs = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".npy"))
        feeds = {os.path.basename(p)[:-4]: np.load(p) for p in inputs}
        n = args.iterations or ITERATIONS[case]
        for threads in [int(t) for t in args.threads.split(",")]:
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            # Feed names in the model's order (the .npy files are named after them).
            feeds = {i.name: feeds[i.name] for i in sess.get_inputs()}
            ordered = [os.path.join(d, f"{i.name}.npy") for i in sess.get_inputs()]
            ov_sess = openvino_session(model, threads)
            k_times, o_times, v_times, gflops = [], [], [], []
            for _ in range(args.rounds):
                o_times.append(ort_round(sess, feeds, n))
                if ov_sess:
                    v_times.append(ort_round(ov_sess, feeds, n))
                r = kiln_round(args.kiln, model, ordered, threads, n)
                k_times.append(r["median_ms"])
                gflops.append(r["gflops"])
            k, o = statistics.median(k_times), statistics.median(o_times)
            v = statistics.median(v_times) if v_times else None
            rows.append((case, threads, k, o, v, statistics.median(gflops)))
            vs = f"  openvino {v:9.3f} ms  ratio {k / v:5.2f}" if v else ""
            print(f"{case:9} {threads} thr  kiln {k:9.3f} ms  ort {o:9.3f} ms  ratio {k / o:5.2f}{vs}", file=sys.stderr)
    print("| case | threads | Kiln ms | onnxruntime ms | OpenVINO ms | Kiln / onnxruntime | Kiln / OpenVINO | Kiln GFLOP/s |")
    print("|---|---|---|---|---|---|---|---|")
    for case, threads, k, o, v, g in rows:
        vcols = f"{v:.3f} | {k / v:.2f}" if v else "- | -"
        vms, vratio = vcols.split(" | ")
        print(f"| {case} | {threads} | {k:.3f} | {o:.3f} | {vms} | {k / o:.2f} | {vratio} | {g:.1f} |")


if __name__ == "__main__":
    main()
