"""Every zoo model through Kiln and onnxruntime (and OpenVINO when it loads the model),
alternating in one run, at each thread count: the same model file, the same inputs.

Usage: zoo.py KILN ZOO_DIR OUT_DIR (or `bench/zoo [options]`) [--threads 1,2] [--rounds 5] [--models a,b] [--seconds S]

The inputs are the zoo's own (`test_data_set_0/input_<i>.pb`), written once as
OUT_DIR/<model>/<input name>.npy for `kiln bench`. Each round times onnxruntime for about
S seconds (after a warm-up), then OpenVINO, then `kiln bench` for the same number of
runs, each after a pause (the peers' pools spin after a run and would steal a 2-core
machine's cores from the next); a latency is the median over the rounds' medians. Prints
a Markdown table with the ratios (below 1: Kiln is faster) and their geometric means.
"""
import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
import onnx
from onnx import numpy_helper
import onnxruntime as ort

# The one way to time `kiln bench`, and the pause that lets the peers' pools go idle.
from compare import PAUSE_S, kiln_round


def timed(run, n):
    time.sleep(PAUSE_S)
    for _ in range(2):
        run()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def inputs_of(model_dir, out_dir, sess):
    """The model's test inputs as {name: array}, also written as out_dir/<name>.npy."""
    os.makedirs(out_dir, exist_ok=True)
    feeds = {}
    for k, i in enumerate(sess.get_inputs()):
        t = onnx.TensorProto()
        with open(os.path.join(model_dir, "test_data_set_0", f"input_{k}.pb"), "rb") as f:
            t.ParseFromString(f.read())
        a = numpy_helper.to_array(t)
        feeds[i.name] = a
        np.save(os.path.join(out_dir, f"{k}.npy"), a)
    return feeds


def openvino_run(model, threads, feeds):
    try:
        import openvino as ov
        config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_PRECISION_HINT": "f32"}
        req = ov.Core().compile_model(model, "CPU", config).create_infer_request()
        req.infer(feeds)
        return lambda: req.infer(feeds)
    except Exception as e:  # OpenVINO not installed, or it refuses the model
        print(f"  openvino: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr)
        return None


def failing_in_expected(path):
    """The models tests/zoo/expected.txt records as not passing, with the reason given:
    timing a model Kiln computes wrongly, or does not take, would stop the run or mislead."""
    failing = {}
    with open(path) as f:
        for line in f:
            parts = line.split(None, 2)
            if not parts or parts[0].startswith("#") or len(parts) < 2:
                continue
            if parts[1] != "pass":
                failing[parts[0]] = " ".join(parts[1:]).strip()
    return failing


def string_inputs(sess):
    """The names of the inputs `kiln bench` cannot be fed from .npy (strings)."""
    return [i.name for i in sess.get_inputs() if i.type == "tensor(string)"]


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln")
    ap.add_argument("zoo")
    ap.add_argument("out")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--models", default="")
    ap.add_argument("--skip", default="")
    ap.add_argument("--expected", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "..", "tests", "zoo", "expected.txt"))
    args = ap.parse_args()
    models = sorted(m for m in os.listdir(args.zoo) if os.path.isfile(os.path.join(args.zoo, m, "model.onnx")))
    if args.models:
        models = [m for m in models if any(s in m for s in args.models.split(","))]
    if args.skip:
        models = [m for m in models if not any(s in m for s in args.skip.split(","))]
    failing = failing_in_expected(args.expected) if os.path.isfile(args.expected) else {}
    for m in [m for m in models if m in failing]:
        print(f"skipped {m}: expected.txt says {failing[m]}", file=sys.stderr)
    models = [m for m in models if m not in failing]
    print(f"onnxruntime {ort.__version__}; {args.rounds} alternating rounds per model", file=sys.stderr)
    rows = []
    for m in models:
        model = os.path.join(args.zoo, m, "model.onnx")
        strings = string_inputs(ort.InferenceSession(model, providers=["CPUExecutionProvider"]))
        if strings:
            print(f"skipped {m}: string inputs {', '.join(strings)} (kiln bench reads .npy numbers)",
                  file=sys.stderr)
            continue
        for threads in [int(t) for t in args.threads.split(",")]:
            so = ort.SessionOptions()
            so.log_severity_level = 3
            so.intra_op_num_threads = threads
            so.inter_op_num_threads = 1
            so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
            out_dir = os.path.join(args.out, m)
            feeds = inputs_of(os.path.join(args.zoo, m), out_dir, sess)
            npys = [os.path.join(out_dir, f"{k}.npy") for k in range(len(feeds))]
            # As many runs per round as take about --seconds on onnxruntime, timed warm
            # (the first run is cold), so a model of a few microseconds gets enough runs
            # that one host hiccup does not move its median.
            sess.run(None, feeds)
            t = time.perf_counter()
            for _ in range(5):
                sess.run(None, feeds)
            one = max((time.perf_counter() - t) / 5, 1e-6)
            n = max(5, min(100_000, int(args.seconds / one)))
            ov = openvino_run(model, threads, feeds)
            k_t, o_t, v_t = [], [], []
            for _ in range(args.rounds):
                o_t.append(timed(lambda: sess.run(None, feeds), n))
                if ov:
                    v_t.append(timed(ov, n))
                k_t.append(kiln_round(args.kiln, model, npys, threads, n)["median_ms"])
            k, o = statistics.median(k_t), statistics.median(o_t)
            v = statistics.median(v_t) if v_t else None
            rows.append((m, threads, k, o, v))
            vs = f"  openvino {v:9.3f} ms {k / v:5.2f}" if v else ""
            print(f"{m:34} {threads} thr  kiln {k:9.3f} ms  ort {o:9.3f} ms  {k / o:5.2f}{vs}", file=sys.stderr)
    print("| model | threads | Kiln ms | onnxruntime ms | OpenVINO ms | Kiln / onnxruntime | Kiln / OpenVINO |")
    print("|---|---|---|---|---|---|---|")
    for m, threads, k, o, v in rows:
        vms, vr = (f"{v:.3f}", f"{k / v:.2f}") if v else ("-", "-")
        print(f"| {m} | {threads} | {k:.3f} | {o:.3f} | {vms} | {k / o:.2f} | {vr} |")
    for threads in sorted({r[1] for r in rows}):
        ratios = [r[2] / r[3] for r in rows if r[1] == threads]
        vr = [r[2] / r[4] for r in rows if r[1] == threads and r[4]]
        print(f"\nGeometric mean at {threads} thread(s): Kiln / onnxruntime {geomean(ratios):.2f}"
              + (f", Kiln / OpenVINO {geomean(vr):.2f} over {len(vr)} models" if vr else ""))


if __name__ == "__main__":
    main()
