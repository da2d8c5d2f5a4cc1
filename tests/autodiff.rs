//! Reverse-mode gradients against central finite differences, in f64 on the reference
//! interpreter: every rule on random inputs (relative error ≤ 1e-6), composites with
//! symbolic dims, a gradient of a gradient, and the errors for what has no gradient.
use crate::common;

use kiln::autodiff::grad;
use kiln::backend::{backend_with, Device};
use kiln::ir::{text, Attr, Attrs, DType, Graph, Shape, TensorType, Value};
use kiln::passes::CompileOptions;
use kiln::{Dim, Tensor};

use common::{check_gradients, f64_type, op, Rng};

fn axes(g: &mut Graph, v: &[i64]) -> Value {
    let name = g.fresh_name("axes");
    let t = Tensor::from_vec(&[v.len()], v.to_vec()).unwrap();
    g.add_constant_value(&name, t).unwrap().into()
}

/// A differentiable case: a graph from parameters to one value, and the parameters'
/// values (shapes of the run; the graph's dims may be symbolic).
struct Case {
    g: Graph,
    out: Value,
    params: Vec<Value>,
    values: Vec<Tensor>,
}

impl Case {
    fn new(name: &str) -> Case {
        Case {
            g: Graph::new(name),
            out: Value {
                node: kiln::NodeId(0),
                output: 0,
            },
            params: vec![],
            values: vec![],
        }
    }

    fn param(&mut self, rng: &mut Rng, dims: &[usize], lo: f64) -> Value {
        let name = format!("p{}", self.params.len());
        let v: Value = self.g.add_parameter(&name, f64_type(dims)).unwrap().into();
        self.params.push(v);
        self.values.push(rng.f64_tensor_away_from_zero(dims, lo));
        v
    }
}

/// The loss Σ out·R (R random, fixed) and its gradients by `grad`, each against central
/// differences of the loss.
fn check(mut c: Case, rng: &mut Rng) {
    let ty = c.g.value_type(c.out).unwrap().clone();
    let dims = ty.shape.to_fixed().expect("give the output static dims");
    let r: Value =
        c.g.add_constant_value("r", rng.f64_tensor_away_from_zero(&dims, 0.1))
            .unwrap()
            .into();
    let weighted = op(&mut c.g, "Mul", &[c.out, r], Attrs::new());
    let keep0 = Attrs::new().with("keepdims", Attr::Int(0));
    c.out = op(&mut c.g, "ReduceSum", &[weighted], keep0);
    check_params(&c, rng, 0);
}

/// The scalar `c.out` times a random scalar as the loss; the gradients with respect to
/// `c.params` (whose values follow `data` undifferentiated inputs in `c.values`) against
/// central differences, element by element: relative error ≤ 1e-6 (below magnitudes of
/// 1e-2, absolute).
fn check_params(c: &Case, rng: &mut Rng, data: usize) {
    let mut g = c.g.clone();
    let r: Value = g
        .add_constant_value("r_loss", rng.f64_tensor_away_from_zero(&[], 0.1))
        .unwrap()
        .into();
    let loss = op(&mut g, "Mul", &[c.out, r], Attrs::new());
    let worst = check_gradients(&g, loss, &c.params, &c.values, data);
    // `--nocapture` shows each case's worst error.
    eprintln!("case '{}': max rel err {worst:.1e}", g.name);
}

#[test]
fn elementwise_rules_with_broadcasting() {
    let mut rng = Rng(1);
    for name in ["Add", "Sub", "Mul", "Div", "Pow"] {
        for (da, db) in [
            (&[3, 4][..], &[3, 4][..]),
            (&[3, 4], &[4]),
            (&[3, 1], &[1, 4]),
            (&[2, 3, 4], &[3, 1]),
        ] {
            let mut c = Case::new(name);
            // Pow and Div: bases and divisors away from 0 (and bases positive).
            let a = c.param(&mut rng, da, 0.3);
            let b = c.param(&mut rng, db, 0.3);
            let a = if name == "Pow" {
                op(&mut c.g, "Abs", &[a], Attrs::new())
            } else {
                a
            };
            c.out = op(&mut c.g, name, &[a, b], Attrs::new());
            check(c, &mut rng);
        }
    }
    for name in [
        "Neg",
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Abs",
        "Tanh",
        "Sigmoid",
        "Relu",
        "Identity",
    ] {
        let mut c = Case::new(name);
        let x = c.param(&mut rng, &[3, 5], 0.2);
        let x = if matches!(name, "Log" | "Sqrt") {
            op(&mut c.g, "Abs", &[x], Attrs::new())
        } else {
            x
        };
        c.out = op(&mut c.g, name, &[x], Attrs::new());
        check(c, &mut rng);
    }
}

#[test]
fn selections_bounds_expansions_and_concatenations() {
    let mut rng = Rng(6);
    let mut c = Case::new("gelu tanh");
    let x = c.param(&mut rng, &[4, 3], 0.0);
    let attrs = Attrs::new().with("approximate", Attr::String("tanh".into()));
    c.out = op(&mut c.g, "Gelu", &[x], attrs);
    check(c, &mut rng);
    for name in ["Max", "Min"] {
        let mut c = Case::new(name);
        let a = c.param(&mut rng, &[3, 4], 0.0);
        let b = c.param(&mut rng, &[4], 0.0);
        c.out = op(&mut c.g, name, &[a, b], Attrs::new());
        check(c, &mut rng);
    }
    let mut c = Case::new("where");
    // The condition is data (a parameter's only path to the loss through it would be
    // boolean: an error, tested below).
    let mask = rng.f64_tensor_away_from_zero(&[3, 4], 0.0);
    let cond: Value = c.g.add_constant_value("mask", mask).unwrap().into();
    let zero: Value =
        c.g.add_constant_value("zero", Tensor::scalar(0.0f64))
            .unwrap()
            .into();
    let cond = op(&mut c.g, "Greater", &[cond, zero], Attrs::new());
    let a = c.param(&mut rng, &[3, 4], 0.0);
    let b = c.param(&mut rng, &[1, 4], 0.0);
    c.out = op(&mut c.g, "Where", &[cond, a, b], Attrs::new());
    check(c, &mut rng);
    let mut c = Case::new("clip");
    let x = c.param(&mut rng, &[3, 4], 0.0);
    let lo: Value =
        c.g.add_constant_value("lo", Tensor::scalar(-0.5f64))
            .unwrap()
            .into();
    let hi: Value =
        c.g.add_constant_value("hi", Tensor::scalar(0.45f64))
            .unwrap()
            .into();
    c.out = op(&mut c.g, "Clip", &[x, lo, hi], Attrs::new());
    check(c, &mut rng);
    let mut c = Case::new("expand and concat");
    let x = c.param(&mut rng, &[3, 1], 0.0);
    let y = c.param(&mut rng, &[3, 2], 0.0);
    let s = axes(&mut c.g, &[2, 3, 4]);
    let e = op(&mut c.g, "Expand", &[x, s], Attrs::new());
    let yy = op(&mut c.g, "Mul", &[y, y], Attrs::new());
    let (a0, s232) = (axes(&mut c.g, &[0]), axes(&mut c.g, &[2, 3, 2]));
    let y3 = op(&mut c.g, "Unsqueeze", &[yy, a0], Attrs::new());
    let y3 = op(&mut c.g, "Expand", &[y3, s232], Attrs::new());
    c.out = op(
        &mut c.g,
        "Concat",
        &[e, y3, e],
        Attrs::new().with("axis", Attr::Int(-1)),
    );
    check(c, &mut rng);
}

/// Convolutions with strides, padding and dilation (the transposed convolution needs
/// output padding when the stride skips input rows), and pools.
#[test]
fn convolutions_and_pools() {
    let mut rng = Rng(7);
    let ints = |v: &[i64]| Attr::Ints(v.to_vec());
    for (x, w, strides, pads, dil) in [
        (
            &[2, 3, 6, 5][..],
            &[4, 3, 3, 3][..],
            &[1i64, 1][..],
            &[1i64, 1, 1, 1][..],
            &[1i64, 1][..],
        ),
        (
            &[1, 2, 7, 8],
            &[3, 2, 3, 2],
            &[2, 3],
            &[1, 0, 0, 1],
            &[1, 1],
        ),
        (
            &[1, 2, 9, 9],
            &[2, 2, 3, 3],
            &[2, 2],
            &[0, 0, 0, 0],
            &[2, 1],
        ),
    ] {
        let mut c = Case::new("conv");
        let xv = c.param(&mut rng, x, 0.0);
        let wv = c.param(&mut rng, w, 0.0);
        let b = c.param(&mut rng, &[w[0]], 0.0);
        let attrs = Attrs::new()
            .with("strides", ints(strides))
            .with("pads", ints(pads))
            .with("dilations", ints(dil));
        c.out = op(&mut c.g, "Conv", &[xv, wv, b], attrs);
        check(c, &mut rng);
    }
    let mut c = Case::new("max pool");
    let xv = c.param(&mut rng, &[2, 3, 5, 6], 0.0);
    let attrs = Attrs::new()
        .with("kernel_shape", ints(&[2, 3]))
        .with("strides", ints(&[2, 2]))
        .with("pads", ints(&[0, 1, 1, 0]));
    c.out = op(&mut c.g, "MaxPool", &[xv], attrs);
    check(c, &mut rng);
    for name in ["GlobalAveragePool", "GlobalMaxPool"] {
        let mut c = Case::new(name);
        let xv = c.param(&mut rng, &[2, 3, 4, 5], 0.0);
        c.out = op(&mut c.g, name, &[xv], Attrs::new());
        check(c, &mut rng);
    }
}

#[test]
fn products_with_transposes_and_batches() {
    let mut rng = Rng(2);
    let mut c = Case::new("matmul");
    let a = c.param(&mut rng, &[3, 4], 0.0);
    let b = c.param(&mut rng, &[4, 5], 0.0);
    c.out = op(&mut c.g, "MatMul", &[a, b], Attrs::new());
    check(c, &mut rng);

    let mut c = Case::new("batched matmul, broadcast B");
    let a = c.param(&mut rng, &[2, 3, 4], 0.0);
    let b = c.param(&mut rng, &[4, 5], 0.0);
    c.out = op(&mut c.g, "MatMul", &[a, b], Attrs::new());
    check(c, &mut rng);

    for (ta, tb) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let mut c = Case::new("gemm");
        let a = c.param(&mut rng, if ta == 1 { &[4, 3] } else { &[3, 4] }, 0.0);
        let b = c.param(&mut rng, if tb == 1 { &[5, 4] } else { &[4, 5] }, 0.0);
        let bias = c.param(&mut rng, &[5], 0.0);
        let attrs = Attrs::new()
            .with("transA", Attr::Int(ta))
            .with("transB", Attr::Int(tb))
            .with("alpha", Attr::Float(0.7))
            .with("beta", Attr::Float(1.3));
        c.out = op(&mut c.g, "Gemm", &[a, b, bias], attrs);
        check(c, &mut rng);
    }
}

#[test]
fn reductions_shapes_and_softmax() {
    let mut rng = Rng(3);
    for name in ["ReduceSum", "ReduceMean"] {
        for (ax, keep) in [(&[1i64][..], 1), (&[0, 2], 0), (&[-1], 0)] {
            let mut c = Case::new(name);
            let x = c.param(&mut rng, &[2, 3, 4], 0.0);
            let a = axes(&mut c.g, ax);
            c.out = op(
                &mut c.g,
                name,
                &[x, a],
                Attrs::new().with("keepdims", Attr::Int(keep)),
            );
            check(c, &mut rng);
        }
    }
    let mut c = Case::new("reshape, transpose, flatten");
    let x = c.param(&mut rng, &[2, 3, 4], 0.0);
    let s = axes(&mut c.g, &[4, 6]);
    let h = op(&mut c.g, "Reshape", &[x, s], Attrs::new());
    let h = op(
        &mut c.g,
        "Transpose",
        &[h],
        Attrs::new().with("perm", Attr::Ints(vec![1, 0])),
    );
    let h = op(&mut c.g, "Mul", &[h, h], Attrs::new());
    c.out = op(&mut c.g, "Flatten", &[h], Attrs::new());
    check(c, &mut rng);
    for name in ["Softmax", "LogSoftmax"] {
        for axis in [-1, 0] {
            let mut c = Case::new(name);
            let x = c.param(&mut rng, &[3, 5], 0.0);
            c.out = op(
                &mut c.g,
                name,
                &[x],
                Attrs::new().with("axis", Attr::Int(axis)),
            );
            check(c, &mut rng);
        }
    }
}

/// A two-layer MLP's cross-entropy over a symbolic batch, with respect to all its
/// weights; a value used twice (the residual) sums its gradients.
#[test]
fn an_mlp_loss_over_a_symbolic_batch() {
    let mut rng = Rng(4);
    let mut g = Graph::new("mlp");
    let batch = |d: usize| {
        TensorType::new(
            DType::F64,
            Shape::new([Dim::Sym("N".into()), Dim::Fixed(d)]),
        )
    };
    let x: Value = g.add_parameter("x", batch(6)).unwrap().into();
    let onehot: Value = g.add_parameter("labels", batch(4)).unwrap().into();
    let mut c = Case::new("mlp");
    c.g = g;
    let w1 = c.param(&mut rng, &[6, 8], 0.0);
    let b1 = c.param(&mut rng, &[8], 0.0);
    let w2 = c.param(&mut rng, &[8, 4], 0.0);
    let b2 = c.param(&mut rng, &[4], 0.0);
    let h = op(&mut c.g, "MatMul", &[x, w1], Attrs::new());
    let h = op(&mut c.g, "Add", &[h, b1], Attrs::new());
    let h = op(&mut c.g, "Tanh", &[h], Attrs::new());
    let z = op(&mut c.g, "Gemm", &[h, w2, b2], Attrs::new());
    let z = op(&mut c.g, "Add", &[z, z], Attrs::new());
    let lp = op(&mut c.g, "LogSoftmax", &[z], Attrs::new());
    let nll = op(&mut c.g, "Mul", &[lp, onehot], Attrs::new());
    let nll = op(&mut c.g, "Neg", &[nll], Attrs::new());
    let a = axes(&mut c.g, &[0, 1]);
    let loss = op(
        &mut c.g,
        "ReduceMean",
        &[nll, a],
        Attrs::new().with("keepdims", Attr::Int(0)),
    );
    c.out = loss;
    // The data come first in the graph's inputs: x and the labels are not differentiated.
    let n = 5;
    let mut labels = vec![0.0; n * 4];
    for i in 0..n {
        labels[i * 4 + i % 4] = 1.0;
    }
    let data = [
        rng.f64_tensor_away_from_zero(&[n, 6], 0.0),
        Tensor::from_vec(&[n, 4], labels).unwrap(),
    ];
    c.values.splice(0..0, data);
    check_params(&c, &mut rng, 2);
}

/// A convolution and a MaxPool over a symbolic batch, with respect to the filter: the
/// pool's gradient scatters into a flattened input whose length is a symbol.
#[test]
fn a_max_pool_over_a_symbolic_batch() {
    let mut rng = Rng(5);
    let mut g = Graph::new("pool");
    let ty = TensorType::new(
        DType::F64,
        Shape::new([
            Dim::Sym("N".into()),
            Dim::Fixed(2),
            Dim::Fixed(4),
            Dim::Fixed(4),
        ]),
    );
    let x: Value = g.add_parameter("x", ty).unwrap().into();
    let mut c = Case::new("pool");
    c.g = g;
    let w = c.param(&mut rng, &[3, 2, 3, 3], 0.0);
    let pads = Attrs::new().with("pads", Attr::Ints(vec![1, 1, 1, 1]));
    let y = op(&mut c.g, "Conv", &[x, w], pads);
    let pool = Attrs::new()
        .with("kernel_shape", Attr::Ints(vec![2, 2]))
        .with("strides", Attr::Ints(vec![2, 2]));
    let p = op(&mut c.g, "MaxPool", &[y], pool);
    let p = op(&mut c.g, "Mul", &[p, p], Attrs::new());
    let a = axes(&mut c.g, &[0, 1, 2, 3]);
    c.out = op(
        &mut c.g,
        "ReduceMean",
        &[p, a],
        Attrs::new().with("keepdims", Attr::Int(0)),
    );
    c.values
        .insert(0, rng.f64_tensor_away_from_zero(&[3, 2, 4, 4], 0.0));
    check_params(&c, &mut rng, 1);
}

/// SoftmaxCrossEntropyLoss with each reduction, through its loss and its log_prob.
#[test]
fn softmax_cross_entropy() {
    let mut rng = Rng(8);
    for reduction in ["mean", "sum", "none"] {
        let mut c = Case::new(reduction);
        let scores = c.param(&mut rng, &[4, 5], 0.0);
        let labels = Tensor::from_vec(&[4], vec![0i64, 3, 4, 3]).unwrap();
        let labels: Value = c.g.add_constant_value("labels", labels).unwrap().into();
        let attrs = Attrs::new().with("reduction", Attr::String(reduction.into()));
        let id =
            c.g.op("SoftmaxCrossEntropyLoss", &[scores, labels], attrs, "")
                .unwrap();
        let flat = |a| Attrs::new().with("axis", Attr::Int(a));
        let lp = op(&mut c.g, "Exp", &[id.out(1)], Attrs::new());
        let lp = op(&mut c.g, "ReduceMean", &[lp], Attrs::new());
        let lp = op(&mut c.g, "Flatten", &[lp], flat(0));
        let loss = op(&mut c.g, "Flatten", &[id.into()], flat(0));
        c.out = op(&mut c.g, "Concat", &[loss, lp], flat(1));
        check(c, &mut rng);
    }
}

/// d/dx Σ r·(d/dx Σ x³) = 6·x·r: the rules differentiate their own output.
#[test]
fn a_gradient_of_a_gradient() {
    let mut rng = Rng(5);
    let mut g = Graph::new("second order");
    let x: Value = g.add_parameter("x", f64_type(&[7])).unwrap().into();
    let x2 = op(&mut g, "Mul", &[x, x], Attrs::new());
    let x3 = op(&mut g, "Mul", &[x2, x], Attrs::new());
    let s = op(
        &mut g,
        "ReduceSum",
        &[x3],
        Attrs::new().with("keepdims", Attr::Int(0)),
    );
    let dx = grad(&mut g, s, &[x]).unwrap()[0];
    let mut c = Case::new("second order");
    c.g = g;
    c.params = vec![x];
    c.values = vec![rng.f64_tensor_away_from_zero(&[7], 0.0)];
    c.out = dx;
    check(c, &mut rng);
}

#[test]
fn what_has_no_gradient_is_an_error_naming_the_node() {
    let mut g = Graph::new("errors");
    let x: Value = g.add_parameter("x", f64_type(&[3])).unwrap().into();
    let k: Value = g
        .add_constant_value("k", Tensor::from_vec(&[3], vec![1.0f64, 2.0, 3.0]).unwrap())
        .unwrap()
        .into();
    let y = op(&mut g, "Mul", &[x, k], Attrs::new());
    // A loss that is not a scalar.
    let e = grad(&mut g, y, &[x]).unwrap_err().to_string();
    assert!(
        e.contains("must be a float scalar") && e.contains("Mul"),
        "{e}"
    );
    // With respect to a constant.
    let s = op(
        &mut g,
        "ReduceSum",
        &[y],
        Attrs::new().with("keepdims", Attr::Int(0)),
    );
    let e = grad(&mut g, s, &[k]).unwrap_err().to_string();
    assert!(e.contains("'k' is a Constant"), "{e}");
    // Through an op without a rule.
    let f = op(&mut g, "Floor", &[x], Attrs::new());
    let fs = op(
        &mut g,
        "ReduceSum",
        &[f],
        Attrs::new().with("keepdims", Attr::Int(0)),
    );
    let e = grad(&mut g, fs, &[x]).unwrap_err().to_string();
    assert!(
        e.contains("no gradient rule for Floor") && e.contains("Floor"),
        "{e}"
    );
    // Only through integers: x's shape.
    let n = op(&mut g, "Size", &[x], Attrs::new());
    let n = op(
        &mut g,
        "Cast",
        &[n],
        Attrs::new().with("to", Attr::String("f64".into())),
    );
    let e = grad(&mut g, n, &[x]).unwrap_err().to_string();
    assert!(e.contains("only through integer values"), "{e}");
    // Not a dependency at all: zeros.
    let other: Value = g.add_parameter("other", f64_type(&[2])).unwrap().into();
    let gz = grad(&mut g, s, &[other]).unwrap()[0];
    g.add_output("gz", gz).unwrap();
    let exe = backend_with(Device::Interp, CompileOptions::default())
        .unwrap()
        .compile(&g)
        .unwrap();
    let got = exe
        .run(&[
            Tensor::from_vec(&[3], vec![1.0f64; 3]).unwrap(),
            Tensor::from_vec(&[2], vec![5.0f64; 2]).unwrap(),
        ])
        .unwrap();
    assert_eq!(got[0].to_f64_vec(), vec![0.0, 0.0]);
}

fn konst(g: &mut Graph, t: Tensor) -> Value {
    let name = g.fresh_name("k");
    g.add_constant_value(&name, t).unwrap().into()
}

fn scaled(g: &mut Graph, x: Value, s: f64) -> Value {
    let k = konst(g, Tensor::scalar(s));
    op(g, "Mul", &[x, k], Attrs::new())
}

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

/// Convolutions beyond 2-D group 1: grouped, depthwise, 1-D, 3-D, automatic padding.
#[test]
fn convolutions_of_any_rank_and_group() {
    let mut rng = Rng(11);
    type ConvCase<'a> = (&'a [usize], &'a [usize], i64, Attrs);
    let cases: Vec<ConvCase> = vec![
        // Grouped 2-D, strided and padded.
        (
            &[2, 4, 6, 5],
            &[6, 2, 3, 2],
            2,
            Attrs::new()
                .with("strides", ints(&[2, 1]))
                .with("pads", ints(&[1, 0, 0, 1])),
        ),
        // Depthwise 2-D with dilation.
        (
            &[1, 3, 7, 7],
            &[3, 1, 3, 3],
            3,
            Attrs::new()
                .with("dilations", ints(&[2, 1]))
                .with("pads", ints(&[1, 1, 1, 1])),
        ),
        // Depthwise with a channel multiplier (M = 2·C).
        (
            &[2, 2, 5, 5],
            &[4, 1, 2, 2],
            2,
            Attrs::new().with("strides", ints(&[2, 2])),
        ),
        // 1-D, strided, with a skipped last input position.
        (
            &[2, 3, 10],
            &[4, 3, 3],
            1,
            Attrs::new()
                .with("strides", ints(&[3]))
                .with("pads", ints(&[1, 0])),
        ),
        // 1-D grouped, dilated.
        (
            &[1, 4, 9],
            &[2, 2, 2],
            2,
            Attrs::new().with("dilations", ints(&[3])),
        ),
        // 3-D.
        (
            &[1, 2, 4, 5, 3],
            &[3, 2, 2, 3, 2],
            1,
            Attrs::new()
                .with("strides", ints(&[1, 2, 1]))
                .with("pads", ints(&[1, 0, 1, 0, 1, 0])),
        ),
        // 2-D SAME_UPPER, strided.
        (
            &[1, 2, 7, 6],
            &[2, 2, 3, 3],
            1,
            Attrs::new()
                .with("auto_pad", Attr::String("SAME_UPPER".into()))
                .with("strides", ints(&[2, 2])),
        ),
        // 2-D SAME_LOWER, grouped.
        (
            &[1, 4, 5, 5],
            &[4, 2, 2, 2],
            2,
            Attrs::new().with("auto_pad", Attr::String("SAME_LOWER".into())),
        ),
    ];
    for (x, w, group, attrs) in cases {
        let mut c = Case::new(&format!("conv {x:?} {w:?} group {group}"));
        let xv = c.param(&mut rng, x, 0.0);
        let wv = c.param(&mut rng, w, 0.0);
        let b = c.param(&mut rng, &[w[0]], 0.0);
        c.out = op(
            &mut c.g,
            "Conv",
            &[xv, wv, b],
            attrs.with("group", Attr::Int(group)),
        );
        check(c, &mut rng);
    }
}

/// AveragePool with padding counted or not, ceil mode, dilation, 1-D and automatic
/// padding: each window's count differs at the borders.
#[test]
fn average_pools() {
    let mut rng = Rng(12);
    let cases: Vec<(&[usize], Attrs)> = vec![
        (
            &[2, 3, 5, 6],
            Attrs::new()
                .with("kernel_shape", ints(&[2, 3]))
                .with("strides", ints(&[2, 2]))
                .with("pads", ints(&[0, 1, 1, 0])),
        ),
        (
            &[1, 2, 6, 7],
            Attrs::new()
                .with("kernel_shape", ints(&[3, 3]))
                .with("strides", ints(&[2, 2]))
                .with("pads", ints(&[1, 1, 1, 1]))
                .with("ceil_mode", Attr::Int(1)),
        ),
        (
            &[1, 2, 7, 7],
            Attrs::new()
                .with("kernel_shape", ints(&[2, 2]))
                .with("strides", ints(&[3, 3]))
                .with("ceil_mode", Attr::Int(1)),
        ),
        (
            &[1, 2, 7, 6],
            Attrs::new()
                .with("kernel_shape", ints(&[2, 2]))
                .with("dilations", ints(&[2, 1]))
                .with("pads", ints(&[1, 0, 0, 1])),
        ),
        (
            &[2, 3, 9],
            Attrs::new()
                .with("kernel_shape", ints(&[4]))
                .with("strides", ints(&[2]))
                .with("pads", ints(&[2, 1])),
        ),
        (
            &[1, 2, 5, 5],
            Attrs::new()
                .with("kernel_shape", ints(&[3, 2]))
                .with("strides", ints(&[2, 2]))
                .with("auto_pad", Attr::String("SAME_UPPER".into())),
        ),
    ];
    for (x, attrs) in cases {
        for include_pad in [0, 1] {
            let mut c = Case::new(&format!(
                "average pool {x:?} count_include_pad {include_pad}"
            ));
            let xv = c.param(&mut rng, x, 0.0);
            let attrs = attrs
                .clone()
                .with("count_include_pad", Attr::Int(include_pad));
            c.out = op(&mut c.g, "AveragePool", &[xv], attrs);
            check(c, &mut rng);
        }
    }
}

/// BatchNormalization (every input, positive variances), LayerNormalization through Y
/// only and through all three outputs, RMSNormalization, InstanceNormalization.
#[test]
fn normalizations() {
    let mut rng = Rng(13);
    for x in [&[2, 3, 4, 5][..], &[4, 3]] {
        let mut c = Case::new("batch norm");
        let xv = c.param(&mut rng, x, 0.0);
        let ps: Vec<Value> = (0..4).map(|_| c.param(&mut rng, &[3], 0.3)).collect();
        let var = op(&mut c.g, "Abs", &[ps[3]], Attrs::new());
        c.out = op(
            &mut c.g,
            "BatchNormalization",
            &[xv, ps[0], ps[1], ps[2], var],
            Attrs::new().with("epsilon", Attr::Float(0.01)),
        );
        check(c, &mut rng);
    }
    for (axis, scale, bias) in [
        (-1i64, &[4][..], Some(&[4][..])),
        (1, &[3, 4], None),
        (1, &[1, 4], Some(&[3, 1])),
    ] {
        // Default stash_type 1 (f32 statistics): the rule recomputes them in f64.
        let mut c = Case::new(&format!("layer norm axis {axis}"));
        let xv = c.param(&mut rng, &[2, 3, 4], 0.0);
        let s = c.param(&mut rng, scale, 0.0);
        let mut ins = vec![xv, s];
        if let Some(b) = bias {
            ins.push(c.param(&mut rng, b, 0.0));
        }
        c.out = op(
            &mut c.g,
            "LayerNormalization",
            &ins,
            Attrs::new().with("axis", Attr::Int(axis)),
        );
        check(c, &mut rng);
    }
    for outputs in [&[0usize, 1, 2][..], &[1, 2], &[2]] {
        let mut c = Case::new(&format!("layer norm outputs {outputs:?}"));
        let xv = c.param(&mut rng, &[3, 5], 0.0);
        let s = c.param(&mut rng, &[5], 0.0);
        let b = c.param(&mut rng, &[5], 0.0);
        let attrs = Attrs::new().with("stash_type", Attr::Int(0));
        let id =
            c.g.op("LayerNormalization", &[xv, s, b], attrs, "")
                .unwrap();
        let flat = |a| Attrs::new().with("axis", Attr::Int(a));
        let parts: Vec<Value> = outputs
            .iter()
            .map(|&o| op(&mut c.g, "Flatten", &[id.out(o as u32)], flat(0)))
            .collect();
        c.out = op(&mut c.g, "Concat", &parts, flat(1));
        check(c, &mut rng);
    }
    let mut c = Case::new("rms norm");
    let xv = c.param(&mut rng, &[2, 3, 4], 0.0);
    let s = c.param(&mut rng, &[3, 4], 0.0);
    c.out = op(
        &mut c.g,
        "RMSNormalization",
        &[xv, s],
        Attrs::new().with("axis", Attr::Int(1)),
    );
    check(c, &mut rng);
    let mut c = Case::new("instance norm");
    let xv = c.param(&mut rng, &[2, 3, 4, 3], 0.0);
    let s = c.param(&mut rng, &[3], 0.0);
    let b = c.param(&mut rng, &[3], 0.0);
    c.out = op(&mut c.g, "InstanceNormalization", &[xv, s, b], Attrs::new());
    check(c, &mut rng);
}

/// Gather along each axis with repeated and negative indices (the repeats' gradients
/// add up), GatherElements, Slice (unit and other steps), Pad in each mode and cropping,
/// Tile, Split with an unused output.
#[test]
fn selections_and_their_scatters() {
    let mut rng = Rng(14);
    for axis in [0i64, 1, -1] {
        let mut c = Case::new(&format!("gather axis {axis}"));
        let xv = c.param(&mut rng, &[4, 3, 5], 0.0);
        let idx = konst(
            &mut c.g,
            Tensor::from_vec(&[2, 3], vec![0i64, 2, -1, 2, 2, 1]).unwrap(),
        );
        c.out = op(
            &mut c.g,
            "Gather",
            &[xv, idx],
            Attrs::new().with("axis", Attr::Int(axis)),
        );
        check(c, &mut rng);
    }
    let mut c = Case::new("gather scalar index");
    let xv = c.param(&mut rng, &[4, 3], 0.0);
    let idx = konst(&mut c.g, Tensor::scalar(2i64));
    c.out = op(&mut c.g, "Gather", &[xv, idx], Attrs::new());
    check(c, &mut rng);
    let mut c = Case::new("gather nd");
    let xv = c.param(&mut rng, &[3, 4, 2], 0.0);
    let idx = konst(
        &mut c.g,
        Tensor::from_vec(&[3, 2], vec![0i64, 1, 2, -1, 0, 1]).unwrap(),
    );
    c.out = op(&mut c.g, "GatherND", &[xv, idx], Attrs::new());
    check(c, &mut rng);
    let mut c = Case::new("reverse sequence");
    let xv = c.param(&mut rng, &[4, 3, 2], 0.0);
    let lens = konst(&mut c.g, Tensor::from_vec(&[3], vec![4i64, 1, 2]).unwrap());
    c.out = op(&mut c.g, "ReverseSequence", &[xv, lens], Attrs::new());
    check(c, &mut rng);
    for (upper, k) in [(1, None), (0, Some(-1i64))] {
        let mut c = Case::new(&format!("trilu {upper} {k:?}"));
        let xv = c.param(&mut rng, &[2, 3, 4], 0.0);
        let mut ins = vec![Some(xv)];
        if let Some(k) = k {
            ins.push(Some(konst(&mut c.g, Tensor::scalar(k))));
        }
        let attrs = Attrs::new().with("upper", Attr::Int(upper));
        c.out = c.g.add_op("Trilu", &ins, attrs, "").unwrap().into();
        check(c, &mut rng);
    }
    let mut c = Case::new("gather elements");
    let xv = c.param(&mut rng, &[3, 4], 0.0);
    let idx = konst(
        &mut c.g,
        Tensor::from_vec(
            &[3, 5],
            vec![0i64, 0, 3, 1, -1, 2, 2, 2, 0, 1, 3, 3, 0, 1, 2],
        )
        .unwrap(),
    );
    c.out = op(
        &mut c.g,
        "GatherElements",
        &[xv, idx],
        Attrs::new().with("axis", Attr::Int(1)),
    );
    check(c, &mut rng);
    type SliceCase<'a> = (&'a [i64], &'a [i64], Option<&'a [i64]>, Option<&'a [i64]>);
    let slices: Vec<SliceCase> = vec![
        (&[1, -3], &[3, 100], None, None),
        (&[-2], &[1000], Some(&[0]), None),
        (&[0, 4], &[5, 0], Some(&[1, 2]), Some(&[2, -1])),
        (&[-1], &[-100], Some(&[-1]), Some(&[-2])),
    ];
    for (starts, ends, ax, steps) in slices {
        let mut c = Case::new(&format!("slice {starts:?} {ends:?} {ax:?} {steps:?}"));
        let xv = c.param(&mut rng, &[4, 6, 5], 0.0);
        let mut ins = vec![Some(axes(&mut c.g, starts)), Some(axes(&mut c.g, ends))];
        if ax.is_some() || steps.is_some() {
            let a = ax.map_or_else(|| (0..starts.len() as i64).collect(), |a| a.to_vec());
            ins.push(Some(axes(&mut c.g, &a)));
        }
        if let Some(s) = steps {
            ins.push(Some(axes(&mut c.g, s)));
        }
        ins.insert(0, Some(xv));
        c.out = c.g.add_op("Slice", &ins, Attrs::new(), "").unwrap().into();
        check(c, &mut rng);
    }
    for (mode, pads) in [
        ("constant", &[1i64, 0, 2, 1][..]),
        ("constant", &[-1, 2, 1, -2]),
        ("reflect", &[2, 1, 1, 3]),
        ("edge", &[1, 2, 3, 0]),
        ("wrap", &[1, 0, 2, 3]),
    ] {
        let mut c = Case::new(&format!("pad {mode} {pads:?}"));
        let xv = c.param(&mut rng, &[4, 5], 0.0);
        let p = axes(&mut c.g, pads);
        let mut ins = vec![xv, p];
        if mode == "constant" {
            ins.push(c.param(&mut rng, &[], 0.0));
        }
        c.out = op(
            &mut c.g,
            "Pad",
            &ins,
            Attrs::new().with("mode", Attr::String(mode.into())),
        );
        check(c, &mut rng);
    }
    let mut c = Case::new("pad on listed axes");
    let xv = c.param(&mut rng, &[2, 3, 4], 0.0);
    let (p, a) = (axes(&mut c.g, &[1, 2]), axes(&mut c.g, &[-1]));
    c.out =
        c.g.add_op("Pad", &[Some(xv), Some(p), None, Some(a)], Attrs::new(), "")
            .unwrap()
            .into();
    check(c, &mut rng);
    for (axis, exclusive, reverse) in [(1i64, 0, 0), (0, 1, 0), (-1, 1, 1), (0, 0, 1)] {
        let mut c = Case::new(&format!("cumsum {axis} {exclusive} {reverse}"));
        let xv = c.param(&mut rng, &[3, 4], 0.0);
        let a = konst(&mut c.g, Tensor::scalar(axis));
        let attrs = Attrs::new()
            .with("exclusive", Attr::Int(exclusive))
            .with("reverse", Attr::Int(reverse));
        c.out = op(&mut c.g, "CumSum", &[xv, a], attrs);
        check(c, &mut rng);
    }
    let mut c = Case::new("tile");
    let xv = c.param(&mut rng, &[2, 3], 0.0);
    let reps = axes(&mut c.g, &[3, 2]);
    c.out = op(&mut c.g, "Tile", &[xv, reps], Attrs::new());
    check(c, &mut rng);
    let mut c = Case::new("split");
    let xv = c.param(&mut rng, &[3, 7], 0.0);
    let sizes = axes(&mut c.g, &[2, 4, 1]);
    let id =
        c.g.op(
            "Split",
            &[xv, sizes],
            Attrs::new().with("axis", Attr::Int(1)),
            "",
        )
        .unwrap();
    let sq = op(&mut c.g, "Mul", &[id.out(2), id.out(2)], Attrs::new());
    c.out = op(
        &mut c.g,
        "Concat",
        &[id.out(0), sq],
        Attrs::new().with("axis", Attr::Int(1)),
    );
    check(c, &mut rng);
}

/// Variadic Sum, Mean, Max, Min with broadcasting; ReduceMax/ReduceMin and the other
/// reductions.
#[test]
fn variadic_ops_and_reductions() {
    let mut rng = Rng(15);
    for name in ["Sum", "Mean", "Max", "Min"] {
        for dims in [
            &[&[3, 4][..], &[4], &[3, 1]][..],
            &[&[2, 3]],
            &[&[2, 3], &[2, 3]],
        ] {
            let mut c = Case::new(&format!("{name} of {}", dims.len()));
            let ins: Vec<Value> = dims.iter().map(|d| c.param(&mut rng, d, 0.0)).collect();
            c.out = op(&mut c.g, name, &ins, Attrs::new());
            check(c, &mut rng);
        }
    }
    for name in [
        "ReduceMax",
        "ReduceMin",
        "ReduceL1",
        "ReduceL2",
        "ReduceSumSquare",
        "ReduceLogSumExp",
        "ReduceLogSum",
    ] {
        for (ax, keep) in [(Some(&[1i64][..]), 1), (Some(&[0, 2]), 0), (None, 0)] {
            let mut c = Case::new(name);
            let x = c.param(&mut rng, &[2, 3, 4], 0.2);
            let x = if name == "ReduceLogSum" {
                op(&mut c.g, "Abs", &[x], Attrs::new())
            } else {
                x
            };
            let mut ins = vec![x];
            if let Some(ax) = ax {
                ins.push(axes(&mut c.g, ax));
            }
            c.out = op(
                &mut c.g,
                name,
                &ins,
                Attrs::new().with("keepdims", Attr::Int(keep)),
            );
            check(c, &mut rng);
        }
    }
}

/// Ties of ReduceMax share the gradient equally; of Max, the first operand takes it.
#[test]
fn ties_of_extrema() {
    let mut g = Graph::new("ties");
    let x: Value = g.add_parameter("x", f64_type(&[2, 3])).unwrap().into();
    let m = op(
        &mut g,
        "ReduceMax",
        &[x],
        Attrs::new().with("keepdims", Attr::Int(0)),
    );
    let b: Value = g.add_parameter("b", f64_type(&[2, 3])).unwrap().into();
    let c: Value = g.add_parameter("c", f64_type(&[3])).unwrap().into();
    let mm = op(&mut g, "Max", &[x, b, c], Attrs::new());
    let s = op(
        &mut g,
        "ReduceSum",
        &[mm],
        Attrs::new().with("keepdims", Attr::Int(0)),
    );
    let loss = op(&mut g, "Add", &[m, s], Attrs::new());
    let grads = grad(&mut g, loss, &[x, b, c]).unwrap();
    for (i, gv) in grads.iter().enumerate() {
        g.add_output(&format!("g{i}"), *gv).unwrap();
    }
    let exe = backend_with(Device::Interp, CompileOptions::default())
        .unwrap()
        .compile(&g)
        .unwrap();
    let t = |d: &[usize], v: &[f64]| Tensor::from_vec(d, v.to_vec()).unwrap();
    let got = exe
        .run(&[
            t(&[2, 3], &[1.0, 3.0, 3.0, 0.0, 2.0, 2.0]),
            t(&[2, 3], &[1.0, 3.0, 0.0, 5.0, 2.0, 1.0]),
            t(&[3], &[1.0, 3.0, 3.0]),
        ])
        .unwrap();
    // ReduceMax over all: the max 3 at x[0, 1] and x[0, 2] gets ½ each. Max(x, b, c):
    // x wins its ties (all of row 0), b takes [1, 0] (5), c [1, 1] and [1, 2] (3).
    assert_eq!(got[0].to_f64_vec(), vec![1.0, 1.5, 1.5, 0.0, 0.0, 0.0]);
    assert_eq!(got[1].to_f64_vec(), vec![0.0, 0.0, 0.0, 1.0, 0.0, 0.0]);
    assert_eq!(got[2].to_f64_vec(), vec![0.0, 1.0, 1.0]);
}

/// The unary activations and trigonometric functions, each on inputs spread over its
/// regions (scaled to stay in its domain and away from its kinks).
#[test]
fn activations_and_trigonometry() {
    let mut rng = Rng(16);
    let f = |a: f64| Attr::Float(a);
    for (name, scale, shift, attrs) in [
        ("Softplus", 3.0, 0.0, Attrs::new()),
        ("Mish", 3.0, 0.0, Attrs::new()),
        ("Sin", 3.0, 0.0, Attrs::new()),
        ("Cos", 3.0, 0.0, Attrs::new()),
        ("Tan", 1.0, 0.0, Attrs::new()),
        ("Asin", 0.8, 0.0, Attrs::new()),
        ("Acos", 0.8, 0.0, Attrs::new()),
        ("Atan", 3.0, 0.0, Attrs::new()),
        ("Sinh", 2.0, 0.0, Attrs::new()),
        ("Cosh", 2.0, 0.0, Attrs::new()),
        ("Asinh", 3.0, 0.0, Attrs::new()),
        ("Acosh", 1.0, 2.2, Attrs::new()),
        ("Atanh", 0.8, 0.0, Attrs::new()),
        ("Softsign", 3.0, 0.0, Attrs::new()),
        ("HardSwish", 5.0, 0.0, Attrs::new()),
        ("Elu", 2.0, 0.0, Attrs::new().with("alpha", f(0.7))),
        ("Celu", 2.0, 0.0, Attrs::new().with("alpha", f(1.3))),
        ("Selu", 2.0, 0.0, Attrs::new()),
        (
            "HardSigmoid",
            5.0,
            0.0,
            Attrs::new().with("alpha", f(0.3)).with("beta", f(0.4)),
        ),
        (
            "ThresholdedRelu",
            2.0,
            0.0,
            Attrs::new().with("alpha", f(0.5)),
        ),
    ] {
        let mut c = Case::new(name);
        let x = c.param(&mut rng, &[4, 6], 0.05);
        let x = scaled(&mut c.g, x, scale);
        let x = if shift != 0.0 {
            let k = konst(&mut c.g, Tensor::scalar(shift));
            op(&mut c.g, "Add", &[x, k], Attrs::new())
        } else {
            x
        };
        c.out = op(&mut c.g, name, &[x], attrs);
        check(c, &mut rng);
    }
    let mut c = Case::new("PRelu");
    let x = c.param(&mut rng, &[3, 5], 0.05);
    let s = c.param(&mut rng, &[5], 0.0);
    c.out = op(&mut c.g, "PRelu", &[x, s], Attrs::new());
    check(c, &mut rng);
}

#[test]
fn an_op_still_without_a_rule_names_its_node() {
    let mut g = Graph::new("unsupported");
    let x: Value = g
        .add_parameter("x", f64_type(&[1, 2, 4, 4]))
        .unwrap()
        .into();
    let attrs = Attrs::new().with("kernel_shape", ints(&[2, 2]));
    let p: Value = g.op("LpPool", &[x], attrs, "the_lp_pool").unwrap().into();
    let s = op(
        &mut g,
        "ReduceSum",
        &[p],
        Attrs::new().with("keepdims", Attr::Int(0)),
    );
    let e = grad(&mut g, s, &[x]).unwrap_err().to_string();
    assert!(
        e.contains("'the_lp_pool' (LpPool)") && e.contains("no gradient rule for LpPool"),
        "{e}"
    );
}

/// A network built the same way in f32 and f64: its parameters (data and weights, in
/// graph-input order) with values drawn from one seed, so both precisions see the same
/// numbers.
struct Net {
    g: Graph,
    dt: DType,
    rng: Rng,
    values: Vec<Tensor>,
    weights: Vec<Value>,
}

impl Net {
    fn new(name: &str, dt: DType) -> Net {
        Net {
            g: Graph::new(name),
            dt,
            rng: Rng(99),
            values: vec![],
            weights: vec![],
        }
    }

    fn input(&mut self, dims: &[usize], scale: f64) -> Value {
        let name = format!("in{}", self.values.len());
        let ty = TensorType::new(self.dt, Shape::fixed(dims));
        let v: Value = self.g.add_parameter(&name, ty).unwrap().into();
        let t = self.rng.f64_tensor_away_from_zero(dims, 0.0);
        let x: Vec<f64> = t.to_f64_vec().iter().map(|v| v * scale).collect();
        self.values
            .push(Tensor::from_f64s(self.dt, dims, &x).unwrap());
        v
    }

    fn weight(&mut self, dims: &[usize], scale: f64) -> Value {
        let v = self.input(dims, scale);
        self.weights.push(v);
        v
    }

    /// i64 data (labels, indices) below `bound`.
    fn indices(&mut self, dims: &[usize], bound: i64) -> Value {
        let name = format!("in{}", self.values.len());
        let ty = TensorType::new(DType::I64, Shape::fixed(dims));
        let v: Value = self.g.add_parameter(&name, ty).unwrap().into();
        let n: usize = dims.iter().product();
        let x: Vec<i64> = (0..n as i64).map(|i| (i * 7 + 3) % bound).collect();
        self.values.push(Tensor::from_vec(dims, x).unwrap());
        v
    }

    fn op(&mut self, name: &str, inputs: &[Value], attrs: Attrs) -> Value {
        op(&mut self.g, name, inputs, attrs)
    }

    fn sce(&mut self, scores: Value, labels: Value) -> Value {
        self.op("SoftmaxCrossEntropyLoss", &[scores, labels], Attrs::new())
    }
}

/// An MLP with softmax cross-entropy.
fn mlp_net(dt: DType) -> (Net, Value) {
    let mut n = Net::new("mlp", dt);
    let x = n.input(&[8, 12], 1.0);
    let labels = n.indices(&[8], 5);
    let w1 = n.weight(&[12, 32], 0.4);
    let b1 = n.weight(&[32], 0.1);
    let w2 = n.weight(&[32, 5], 0.4);
    let b2 = n.weight(&[5], 0.1);
    let h = n.op("Gemm", &[x, w1, b1], Attrs::new());
    let h = n.op("Relu", &[h], Attrs::new());
    let h2 = n.op("MatMul", &[h, w2], Attrs::new());
    let z = n.op("Add", &[h2, b2], Attrs::new());
    let loss = n.sce(z, labels);
    (n, loss)
}

/// Conv (plain and depthwise), pools, batch normalization, a classifier.
fn conv_net(dt: DType) -> (Net, Value) {
    let mut n = Net::new("convnet", dt);
    let x = n.input(&[2, 3, 12, 12], 1.0);
    let labels = n.indices(&[2], 4);
    let w1 = n.weight(&[8, 3, 3, 3], 0.3);
    let b1 = n.weight(&[8], 0.1);
    let w2 = n.weight(&[8, 1, 3, 3], 0.3);
    let scale = n.weight(&[8], 1.0);
    let shift = n.weight(&[8], 0.2);
    let mean = n.weight(&[8], 0.2);
    let var = n.weight(&[8], 1.0);
    let w3 = n.weight(&[8, 4], 0.4);
    let h = n.op(
        "Conv",
        &[x, w1, b1],
        Attrs::new().with("pads", ints(&[1, 1, 1, 1])),
    );
    let h = n.op("Relu", &[h], Attrs::new());
    let mp = Attrs::new()
        .with("kernel_shape", ints(&[2, 2]))
        .with("strides", ints(&[2, 2]));
    let id = n.g.op("MaxPool", &[h], mp, "").unwrap();
    let h = id.into();
    let h = n.op(
        "Conv",
        &[h, w2],
        Attrs::new()
            .with("group", Attr::Int(8))
            .with("pads", ints(&[1, 1, 1, 1])),
    );
    let ap = Attrs::new()
        .with("kernel_shape", ints(&[3, 3]))
        .with("strides", ints(&[2, 2]))
        .with("pads", ints(&[1, 1, 1, 1]));
    let h = n.op("AveragePool", &[h], ap);
    let var = n.op("Abs", &[var], Attrs::new());
    let h = n.op(
        "BatchNormalization",
        &[h, scale, shift, mean, var],
        Attrs::new(),
    );
    let h = n.op("Tanh", &[h], Attrs::new());
    let h = n.op("GlobalAveragePool", &[h], Attrs::new());
    let h = n.op("Flatten", &[h], Attrs::new());
    let z = n.op("MatMul", &[h, w3], Attrs::new());
    let loss = n.sce(z, labels);
    (n, loss)
}

/// An embedding lookup, layer normalization, a projection with Gelu, softmax attention
/// weights over the sequence, and a squared-error-like loss.
fn layer_norm_net(dt: DType) -> (Net, Value) {
    let mut n = Net::new("layernorm", dt);
    let tokens = n.indices(&[3, 5], 10);
    let emb = n.weight(&[10, 16], 1.0);
    let scale = n.weight(&[16], 1.0);
    let bias = n.weight(&[16], 0.2);
    let w = n.weight(&[16, 16], 0.3);
    let h = n.op("Gather", &[emb, tokens], Attrs::new());
    let id =
        n.g.op("LayerNormalization", &[h, scale, bias], Attrs::new(), "")
            .unwrap();
    let h = n.op("MatMul", &[id.into(), w], Attrs::new());
    let h = n.op("Gelu", &[h], Attrs::new());
    let a = n.op("Softmax", &[h], Attrs::new().with("axis", Attr::Int(1)));
    let h = n.op("Mul", &[a, h], Attrs::new());
    let h = n.op("Sin", &[h], Attrs::new());
    let l = n.op(
        "ReduceSumSquare",
        &[h],
        Attrs::new().with("keepdims", Attr::Int(0)),
    );
    (n, l)
}

/// The largest |a − b| relative to b's largest magnitude.
fn rel_max_err(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-30);
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
        / scale
}

/// The same networks in f32 and f64, their gradient graphs run on the interpreter and on
/// the CPU backend: f32 gradients within 1e-5 of the f64 ones (relative to each
/// gradient's largest magnitude; 3.7e-7 is the largest seen), the CPU's f64 within 1e-9
/// of the interpreter's.
#[test]
fn f32_gradients_against_f64_on_the_interpreter_and_the_cpu() {
    let nets: [fn(DType) -> (Net, Value); 3] = [mlp_net, conv_net, layer_norm_net];
    for build in nets {
        let mut results = vec![];
        for dt in [DType::F64, DType::F32] {
            let (mut n, loss) = build(dt);
            let grads = grad(&mut n.g, loss, &n.weights)
                .unwrap_or_else(|e| panic!("{e}\n{}", text::print(&n.g)));
            n.g.add_output("loss", loss).unwrap();
            for (i, gv) in grads.iter().enumerate() {
                n.g.add_output(&format!("grad{i}"), *gv).unwrap();
            }
            for device in [Device::Interp, Device::Cpu] {
                let exe = backend_with(
                    device,
                    CompileOptions {
                        threads: 1,
                        ..Default::default()
                    },
                )
                .unwrap()
                .compile(&n.g)
                .unwrap_or_else(|e| panic!("{}: {e}", n.g.name));
                let out = exe
                    .run(&n.values)
                    .unwrap_or_else(|e| panic!("{} on {device:?}: {e}", n.g.name));
                results.push((dt, device, n.g.name.clone(), out));
            }
        }
        let reference = &results[0].3;
        for (dt, device, name, out) in &results[1..] {
            let tol = if *dt == DType::F64 { 1e-9 } else { 1e-5 };
            for (i, (got, want)) in out.iter().zip(reference).enumerate() {
                let err = rel_max_err(got, want);
                eprintln!("{name} {dt} {device:?} output {i}: rel err {err:.2e}");
                assert!(
                    err <= tol,
                    "{name}: output {i} in {dt} on {device:?} is off by {err:.2e} (tolerance {tol:.0e})"
                );
            }
        }
    }
}
