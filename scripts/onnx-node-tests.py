#!/usr/bin/env python3
"""Writes the ONNX backend node test suite in its classic layout:
    <out>/<case>/model.onnx
    <out>/<case>/tolerance.txt            (rtol atol)
    <out>/<case>/test_data_set_<k>/input_<i>.pb, output_<i>.pb
onnx 1.23 wheels no longer ship data/node; the cases are generated in memory by
onnx.backend.test.loader.load_node_model_tests(). Usage: onnx-node-tests.py OUT_DIR
"""
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.test.loader import load_node_model_tests


def proto_of(x):
    if isinstance(x, onnx.TensorProto):
        return x
    if isinstance(x, list):
        return numpy_helper.from_list(x)
    if x is None:
        return numpy_helper.from_optional(None)
    return numpy_helper.from_array(np.asarray(x))


def main(out):
    warnings.simplefilter("ignore")
    cases = load_node_model_tests()
    for case in cases:
        d = os.path.join(out, case.name)
        os.makedirs(d, exist_ok=True)
        onnx.save(case.model, os.path.join(d, "model.onnx"))
        with open(os.path.join(d, "tolerance.txt"), "w") as f:
            f.write(f"{case.rtol} {case.atol}\n")
        for k, (inputs, outputs) in enumerate(case.data_sets or []):
            ds = os.path.join(d, f"test_data_set_{k}")
            os.makedirs(ds, exist_ok=True)
            for kind, values in (("input", inputs), ("output", outputs)):
                for i, x in enumerate(values):
                    with open(os.path.join(ds, f"{kind}_{i}.pb"), "wb") as f:
                        f.write(proto_of(x).SerializeToString())
    print(f"onnx {onnx.__version__}: {len(cases)} node cases in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
