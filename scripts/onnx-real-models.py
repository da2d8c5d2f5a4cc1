#!/usr/bin/env python3
"""Exporter-style ONNX models, built with onnx.helper and seeded random weights, run
through Kiln (the `kiln` CLI, every backend given) and through onnxruntime; outputs must
agree within rtol 1e-4, atol 1e-5. Usage: onnx-real-models.py KILN_BINARY OUT_DIR [BACKEND...]
(`cpu` runs the pass pipeline before the interpreter), or onnx-real-models.py --write-only
OUT_DIR to write the models alone (the benchmarks do).

Models: an MLP, a small CNN, ResNet-18 and ResNet-50 (un-fused BatchNormalization; run at
64x64 so that the reference interpreter stays quick; ResNet-50's spatial dims are
symbolic) and a 2-layer BERT-base-shaped encoder (hidden 768, 12 heads, Erf-GELU,
symbolic batch and sequence; layer 0 writes softmax and LayerNorm decomposed, as older
exporters do, layer 1 uses the ops).
"""
import os
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(2026)


class Builder:
    def __init__(self):
        self.nodes, self.inits, self.count = [], [], 0

    def name(self, base):
        self.count += 1
        return f"{base}_{self.count}"

    def weight(self, shape, scale=None, base="w"):
        scale = scale if scale is not None else 1.0 / np.sqrt(max(1, np.prod(shape[1:]) if len(shape) > 1 else shape[0]))
        arr = (rng.standard_normal(shape) * scale).astype(np.float32)
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(arr, n))
        return n

    def const(self, arr, base="c"):
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), n))
        return n

    def op(self, op, inputs, n_out=1, **attrs):
        outs = [self.name(op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.name(op), **attrs))
        return outs[0] if n_out == 1 else outs

    def model(self, name, inputs, outputs):
        g = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="kiln-real-models")
        m.ir_version = 8

        return m


def out_info(name, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, None)


def mlp():
    b = Builder()
    h = b.op("Gemm", ["x", b.weight([128, 64]), b.weight([128], 0.1)], transB=1)
    h = b.op("Relu", [h])
    h = b.op("Gemm", [h, b.weight([10, 128]), b.weight([10], 0.1)], transB=1)
    y = b.op("Softmax", [h], axis=-1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])
    return b.model("mlp", [x], [out_info(y)]), {"x": rng.standard_normal((4, 64)).astype(np.float32)}


def conv_bn_relu(b, x, cin, cout, k, stride, relu=True):
    y = b.op("Conv", [x, b.weight([cout, cin, k, k])], kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
    gamma = b.const((1.0 + 0.1 * rng.standard_normal(cout)).astype(np.float32))
    beta = b.const((0.1 * rng.standard_normal(cout)).astype(np.float32))
    mean = b.const((0.1 * rng.standard_normal(cout)).astype(np.float32))
    var = b.const((1.0 + 0.1 * rng.random(cout)).astype(np.float32))
    y = b.op("BatchNormalization", [y, gamma, beta, mean, var], epsilon=1e-5)
    return b.op("Relu", [y]) if relu else y


def small_cnn():
    b = Builder()
    h = b.op("Relu", [b.op("Conv", ["x", b.weight([8, 3, 3, 3]), b.weight([8], 0.1)], pads=[1, 1, 1, 1])])
    h = b.op("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = b.op("Relu", [b.op("Conv", [h, b.weight([16, 8, 3, 3])], pads=[1, 1, 1, 1])])
    h = b.op("Flatten", [b.op("GlobalAveragePool", [h])], axis=1)
    y = b.op("Gemm", [h, b.weight([10, 16]), b.weight([10], 0.1)], transB=1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 32, 32])
    return b.model("small_cnn", [x], [out_info(y)]), {"x": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)}


def resnet18():
    b = Builder()
    h = conv_bn_relu(b, "x", 3, 64, 7, 2)
    h = b.op("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, cout in enumerate([64, 128, 256, 512]):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            y = conv_bn_relu(b, h, cin, cout, 3, stride)
            y = conv_bn_relu(b, y, cout, cout, 3, 1, relu=False)
            skip = h if stride == 1 and cin == cout else conv_bn_relu(b, h, cin, cout, 1, stride, relu=False)
            h = b.op("Relu", [b.op("Add", [y, skip])])
            cin = cout
    h = b.op("Flatten", [b.op("GlobalAveragePool", [h])], axis=1)
    y = b.op("Gemm", [h, b.weight([1000, 512]), b.weight([1000], 0.1)], transB=1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])
    return b.model("resnet18", [x], [out_info(y)]), {"x": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}


def resnet50():
    b = Builder()
    h = conv_bn_relu(b, "x", 3, 64, 7, 2)
    h = b.op("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for stage, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)]):
        cout = width * 4
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            y = conv_bn_relu(b, h, cin, width, 1, 1)
            y = conv_bn_relu(b, y, width, width, 3, stride)
            y = conv_bn_relu(b, y, width, cout, 1, 1, relu=False)
            skip = h if block > 0 else conv_bn_relu(b, h, cin, cout, 1, stride, relu=False)
            h = b.op("Relu", [b.op("Add", [y, skip])])
            cin = cout
    h = b.op("Flatten", [b.op("GlobalAveragePool", [h])], axis=1)
    y = b.op("Gemm", [h, b.weight([1000, 2048]), b.weight([1000], 0.1)], transB=1)
    # Symbolic spatial dims: the tests run it at 64x64, the memory report at 224x224.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])
    return b.model("resnet50", [x], [out_info(y)]), {"x": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}


def layer_norm_decomposed(b, x, hidden):
    """LayerNormalization as exporters at opsets below 17 write it."""
    mean = b.op("ReduceMean", [x], axes=[-1])
    d = b.op("Sub", [x, mean])
    var = b.op("ReduceMean", [b.op("Pow", [d, b.const(np.float32(2.0))])], axes=[-1])
    normed = b.op("Div", [d, b.op("Sqrt", [b.op("Add", [var, b.const(np.float32(1e-12))])])])
    gamma = b.const((1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
    beta = b.const((0.1 * rng.standard_normal(hidden)).astype(np.float32))
    return b.op("Add", [b.op("Mul", [normed, gamma]), beta])


def softmax_decomposed(b, x):
    """Softmax over the last axis as a graph of primitive ops."""
    e = b.op("Exp", [b.op("Sub", [x, b.op("ReduceMax", [x], axes=[-1])])])
    return b.op("Div", [e, b.op("ReduceSum", [e, b.const(np.array([-1], dtype=np.int64))])])


def bert_encoder():
    b = Builder()
    hidden, heads, ffn = 768, 12, 3072
    head = hidden // heads
    h = b.op("Gather", [b.weight([1000, hidden], 0.02), "ids"], axis=0)
    split_heads = b.const(np.array([0, 0, heads, head], dtype=np.int64))
    merge_heads = b.const(np.array([0, 0, hidden], dtype=np.int64))
    # Layer 0 writes softmax and LayerNorm decomposed, as older exporters do; layer 1
    # uses the ops. The recognize pass turns the first into the second.
    for layer in range(2):
        def dense(x, n_in, n_out):
            return b.op("Add", [b.op("MatMul", [x, b.weight([n_in, n_out])]), b.weight([n_out], 0.02)])

        def heads_of(x):
            return b.op("Transpose", [b.op("Reshape", [x, split_heads])], perm=[0, 2, 1, 3])

        q, k, v = (heads_of(dense(h, hidden, hidden)) for _ in range(3))
        scores = b.op("Div", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]), b.const(np.float32(np.sqrt(head)))])
        probs = softmax_decomposed(b, scores) if layer == 0 else b.op("Softmax", [scores], axis=-1)
        ctx = b.op("MatMul", [probs, v])
        ctx = b.op("Reshape", [b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), merge_heads])
        attn_out = b.op("Add", [dense(ctx, hidden, hidden), h])
        if layer == 0:
            h = layer_norm_decomposed(b, attn_out, hidden)
        else:
            ln1 = [b.const(np.ones(hidden, np.float32)), b.const(np.zeros(hidden, np.float32))]
            h = b.op("LayerNormalization", [attn_out] + ln1, axis=-1, epsilon=1e-12)
        u = dense(h, hidden, ffn)
        gelu = b.op("Mul", [b.op("Mul", [u, b.const(np.float32(0.5))]),
                            b.op("Add", [b.op("Erf", [b.op("Div", [u, b.const(np.float32(np.sqrt(2.0)))])]), b.const(np.float32(1.0))])])
        ln2 = [b.const(np.ones(hidden, np.float32)), b.const(np.zeros(hidden, np.float32))]
        h = b.op("LayerNormalization", [b.op("Add", [dense(gelu, ffn, hidden), h])] + ln2, axis=-1, epsilon=1e-12)
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", "S"])
    return b.model("bert_encoder", [ids], [out_info(h)]), {"ids": rng.integers(0, 1000, (2, 16)).astype(np.int64)}


def main(kiln, out, backends):
    failures = 0
    for make in (mlp, small_cnn, resnet18, resnet50, bert_encoder):
        model, feeds = make()
        d = os.path.join(out, model.graph.name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "model.onnx")
        onnx.save(model, path)
        want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
        inputs = []
        for i in model.graph.input:
            p = os.path.join(d, f"{i.name}.npy")
            np.save(p, feeds[i.name])
            inputs.append(p)
        for backend in backends:
            res = os.path.join(d, backend)
            t = time.time()
            subprocess.run([kiln, "run", path, "--inputs", *inputs, "--outputs", res, "--backend", backend],
                           check=True, stdout=subprocess.DEVNULL)
            elapsed = time.time() - t
            for o, w in zip(model.graph.output, want):
                got = np.load(os.path.join(res, f"{o.name}.npy"))
                ok = got.shape == w.shape and np.allclose(got, w, rtol=1e-4, atol=1e-5)
                err = float(np.max(np.abs(got.astype(np.float64) - w))) if got.shape == w.shape else float("inf")
                print(f"{model.graph.name:13s} {backend:6s} {'ok  ' if ok else 'FAIL'} max |kiln - ort| = {err:.2e}  ({elapsed:.1f} s)")
                failures += not ok
    print(f"onnxruntime {ort.__version__}: {failures} mismatches")
    return failures


def write_only(out):
    for make in (mlp, small_cnn, resnet18, resnet50, bert_encoder):
        model, _ = make()
        d = os.path.join(out, model.graph.name)
        os.makedirs(d, exist_ok=True)
        onnx.save(model, os.path.join(d, "model.onnx"))


if __name__ == "__main__":
    if sys.argv[1] == "--write-only":
        write_only(sys.argv[2])
        sys.exit(0)
    sys.exit(1 if main(sys.argv[1], sys.argv[2], sys.argv[3:] or ["interp"]) else 0)
