//! Reverse-mode gradients against central finite differences, in f64 on the reference
//! interpreter: every rule on random inputs (relative error ≤ 1e-6), composites with
//! symbolic dims, a gradient of a gradient, and the errors for what has no gradient.
use kiln::autodiff::grad;
use kiln::backend::{backend_with, Device};
use kiln::ir::{text, Attr, Attrs, DType, Graph, Shape, TensorType, Value};
use kiln::passes::PassOptions;
use kiln::{Dim, Tensor};

/// splitmix64: every run checks the same points.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
    /// Values in ±[lo, 1): away from 0 by `lo` (kinks of Relu and Abs, poles of 1/x).
    fn tensor(&mut self, dims: &[usize], lo: f64) -> Tensor {
        let n = dims.iter().product();
        let v: Vec<f64> = (0..n)
            .map(|_| {
                let r = self.next();
                r.signum() * (lo + (1.0 - lo) * r.abs())
            })
            .collect();
        Tensor::from_vec(dims, v).unwrap()
    }
}

fn f64_type(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F64, Shape::fixed(dims))
}

fn op(g: &mut Graph, op: &str, inputs: &[Value], attrs: Attrs) -> Value {
    g.op(op, inputs, attrs, "")
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)))
        .into()
}

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
        self.values.push(rng.tensor(dims, lo));
        v
    }
}

/// The loss Σ out·R (R random, fixed) and its gradients by `grad`, each against central
/// differences of the loss.
fn check(mut c: Case, rng: &mut Rng) {
    let ty = c.g.value_type(c.out).unwrap().clone();
    let dims = ty.shape.to_fixed().expect("give the output static dims");
    let r: Value =
        c.g.add_constant_value("r", rng.tensor(&dims, 0.1))
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
        .add_constant_value("r_loss", rng.tensor(&[], 0.1))
        .unwrap()
        .into();
    let loss = op(&mut g, "Mul", &[c.out, r], Attrs::new());
    let grads =
        grad(&mut g, loss, &c.params).unwrap_or_else(|e| panic!("{e}\n{}", text::print(&g)));
    g.add_output("loss", loss).unwrap();
    for (i, gv) in grads.iter().enumerate() {
        g.add_output(&format!("grad{i}"), *gv).unwrap();
    }
    let exe = backend_with(Device::Interp, PassOptions::default(), 1)
        .unwrap()
        .compile(&g)
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(&g)));
    let run = |vals: &[Tensor]| {
        exe.run(vals)
            .unwrap_or_else(|e| panic!("{e}\n{}", text::print(&g)))
    };
    let base = run(&c.values);
    let h = 1e-5;
    for p in 0..c.params.len() {
        let value = &c.values[data + p];
        assert_eq!(base[1 + p].shape(), value.shape(), "gradient {p}'s shape");
        let x = value.to_f64_vec();
        for (k, &ana) in base[1 + p].to_f64_vec().iter().enumerate() {
            let at = |d: f64| {
                let mut xs = x.clone();
                xs[k] += d;
                let mut vals = c.values.clone();
                vals[data + p] = Tensor::from_vec(value.shape(), xs).unwrap();
                run(&vals)[0].to_f64_vec()[0]
            };
            let numeric = (at(h) - at(-h)) / (2.0 * h);
            let err = (ana - numeric).abs() / ana.abs().max(numeric.abs()).max(1e-2);
            assert!(
                err <= 1e-6,
                "{}: d loss / d p{p}[{k}]: {ana} by the rules, {numeric} by differences (rel {err:.1e})\n{}",
                g.name,
                text::print(&g)
            );
        }
    }
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
    let mask = rng.tensor(&[3, 4], 0.0);
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
        rng.tensor(&[n, 6], 0.0),
        Tensor::from_vec(&[n, 4], labels).unwrap(),
    ];
    c.values.splice(0..0, data);
    check_params(&c, &mut rng, 2);
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
    c.values = vec![rng.tensor(&[7], 0.0)];
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
    let exe = backend_with(Device::Interp, PassOptions::default(), 1)
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
