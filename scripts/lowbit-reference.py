"""Writes tests/onnx/lowbit_reference.txt: what ml_dtypes and ONNX's reference make of
every float8/float4 code and of chosen values cast to the low-bit dtypes (ties, the
values around them, the overflow boundary, specials), for `tensor::lowbit`'s tests.

Run with the project's Python (scripts/py-env.sh): target/py/bin/python scripts/lowbit-reference.py
A line `decode <fmt>` or `encode <fmt> <saturate> <round_mode>` starts a section of
`<f32 bits> <code>` lines (bits in hex, code in decimal).
"""
import sys

import ml_dtypes
import numpy as np
import onnx
from onnx.reference.ops.op_cast import cast_to

FORMATS = {
    "f8e4m3fn": (ml_dtypes.float8_e4m3fn, onnx.TensorProto.FLOAT8E4M3FN, 256),
    "f8e4m3fnuz": (ml_dtypes.float8_e4m3fnuz, onnx.TensorProto.FLOAT8E4M3FNUZ, 256),
    "f8e5m2": (ml_dtypes.float8_e5m2, onnx.TensorProto.FLOAT8E5M2, 256),
    "f8e5m2fnuz": (ml_dtypes.float8_e5m2fnuz, onnx.TensorProto.FLOAT8E5M2FNUZ, 256),
    "f8e8m0": (ml_dtypes.float8_e8m0fnu, onnx.TensorProto.FLOAT8E8M0, 256),
    "f4e2m1": (ml_dtypes.float4_e2m1fn, onnx.TensorProto.FLOAT4E2M1, 16),
    "i4": (ml_dtypes.int4, onnx.TensorProto.INT4, 16),
    "u4": (ml_dtypes.uint4, onnx.TensorProto.UINT4, 16),
    "i2": (ml_dtypes.int2, onnx.TensorProto.INT2, 4),
    "u2": (ml_dtypes.uint2, onnx.TensorProto.UINT2, 4),
}


def bits(v):
    return f"{np.float32(v).view(np.uint32):08x}"


def main(out):
    rng = np.random.RandomState(22)
    for name, (dt, _, n) in FORMATS.items():
        if name[0] in "iu":
            continue
        codes = np.arange(n, dtype=np.uint8)
        out.write(f"decode {name}\n")
        for c, v in zip(codes, codes.view(dt).astype(np.float32)):
            out.write(f"{bits(v)} {c}\n")
    for name, (dt, code, n) in FORMATS.items():
        if name[0] in "iu":
            # In range only: ONNX leaves a float cast to a fixed-point type undefined
            # out of range, and ml_dtypes changed its answer there (0.5 wraps, 0.7 gives
            # 0); Kiln saturates, tested in tensor::lowbit's own tests.
            info = dt(0).dtype
            lo, hi = int(ml_dtypes.iinfo(info).min), int(ml_dtypes.iinfo(info).max)
            values = np.arange(-40, 41, dtype=np.float32) / 4
            values = values[(np.trunc(values) >= lo) & (np.trunc(values) <= hi)]
        else:
            finite = np.arange(n, dtype=np.uint8).view(dt).astype(np.float32)
            finite = np.unique(finite[np.isfinite(finite)])
            mids = (finite[:-1] + finite[1:]) / 2
            # Just below and above every tie (the first 64 and the top 16: the rest are
            # the same binade pattern scaled).
            picked = np.concatenate([mids[:64], mids[-16:]])
            near = np.concatenate([np.nextafter(picked, -np.inf), np.nextafter(picked, np.inf)])
            top = float(finite[-1])
            specials = [0.0, -0.0, np.inf, -np.inf, np.nan, top * 1.03, top * 1.1, -top * 2, 1e-30]
            randoms = (rng.randn(40) * np.exp2(rng.uniform(-12, 12, 40))).astype(np.float32)
            values = np.concatenate([finite, -finite[::8], mids, -mids[::8], near, specials, randoms])
        with np.errstate(over="ignore"):
            values = values.astype(np.float32)
        modes = ["up", "down", "nearest"] if name == "f8e8m0" else ["up"]
        for saturate in [1, 0]:
            for mode in modes:
                got = cast_to(values, code, bool(saturate), mode)
                out.write(f"encode {name} {saturate} {mode}\n")
                for v, c in zip(values, np.asarray(got).view(np.uint8)):
                    out.write(f"{bits(v)} {c}\n")


if __name__ == "__main__":
    main(sys.stdout)
