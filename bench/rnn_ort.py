"""onnxruntime's time for one LSTM or GRU layer, the single-op model benches/rnn.rs times
Kiln on (random weights with a bias, forward, no initial state).

Usage: rnn_ort.py OP SEQ BATCH INPUT HIDDEN THREADS
Prints the median milliseconds per run.
"""
import statistics
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
import onnxruntime as ort


def main():
    op = sys.argv[1]
    seq, batch, inp, hidden, threads = map(int, sys.argv[2:7])
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    rng = np.random.default_rng(0)
    scale = 1.0 / np.sqrt(hidden)
    w = (rng.uniform(-scale, scale, (1, gates * hidden, inp))).astype(np.float32)
    r = (rng.uniform(-scale, scale, (1, gates * hidden, hidden))).astype(np.float32)
    b = (rng.uniform(-scale, scale, (1, 2 * gates * hidden))).astype(np.float32)
    node = helper.make_node(op, ["x", "w", "r", "b"], ["y", "y_h"], hidden_size=hidden)
    graph = helper.make_graph(
        [node], "rnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, inp])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("y_h", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(r, "r"),
         numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    x = rng.standard_normal((seq, batch, inp)).astype(np.float32)
    for _ in range(3):
        sess.run(None, {"x": x})
    times = []
    deadline = time.perf_counter() + 2.0
    while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 200):
        t = time.perf_counter()
        sess.run(None, {"x": x})
        times.append((time.perf_counter() - t) * 1e3)
    print(f"{statistics.median(times):.4f}")


if __name__ == "__main__":
    main()
