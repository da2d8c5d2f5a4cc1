"""Where onnxruntime spends a model's time, by op type: the peer's side of Kiln's
KILN_PROFILE=1 breakdown, so that a gap can be pinned on one kernel family.

Usage: ort_profile.py MODEL_DIR THREADS [RUNS]   (MODEL_DIR as written by models.py)
"""
import collections
import glob
import json
import os
import sys

import numpy as np
import onnxruntime as ort


def main(d, threads, runs=20):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.enable_profiling = True
    so.profile_file_prefix = "/tmp/ort_profile"
    sess = ort.InferenceSession(os.path.join(d, "model.onnx"), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.load(os.path.join(d, f"{i.name}.npy")) for i in sess.get_inputs()}
    for _ in range(3):
        sess.run(None, feeds)
    for _ in range(runs):
        sess.run(None, feeds)
    path = sess.end_profiling()
    events = json.load(open(path))
    by_op = collections.defaultdict(float)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            by_op[e["args"]["op_name"]] += e["dur"] / 1e3
    total = sum(by_op.values())
    print(f"onnxruntime {ort.__version__}, {threads} thread(s), per run (mean of {runs + 3} incl. 3 warm-up):")
    for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1]):
        print(f"  {op:<24} {ms / (runs + 3):9.3f} ms  {100 * ms / total:5.1f}%")
    os.remove(path)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *(int(a) for a in sys.argv[3:]))
