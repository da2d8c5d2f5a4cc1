#!/usr/bin/env python3
"""Tree-ensemble and string models and onnxruntime's outputs on them, for
tests/onnx_ml.rs.

Usage: make-ml-fixtures.py [OUT_DIR] (default tests/onnx, the committed fixtures: trees/
and strings/).
Needs scikit-learn and skl2onnx besides onnx and onnxruntime
(`$(scripts/py-env.sh)`: skl2onnx and scikit-learn are in its lock).

Each case is a folder as in the ONNX node suite: model.onnx and
test_data_set_0/{input,output}_<i>.pb, the outputs onnxruntime's. The models are
small scikit-learn models exported by skl2onnx (decision trees, random forests,
gradient boosting, histogram gradient boosting with missing values; int and string
class labels) and hand-written ones for what skl2onnx never writes: the other branch
modes, aggregate functions, post-transforms, opset 3's `*_as_tensor` attributes and
opset 5's `TreeEnsemble` with set membership. The string cases are single nodes:
LabelEncoder in each of its forms, TfIdfVectorizer over strings, StringNormalizer,
StringSplit, StringConcat and RegexFullMatch.
"""
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from skl2onnx import to_onnx
from sklearn.datasets import make_classification, make_regression
from sklearn.ensemble import (
    GradientBoostingClassifier,
    GradientBoostingRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

SEED = 7
ROWS = 16


def write_case(out, name, model, x):
    case = os.path.join(out, name)
    data = os.path.join(case, "test_data_set_0")
    os.makedirs(data, exist_ok=True)
    onnx.save(model, os.path.join(case, "model.onnx"))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = sess.run(None, {sess.get_inputs()[0].name: x})
    with open(os.path.join(data, "input_0.pb"), "wb") as f:
        f.write(numpy_helper.from_array(x).SerializeToString())
    for i, y in enumerate(outputs):
        with open(os.path.join(data, f"output_{i}.pb"), "wb") as f:
            f.write(numpy_helper.from_array(np.asarray(y)).SerializeToString())


def sklearn_cases(out):
    xc, yc = make_classification(
        n_samples=300, n_features=6, n_informative=4, n_classes=3, random_state=SEED
    )
    xb, yb = make_classification(n_samples=300, n_features=6, random_state=SEED + 1)
    xr, yr = make_regression(n_samples=300, n_features=6, n_targets=2, random_state=SEED)
    xc, xb, xr = (a.astype(np.float32) for a in (xc, xb, xr))
    rng = np.random.default_rng(SEED)
    # Trees learn where missing values go; a fifth of its inputs are NaN.
    xm = xc.copy()
    xm[rng.random(xm.shape) < 0.2] = np.nan
    names = np.array(["cat", "dog", "fish"])
    cases = [
        ("dt_classifier", DecisionTreeClassifier(max_depth=4, random_state=SEED), xc, yc),
        ("dt_classifier_strings", DecisionTreeClassifier(max_depth=4, random_state=SEED), xc, names[yc]),
        ("rf_classifier_binary", RandomForestClassifier(n_estimators=3, max_depth=3, random_state=SEED), xb, yb),
        ("gb_classifier_binary", GradientBoostingClassifier(n_estimators=3, max_depth=3, random_state=SEED), xb, yb),
        ("gb_classifier", GradientBoostingClassifier(n_estimators=3, max_depth=2, random_state=SEED), xc, yc),
        ("dt_classifier_missing", DecisionTreeClassifier(max_depth=4, random_state=SEED), xm, yc),
        ("dt_regressor", DecisionTreeRegressor(max_depth=4, random_state=SEED), xr, yr[:, 0]),
        ("rf_regressor_two_targets", RandomForestRegressor(n_estimators=3, max_depth=3, random_state=SEED), xr, yr),
        ("gb_regressor", GradientBoostingRegressor(n_estimators=3, max_depth=3, random_state=SEED), xr, yr[:, 0]),
        ("dt_regressor_missing", DecisionTreeRegressor(max_depth=4, random_state=SEED), xm, yr[:, 0]),
    ]
    for name, est, x, y in cases:
        est.fit(x, y)
        model = to_onnx(est, x[:1], options={"zipmap": False} if hasattr(est, "classes_") else None,
                        target_opset={"": 17, "ai.onnx.ml": 3})
        write_case(out, name, model, x[:ROWS])


def tree_node(op, opset, x_type=TensorProto.FLOAT, outputs=None, **attrs):
    outputs = outputs or [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)]
    node = helper.make_node(op, ["X"], [o.name for o in outputs], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph([node], op, [helper.make_tensor_value_info("X", x_type, [None, 3])], outputs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", opset)]
    )
    model.ir_version = 8
    return model


def small_tree(mode):
    """Two trees over 3 features: tree 0 splits on feature 0 by `mode`, then feature 1;
    tree 1 is one split on feature 2. Leaves carry weights for targets 0 and 1."""
    return dict(
        nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1],
        nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2],
        nodes_featureids=[0, 1, 0, 0, 0, 2, 0, 0],
        nodes_modes=[mode, "BRANCH_LEQ", "LEAF", "LEAF", "LEAF", "BRANCH_GT", "LEAF", "LEAF"],
        nodes_values=[0.5, -0.25, 0, 0, 0, 0.0, 0, 0],
        nodes_truenodeids=[1, 2, 0, 0, 0, 1, 0, 0],
        nodes_falsenodeids=[4, 3, 0, 0, 0, 2, 0, 0],
        nodes_missing_value_tracks_true=[1, 0, 0, 0, 0, 0, 0, 0],
    )


def leaf_weights(prefix, ids=(0, 1, 0, 1, 0, 1, 0, 1, 0, 1)):
    """Weights for every leaf of `small_tree`, each for two targets (classes) `ids`:
    onnxruntime and the ONNX reference differ on a target no leaf reached."""
    return {
        f"{prefix}_treeids": [0, 0, 0, 0, 0, 0, 1, 1, 1, 1],
        f"{prefix}_nodeids": [2, 2, 3, 3, 4, 4, 1, 1, 2, 2],
        f"{prefix}_ids": list(ids),
        f"{prefix}_weights": [1.5, -0.5, 2.0, 0.25, -1.25, 0.5, 0.75, -0.375, -2.0, 0.5],
    }


def handmade_cases(out):
    rng = np.random.default_rng(SEED)
    x = rng.uniform(-1.5, 1.5, size=(ROWS, 3)).astype(np.float32)
    # Exact split values, so EQ and NEQ take both ways; NaN for the missing-value rule.
    x[::5, 0] = 0.5
    x[3, 0] = np.nan
    x[7, 2] = 0.0
    modes = ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"]
    for mode in modes:
        for agg in ["SUM", "AVERAGE", "MIN", "MAX"]:
            if mode != "BRANCH_LT" and agg != "SUM":
                continue
            m = tree_node("TreeEnsembleRegressor", 3, n_targets=2, aggregate_function=agg,
                          base_values=[0.25, -0.5], **small_tree(mode), **leaf_weights("target"))
            write_case(out, f"regressor_{mode.lower()}_{agg.lower()}", m, x)
    for post in ["SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"]:
        xp = np.clip(x, -1, 1) * 0.2 + 0.5 if post == "PROBIT" else x
        m = tree_node("TreeEnsembleRegressor", 3, n_targets=2, post_transform=post,
                      **small_tree("BRANCH_LEQ"), **leaf_weights("target"))
        write_case(out, f"regressor_post_{post.lower()}", m, xp)
    outputs = [helper.make_tensor_value_info("Y", TensorProto.INT64, None),
               helper.make_tensor_value_info("Z", TensorProto.FLOAT, None)]
    # Three classes: onnxruntime treats two as the binary case whatever the weights.
    for post in ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"]:
        m = tree_node("TreeEnsembleClassifier", 3, outputs=outputs, post_transform=post,
                      classlabels_int64s=[10, 20, 30], base_values=[0.125, -0.125, 0.25],
                      **small_tree("BRANCH_GTE"),
                      **leaf_weights("class", ids=(0, 1, 1, 2, 0, 2, 2, 1, 0, 1)))
        write_case(out, f"classifier_post_{post.lower()}", m, x)
    # The binary case as skl2onnx writes it: every weight for class 0, one base value;
    # Z is (1 - s, s), or (-s, s) before LOGISTIC. onnxruntime's label threshold for
    # NONE is 0.5 only when every weight is positive.
    for post in ["NONE", "LOGISTIC"]:
        weights = leaf_weights("class", ids=[0] * 10)
        if post == "NONE":
            weights["class_weights"] = [abs(w) / 4 for w in weights["class_weights"]]
        m = tree_node("TreeEnsembleClassifier", 3, outputs=outputs, post_transform=post,
                      classlabels_int64s=[0, 1], base_values=[0.0625],
                      **small_tree("BRANCH_LEQ"), **weights)
        write_case(out, f"classifier_binary_{post.lower()}", m, x)
    # Opset 3's double-precision tensor attributes, on double input.
    attrs = small_tree("BRANCH_LT")
    values = np.array(attrs.pop("nodes_values"), dtype=np.float64) + 1e-9
    weights = leaf_weights("target")
    target_weights = np.array(weights.pop("target_weights"), dtype=np.float64)
    m = tree_node("TreeEnsembleRegressor", 3, x_type=TensorProto.DOUBLE, n_targets=2,
                  nodes_values_as_tensor=numpy_helper.from_array(values, "nodes_values"),
                  target_weights_as_tensor=numpy_helper.from_array(target_weights, "target_weights"),
                  base_values_as_tensor=numpy_helper.from_array(np.array([0.5, 0.25]), "base_values"),
                  **attrs, **weights)
    write_case(out, "regressor_as_tensor_double", m, x.astype(np.float64))
    # Opset 5: one tree, a set-membership root, then LEQ; AVERAGE of the two trees.
    m = tree_node(
        "TreeEnsemble", 5, n_targets=2, aggregate_function=0, post_transform=0,
        tree_roots=[0, 2],
        nodes_featureids=[0, 1, 2],
        nodes_modes=numpy_helper.from_array(np.array([6, 0, 3], dtype=np.uint8), "nodes_modes"),
        nodes_splits=numpy_helper.from_array(np.array([0.0, 0.1, -0.2], dtype=np.float32), "nodes_splits"),
        nodes_truenodeids=[0, 1, 3], nodes_trueleafs=[1, 1, 1],
        nodes_falsenodeids=[1, 2, 4], nodes_falseleafs=[0, 1, 1],
        nodes_missing_value_tracks_true=[0, 1, 0],
        membership_values=numpy_helper.from_array(np.array([0.5, 1.0, np.nan], dtype=np.float32), "m"),
        leaf_targetids=[0, 1, 0, 1, 0],
        leaf_weights=numpy_helper.from_array(np.array([1, 2, 3, 4, 5], dtype=np.float32), "w"),
    )
    write_case(out, "tree_ensemble_v5_member_average", m, x)


def string_node(op, x, opset, y_type, domain="", outputs=("Y",), out_types=None, **attrs):
    """A one-node model over input X (a numpy array: strings are objects)."""
    x_type = TensorProto.STRING if x.dtype == object else helper.np_dtype_to_tensor_dtype(x.dtype)
    out_types = out_types or [y_type]
    node = helper.make_node(op, ["X"], list(outputs), domain=domain, **attrs)
    graph = helper.make_graph(
        [node], op, [helper.make_tensor_value_info("X", x_type, list(x.shape))],
        [helper.make_tensor_value_info(o, t, None) for o, t in zip(outputs, out_types)],
    )
    opsets = [helper.make_opsetid("", 20)]
    if domain:
        opsets.append(helper.make_opsetid(domain, opset))
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 9
    return model


def string_cases(out):
    words = np.array([["cat", "Dog", "fish"], ["bird", "cat", "éclair"]], dtype=object)
    ints = np.array([[0, 2, 5], [1, -1, 0]], dtype=np.int64)
    floats = np.array([0.5, np.nan, 2.25, -1.0], dtype=np.float32)
    tokens = np.array([["a", "b", "c", "a", "b"], ["c", "c", "x", "a", "b"]], dtype=object)
    ml, S, I, F = "ai.onnx.ml", TensorProto.STRING, TensorProto.INT64, TensorProto.FLOAT
    tensor = numpy_helper.from_array
    cases = [
        ("label_encoder_v1_string_to_int", words, ("LabelEncoder", 1, I, ml),
         dict(classes_strings=["fish", "cat", "bird"], default_int64=-7)),
        ("label_encoder_v1_int_to_string", ints, ("LabelEncoder", 1, S, ml),
         dict(classes_strings=["a", "b", "c"], default_string="?")),
        ("label_encoder_v2_float_to_string", floats, ("LabelEncoder", 2, S, ml),
         dict(keys_floats=[0.5, 2.25, float("nan")], values_strings=["half", "2.25", "missing"])),
        ("label_encoder_v2_int_to_float", np.array([3, 1, 4, 1, 5], dtype=np.int64),
         ("LabelEncoder", 2, F, ml),
         dict(keys_int64s=[1, 3, 5], values_floats=[0.25, -3.5, 1e3], default_float=9.0)),
        ("label_encoder_v2_string_to_string", words, ("LabelEncoder", 2, S, ml),
         dict(keys_strings=["cat", "éclair"], values_strings=["chat", "eclair"])),
        ("label_encoder_v4_double_tensors", np.array([7, -2, 9], dtype=np.int64),
         ("LabelEncoder", 4, TensorProto.DOUBLE, ml),
         dict(keys_tensor=tensor(np.array([7, 9], dtype=np.int64), "k"),
              values_tensor=tensor(np.array([0.5, 1.5]), "v"),
              default_tensor=tensor(np.array([-0.25]), "d"))),
        ("tfidf_strings", tokens, ("TfIdfVectorizer", 9, F, ""),
         dict(mode="TFIDF", min_gram_length=1, max_gram_length=2, max_skip_count=1,
              pool_strings=["a", "c", "x", "a", "b", "c", "c"], ngram_counts=[0, 3],
              ngram_indexes=[0, 1, 2, 3, 4], weights=[0.5, 1.0, 2.0, 1.5, 0.25])),
        ("strnormalizer_insensitive_lower",
         np.array(["The", "CAT", "sat", "the", "Mat"], dtype=object), ("StringNormalizer", 10, S, ""),
         dict(case_change_action="LOWER", stopwords=["the", "mat"], locale="C")),
        ("regex_full_match_classes", np.array(["abc123", "ABC", "x_9", "", "42"], dtype=object),
         ("RegexFullMatch", 20, TensorProto.BOOL, ""), dict(pattern=r"[a-z]+\d*|\d+")),
    ]
    for name, x, (op, opset, y_type, domain), attrs in cases:
        write_case(out, name, string_node(op, x, opset, y_type, domain, **attrs), x)
    x = np.array([" a  b c ", "", "one"], dtype=object)
    m = string_node("StringSplit", x, 20, None, outputs=("Y", "Z"), out_types=[S, I], maxsplit=1)
    write_case(out, "string_split_whitespace_max1", m, x)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/onnx"
    sklearn_cases(os.path.join(out, "trees"))
    handmade_cases(os.path.join(out, "trees"))
    string_cases(os.path.join(out, "strings"))


if __name__ == "__main__":
    main()
