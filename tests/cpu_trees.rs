//! The CPU backend's tree-ensemble kernel against the reference interpreter, bit for
//! bit: random forests of every branch mode with missing-value tracks and NaN features,
//! every aggregate and post-transform, regressors, multi-class and binary classifiers
//! and the opset-5 `TreeEnsemble`, at 1 and 2 threads.
use crate::common;

use kiln::backend::cpu::CpuBackend;
use kiln::backend::{backend_with, Device, Executable};
use kiln::ir::{text, Attr, Attrs, DType, Graph};
use kiln::passes::CompileOptions;
use kiln::Tensor;

use common::{typed_param, Rng};

/// `g` on cpu at 1 and 2 threads gives exactly the interpreter's outputs (NaN equal
/// to NaN) through a `tree-ensemble` step.
fn check_exact(g: &Graph, inputs: &[Tensor]) {
    let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
    let want = interp.compile(g).unwrap().run(inputs).unwrap();
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    for threads in [1, 2] {
        let exe = CpuBackend::new(CompileOptions {
            threads,
            ..Default::default()
        })
        .compile_cpu(g)
        .unwrap();
        let kinds = exe
            .step_kinds(&shapes)
            .unwrap()
            .expect("lowered to kernels");
        assert!(
            kinds.contains(&"tree-ensemble") && !kinds.contains(&"fallback"),
            "{kinds:?}\n{}",
            text::print(g)
        );
        let got = exe.run(inputs).unwrap();
        for (i, (w, o)) in want.iter().zip(&got).enumerate() {
            assert_eq!((w.dtype(), w.shape()), (o.dtype(), o.shape()), "output {i}");
            for (e, (a, b)) in w.to_f64_vec().iter().zip(o.to_f64_vec()).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "output {i} element {e}, {threads} thread(s): want {a}, got {b}"
                );
            }
        }
    }
}

/// Random f32 rows with some NaN features.
fn rows(rng: &mut Rng, n: usize, features: usize) -> Tensor {
    let v: Vec<f32> = (0..n * features)
        .map(|_| {
            if rng.below(10) == 0 {
                f32::NAN
            } else {
                (rng.below(9) as f32 - 4.0) * 0.5
            }
        })
        .collect();
    Tensor::from_vec(&[n, features], v).unwrap()
}

const MODES: [&str; 6] = [
    "BRANCH_LEQ",
    "BRANCH_LT",
    "BRANCH_GTE",
    "BRANCH_GT",
    "BRANCH_EQ",
    "BRANCH_NEQ",
];

/// The node attributes of `trees` random trees of depth `depth` over `features`
/// features (opset 1/3 form), with `prefix`_* weights for `targets` targets on each
/// leaf (all for target `only` if given).
fn forest_v3(
    rng: &mut Rng,
    trees: usize,
    depth: u32,
    features: usize,
    prefix: &str,
    targets: usize,
    only: Option<i64>,
) -> Attrs {
    let mut a = Attrs::new();
    let (mut treeids, mut nodeids, mut featureids, mut modes) = (vec![], vec![], vec![], vec![]);
    let (mut values, mut yes, mut no, mut missing) = (vec![], vec![], vec![], vec![]);
    let (mut t_tree, mut t_node, mut t_ids, mut t_weights) = (vec![], vec![], vec![], vec![]);
    let nodes = (1i64 << (depth + 1)) - 1;
    let branches = (1i64 << depth) - 1;
    for t in 0..trees as i64 {
        for id in 0..nodes {
            treeids.push(t);
            nodeids.push(id);
            if id < branches {
                featureids.push(rng.below(features) as i64);
                modes.push(rng.pick(&MODES).to_string());
                values.push((rng.below(9) as f64 - 4.0) * 0.5);
                yes.push(2 * id + 1);
                no.push(2 * id + 2);
                missing.push(rng.below(2) as i64);
            } else {
                featureids.push(0);
                modes.push("LEAF".to_string());
                values.push(0.0);
                yes.push(0);
                no.push(0);
                missing.push(0);
                for target in 0..targets as i64 {
                    if only.is_some_and(|o| o != target) || rng.below(4) == 0 {
                        continue;
                    }
                    t_tree.push(t);
                    t_node.push(id);
                    t_ids.push(target);
                    t_weights.push(rng.f64());
                }
            }
        }
    }
    let ints = |v: Vec<i64>| Attr::Ints(v);
    a.set("nodes_treeids", ints(treeids));
    a.set("nodes_nodeids", ints(nodeids));
    a.set("nodes_featureids", ints(featureids));
    a.set("nodes_modes", Attr::Strings(modes));
    a.set("nodes_values", Attr::Floats(values));
    a.set("nodes_truenodeids", ints(yes));
    a.set("nodes_falsenodeids", ints(no));
    a.set("nodes_missing_value_tracks_true", ints(missing));
    a.set(&format!("{prefix}_treeids"), ints(t_tree));
    a.set(&format!("{prefix}_nodeids"), ints(t_node));
    a.set(&format!("{prefix}_ids"), ints(t_ids));
    a.set(&format!("{prefix}_weights"), Attr::Floats(t_weights));
    a
}

fn graph(op: &str, attrs: Attrs, n: usize, features: usize) -> Graph {
    let mut g = Graph::new("trees");
    let x = typed_param(&mut g, "x", DType::F32, &[n, features]);
    let node = g.add_op(op, &[Some(x)], attrs, "trees").unwrap();
    for i in 0..g.node(node).outputs.len() {
        g.add_output(&format!("y{i}"), node.out(i as u32)).unwrap();
    }
    g
}

#[test]
fn regressors_of_every_aggregate_and_post_transform() {
    let mut rng = Rng(11);
    for (i, aggregate) in ["SUM", "AVERAGE", "MIN", "MAX"].iter().enumerate() {
        for post in ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"] {
            let (features, n) = (5, 300 + i);
            let mut a = forest_v3(&mut rng, 7, 4, features, "target", 3, None);
            a.set("n_targets", Attr::Int(3));
            a.set("aggregate_function", Attr::String(aggregate.to_string()));
            a.set("post_transform", Attr::String(post.into()));
            a.set("base_values", Attr::Floats(vec![0.25, -0.5, 0.0]));
            let g = graph("TreeEnsembleRegressor", a, n, features);
            check_exact(&g, &[rows(&mut rng, n, features)]);
        }
    }
}

#[test]
fn classifiers_multi_class_and_binary() {
    let mut rng = Rng(12);
    for post in ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"] {
        let features = 4;
        let mut a = forest_v3(&mut rng, 5, 3, features, "class", 3, None);
        a.set("classlabels_int64s", Attr::Ints(vec![7, 8, 9]));
        a.set("post_transform", Attr::String(post.into()));
        let g = graph("TreeEnsembleClassifier", a, 257, features);
        check_exact(&g, &[rows(&mut rng, 257, features)]);
        // Two classes, every weight for class 1: the binary rule.
        let mut a = forest_v3(&mut rng, 5, 3, features, "class", 2, Some(1));
        a.set("classlabels_int64s", Attr::Ints(vec![0, 1]));
        a.set("post_transform", Attr::String(post.into()));
        a.set("base_values", Attr::Floats(vec![0.1]));
        let g = graph("TreeEnsembleClassifier", a, 33, features);
        check_exact(&g, &[rows(&mut rng, 33, features)]);
    }
}

#[test]
fn opset_5_tree_ensemble_with_membership() {
    // Tree 0: node 0 tests feature 0 in {1, 3, NaN}, true -> leaf 0, false -> node 1,
    // which tests feature 1 < 0.5 (NaN true) into leaves 1 and 2. Tree 1 is leaf 3.
    let mut rng = Rng(13);
    let ints = |v: &[i64]| Attr::Ints(v.to_vec());
    for aggregate in 0..4 {
        let mut a = Attrs::new();
        a.set("n_targets", Attr::Int(2));
        a.set("aggregate_function", Attr::Int(aggregate));
        a.set("post_transform", Attr::Int(aggregate % 3));
        a.set("tree_roots", ints(&[0, 2]));
        a.set("nodes_featureids", ints(&[0, 1, 0]));
        a.set("nodes_modes", ints(&[6, 1, 0]));
        a.set("nodes_splits", Attr::Floats(vec![0.0, 0.5, 0.0]));
        a.set("membership_values", Attr::Floats(vec![1.0, 3.0, f64::NAN]));
        a.set("nodes_missing_value_tracks_true", ints(&[0, 1, 0]));
        a.set("nodes_truenodeids", ints(&[0, 1, 3]));
        a.set("nodes_trueleafs", ints(&[1, 1, 1]));
        a.set("nodes_falsenodeids", ints(&[1, 2, 3]));
        a.set("nodes_falseleafs", ints(&[0, 1, 1]));
        a.set("leaf_targetids", ints(&[0, 1, 0, 1]));
        a.set("leaf_weights", Attr::Floats(vec![5.0, 7.0, 2.0, -1.0]));
        let g = graph("TreeEnsemble", a, 50, 2);
        let x = rows(&mut rng, 50, 2).to_f64_vec();
        let x: Vec<f32> = x.iter().map(|v| (v * 2.0).round() as f32).collect();
        check_exact(&g, &[Tensor::from_vec(&[50, 2], x).unwrap()]);
    }
}
