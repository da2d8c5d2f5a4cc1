//! Tree ensembles on hand-computed trees (tests/onnx_ml.rs checks them against
//! onnxruntime on exported models).
use kiln::ir::Attr;
use kiln::Tensor;

use crate::ops::harness::*;

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

fn floats(v: &[f64]) -> Attr {
    Attr::Floats(v.to_vec())
}

fn strings(v: &[&str]) -> Attr {
    Attr::Strings(v.iter().map(|s| s.to_string()).collect())
}

/// One tree: node 0 tests feature 0 by `mode` against 1.0 (NaN goes true), node 1
/// tests feature 1 <= 0.0; leaves 2, 3, 4.
fn tree_v3(mode: &str, prefix: &str, weights: &[f64], ids: &[i64]) -> Vec<(String, Attr)> {
    let p = |s: &str| format!("{prefix}_{s}");
    vec![
        ("nodes_treeids".into(), ints(&[0, 0, 0, 0, 0])),
        ("nodes_nodeids".into(), ints(&[0, 1, 2, 3, 4])),
        ("nodes_featureids".into(), ints(&[0, 1, 0, 0, 0])),
        (
            "nodes_modes".into(),
            strings(&[mode, "BRANCH_LEQ", "LEAF", "LEAF", "LEAF"]),
        ),
        ("nodes_values".into(), floats(&[1.0, 0.0, 0.0, 0.0, 0.0])),
        ("nodes_truenodeids".into(), ints(&[1, 2, 0, 0, 0])),
        ("nodes_falsenodeids".into(), ints(&[4, 3, 0, 0, 0])),
        (
            "nodes_missing_value_tracks_true".into(),
            ints(&[1, 0, 0, 0, 0]),
        ),
        (p("treeids"), ints(&vec![0; ids.len()])),
        (
            p("nodeids"),
            ints(if ids.is_empty() { &[] } else { &[2, 3, 4] }),
        ),
        (p("ids"), ints(ids)),
        (p("weights"), floats(weights)),
    ]
}

fn with(pairs: Vec<(String, Attr)>, extra: &[(&str, Attr)]) -> kiln::ir::Attrs {
    let mut a = kiln::ir::Attrs::new();
    for (k, v) in pairs {
        a.set(&k, v);
    }
    for (k, v) in extra {
        a.set(k, v.clone());
    }
    a
}

#[test]
fn tree_ensemble_regressor_follows_each_branch_mode() {
    // Rows: feature 0 below, at and above the split, then NaN; feature 1 picks leaf 2
    // (<= 0) or 3.
    let x = f32s(&[4, 2], &[0.5, -1.0, 1.0, 1.0, 2.0, -1.0, f32::NAN, 1.0]);
    let leaf = |l: usize| [10.0, 20.0, 30.0][l];
    let cases: [(&str, [usize; 4]); 6] = [
        ("BRANCH_LEQ", [0, 1, 2, 1]),
        ("BRANCH_LT", [0, 2, 2, 1]),
        ("BRANCH_GTE", [2, 1, 0, 1]),
        ("BRANCH_GT", [2, 2, 0, 1]),
        ("BRANCH_EQ", [2, 1, 2, 1]),
        ("BRANCH_NEQ", [0, 2, 0, 1]),
    ];
    for (mode, leaves) in cases {
        let a = with(
            tree_v3(mode, "target", &[10.0, 20.0, 30.0], &[0, 0, 0]),
            &[("base_values", floats(&[0.5]))],
        );
        let y = run1("TreeEnsembleRegressor", vec![Input(x.clone())], a);
        let want: Vec<f32> = leaves.iter().map(|&l| (leaf(l) + 0.5) as f32).collect();
        assert_eq!(y, f32s(&[4, 1], &want), "{mode}");
    }
    let e = run_err(
        "TreeEnsembleRegressor",
        vec![Input(x)],
        with(
            tree_v3("BRANCH_LEQ", "target", &[1.0, 2.0, 3.0], &[0, 0, 0]),
            &[("aggregate_function", Attr::String("MEDIAN".into()))],
        ),
    );
    assert!(e.contains("aggregate_function must be"), "{e}");
}

#[test]
fn tree_ensemble_classifier_sums_scores_and_picks_labels() {
    // Leaves: 2 -> class 0 (0.75) and class 2 (0.25); 3 -> class 1; 4 -> class 2.
    let mut a = tree_v3("BRANCH_LEQ", "class", &[], &[]);
    a.retain(|(k, _)| !k.starts_with("class_"));
    let a = with(
        a,
        &[
            ("class_treeids", ints(&[0, 0, 0, 0])),
            ("class_nodeids", ints(&[2, 2, 3, 4])),
            ("class_ids", ints(&[0, 2, 1, 2])),
            ("class_weights", floats(&[0.75, 0.25, 1.0, 1.0])),
            ("classlabels_strings", strings(&["a", "b", "c"])),
        ],
    );
    let x = f32s(&[3, 2], &[0.0, -1.0, 0.0, 1.0, 5.0, 0.0]);
    let out = run("TreeEnsembleClassifier", vec![Input(x)], a).unwrap();
    let labels = Tensor::from_strings(&[3], vec!["a".into(), "b".into(), "c".into()]).unwrap();
    assert_eq!(out[0], labels);
    let z = [0.75, 0.0, 0.25, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0];
    assert_eq!(out[1], f32s(&[3, 3], &z));
}

#[test]
fn tree_ensemble_v5_aggregates_and_tests_membership() {
    // Tree 0: node 0 tests feature 0 in {1, 3}, true -> leaf 0, false -> leaf 1. Tree 1
    // is the single leaf 2. MAX over the trees, per target.
    let a = attrs(&[
        ("n_targets", Attr::Int(2)),
        ("aggregate_function", Attr::Int(3)),
        ("tree_roots", ints(&[0, 1])),
        ("nodes_featureids", ints(&[0, 0])),
        ("nodes_modes", ints(&[6, 0])),
        ("nodes_splits", floats(&[0.0, 0.0])),
        ("membership_values", floats(&[1.0, 3.0, f64::NAN])),
        ("nodes_truenodeids", ints(&[0, 2])),
        ("nodes_trueleafs", ints(&[1, 1])),
        ("nodes_falsenodeids", ints(&[1, 2])),
        ("nodes_falseleafs", ints(&[1, 1])),
        ("leaf_targetids", ints(&[0, 1, 0])),
        ("leaf_weights", floats(&[5.0, 7.0, 2.0])),
    ]);
    let x = f64s(&[3, 1], &[3.0, 2.0, f64::NAN]);
    let y = run1("TreeEnsemble", vec![Input(x)], a.clone());
    // Targets without a leaf in a row are 0.
    assert_eq!(y, f64s(&[3, 2], &[5.0, 0.0, 2.0, 7.0, 2.0, 7.0]));
    let mut bad = a;
    bad.set("nodes_modes", ints(&[7, 0]));
    let e = run_err("TreeEnsemble", vec![Input(f64s(&[1, 1], &[0.0]))], bad);
    assert!(e.contains("nodes_modes[0] = 7 is not a mode"), "{e}");
}
