"""Writes one small model per com.microsoft contrib op and attribute variant, with random
inputs and onnxruntime's outputs, into OUT/<case>/ in the ONNX node suite's layout
(model.onnx, test_data_set_0/input_<k>.pb, output_<k>.pb). tests/onnx_contrib.rs runs
each on Kiln's backends and compares.

Usage: contrib-cases.py OUT
"""
import os
import shutil
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

MS = "com.microsoft"
F32 = np.float32


class Cases:
    def __init__(self, out):
        self.out = out
        self.rng = np.random.default_rng(22)
        self.names = []

    def f(self, *shape, scale=1.0):
        return (self.rng.standard_normal(shape) * scale).astype(F32)

    def ints(self, dtype, lo, hi, *shape):
        return self.rng.integers(lo, hi, size=shape, endpoint=True).astype(dtype)

    def case(
        self, name, op, inputs, outputs, opset=17, domain=MS, ort_domain=None, numpy=None, **attrs
    ):
        """One `op` node of `domain` reading `inputs` (name -> array; None for an omitted
        optional input) and writing `outputs` (names; "" for an unused output). The
        reference runs the node in `ort_domain` when onnxruntime registers the op there
        only (its LayerNormalization); `numpy` computes the outputs instead, for the ops
        onnxruntime implements on GPUs only."""
        names = [k if v is not None else "" for k, v in inputs.items()]
        node = helper.make_node(op, names, outputs, domain=domain, **attrs)
        reference = None
        if ort_domain is not None:
            reference = helper.make_node(op, names, outputs, domain=ort_domain, **attrs)
        self.graph(name, [node], inputs, [o for o in outputs if o], opset, reference, numpy)

    def graph(self, name, nodes, inputs, outputs, opset=17, reference=None, numpy=None):
        given = {k: v for k, v in inputs.items() if v is not None}
        graph_inputs = [
            helper.make_tensor_value_info(
                k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape)
            )
            for k, v in given.items()
        ]
        # Outputs are declared without a type; onnxruntime infers them.
        graph_outputs = [helper.make_empty_tensor_value_info(o) for o in outputs]
        model = helper.make_model(
            helper.make_graph(nodes, name, graph_inputs, graph_outputs),
            opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)],
        )
        model.ir_version = 8
        ran = model
        if reference is not None:
            ran = onnx.ModelProto()
            ran.CopyFrom(model)
            del ran.graph.node[:]
            ran.graph.node.append(reference)
        if numpy is not None:
            results = numpy(**given)
        else:
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            # One thread: DynamicQuantizeLSTM quantizes per chunk of rows it runs in parallel.
            options.intra_op_num_threads = 1
            session = ort.InferenceSession(
                ran.SerializeToString(), options, providers=["CPUExecutionProvider"]
            )
            results = session.run(outputs, given)
        folder = os.path.join(self.out, name)
        data = os.path.join(folder, "test_data_set_0")
        os.makedirs(data)
        onnx.save(model, os.path.join(folder, "model.onnx"))
        for k, (n, v) in enumerate(given.items()):
            save(numpy_helper.from_array(v, n), os.path.join(data, f"input_{k}.pb"))
        for k, (n, v) in enumerate(zip(outputs, results)):
            save(numpy_helper.from_array(v, n), os.path.join(data, f"output_{k}.pb"))
        self.names.append(name)


def save(t, path):
    with open(path, "wb") as f:
        f.write(t.SerializeToString())


def gelus(c):
    c.case("gelu", "Gelu", {"x": c.f(2, 3, 8, scale=2)}, ["y"])
    c.case("bias_gelu", "BiasGelu", {"a": c.f(2, 3, 8, scale=2), "b": c.f(8)}, ["y"])
    c.case("fast_gelu", "FastGelu", {"x": c.f(2, 3, 8, scale=2)}, ["y"])
    c.case("fast_gelu_bias", "FastGelu", {"x": c.f(2, 3, 8, scale=2), "bias": c.f(8)}, ["y"])
    c.case("quick_gelu", "QuickGelu", {"x": c.f(2, 3, 8, scale=2)}, ["y"])
    c.case("quick_gelu_alpha", "QuickGelu", {"x": c.f(2, 3, 8, scale=2)}, ["y"], alpha=0.9)


def norms(c):
    x, g, b = c.f(2, 3, 8, scale=2) + 1, c.f(8), c.f(8)
    # onnxruntime registers these two in the default domain only (for every opset), but
    # models name LayerNormalization in com.microsoft too.
    c.case(
        "layer_norm",
        "LayerNormalization",
        {"x": x, "g": g, "b": b},
        ["y", "mean", "inv_std"],
        ort_domain="",
    )
    c.case(
        "layer_norm_axis1_no_bias",
        "LayerNormalization",
        {"x": x, "g": c.f(3, 8)},
        ["y"],
        ort_domain="",
        axis=1,
        epsilon=1e-3,
    )
    c.case(
        "simplified_layer_norm",
        "SimplifiedLayerNormalization",
        {"x": x, "g": g},
        ["y"],
        domain="",
        opset=13,
    )
    skip = c.f(2, 3, 8)
    c.case(
        "skip_layer_norm",
        "SkipLayerNormalization",
        {"x": x, "skip": skip, "g": g, "b": b, "bias": c.f(8)},
        ["y", "", "", "sum"],
        epsilon=1e-6,
    )
    c.case(
        "skip_layer_norm_plain",
        "SkipLayerNormalization",
        {"x": x, "skip": skip, "g": g},
        ["y"],
    )
    c.case(
        "skip_layer_norm_2d",
        "SkipLayerNormalization",
        {"x": c.f(5, 8), "skip": c.f(5, 8), "g": g, "b": b},
        ["y"],
    )
    c.case(
        "skip_simplified_layer_norm",
        "SkipSimplifiedLayerNormalization",
        {"x": x, "skip": skip, "g": g},
        ["y", "", "", "sum"],
    )
    c.case(
        "bias_add",
        "BiasAdd",
        {"x": c.f(2, 3, 320), "bias": c.f(320), "skip": c.f(2, 3, 320)},
        ["y"],
        numpy=lambda x, bias, skip: [x + bias + skip],
    )


def matmuls(c):
    c.case("fused_matmul", "FusedMatMul", {"a": c.f(2, 3, 4), "b": c.f(2, 4, 5)}, ["y"], alpha=0.5)
    c.case(
        "fused_matmul_trans",
        "FusedMatMul",
        {"a": c.f(2, 4, 3), "b": c.f(5, 4)},
        ["y"],
        transA=1,
        transB=1,
    )
    x, w, bias = c.f(1, 3, 8, 8), c.f(4, 3, 3, 3), c.f(4)
    for act, params in [
        ("Relu", None),
        ("Tanh", None),
        ("Sigmoid", None),
        ("LeakyRelu", [0.1]),
        ("Clip", [-0.5, 0.5]),
        ("HardSigmoid", [0.3, 0.4]),
    ]:
        attrs = {"activation": act, "pads": [1, 1, 1, 1]}
        if params:
            attrs["activation_params"] = params
        c.case(f"fused_conv_{act.lower()}", "FusedConv", {"x": x, "w": w, "b": bias}, ["y"], **attrs)
    c.case(
        "fused_conv_sum",
        "FusedConv",
        {"x": x, "w": w, "b": bias, "z": c.f(1, 4, 3, 3)},
        ["y"],
        activation="Relu",
        strides=[2, 2],
    )


def quantized(c):
    for t, lo, hi in [(np.uint8, 0, 255), (np.int8, -128, 127)]:
        tn = "u8" if t == np.uint8 else "i8"
        for op in ["QLinearAdd", "QLinearMul"]:
            c.case(
                f"{op.lower()}_{tn}",
                op,
                {
                    "a": c.ints(t, lo, hi, 2, 3, 4),
                    "a_scale": np.array(0.05, F32),
                    "a_zero": np.array(lo + 100, t),
                    "b": c.ints(t, lo, hi, 4),
                    "b_scale": np.array(0.02, F32),
                    "b_zero": np.array(lo + 120, t),
                    "c_scale": np.array(0.1 if op == "QLinearAdd" else 0.5, F32),
                    "c_zero": np.array(lo + 128, t),
                },
                ["y"],
            )
    for name, extra, attrs in [
        ("qgemm", {"y_scale": np.array(0.05, F32), "y_zero": np.array(128, np.uint8)}, {}),
        ("qgemm_float_trans_b", {}, {"transB": 1, "alpha": 0.5}),
        ("qgemm_i8_out", {"y_scale": np.array(0.07, F32), "y_zero": np.array(3, np.int8)}, {}),
    ]:
        trans_b = attrs.get("transB", 0)
        # onnxruntime's kernel wants y's type to be A's.
        at, lo, hi = (np.int8, -128, 127) if name.endswith("i8_out") else (np.uint8, 0, 255)
        c.case(
            name,
            "QGemm",
            {
                "a": c.ints(at, lo, hi, 3, 8),
                "a_scale": np.array(0.01, F32),
                "a_zero": np.array(lo + 120, at),
                "b": c.ints(np.int8, -127, 127, *((5, 8) if trans_b else (8, 5))),
                "b_scale": np.abs(c.f(5, scale=0.01)) + 0.001,
                "b_zero": np.zeros(5, np.int8),
                "c": c.ints(np.int32, -3000, 3000, 5),
            }
            | extra,
            ["y"],
            **attrs,
        )
    for name, t, lo, hi, shape, attrs in [
        ("qlinear_global_average_pool", np.uint8, 0, 255, (2, 3, 5, 4), {}),
        ("qlinear_global_average_pool_channels_last", np.int8, -128, 127, (2, 5, 4, 3), {"channels_last": 1}),
    ]:
        c.case(
            name,
            "QLinearGlobalAveragePool",
            {
                "x": c.ints(t, lo, hi, *shape),
                "x_scale": np.array(0.03, F32),
                "x_zero": np.array(lo + 110, t),
                "y_scale": np.array(0.02, F32),
                "y_zero": np.array(lo + 130, t),
            },
            ["y"],
            **attrs,
        )
    a = c.f(2, 3, 8)
    c.case(
        "dynamic_quantize_matmul",
        "DynamicQuantizeMatMul",
        {
            "a": a,
            "b": c.ints(np.int8, -127, 127, 8, 5),
            "b_scale": np.array([0.01], F32),
            "b_zero": np.array([0], np.int8),
            "bias": c.f(5),
        },
        ["y"],
    )
    c.case(
        "dynamic_quantize_matmul_u8_per_column",
        "DynamicQuantizeMatMul",
        {
            "a": a,
            "b": c.ints(np.uint8, 0, 255, 8, 5),
            "b_scale": c.f(5, scale=0.01) ** 2 + 0.001,
            "b_zero": c.ints(np.uint8, 100, 150, 5),
        },
        ["y"],
    )
    c.case(
        "matmul_integer_to_float",
        "MatMulIntegerToFloat",
        {
            "a": c.ints(np.uint8, 0, 255, 2, 3, 8),
            "b": c.ints(np.int8, -127, 127, 8, 5),
            "a_scale": np.array(0.02, F32),
            "b_scale": c.f(5, scale=0.01) ** 2 + 0.001,
            "a_zero": np.array(120, np.uint8),
            "b_zero": c.ints(np.int8, -3, 3, 5),
            "bias": c.f(5),
        },
        ["y"],
    )
    c.case(
        "matmul_integer_to_float_plain",
        "MatMulIntegerToFloat",
        {
            "a": c.ints(np.uint8, 0, 255, 3, 8),
            "b": c.ints(np.uint8, 0, 255, 8, 5),
            "a_scale": np.array(0.02, F32),
            "b_scale": np.array(0.03, F32),
        },
        ["y"],
    )


def lstms(c):
    seq, batch, inp, hidden = 5, 3, 6, 4
    for name, direction, dirs, extra in [
        ("dynamic_quantize_lstm", "forward", 1, {}),
        ("dynamic_quantize_lstm_reverse_lens", "reverse", 1, {"lens": True}),
        ("dynamic_quantize_lstm_bidirectional_u8", "bidirectional", 2, {"u8": True}),
    ]:
        u8 = extra.get("u8", False)
        wt, lo, hi = (np.uint8, 0, 255) if u8 else (np.int8, -127, 127)
        zero = np.full(dirs, 128 if u8 else 0, wt)
        inputs = {
            "x": c.f(seq, batch, inp),
            "w": c.ints(wt, lo, hi, dirs, inp, 4 * hidden),
            "r": c.ints(wt, lo, hi, dirs, hidden, 4 * hidden),
            "b": c.f(dirs, 8 * hidden, scale=0.1),
            "lens": np.array([5, 2, 4], np.int32) if extra.get("lens") else None,
            "h0": c.f(dirs, batch, hidden, scale=0.5),
            "c0": c.f(dirs, batch, hidden, scale=0.5),
            "p": None,
            "w_scale": (np.abs(c.f(dirs, 4 * hidden)) * 0.004 + 0.001) if u8 else np.full(dirs, 0.004, F32),
            "w_zero": zero if not u8 else np.full((dirs, 4 * hidden), 128, wt),
            "r_scale": np.full(dirs, 0.005, F32),
            "r_zero": zero,
        }
        c.case(
            name,
            "DynamicQuantizeLSTM",
            inputs,
            ["y", "y_h", "y_c"],
            hidden_size=hidden,
            direction=direction,
        )


def attentions(c):
    b, s, hidden, heads = 2, 4, 8, 2
    x = c.f(b, s, hidden)
    w, bias = c.f(hidden, 3 * hidden, scale=0.5), c.f(3 * hidden)
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0]], np.int32)
    c.case("attention", "Attention", {"x": x, "w": w, "bias": bias}, ["y"], num_heads=heads)
    c.case(
        "attention_mask",
        "Attention",
        {"x": x, "w": w, "bias": bias, "mask": mask},
        ["y"],
        num_heads=heads,
    )
    c.case(
        "attention_unidirectional",
        "Attention",
        {"x": x, "w": w, "bias": bias, "mask": mask},
        ["y"],
        num_heads=heads,
        unidirectional=1,
    )
    c.case(
        "qattention",
        "QAttention",
        {
            "x": c.ints(np.uint8, 0, 255, b, s, hidden),
            "w": c.ints(np.int8, -127, 127, hidden, 3 * hidden),
            "bias": bias,
            "x_scale": np.array(0.01, F32),
            "w_scale": np.array(0.02, F32),
            "mask": mask,
            "x_zero": np.array(128, np.uint8),
            "w_zero": np.array(0, np.int8),
        },
        ["y"],
        num_heads=heads,
    )
    q, k, v = c.f(b, s, hidden), c.f(b, 5, hidden), c.f(b, 5, hidden)
    c.case("multi_head_attention", "MultiHeadAttention", {"q": q, "k": k, "v": v}, ["y"], num_heads=heads)
    c.case(
        "multi_head_attention_bias_mask",
        "MultiHeadAttention",
        {
            "q": q,
            "k": k,
            "v": v,
            "bias": c.f(3 * hidden),
            "mask": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], np.int32),
        },
        ["y"],
        num_heads=heads,
        scale=0.3,
    )
    ids = c.ints(np.int32, 0, 9, b, s)
    inputs = {
        "ids": ids,
        "segments": c.ints(np.int32, 0, 1, b, s),
        "word": c.f(10, hidden),
        "position": c.f(16, hidden),
        "segment": c.f(2, hidden),
        "g": c.f(hidden),
        "beta": c.f(hidden),
        "mask": mask,
    }
    c.case("embed_layer_norm", "EmbedLayerNormalization", inputs, ["y", "mask_index"])
    c.case(
        "embed_layer_norm_no_segment",
        "EmbedLayerNormalization",
        dict(inputs, segments=None, segment=None, mask=None),
        ["y", "mask_index"],
        epsilon=1e-3,
    )


def main():
    out = sys.argv[1]
    if os.path.exists(out):
        shutil.rmtree(out)
    c = Cases(out)
    for family in [gelus, norms, matmuls, quantized, lstms, attentions]:
        family(c)
    print(f"{len(c.names)} contrib cases in {out}")


if __name__ == "__main__":
    main()
