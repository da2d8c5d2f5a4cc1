"""The benchmark models of issue 6's table, written as ONNX files with the same builder
as the real-model tests (scripts/onnx-real-models.py): MLP 784-512-512-10, a small CNN
on 28x28 images, ResNet-18 and ResNet-50 (224x224), a 2-layer BERT-base encoder.

Usage: models.py OUT_DIR  ->  OUT_DIR/<case>/model.onnx and OUT_DIR/<case>/<input>.npy
"""
import importlib.util
import os
import sys

import numpy as np
from onnx import TensorProto, helper

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("real", os.path.join(here, "..", "scripts", "onnx-real-models.py"))
real = importlib.util.module_from_spec(spec)
spec.loader.exec_module(real)
rng = np.random.default_rng(6)


def mlp():
    b = real.Builder()
    h = "x"
    for n_in, n_out in [(784, 512), (512, 512)]:
        h = b.op("Relu", [b.op("Gemm", [h, b.weight([n_out, n_in]), b.weight([n_out], 0.1)], transB=1)])
    y = b.op("Gemm", [h, b.weight([10, 512]), b.weight([10], 0.1)], transB=1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 784])
    return b.model("mlp", [x], [real.out_info(y)]), {"x": rng.standard_normal((64, 784)).astype(np.float32)}


def cnn():
    b = real.Builder()
    h = b.op("Relu", [b.op("Conv", ["x", b.weight([32, 1, 3, 3]), b.weight([32], 0.1)], pads=[1, 1, 1, 1])])
    h = b.op("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = b.op("Relu", [b.op("Conv", [h, b.weight([64, 32, 3, 3]), b.weight([64], 0.1)], pads=[1, 1, 1, 1])])
    h = b.op("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2])
    h = b.op("Flatten", [h], axis=1)
    h = b.op("Relu", [b.op("Gemm", [h, b.weight([128, 3136]), b.weight([128], 0.1)], transB=1)])
    y = b.op("Gemm", [h, b.weight([10, 128]), b.weight([10], 0.1)], transB=1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1, 28, 28])
    return b.model("cnn", [x], [real.out_info(y)]), {"x": rng.standard_normal((64, 1, 28, 28)).astype(np.float32)}


def image(model):
    m, _ = model()
    return m, {"x": rng.standard_normal((1, 3, 224, 224)).astype(np.float32)}


def bert():
    m, _ = real.bert_encoder()
    return m, {"ids": rng.integers(0, 1000, (1, 128)).astype(np.int64)}


CASES = {
    "mlp": mlp,
    "cnn": cnn,
    "resnet18": lambda: image(real.resnet18),
    "resnet50": lambda: image(real.resnet50),
    "bert": bert,
}


def main(out):
    import onnx

    for name, make in CASES.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        model, inputs = make()
        onnx.save(model, os.path.join(d, "model.onnx"))
        for k, v in inputs.items():
            np.save(os.path.join(d, f"{k}.npy"), v)


if __name__ == "__main__":
    main(sys.argv[1])
