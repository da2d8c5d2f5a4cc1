//! The pass pipeline: snapshots of the IR after each pass on small graphs, every one
//! checked by differential testing (the reference interpreter gives the same outputs
//! before and after), random valid graphs through the whole pipeline (a seeded
//! property test), and the pass manager's switches and errors.
use crate::common;

use kiln::backend::interp::InterpExecutable;
use kiln::backend::Executable;
use kiln::ir::{text, Attr, Attrs, DType, Graph, Shape, TensorType, Value};
use kiln::passes::{
    self, run_passes, run_pipeline, Changed, CompileOptions, DumpIr, Pass, PassContext,
};
use kiln::{Result, Tensor};

use common::{f32_type, named_op, param, random_inputs, Rng};

fn run(g: &Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    InterpExecutable::new(g.clone())
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)))
        .run(inputs)
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)))
}

/// Both graphs give the same outputs on the same random inputs.
fn assert_same(before: &Graph, after: &Graph, seed: u64) {
    let mut rng = Rng(seed);
    let inputs = random_inputs(before, &mut rng, 2, 2.0);
    let (want, got) = (run(before, &inputs), run(after, &inputs));
    assert_eq!(want.len(), got.len());
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        g.check_close(w, 1e-5, 1e-5).unwrap_or_else(|e| {
            panic!(
                "output {i} differs after the passes: {e}\nbefore:\n{}\nafter:\n{}",
                text::print(before),
                text::print(after)
            )
        });
    }
}

fn options(pipeline: &str) -> CompileOptions {
    let mut o = CompileOptions::default();
    o.set("passes", pipeline).unwrap();
    o.verify = true;
    o
}

/// `g` after `pipeline` then dce, checked against `g` by the interpreter.
fn optimized(g: &Graph, pipeline: &str) -> Graph {
    let mut after = g.clone();
    run_pipeline(&mut after, &options(&format!("{pipeline},dce"))).unwrap();
    assert_same(g, &after, 7);
    after
}

fn c(g: &mut Graph, name: &str, dims: &[usize], values: &[f32]) -> Value {
    let t = Tensor::from_vec(dims, values.to_vec()).unwrap();
    g.add_constant_value(name, t).unwrap().into()
}

fn none() -> Attrs {
    Attrs::new()
}

fn ints(name: &str, v: &[i64]) -> Attrs {
    Attrs::new().with(name, Attr::Ints(v.to_vec()))
}

#[test]
fn constant_fold_evaluates_constants_and_static_shapes() {
    let mut g = Graph::new("fold");
    let x = param(&mut g, "x", &[2, 3]);
    let a = c(&mut g, "a", &[3], &[1.0, 2.0, 3.0]);
    let b = c(&mut g, "b", &[3], &[0.5, 0.5, 0.5]);
    let ab = named_op(&mut g, "Mul", &[a, b], none(), "ab");
    let y = named_op(&mut g, "Add", &[x, ab], none(), "y");
    // Shape of a static shape folds; the Reshape then reads a constant.
    let s = named_op(&mut g, "Shape", &[x], none(), "s");
    let r = named_op(&mut g, "Reshape", &[y, s], none(), "r");
    g.add_output("r", r).unwrap();
    insta::assert_snapshot!(text::print(&optimized(&g, "constant-fold")));
}

#[test]
fn simplify_removes_identities_and_folds_transposes() {
    let mut g = Graph::new("simplify");
    let x = param(&mut g, "x", &[2, 3]);
    let w = param(&mut g, "w", &[4, 3]);
    let one = c(&mut g, "one", &[], &[1.0]);
    let zero = c(&mut g, "zero", &[1], &[0.0]);
    let a = named_op(&mut g, "Mul", &[x, one], none(), "times_one");
    let b = named_op(&mut g, "Add", &[zero, a], none(), "plus_zero");
    let i = named_op(&mut g, "Identity", &[b], none(), "identity");
    let t1 = named_op(&mut g, "Transpose", &[i], ints("perm", &[1, 0]), "t1");
    let t2 = named_op(&mut g, "Transpose", &[t1], ints("perm", &[1, 0]), "t2");
    // MatMul(x, w^T): the transpose becomes FusedMatMul's transB.
    let wt = named_op(&mut g, "Transpose", &[w], ints("perm", &[1, 0]), "wt");
    let mm = named_op(&mut g, "MatMul", &[t2, wt], none(), "mm");
    let shape = g
        .add_constant_value("shape", Tensor::from_vec(&[1], vec![8i64]).unwrap())
        .unwrap();
    let shape2 = g
        .add_constant_value("shape2", Tensor::from_vec(&[2], vec![4i64, 2]).unwrap())
        .unwrap();
    let r1 = named_op(&mut g, "Reshape", &[mm, shape.into()], none(), "r1");
    let r2 = named_op(&mut g, "Reshape", &[r1, shape2.into()], none(), "r2");
    g.add_output("y", r2).unwrap();
    insta::assert_snapshot!(text::print(&optimized(&g, "simplify")));
}

#[test]
fn simplify_folds_integer_self_subtraction_only() {
    let mut g = Graph::new("sub");
    let i = g
        .add_parameter("i", TensorType::new(DType::I32, Shape::fixed(&[3])))
        .unwrap();
    let x = param(&mut g, "x", &[3]);
    let zi = named_op(&mut g, "Sub", &[i.into(), i.into()], none(), "zi");
    let zx = named_op(&mut g, "Sub", &[x, x], none(), "zx");
    g.add_output("zi", zi).unwrap();
    g.add_output("zx", zx).unwrap();
    let mut after = g.clone();
    run_pipeline(&mut after, &options("simplify,dce")).unwrap();
    let ops: Vec<&str> = after.nodes().iter().map(|n| n.op.as_str()).collect();
    // x - x is NaN for infinite x: it stays.
    assert_eq!(ops.iter().filter(|o| **o == "Sub").count(), 1, "{ops:?}");
    assert!(ops.contains(&"Constant"));
}

#[test]
fn cse_and_canonicalize_merge_equal_work() {
    let mut g = Graph::new("cse");
    let x = param(&mut g, "x", &[2, 3]);
    let c1 = c(&mut g, "c1", &[3], &[1.0, 2.0, 3.0]);
    let c2 = c(&mut g, "c2", &[3], &[1.0, 2.0, 3.0]);
    // c1 + x and x + c2 are the same once the constant goes second and c1 == c2.
    let a = named_op(&mut g, "Add", &[c1, x], none(), "a");
    let b = named_op(&mut g, "Add", &[x, c2], none(), "b");
    let ra = named_op(&mut g, "Relu", &[a], none(), "ra");
    let rb = named_op(&mut g, "Relu", &[b], none(), "rb");
    let y = named_op(&mut g, "Mul", &[ra, rb], none(), "y");
    g.add_output("y", y).unwrap();
    insta::assert_snapshot!(text::print(&optimized(&g, "canonicalize,cse")));
}

fn conv_bn(g: &mut Graph, rng: &mut Rng, x: Value, cin: usize, cout: usize, name: &str) -> Value {
    let w = g
        .add_constant_value(
            &format!("{name}.w"),
            rng.f32_tensor(&[cout, cin, 3, 3], 2.0),
        )
        .unwrap();
    let conv = named_op(
        g,
        "Conv",
        &[x, w.into()],
        ints("pads", &[1, 1, 1, 1]),
        &format!("{name}.conv"),
    );
    let params: Vec<Value> = ["scale", "bias", "mean", "var"]
        .iter()
        .map(|p| {
            let mut t = rng.f32_tensor(&[cout], 2.0);
            if *p == "var" {
                t = Tensor::from_vec(
                    &[cout],
                    t.to_f64_vec()
                        .iter()
                        .map(|v| v.abs() as f32 + 0.5)
                        .collect(),
                )
                .unwrap();
            }
            g.add_constant_value(&format!("{name}.{p}"), t)
                .unwrap()
                .into()
        })
        .collect();
    named_op(
        g,
        "BatchNormalization",
        &[conv, params[0], params[1], params[2], params[3]],
        none(),
        &format!("{name}.bn"),
    )
}

/// A residual block: conv-bn-relu, conv-bn, + x, relu.
fn residual_block() -> Graph {
    let mut rng = Rng(3);
    let mut g = Graph::new("residual");
    let x = param(&mut g, "x", &[1, 4, 5, 5]);
    let h = conv_bn(&mut g, &mut rng, x, 4, 4, "c1");
    let h = named_op(&mut g, "Relu", &[h], none(), "relu1");
    let h = conv_bn(&mut g, &mut rng, h, 4, 4, "c2");
    let h = named_op(&mut g, "Add", &[h, x], none(), "add");
    let y = named_op(&mut g, "Relu", &[h], none(), "relu2");
    g.add_output("y", y).unwrap();
    g
}

/// `auto_pad` becomes the explicit `pads` it means, for convolutions and pools alike,
/// and the outputs stay the same; with ceil_mode (where the two differ) it stays.
#[test]
fn canonicalize_makes_auto_pad_explicit() {
    let mut rng = Rng(3);
    for (mode, want) in [
        ("SAME_UPPER", [0, 0, 1, 1]),
        ("SAME_LOWER", [1, 1, 0, 0]),
        ("VALID", [0; 4]),
    ] {
        let mut g = Graph::new("g");
        let x = param(&mut g, "x", &[1, 2, 6, 6]);
        let w = common::weight(&mut g, &mut rng, "w", &[3, 2, 2, 2]);
        let auto = Attrs::new().with("auto_pad", Attr::String(mode.into()));
        let y = named_op(&mut g, "Conv", &[x, w], auto.clone(), "conv");
        let pool = auto.with("kernel_shape", Attr::Ints(vec![2, 2]));
        let p = named_op(&mut g, "MaxPool", &[y], pool.clone(), "pool");
        let q = named_op(
            &mut g,
            "AveragePool",
            &[y],
            pool.with("ceil_mode", Attr::Int(1)),
            "ceil",
        );
        g.add_output("p", p).unwrap();
        g.add_output("q", q).unwrap();
        let after = optimized(&g, "canonicalize");
        for n in after.nodes() {
            let (pads, auto) = (n.attrs.0.get("pads"), n.attrs.0.get("auto_pad"));
            match n.name.as_str() {
                "conv" | "pool" => {
                    assert_eq!(pads, Some(&Attr::Ints(want.to_vec())), "{mode}: {}", n.name);
                    assert!(auto.is_none());
                }
                "ceil" => assert_eq!(auto, Some(&Attr::String(mode.into()))),
                _ => {}
            }
        }
    }
}

#[test]
fn batchnorm_folds_into_conv_and_epilogues_fuse() {
    let g = residual_block();
    let folded = optimized(&g, "fold-batchnorm");
    assert!(folded.nodes().iter().all(|n| n.op != "BatchNormalization"));
    let fused = optimized(&folded, "fuse-epilogue");
    let ops: Vec<String> = fused
        .nodes()
        .iter()
        .filter(|n| !matches!(n.op.as_str(), "Constant" | "Parameter"))
        .map(|n| {
            let act = n.attrs.get("activation").map(|a| format!("{a:?}"));
            format!("{} {}in {}", n.op, n.inputs.len(), act.unwrap_or_default())
        })
        .collect();
    insta::assert_snapshot!(ops.join("\n"));
    // The whole pipeline from the original graph agrees as well.
    optimized(&g, passes::DEFAULT_PIPELINE);
}

#[test]
fn batchnorm_without_a_conv_becomes_scale_and_shift() {
    let mut rng = Rng(5);
    let mut g = Graph::new("bn");
    let x = param(&mut g, "x", &[2, 3, 2]);
    let p: Vec<Value> = (0..4)
        .map(|i| {
            let t = rng.f32_tensor(&[3], 2.0);
            let t = if i == 3 {
                Tensor::from_vec(
                    &[3],
                    t.to_f64_vec()
                        .iter()
                        .map(|v| v.abs() as f32 + 0.5)
                        .collect(),
                )
                .unwrap()
            } else {
                t
            };
            g.add_constant_value(&format!("p{i}"), t).unwrap().into()
        })
        .collect();
    let y = named_op(
        &mut g,
        "BatchNormalization",
        &[x, p[0], p[1], p[2], p[3]],
        none(),
        "bn",
    );
    g.add_output("y", y).unwrap();
    let after = optimized(&g, "fold-batchnorm,fuse-elementwise");
    let ops: Vec<&str> = after.nodes().iter().map(|n| n.op.as_str()).collect();
    assert!(
        ops.contains(&"Fused") && !ops.contains(&"BatchNormalization"),
        "{ops:?}"
    );
}

#[test]
fn matmul_bias_gelu_and_residual_fuse() {
    let mut rng = Rng(9);
    let mut g = Graph::new("dense");
    let x = param(&mut g, "x", &[2, 3, 4]);
    let w = g
        .add_constant_value("w", rng.f32_tensor(&[4, 4], 2.0))
        .unwrap();
    let b = g
        .add_constant_value("b", rng.f32_tensor(&[4], 2.0))
        .unwrap();
    let mm = named_op(&mut g, "MatMul", &[x, w.into()], none(), "mm");
    let biased = named_op(&mut g, "Add", &[mm, b.into()], none(), "biased");
    let act = named_op(&mut g, "Gelu", &[biased], none(), "gelu");
    let w2 = g
        .add_constant_value("w2", rng.f32_tensor(&[4, 4], 2.0))
        .unwrap();
    let mm2 = named_op(&mut g, "MatMul", &[act, w2.into()], none(), "mm2");
    let res = named_op(&mut g, "Add", &[x, mm2], none(), "residual");
    g.add_output("y", res).unwrap();
    insta::assert_snapshot!(text::print(&optimized(&g, "fuse-epilogue")));
}

#[test]
fn elementwise_chains_fuse_into_one_loop() {
    let mut g = Graph::new("chain");
    let x = param(&mut g, "x", &[2, 3]);
    let y = param(&mut g, "y", &[3]);
    let a = named_op(&mut g, "Mul", &[x, y], none(), "a");
    let b = named_op(&mut g, "Sigmoid", &[a], none(), "b");
    let alpha = Attrs::new().with("alpha", Attr::Float(0.1));
    let d = named_op(&mut g, "LeakyRelu", &[b], alpha, "d");
    let e = named_op(&mut g, "Sub", &[d, x], none(), "e");
    // `a` has a second reader, the root: it fuses too, with no output of its own.
    let f = named_op(&mut g, "Add", &[e, a], none(), "f");
    g.add_output("f", f).unwrap();
    insta::assert_snapshot!(text::print(&optimized(&g, "fuse-elementwise")));
}

/// Results that nodes outside the chain read too join it as extra outputs of the fused
/// loop (an optimizer's m' and v', stored and read by the weight update), unless such
/// a reader leads back into the chain.
#[test]
fn shared_results_become_extra_outputs() {
    let mut g = Graph::new("shared");
    let x = param(&mut g, "x", &[2, 3]);
    let y = param(&mut g, "y", &[2, 3]);
    let axes = g
        .add_constant_value("axes", Tensor::from_vec(&[1], vec![1i64]).unwrap())
        .unwrap()
        .into();
    // m is read by the root and by a reduction outside: exported.
    let m = named_op(&mut g, "Mul", &[x, y], none(), "m");
    let total = named_op(&mut g, "ReduceSum", &[m, axes], none(), "total");
    // s is read by the chain and by a reduction whose result the chain reads: s stays.
    let s = named_op(&mut g, "Add", &[x, y], none(), "s");
    let s_max = named_op(&mut g, "ReduceMax", &[s, axes], none(), "s_max");
    let shifted = named_op(&mut g, "Sub", &[s, s_max], none(), "shifted");
    let root = named_op(&mut g, "Div", &[shifted, m], none(), "root");
    g.add_output("root", root).unwrap();
    g.add_output("total", total).unwrap();
    insta::assert_snapshot!(text::print(&optimized(&g, "fuse-elementwise")));
}

#[test]
fn recognize_finds_gelu_softmax_and_layernorm() {
    let mut g = Graph::new("decomposed");
    let x = param(&mut g, "x", &[2, 4]);
    // GELU: x * 0.5 * (1 + erf(x / sqrt 2))
    let half = c(&mut g, "half", &[], &[0.5]);
    let sqrt2 = c(&mut g, "sqrt2", &[], &[std::f32::consts::SQRT_2]);
    let one = c(&mut g, "one", &[], &[1.0]);
    let xh = named_op(&mut g, "Mul", &[x, half], none(), "xh");
    let xd = named_op(&mut g, "Div", &[x, sqrt2], none(), "xd");
    let erf = named_op(&mut g, "Erf", &[xd], none(), "erf");
    let e1 = named_op(&mut g, "Add", &[erf, one], none(), "e1");
    let gelu = named_op(&mut g, "Mul", &[xh, e1], none(), "gelu");
    // Softmax over the last axis.
    let axes = g
        .add_constant_value("axes", Tensor::from_vec(&[1], vec![-1i64]).unwrap())
        .unwrap();
    let mx = named_op(&mut g, "ReduceMax", &[gelu, axes.into()], none(), "max");
    let sh = named_op(&mut g, "Sub", &[gelu, mx], none(), "shifted");
    let ex = named_op(&mut g, "Exp", &[sh], none(), "exp");
    let sm = named_op(&mut g, "ReduceSum", &[ex, axes.into()], none(), "sum");
    let soft = named_op(&mut g, "Div", &[ex, sm], none(), "softmax");
    // LayerNorm over the last axis.
    let mean = named_op(&mut g, "ReduceMean", &[soft, axes.into()], none(), "mean");
    let d = named_op(&mut g, "Sub", &[soft, mean], none(), "d");
    let two = c(&mut g, "two", &[], &[2.0]);
    let sq = named_op(&mut g, "Pow", &[d, two], none(), "sq");
    let var = named_op(&mut g, "ReduceMean", &[sq, axes.into()], none(), "var");
    let eps = c(&mut g, "eps", &[], &[1e-5]);
    let ve = named_op(&mut g, "Add", &[var, eps], none(), "ve");
    let sd = named_op(&mut g, "Sqrt", &[ve], none(), "sd");
    let n = named_op(&mut g, "Div", &[d, sd], none(), "normed");
    let gamma = c(&mut g, "gamma", &[4], &[1.0, 2.0, 0.5, 1.5]);
    let beta = c(&mut g, "beta", &[4], &[0.1, 0.0, -0.1, 0.2]);
    let gm = named_op(&mut g, "Mul", &[n, gamma], none(), "gm");
    let ln = named_op(&mut g, "Add", &[gm, beta], none(), "ln");
    g.add_output("y", ln).unwrap();
    let after = optimized(&g, "recognize");
    let ops: Vec<&str> = after
        .nodes()
        .iter()
        .map(|n| n.op.as_str())
        .filter(|o| !matches!(*o, "Constant" | "Parameter"))
        .collect();
    assert_eq!(ops, ["Gelu", "Softmax", "LayerNormalization"]);
    insta::assert_snapshot!(text::print(&after));
}

/// GELU's tanh form as jax2tf writes it (x³ as nested products) and as PyTorch writes it
/// (`Pow(x, 3)`), each becoming one `Gelu` with `approximate = "tanh"` that computes
/// what the decomposed graph did.
#[test]
fn recognize_finds_gelu_tanh() {
    for pow in [false, true] {
        let mut g = Graph::new("gelu_tanh");
        let x = param(&mut g, "x", &[2, 4]);
        let cube = if pow {
            let three = c(&mut g, "three", &[], &[3.0]);
            named_op(&mut g, "Pow", &[x, three], none(), "x3")
        } else {
            let k = c(&mut g, "k", &[], &[0.044715]);
            let xk = named_op(&mut g, "Mul", &[x, k], none(), "xk");
            let xxk = named_op(&mut g, "Mul", &[x, xk], none(), "xxk");
            named_op(&mut g, "Mul", &[x, xxk], none(), "x3")
        };
        let cube = if pow {
            let k = c(&mut g, "k", &[], &[0.044715]);
            named_op(&mut g, "Mul", &[cube, k], none(), "kx3")
        } else {
            cube
        };
        let inner = named_op(&mut g, "Add", &[x, cube], none(), "inner");
        let s = c(&mut g, "s", &[], &[(2.0 / std::f32::consts::PI).sqrt()]);
        let u = named_op(&mut g, "Mul", &[inner, s], none(), "u");
        let t = named_op(&mut g, "Tanh", &[u], none(), "t");
        let one = c(&mut g, "one", &[], &[1.0]);
        let t1 = named_op(&mut g, "Add", &[t, one], none(), "t1");
        let half = c(&mut g, "half", &[], &[0.5]);
        let th = named_op(&mut g, "Mul", &[t1, half], none(), "th");
        let y = named_op(&mut g, "Mul", &[x, th], none(), "y");
        g.add_output("y", y).unwrap();
        let after = optimized(&g, "recognize");
        let gelus: Vec<_> = after.nodes().iter().filter(|n| n.op == "Gelu").collect();
        assert_eq!(gelus.len(), 1, "pow={pow}: {}", text::print(&after));
        assert_eq!(
            gelus[0].attrs.string_or("approximate", "none").unwrap(),
            "tanh"
        );
        let xs =
            Tensor::from_vec(&[2, 4], vec![-3.0f32, -1.0, -0.5, 0.0, 0.3, 1.0, 2.0, 4.0]).unwrap();
        let want = run(&g, std::slice::from_ref(&xs));
        let got = run(&after, &[xs]);
        let (w, o) = (want[0].to_f64_vec(), got[0].to_f64_vec());
        for (a, b) in w.iter().zip(&o) {
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + a.abs()),
                "pow={pow}: {w:?} vs {o:?}"
            );
        }
    }
}

#[test]
fn dce_drops_dead_nodes_and_renumbers_from_the_outputs() {
    let mut g = Graph::new("dce");
    let x = param(&mut g, "x", &[2]);
    let unused = param(&mut g, "unused", &[2]);
    named_op(&mut g, "Neg", &[x], none(), "dead");
    let y = named_op(&mut g, "Relu", &[x], none(), "y");
    let _ = unused;
    g.add_output("y", y).unwrap();
    insta::assert_snapshot!(text::print(&optimized(&g, "dce")));
}

// ---------------------------------------------------------------- property test

/// A random valid graph: float values of shapes that broadcast into [2, 3, 4], built
/// from ops every pass has rules for, with neutral constants and decomposed forms
/// mixed in so that the rules fire.
fn random_graph(rng: &mut Rng) -> Graph {
    let mut g = Graph::new("random");
    let shapes: [&[usize]; 4] = [&[2, 3, 4], &[3, 4], &[4], &[1]];
    let mut vals: Vec<Value> = vec![];
    for i in 0..1 + rng.below(3) {
        let dims = if i == 0 {
            shapes[0]
        } else {
            shapes[rng.below(4)]
        };
        vals.push(param(&mut g, &format!("x{i}"), dims));
    }
    let n_ops = 3 + rng.below(12);
    for k in 0..n_ops {
        let name = format!("n{k}");
        let pick = vals[vals.len() - 1 - rng.below(vals.len().min(3))];
        let other = vals[rng.below(vals.len())];
        let full = g.value_type(pick).unwrap().shape == Shape::fixed(&[2, 3, 4]);
        let v = match rng.below(13) {
            0 => ["Relu", "Sigmoid", "Tanh", "Neg", "Abs", "Identity"].map(|o| o.to_string())
                [rng.below(6)]
            .clone(),
            1 => "Add".into(),
            2 => "Mul".into(),
            3 => "Sub".into(),
            4 => "neutral".into(),
            5 => "const".into(),
            6 => "transpose2".into(),
            7 => "reshape2".into(),
            8 if full => "matmul".into(),
            9 if full => "softmax".into(),
            10 => "gelu".into(),
            11 => "cse".into(),
            _ => "Max".into(),
        };
        let out: Option<Value> = match v.as_str() {
            "Add" | "Mul" | "Sub" | "Max" => {
                g.op(&v, &[pick, other], none(), &name).ok().map(Into::into)
            }
            "neutral" => {
                let (o, x) = [("Mul", 1.0), ("Add", 0.0), ("Div", 1.0), ("Sub", 0.0)][rng.below(4)];
                let k = c(&mut g, &format!("{name}.k"), &[1], &[x]);
                Some(named_op(&mut g, o, &[pick, k], none(), &name))
            }
            "const" => {
                let dims = shapes[1 + rng.below(3)];
                let a = g
                    .add_constant_value(&format!("{name}.a"), rng.f32_tensor(dims, 2.0))
                    .unwrap();
                let b = g
                    .add_constant_value(&format!("{name}.b"), rng.f32_tensor(dims, 2.0))
                    .unwrap();
                let ab = named_op(
                    &mut g,
                    "Mul",
                    &[a.into(), b.into()],
                    none(),
                    &format!("{name}.ab"),
                );
                g.op("Add", &[ab, pick], none(), &name).ok().map(Into::into)
            }
            "transpose2" => {
                let r = g.value_type(pick).unwrap().rank() as i64;
                let p: Vec<i64> = (0..r).rev().collect();
                let t = named_op(
                    &mut g,
                    "Transpose",
                    &[pick],
                    ints("perm", &p),
                    &format!("{name}.t"),
                );
                let back = if rng.below(2) == 0 {
                    p.clone()
                } else {
                    (0..r).collect()
                };
                Some(named_op(
                    &mut g,
                    "Transpose",
                    &[t],
                    ints("perm", &back),
                    &name,
                ))
            }
            "reshape2" => {
                let n: usize = g.value_type(pick).unwrap().shape.num_elements().unwrap();
                let s1 = g
                    .add_constant_value(
                        &format!("{name}.s1"),
                        Tensor::from_vec(&[1], vec![n as i64]).unwrap(),
                    )
                    .unwrap();
                let dims: Vec<i64> = g
                    .value_type(pick)
                    .unwrap()
                    .shape
                    .to_fixed()
                    .unwrap()
                    .iter()
                    .map(|&d| d as i64)
                    .collect();
                let s2 = g
                    .add_constant_value(
                        &format!("{name}.s2"),
                        Tensor::from_vec(&[dims.len()], dims).unwrap(),
                    )
                    .unwrap();
                let r1 = named_op(
                    &mut g,
                    "Reshape",
                    &[pick, s1.into()],
                    none(),
                    &format!("{name}.r"),
                );
                Some(named_op(&mut g, "Reshape", &[r1, s2.into()], none(), &name))
            }
            "matmul" => {
                let w = g
                    .add_constant_value(&format!("{name}.w"), rng.f32_tensor(&[4, 4], 2.0))
                    .unwrap();
                let b = g
                    .add_constant_value(&format!("{name}.b"), rng.f32_tensor(&[4], 2.0))
                    .unwrap();
                let mm = named_op(
                    &mut g,
                    "MatMul",
                    &[pick, w.into()],
                    none(),
                    &format!("{name}.mm"),
                );
                let ab = named_op(
                    &mut g,
                    "Add",
                    &[mm, b.into()],
                    none(),
                    &format!("{name}.bias"),
                );
                Some(named_op(&mut g, "Relu", &[ab], none(), &name))
            }
            "softmax" => Some(named_op(&mut g, "Softmax", &[pick], none(), &name)),
            "gelu" => {
                let half = c(&mut g, &format!("{name}.half"), &[], &[0.5]);
                let s2 = c(
                    &mut g,
                    &format!("{name}.s2"),
                    &[],
                    &[std::f32::consts::SQRT_2],
                );
                let one = c(&mut g, &format!("{name}.one"), &[], &[1.0]);
                let xh = named_op(&mut g, "Mul", &[pick, half], none(), &format!("{name}.xh"));
                let xd = named_op(&mut g, "Div", &[pick, s2], none(), &format!("{name}.xd"));
                let e = named_op(&mut g, "Erf", &[xd], none(), &format!("{name}.erf"));
                let e1 = named_op(&mut g, "Add", &[e, one], none(), &format!("{name}.e1"));
                Some(named_op(&mut g, "Mul", &[xh, e1], none(), &name))
            }
            "cse" => {
                let a = named_op(&mut g, "Tanh", &[pick], none(), &format!("{name}.a"));
                let b = named_op(&mut g, "Tanh", &[pick], none(), &format!("{name}.b"));
                Some(named_op(&mut g, "Add", &[a, b], none(), &name))
            }
            unary => Some(named_op(&mut g, unary, &[pick], none(), &name)),
        };
        if let Some(o) = out {
            vals.push(o);
        }
    }
    // One or two outputs, sometimes an intermediate one (fusion must keep it).
    g.add_output("out", *vals.last().unwrap()).unwrap();
    if vals.len() > 3 && rng.below(2) == 0 {
        let mid = vals[vals.len() / 2];
        if mid.node != vals.last().unwrap().node {
            g.add_output("mid", mid).unwrap();
        }
    }
    g
}

#[test]
fn random_graphs_compute_the_same_after_the_pipeline() {
    let mut rng = Rng(2026);
    let mut rewrites = 0;
    const CASES: u64 = 150;
    for case in 0..CASES {
        let g = random_graph(&mut rng);
        let mut after = g.clone();
        let report = run_pipeline(&mut after, &options(passes::DEFAULT_PIPELINE))
            .unwrap_or_else(|e| panic!("case {case}: {e}\n{}", text::print(&g)));
        rewrites += report.records.iter().map(|r| r.rewrites).sum::<usize>();
        assert_same(&g, &after, case);
    }
    // The generator is only useful if the passes fire on what it makes.
    println!("{CASES} random graphs: {rewrites} rewrites, outputs unchanged");
    assert!(
        rewrites > 2 * CASES as usize,
        "only {rewrites} rewrites in {CASES} graphs"
    );
}

// ---------------------------------------------------------------- the manager

#[test]
fn pipelines_and_options_are_checked() {
    let e = passes::parse_pipeline("cse,no-such-pass")
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("unknown pass 'no-such-pass'") && e.contains("constant-fold"),
        "{e}"
    );
    assert_eq!(passes::parse_pipeline("fuse").unwrap().len(), 3);
    let mut o = CompileOptions::default();
    for (key, value, want) in [
        ("dump-ir", "sometimes", "dump-ir: expected"),
        ("dump-ir", "after=cse,nope", "unknown pass 'nope'"),
        ("pass-timing", "maybe", "expected 1 or 0"),
        ("rewrite-limit", "-3", "expected a count"),
        ("colour", "1", "unknown option 'colour'"),
        ("threads", "two", "threads: expected a count"),
        ("autotune", "maybe", "autotune: expected 1 or 0"),
    ] {
        let e = o.set(key, value).unwrap_err().to_string();
        assert!(e.contains(want), "{key}={value}: {e}");
    }
    o.set("dump-ir", "after=cse,dce").unwrap();
    assert_eq!(o.dump_ir, DumpIr::After(vec!["cse".into(), "dce".into()]));
    // Threads and tuning are compile options like the passes' own.
    for (key, value) in [
        ("threads", "3"),
        ("autotune", "1"),
        ("tune-cache", "/tmp/t.tsv"),
        ("tune-force", "im2col"),
    ] {
        o.set(key, value).unwrap();
        assert!(CompileOptions::KEYS.contains(&key), "{key}");
    }
    assert_eq!(o.threads, 3);
    let want = kiln::passes::Tuning {
        measure: true,
        cache: Some("/tmp/t.tsv".into()),
        force: Some("im2col".into()),
    };
    assert_eq!(o.tuning, want);
    // autotune alone keeps its winners in the default cache; "" keeps nothing.
    let mut fresh = CompileOptions::default();
    fresh.set("autotune", "1").unwrap();
    if std::env::var_os("HOME").is_some() || std::env::var_os("XDG_CACHE_HOME").is_some() {
        let cache = fresh.tuning.cache.clone().expect("the default tune cache");
        assert!(cache.ends_with("kiln/tune.tsv"), "{}", cache.display());
    }
    fresh.set("tune-cache", "").unwrap();
    assert_eq!(fresh.tuning.cache, None);
    o.set("threads", "").unwrap();
    o.set("tune-force", "").unwrap();
    assert_eq!((o.threads, o.tuning.force.as_deref()), (0, None));
}

#[test]
fn disabled_passes_and_the_rewrite_limit_bisect() {
    let g = residual_block();
    let mut o = options(passes::DEFAULT_PIPELINE);
    o.set("disable-passes", "fold-batchnorm").unwrap();
    let mut after = g.clone();
    let report = run_pipeline(&mut after, &o).unwrap();
    assert!(report
        .records
        .iter()
        .any(|r| r.pass == "fold-batchnorm" && r.skipped));
    assert!(after.nodes().iter().any(|n| n.op == "BatchNormalization"));
    // Every prefix of the rewrites gives a valid graph that computes the same: the
    // property that makes bisecting a miscompile to one rewrite work.
    let total = {
        let mut a = g.clone();
        let r = run_pipeline(&mut a, &options(passes::DEFAULT_PIPELINE)).unwrap();
        r.records.iter().map(|r| r.rewrites).sum::<usize>()
    };
    assert!(total >= 4, "{total}");
    for limit in 0..=total {
        let mut o = options(passes::DEFAULT_PIPELINE);
        o.set("rewrite-limit", &limit.to_string()).unwrap();
        let mut a = g.clone();
        let r = run_pipeline(&mut a, &o).unwrap();
        assert_eq!(r.records.iter().map(|r| r.rewrites).sum::<usize>(), limit);
        assert_same(&g, &a, limit as u64);
    }
}

#[test]
fn dumps_go_one_file_per_step() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dump-ir");
    let _ = std::fs::remove_dir_all(&dir);
    let mut o = options("fold-batchnorm,fuse-epilogue,dce");
    o.set("dump-ir", "after-all").unwrap();
    o.set("dump-ir-dir", dir.to_str().unwrap()).unwrap();
    let mut g = residual_block();
    run_pipeline(&mut g, &o).unwrap();
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "001-after-fold-batchnorm.kir",
            "002-after-fuse-epilogue.kir",
            "003-after-dce.kir"
        ]
    );
    // Each dump is valid .kir text.
    for f in files {
        text::parse_file(&dir.join(f)).unwrap();
    }
}

/// A pass that breaks the graph: it wires an operand that cannot broadcast.
struct Breaker;

impl Pass for Breaker {
    fn name(&self) -> &'static str {
        "breaker"
    }
    fn summary(&self) -> &'static str {
        "wires a bad operand, for the test"
    }
    fn run(&self, g: &mut Graph, _: &mut PassContext) -> Result<Changed> {
        let add = g.find("add").unwrap();
        let bad = g
            .add_constant_value("bad", Tensor::zeros(DType::F32, &[3]))
            .unwrap();
        g.node_mut(add).inputs[1] = Some(bad.into());
        Ok(true)
    }
}

/// A pass that changes a recorded type and says it changed nothing: the verifier
/// catches what re-inference after a changed pass would have repaired.
struct Liar;

impl Pass for Liar {
    fn name(&self) -> &'static str {
        "liar"
    }
    fn summary(&self) -> &'static str {
        "corrupts a type silently, for the test"
    }
    fn run(&self, g: &mut Graph, _: &mut PassContext) -> Result<Changed> {
        let id = g.find("relu2").unwrap();
        g.node_mut(id).outputs[0] = f32_type(&[7]);
        Ok(false)
    }
}

#[test]
fn the_verifier_names_the_pass_that_broke_the_graph() {
    let o = options("");
    let e = run_passes(&mut residual_block(), &[&Breaker], &o)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pass 'breaker' left an invalid graph") && e.contains("'add'"),
        "{e}"
    );
    let e = run_passes(&mut residual_block(), &[&Liar], &o)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pass 'liar' left an invalid graph") && e.contains("relu2"),
        "{e}"
    );
}

#[test]
fn layout_blocks_convolutions_and_cancels_reorders() {
    // Channels 4: blocks of 4 (NCHW4c) keep the test small; the CPU backend asks for 16.
    let g = residual_block();
    let mut o = options(passes::DEFAULT_PIPELINE);
    o.set("layout", "nchw4c").unwrap();
    let mut after = g.clone();
    run_pipeline(&mut after, &o).unwrap();
    assert_same(&g, &after, 11);
    insta::assert_snapshot!(text::print(&after)
        .lines()
        .filter(|l| !l.contains("= Constant"))
        .collect::<Vec<_>>()
        .join("\n"));
    // Channel counts that are not multiples of the block run blocked too, the last
    // block ragged (4 channels in blocks of 3).
    let mut o = options(passes::DEFAULT_PIPELINE);
    o.set("layout", "nchw3c").unwrap();
    let mut ragged = g.clone();
    run_pipeline(&mut ragged, &o).unwrap();
    assert_same(&g, &ragged, 12);
    let convs: Vec<_> = ragged
        .nodes()
        .iter()
        .filter(|n| n.op == "FusedConv")
        .collect();
    assert_eq!(convs.len(), 2);
    assert!(convs
        .iter()
        .all(|n| n.attrs.int("block") == Ok(Some(3)) && n.attrs.get("plain_x").is_none()));
    // `plain` turns the pass off.
    let mut o = options(passes::DEFAULT_PIPELINE);
    o.set("layout", "plain").unwrap();
    let mut a = g.clone();
    run_pipeline(&mut a, &o).unwrap();
    assert!(a.nodes().iter().all(|n| n.op != "Reorder"));
    let e = CompileOptions::default()
        .set("layout", "nhwc")
        .unwrap_err()
        .to_string();
    assert!(e.contains("layout: expected plain or nchw<block>c"), "{e}");
}

/// The small CNN's shape in blocks of 4: conv(1 → 6 channels) → MaxPool → conv(6 → 8)
/// → AveragePool → GlobalMaxPool → Flatten, plus a MaxPool whose Indices are read.
fn small_cnn() -> Graph {
    let mut rng = Rng(17);
    let mut g = Graph::new("cnn");
    let x = param(&mut g, "x", &[2, 1, 9, 8]);
    let pads = || ints("pads", &[1, 1, 1, 1]);
    let w1 = g
        .add_constant_value("w1", rng.f32_tensor(&[6, 1, 3, 3], 2.0))
        .unwrap();
    let h = named_op(&mut g, "Conv", &[x, w1.into()], pads(), "conv1");
    let h = named_op(&mut g, "Relu", &[h], none(), "relu1");
    let pool = |k: i64, s: i64| {
        ints("kernel_shape", &[k, k])
            .with("strides", Attr::Ints(vec![s, s]))
            .with("pads", Attr::Ints(vec![0, 0, 1, 1]))
    };
    let h = named_op(&mut g, "MaxPool", &[h], pool(2, 2), "pool1");
    let w2 = g
        .add_constant_value("w2", rng.f32_tensor(&[8, 6, 3, 3], 2.0))
        .unwrap();
    let h = named_op(&mut g, "Conv", &[h, w2.into()], pads(), "conv2");
    let h = named_op(&mut g, "Relu", &[h], none(), "relu2");
    let a = named_op(&mut g, "AveragePool", &[h], pool(3, 1), "pool2");
    let gm = named_op(&mut g, "GlobalMaxPool", &[a], none(), "gmax");
    let y = named_op(
        &mut g,
        "Flatten",
        &[gm],
        Attrs::new().with("axis", Attr::Int(1)),
        "flat",
    );
    g.add_output("y", y).unwrap();
    // A MaxPool whose Indices are an output stays plain.
    let idx = g.op("MaxPool", &[h], pool(2, 2), "pool3").unwrap().out(1);
    g.add_output("idx", idx).unwrap();
    g
}

#[test]
fn layout_blocks_pools_and_first_layers() {
    let g = small_cnn();
    let mut o = options(passes::DEFAULT_PIPELINE);
    o.set("layout", "nchw4c").unwrap();
    let mut after = g.clone();
    run_pipeline(&mut after, &o).unwrap();
    assert_same(&g, &after, 5);
    let node = |name: &str| {
        let id = after.find(name).unwrap_or_else(|| panic!("no {name}"));
        after.node(id).clone()
    };
    let int = |name: &str, attr: &str| node(name).attrs.int(attr).unwrap();
    // conv1 reads the 1-channel image as it is and writes blocks.
    assert_eq!(node("conv1").op, "FusedConv");
    assert_eq!(int("conv1", "plain_x"), Some(1));
    assert_eq!(int("conv1", "block"), Some(4));
    assert_eq!(node("conv1").inputs[0], Some(after.inputs()[0].into()));
    assert_eq!(int("conv2", "plain_x"), None);
    // The pools run on the blocks, and no reorder is left between conv1 and gmax: the
    // only ones feed Flatten and the Indices-reading pool3.
    for pool in ["pool1", "pool2", "gmax"] {
        assert_eq!(int(pool, "block"), Some(4), "{pool}");
    }
    assert_eq!(int("pool3", "block"), None);
    let mut reorders: Vec<String> = after
        .nodes()
        .iter()
        .filter(|n| n.op == "Reorder")
        .map(|n| n.name.clone())
        .collect();
    reorders.sort();
    assert_eq!(
        reorders,
        ["conv2.y_plain", "gmax.y_plain"],
        "{}",
        text::print(&after)
    );
    // The dump is deterministic.
    let mut again = g.clone();
    run_pipeline(&mut again, &o).unwrap();
    assert_eq!(text::print(&after), text::print(&again));
}

#[test]
fn reorder_round_trips_and_pads_channels() {
    // 5 channels in blocks of 4: the second block has 3 pad lanes.
    let mut rng = Rng(13);
    let x = rng.f32_tensor(&[2, 5, 3], 2.0);
    let mut g = Graph::new("reorder");
    let p = g.add_parameter("x", f32_type(&[2, 5, 3])).unwrap();
    let blocked = Attrs::new()
        .with("to", Attr::String("blocked".into()))
        .with("block", Attr::Int(4));
    let b = named_op(&mut g, "Reorder", &[p.into()], blocked, "b");
    assert_eq!(g.value_type(b).unwrap().to_string(), "f32[2, 2, 3, 4]");
    let plain = Attrs::new()
        .with("to", Attr::String("plain".into()))
        .with("block", Attr::Int(4))
        .with("channels", Attr::Int(5));
    let back = named_op(&mut g, "Reorder", &[b], plain, "back");
    g.add_output("b", b).unwrap();
    g.add_output("back", back).unwrap();
    let out = run(&g, std::slice::from_ref(&x));
    assert_eq!(out[1], x);
    // Element (n=1, c=4, p=2) lives in block 1, lane 0: flat ((n*2 + 1)*3 + p)*4.
    let (xv, bv) = (x.to_f64_vec(), out[0].to_f64_vec());
    let (n, c, p) = (1, 4, 2);
    assert_eq!(
        bv[((n * 2 + c / 4) * 3 + p) * 4 + c % 4],
        xv[(n * 5 + c) * 3 + p]
    );
    // A plain Reorder needs its channel count, and the counts must agree.
    let mut bad = Graph::new("bad");
    let q = bad.add_parameter("q", f32_type(&[2, 2, 3, 4])).unwrap();
    let wrong = Attrs::new()
        .with("to", Attr::String("plain".into()))
        .with("block", Attr::Int(4))
        .with("channels", Attr::Int(9));
    let e = bad
        .op("Reorder", &[q.into()], wrong, "r")
        .unwrap_err()
        .to_string();
    assert!(e.contains("holding 9 channels"), "{e}");
}

/// Two-operand Einsums become one MatMul (or FusedMatMul) between transposes and reshapes (checked by
/// the interpreter before and after); a diagonal, a label summed in one operand alone
/// and a three-operand Einsum stay Einsums.
#[test]
fn simplify_lowers_einsums_to_matmuls() {
    let cases: &[(&str, &[usize], &[usize], bool)] = &[
        ("ij,jk->ik", &[3, 4], &[4, 5], true),
        ("bhqd,bhkd->bhqk", &[2, 3, 4, 5], &[2, 3, 6, 5], true),
        ("bid,jd->bij", &[2, 3, 4], &[5, 4], true),
        ("ij,kj", &[3, 4], &[5, 4], true),
        ("bij,bjk->bki", &[2, 3, 4], &[2, 4, 5], true),
        ("...ij,...jk->...ik", &[2, 3, 4], &[2, 4, 5], true),
        ("i,i->", &[7], &[7], true),
        ("ij,k->ijk", &[2, 3], &[4], true),
        ("ii,ij->ij", &[3, 3], &[3, 4], false),
        ("ij,jk->k", &[3, 4], &[4, 5], false),
    ];
    for &(eq, a, b, lowered) in cases {
        let mut g = Graph::new("einsum");
        let x = param(&mut g, "a", a);
        let y = param(&mut g, "b", b);
        let attrs = Attrs::new().with("equation", Attr::String(eq.into()));
        let e = named_op(&mut g, "Einsum", &[x, y], attrs, "e");
        g.add_output("y", e).unwrap();
        let after = optimized(&g, "simplify");
        let ops: Vec<&str> = after.nodes().iter().map(|n| n.op.as_str()).collect();
        assert_eq!(ops.contains(&"Einsum"), !lowered, "{eq}: {ops:?}");
        let matmul = ops.iter().any(|o| o.ends_with("MatMul"));
        assert_eq!(matmul, lowered, "{eq}: {ops:?}");
    }
}

/// A MobileNet-style chain over [1, 6, 9, 9] with `mid` middle channels: pointwise
/// conv-bn-HardSwish, depthwise 3×3 conv-bn + the pointwise output, ReLU, depthwise
/// 5×5 stride 2 with asymmetric pads, an unfolded per-channel scale and shift,
/// HardSwish and a scalar scale (PP-LCNet's), pointwise back to 6 channels.
fn depthwise_chain(mid: usize) -> Graph {
    let mut rng = Rng(23);
    let mut g = Graph::new("mobilenet");
    let x = param(&mut g, "x", &[1, 6, 9, 9]);
    let conv = |g: &mut Graph, rng: &mut Rng, x: Value, w: &[usize], attrs: Attrs, name: &str| {
        let wv = g
            .add_constant_value(&format!("{name}.w"), rng.f32_tensor(w, 1.0))
            .unwrap();
        let b = g
            .add_constant_value(&format!("{name}.b"), rng.f32_tensor(&w[..1], 1.0))
            .unwrap();
        named_op(g, "Conv", &[x, wv.into(), b.into()], attrs, name)
    };
    let group = |k: i64| Attrs::new().with("group", Attr::Int(k));
    let h = conv(&mut g, &mut rng, x, &[mid, 6, 1, 1], none(), "pw1");
    let h = named_op(&mut g, "HardSwish", &[h], none(), "hs1");
    let pads = group(mid as i64).with("pads", Attr::Ints(vec![1, 1, 1, 1]));
    let d = conv(&mut g, &mut rng, h, &[mid, 1, 3, 3], pads, "dw1");
    let d = named_op(&mut g, "Add", &[d, h], none(), "add");
    let d = named_op(&mut g, "Relu", &[d], none(), "relu");
    let attrs = group(mid as i64)
        .with("pads", Attr::Ints(vec![2, 1, 1, 2]))
        .with("strides", Attr::Ints(vec![2, 2]));
    let d = conv(&mut g, &mut rng, d, &[mid, 1, 5, 5], attrs, "dw2");
    let scale = g
        .add_constant_value("scale.c", rng.f32_tensor(&[mid, 1, 1], 1.0))
        .unwrap();
    let shift = g
        .add_constant_value("shift.c", rng.f32_tensor(&[1, mid, 1, 1], 1.0))
        .unwrap();
    let k = g
        .add_constant_value("k.c", rng.f32_tensor(&[1], 1.0))
        .unwrap();
    let d = named_op(&mut g, "Mul", &[d, scale.into()], none(), "scale");
    let d = named_op(&mut g, "Add", &[shift.into(), d], none(), "shift");
    let d = named_op(&mut g, "HardSwish", &[d], none(), "hs2");
    let d = named_op(&mut g, "Mul", &[d, k.into()], none(), "k");
    let y = conv(&mut g, &mut rng, d, &[6, mid, 1, 1], none(), "pw2");
    g.add_output("y", y).unwrap();
    g
}

#[test]
fn layout_keeps_depthwise_chains_blocked() {
    // 10 channels in blocks of 4: the last block is ragged.
    let g = depthwise_chain(10);
    let mut o = options(passes::DEFAULT_PIPELINE);
    o.set("layout", "nchw4c").unwrap();
    let mut after = g.clone();
    run_pipeline(&mut after, &o).unwrap();
    assert_same(&g, &after, 29);
    let dump = text::print(&after);
    let node = |name: &str| {
        let id = after
            .find(name)
            .unwrap_or_else(|| panic!("no {name}\n{dump}"));
        after.node(id).clone()
    };
    for conv in ["pw1", "dw1", "dw2", "pw2"] {
        assert_eq!(node(conv).op, "FusedConv", "{conv}\n{dump}");
        assert_eq!(node(conv).attrs.int("block"), Ok(Some(4)), "{conv}\n{dump}");
    }
    // The residual fused into dw1 reads pw1's blocked output.
    assert_eq!(node("dw1").inputs.len(), 4, "{dump}");
    // The scale, shift and activation run blocked, between dw2 and pw2.
    let fused: Vec<_> = after.nodes().iter().filter(|n| n.op == "Fused").collect();
    assert_eq!(fused.len(), 1, "{dump}");
    let dw2 = after.find("dw2").unwrap();
    assert!(
        fused[0]
            .inputs
            .iter()
            .any(|v| v.map(|v| v.node) == Some(dw2)),
        "{dump}"
    );
    // Only the graph's input and output are reordered.
    let reorders = after.nodes().iter().filter(|n| n.op == "Reorder").count();
    assert_eq!(reorders, 2, "{dump}");
    // A depthwise conv whose weights are computed at run time stays plain.
    let mut g = Graph::new("runtime_w");
    let x = param(&mut g, "x", &[1, 8, 5, 5]);
    let w = param(&mut g, "w", &[8, 1, 3, 3]);
    let y = named_op(
        &mut g,
        "Conv",
        &[x, w],
        Attrs::new().with("group", Attr::Int(8)),
        "dw",
    );
    g.add_output("y", y).unwrap();
    let mut after = g.clone();
    run_pipeline(&mut after, &o).unwrap();
    assert!(
        after.nodes().iter().all(|n| n.op != "Reorder"),
        "{}",
        text::print(&after)
    );
}

#[test]
fn depthwise_chains_agree_on_cpu() {
    use kiln::backend::{backend_with, Device};
    // The CPU backend's blocks of 16: 24 channels, the last block half full.
    let g = depthwise_chain(24);
    let inputs = random_inputs(&g, &mut Rng(31), 1, 1.0);
    let want = run(&g, &inputs);
    for threads in [1, 2] {
        let exe = backend_with(
            Device::Cpu,
            CompileOptions {
                threads,
                ..Default::default()
            },
        )
        .unwrap()
        .compile(&g)
        .unwrap();
        let got = exe.run(&inputs).unwrap();
        got[0]
            .check_close(&want[0], 1e-4, 1e-4)
            .unwrap_or_else(|e| panic!("{threads} threads: {e}"));
    }
}

/// A dynamically quantized layer as exporters write it: x quantized, ConvInteger, the
/// bias quantized at run time by the layer's scale (Div, Floor, Cast, Reshape), added in
/// i32, the sum cast to f32 and scaled, then `tail`: "silu" (Sigmoid·y), "residual"
/// (x + y) or nothing. `shared` gives the Cast a second reader.
fn quantized_conv(tail: &str, shared: bool) -> Graph {
    let mut rng = Rng(11);
    let mut g = Graph::new("quantized_conv");
    let x = param(&mut g, "x", &[1, 4, 6, 5]);
    let q = g.op("DynamicQuantizeLinear", &[x], none(), "q").unwrap();
    let w: Vec<u8> = (0..144).map(|_| rng.below(256) as u8).collect();
    let w = g
        .add_constant_value("w", Tensor::from_vec(&[4, 4, 3, 3], w).unwrap())
        .unwrap()
        .into();
    let wz = g
        .add_constant_value("w_zero_point", Tensor::from_vec(&[], vec![121u8]).unwrap())
        .unwrap()
        .into();
    let conv = named_op(
        &mut g,
        "ConvInteger",
        &[q.out(0), w, q.out(2), wz],
        ints("pads", &[1, 1, 1, 1]),
        "conv",
    );
    let w_scale = c(&mut g, "w_scale", &[], &[0.05]);
    let scale = named_op(&mut g, "Mul", &[q.out(1), w_scale], none(), "scale");
    let bias = c(&mut g, "bias", &[4], &[0.7, -1.3, 0.02, 2.5]);
    let b = named_op(&mut g, "Div", &[bias, scale], none(), "bias_div");
    let b = named_op(&mut g, "Floor", &[b], none(), "bias_floor");
    let to = |t: &str| Attrs::new().with("to", Attr::String(t.into()));
    let b = named_op(&mut g, "Cast", &[b], to("i32"), "bias_i32");
    let shape = g
        .add_constant_value(
            "bias_shape",
            Tensor::from_vec(&[4], vec![1i64, -1, 1, 1]).unwrap(),
        )
        .unwrap()
        .into();
    let b = named_op(&mut g, "Reshape", &[b, shape], none(), "bias_reshaped");
    let y = named_op(&mut g, "Add", &[conv, b], none(), "bias_add");
    let f = named_op(&mut g, "Cast", &[y], to("f32"), "cast");
    let y = named_op(&mut g, "Mul", &[f, scale], none(), "dequantized");
    let y = match tail {
        "silu" => {
            let s = named_op(&mut g, "Sigmoid", &[y], none(), "sigmoid");
            named_op(&mut g, "Mul", &[y, s], none(), "silu")
        }
        "residual" => named_op(&mut g, "Add", &[x, y], none(), "residual"),
        _ => y,
    };
    g.add_output("y", y).unwrap();
    if shared {
        g.add_output("cast", f).unwrap();
    }
    g
}

fn count_ops(g: &Graph, op: &str) -> usize {
    g.schedule()
        .unwrap()
        .iter()
        .filter(|&&id| g.node(id).op == op)
        .count()
}

#[test]
fn dequantized_convolutions_fuse_their_epilogue() {
    for (tail, activation, residual) in [
        ("", None, false),
        ("silu", Some("Silu"), false),
        ("residual", None, true),
    ] {
        let g = quantized_conv(tail, false);
        let after = optimized(&g, "recognize,fuse-quant");
        let fused: Vec<_> = after
            .schedule()
            .unwrap()
            .into_iter()
            .filter(|&id| after.node(id).op == "FusedConvInteger")
            .collect();
        assert_eq!(fused.len(), 1, "{tail}:\n{}", text::print(&after));
        let n = after.node(fused[0]);
        assert_eq!(
            n.attrs.string_or("activation", "none").unwrap(),
            activation.unwrap_or("none"),
            "{tail}"
        );
        // x, w, the zero points, the bias, the scale and (with a residual) Z.
        assert_eq!(n.inputs.len(), if residual { 7 } else { 6 }, "{tail}");
        for gone in ["ConvInteger", "Sigmoid", "Silu"] {
            assert_eq!(count_ops(&after, gone), 0, "{tail}: {gone} left");
        }
        // The bias's Cast to i32 stays; the output's Cast to f32 is fused.
        assert_eq!(count_ops(&after, "Cast"), 1, "{tail}");
        // And through the whole pipeline.
        let all = optimized(&g, passes::DEFAULT_PIPELINE);
        assert_eq!(
            count_ops(&all, "FusedConvInteger"),
            1,
            "{}",
            text::print(&all)
        );
    }
    // A Cast another node reads too stays, and so does the integer convolution.
    let g = quantized_conv("", true);
    let after = optimized(&g, "fuse-quant");
    assert_eq!(count_ops(&after, "FusedConvInteger"), 0);
    assert_eq!(count_ops(&after, "ConvInteger"), 1);
}
