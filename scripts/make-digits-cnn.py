#!/usr/bin/env python3
"""Writes examples/data/digits_cnn.onnx, the model `make demo` imports: a small CNN
trained on the UCI handwritten digits (examples/data/digits.bin, see make-digits.py),
written the way PyTorch's exporter writes such a network (opset 17, `/layer/Op` node
names, a symbolic batch axis, Gemm with transB), with a softmax and an argmax head so
that its outputs read as digits. Also writes examples/data/digits_test16.npy, the first
16 test images as float32 [16, 1, 8, 8], and prints their labels.

    x [N,1,8,8] -> Conv 16 3x3 pad 1 -> Relu -> MaxPool 2x2 -> Flatten [N,256]
                -> Gemm 64 -> Relu -> Gemm 10 -> logits
                   logits -> Softmax -> probs;  logits -> ArgMax -> label

Trained here in NumPy (im2col convolution, plain backpropagation, Adam, seeded), then
checked with onnxruntime: the file must give the same test accuracy as NumPy.

    python=$(scripts/py-env.sh) && $python scripts/make-digits-cnn.py
"""
import struct
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SEED = 2026
EPOCHS = 30
BATCH = 64
LR = 2e-3


def load_digits(path):
    data = open(path, "rb").read()
    assert data[:8] == b"KDIGITS1", "not a digits file"
    n_train, n_test, rows, cols = struct.unpack("<4I", data[8:24])
    off = 24

    def take(n):
        nonlocal off
        x = np.frombuffer(data, np.uint8, n * rows * cols, off).reshape(n, 1, rows, cols)
        off += n * rows * cols
        y = np.frombuffer(data, np.uint8, n, off).astype(np.int64)
        off += n
        return x.astype(np.float32) / 16.0, y

    return take(n_train), take(n_test)


def im2col(x):
    """[N,C,8,8] -> [N*64, C*9] patches of a 3x3 window, padding 1."""
    n, c, h, w = x.shape
    p = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([p[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3)], axis=2)
    return cols.transpose(0, 3, 4, 1, 2).reshape(n * h * w, c * 9)


class Model:
    def __init__(self, rng):
        def he(shape, fan_in):
            return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

        self.p = {
            "conv.weight": he((16, 1, 3, 3), 9),
            "conv.bias": np.zeros(16, np.float32),
            "fc1.weight": he((64, 256), 256),
            "fc1.bias": np.zeros(64, np.float32),
            "fc2.weight": he((10, 64), 64),
            "fc2.bias": np.zeros(10, np.float32),
        }

    def forward(self, x):
        p, n = self.p, x.shape[0]
        cols = im2col(x)
        conv = (cols @ p["conv.weight"].reshape(16, 9).T + p["conv.bias"]).reshape(n, 8, 8, 16)
        relu = np.maximum(conv, 0)
        win = relu.reshape(n, 4, 2, 4, 2, 16).transpose(0, 1, 3, 5, 2, 4).reshape(n, 4, 4, 16, 4)
        pooled = win.max(axis=4)  # [n, 4, 4, 16]
        flat = pooled.transpose(0, 3, 1, 2).reshape(n, 256)  # NCHW flatten, as ONNX does
        h = flat @ p["fc1.weight"].T + p["fc1.bias"]
        hr = np.maximum(h, 0)
        logits = hr @ p["fc2.weight"].T + p["fc2.bias"]
        return logits, (cols, conv, win, flat, h, hr)

    def backward(self, dlogits, cache):
        p, g = self.p, {}
        cols, conv, win, flat, h, hr = cache
        n = dlogits.shape[0]
        g["fc2.weight"], g["fc2.bias"] = dlogits.T @ hr, dlogits.sum(0)
        dh = (dlogits @ p["fc2.weight"]) * (h > 0)
        g["fc1.weight"], g["fc1.bias"] = dh.T @ flat, dh.sum(0)
        dpooled = (dh @ p["fc1.weight"]).reshape(n, 16, 4, 4).transpose(0, 2, 3, 1)
        arg = win.argmax(axis=4)
        dwin = np.zeros_like(win)
        np.put_along_axis(dwin, arg[..., None], dpooled[..., None], axis=4)
        drelu = dwin.reshape(n, 4, 4, 16, 2, 2).transpose(0, 1, 4, 2, 5, 3).reshape(n, 8, 8, 16)
        dconv = (drelu * (conv > 0)).reshape(n * 64, 16)
        g["conv.weight"] = (dconv.T @ cols).reshape(16, 1, 3, 3)
        g["conv.bias"] = dconv.sum(0)
        return g


def softmax_xent(logits, y):
    z = logits - logits.max(1, keepdims=True)
    e = np.exp(z)
    probs = e / e.sum(1, keepdims=True)
    loss = -np.log(probs[np.arange(len(y)), y]).mean()
    d = probs
    d[np.arange(len(y)), y] -= 1
    return loss, d / len(y)


def train(x, y, rng):
    model = Model(rng)
    m = {k: np.zeros_like(v) for k, v in model.p.items()}
    v = {k: np.zeros_like(v) for k, v in model.p.items()}
    step = 0
    for epoch in range(EPOCHS):
        order = rng.permutation(len(y))
        total = 0.0
        for s in range(0, len(y), BATCH):
            idx = order[s:s + BATCH]
            logits, cache = model.forward(x[idx])
            loss, d = softmax_xent(logits, y[idx])
            total += loss * len(idx)
            grads = model.backward(d, cache)
            step += 1
            for k, gk in grads.items():
                m[k] = 0.9 * m[k] + 0.1 * gk
                v[k] = 0.999 * v[k] + 0.001 * gk * gk
                mh, vh = m[k] / (1 - 0.9**step), v[k] / (1 - 0.999**step)
                model.p[k] = (model.p[k] - LR * mh / (np.sqrt(vh) + 1e-8)).astype(np.float32)
        print(f"epoch {epoch + 1:2d}  loss {total / len(y):.4f}", file=sys.stderr)
    return model


def to_onnx(model):
    p = model.p
    nodes = [
        helper.make_node("Conv", ["input", "conv.weight", "conv.bias"], ["/conv/Conv_output_0"],
                         name="/conv/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Relu", ["/conv/Conv_output_0"], ["/relu/Relu_output_0"], name="/relu/Relu"),
        helper.make_node("MaxPool", ["/relu/Relu_output_0"], ["/pool/MaxPool_output_0"], name="/pool/MaxPool",
                         kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["/pool/MaxPool_output_0"], ["/Flatten_output_0"], name="/Flatten", axis=1),
        helper.make_node("Gemm", ["/Flatten_output_0", "fc1.weight", "fc1.bias"], ["/fc1/Gemm_output_0"],
                         name="/fc1/Gemm", alpha=1.0, beta=1.0, transB=1),
        helper.make_node("Relu", ["/fc1/Gemm_output_0"], ["/relu_1/Relu_output_0"], name="/relu_1/Relu"),
        helper.make_node("Gemm", ["/relu_1/Relu_output_0", "fc2.weight", "fc2.bias"], ["logits"],
                         name="/fc2/Gemm", alpha=1.0, beta=1.0, transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], name="/Softmax", axis=1),
        helper.make_node("ArgMax", ["logits"], ["label"], name="/ArgMax", axis=1, keepdims=0),
    ]
    inits = [numpy_helper.from_array(v, k) for k, v in p.items()]
    graph = helper.make_graph(
        nodes, "main_graph",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10]),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["batch", 10]),
         helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"])],
        inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch",
                          producer_version="2.5.0")
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def main():
    digits = sys.argv[1] if len(sys.argv) > 1 else "examples/data/digits.bin"
    out = sys.argv[2] if len(sys.argv) > 2 else "examples/data/digits_cnn.onnx"
    sample = sys.argv[3] if len(sys.argv) > 3 else "examples/data/digits_test16.npy"
    (xtr, ytr), (xte, yte) = load_digits(digits)
    model = train(xtr, ytr, np.random.default_rng(SEED))
    numpy_acc = (model.forward(xte)[0].argmax(1) == yte).mean()
    m = to_onnx(model)
    onnx.save(m, out)
    sess = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
    label = sess.run(["label"], {"input": xte})[0]
    ort_acc = (label == yte).mean()
    print(f"test accuracy: numpy {numpy_acc:.4f}, onnxruntime {ort_acc:.4f}", file=sys.stderr)
    assert abs(numpy_acc - ort_acc) < 1e-9 and ort_acc > 0.97, "the exported model disagrees or is weak"
    np.save(sample, np.ascontiguousarray(xte[:16]))
    print("labels of", sample, ":", " ".join(str(v) for v in yte[:16]))


if __name__ == "__main__":
    main()
