#!/usr/bin/env python3
"""Writes examples/data/swish_mlp.onnx: a two-layer MLP whose activation is a custom op,
ScaledSwish (y = x * sigmoid(beta * x), beta = 1.5) of the domain "com.example", for
examples/{c,cpp}/custom_op.*. The weights are graph inputs (not initializers), so that
the examples can differentiate with respect to them and train.

  x [N, 4] -> MatMul W1 [4, 8] -> Add b1 [8] -> com.example::ScaledSwish
           -> MatMul W2 [8, 3] -> Add b2 [3] -> y [N, 3]

Plain Python with a minimal protobuf encoder (no onnx package needed); the field numbers
are onnx.proto's. Run from the repository root: python3 scripts/make-swish-mlp.py
"""
import struct
import sys


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, n):
    return varint(num << 3) + varint(n)


def field_bytes(num, data):
    if isinstance(data, str):
        data = data.encode()
    return varint((num << 3) | 2) + varint(len(data)) + data


def field_float(num, f):
    return varint((num << 3) | 5) + struct.pack("<f", f)


FLOAT = 1  # TensorProto.FLOAT, and AttributeProto.FLOAT


def value_info(name, dims):
    shape = b"".join(
        field_bytes(1, field_bytes(2, d) if isinstance(d, str) else field_varint(1, d))
        for d in dims
    )
    tensor_type = field_varint(1, FLOAT) + field_bytes(2, shape)
    return field_bytes(1, name) + field_bytes(2, field_bytes(1, tensor_type))


def node(op, inputs, outputs, name, domain="", attrs=b""):
    body = b"".join(field_bytes(1, i) for i in inputs)
    body += b"".join(field_bytes(2, o) for o in outputs)
    body += field_bytes(3, name) + field_bytes(4, op) + attrs
    if domain:
        body += field_bytes(7, domain)
    return body


def float_attr(name, value):
    return field_bytes(5, field_bytes(1, name) + field_float(2, value) + field_varint(20, FLOAT))


def opset(domain, version):
    return field_bytes(8, field_bytes(1, domain) + field_varint(2, version))


nodes = [
    node("MatMul", ["x", "W1"], ["h1"], "fc1"),
    node("Add", ["h1", "b1"], ["h2"], "fc1_bias"),
    node("ScaledSwish", ["h2"], ["a"], "act", "com.example", float_attr("beta", 1.5)),
    node("MatMul", ["a", "W2"], ["o1"], "fc2"),
    node("Add", ["o1", "b2"], ["y"], "fc2_bias"),
]
inputs = [("x", ["N", 4]), ("W1", [4, 8]), ("b1", [8]), ("W2", [8, 3]), ("b2", [3])]
graph = b"".join(field_bytes(1, n) for n in nodes) + field_bytes(2, "swish_mlp")
graph += b"".join(field_bytes(11, value_info(n, d)) for n, d in inputs)
graph += field_bytes(12, value_info("y", ["N", 3]))
model = field_varint(1, 8) + field_bytes(2, "kiln/scripts/make-swish-mlp.py")
model += field_bytes(7, graph) + opset("", 17) + opset("com.example", 1)

out = sys.argv[1] if len(sys.argv) > 1 else "examples/data/swish_mlp.onnx"
with open(out, "wb") as f:
    f.write(model)
print(f"wrote {out} ({len(model)} bytes)")
