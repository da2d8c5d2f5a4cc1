//! Control flow on the CPU backend (bodies compiled to their own programs, checked
//! against the interpreter and that no fallback step ran them) and gradients through
//! `If`, `Loop` and `Scan` (finite differences on the interpreter, and the CPU backend's
//! gradients against the interpreter's).
use crate::common;

use std::sync::Arc;

use kiln::autodiff::grad;
use kiln::backend::cpu::CpuBackend;
use kiln::backend::{backend_with, Device};
use kiln::ir::{Attr, Attrs, DType, Graph, Value};
use kiln::passes::CompileOptions;
use kiln::Tensor;

use common::control_graphs::{recurrence_inputs, recurrence_loop};
use common::{check_gradients, op, param, typed_param, Rng};

/// `g` on cpu and interp: the same results (to f32 rounding), and the step kinds of
/// the CPU program.
fn cpu_matches_interp(g: &Graph, inputs: &[Tensor]) -> Vec<&'static str> {
    let want = backend_with(Device::Interp, CompileOptions::default())
        .unwrap()
        .compile(g)
        .unwrap()
        .run(inputs)
        .unwrap();
    let cpu = CpuBackend::new(CompileOptions {
        threads: 2,
        ..Default::default()
    });
    let exe = cpu.compile_cpu(g).unwrap();
    let got = kiln::backend::Executable::run(&exe, inputs).unwrap();
    assert_eq!(got.len(), want.len());
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        a.check_close(b, 1e-5, 1e-4)
            .unwrap_or_else(|e| panic!("output {k}: {e}"));
    }
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    exe.step_kinds(&shapes).unwrap().expect("a lowered program")
}

fn graph_attr(g: Graph) -> Attr {
    Attr::Graph(Arc::new(g))
}

fn bool_scalar(v: bool) -> Tensor {
    Tensor::from_vec(&[], vec![v]).unwrap()
}

/// `If(c, x, y)`: then `relu(x)·y`, else `x - y`.
fn if_graph(dtype: DType) -> Graph {
    let branch = |then: bool| {
        let mut b = Graph::new(if then { "then" } else { "else" });
        let x = typed_param(&mut b, "x", dtype, &[2, 3]);
        let y = typed_param(&mut b, "y", dtype, &[2, 3]);
        let r = if then {
            let r = op(&mut b, "Relu", &[x], Attrs::new());
            op(&mut b, "Mul", &[r, y], Attrs::new())
        } else {
            op(&mut b, "Sub", &[x, y], Attrs::new())
        };
        b.add_output("r", r).unwrap();
        b
    };
    let mut g = Graph::new("if");
    let c = typed_param(&mut g, "c", DType::Bool, &[]);
    let x = typed_param(&mut g, "x", dtype, &[2, 3]);
    let y = typed_param(&mut g, "y", dtype, &[2, 3]);
    let attrs = Attrs::new()
        .with("then_branch", graph_attr(branch(true)))
        .with("else_branch", graph_attr(branch(false)))
        .with("captures", Attr::Int(2));
    let r = op(&mut g, "If", &[c, x, y], attrs);
    g.add_output("r", r).unwrap();
    g
}

#[test]
fn if_runs_the_branch_the_condition_picks() {
    let g = if_graph(DType::F32);
    let mut rng = Rng(1);
    for c in [true, false] {
        let inputs = vec![
            bool_scalar(c),
            rng.f32_tensor(&[2, 3], 1.0),
            rng.f32_tensor(&[2, 3], 1.0),
        ];
        let kinds = cpu_matches_interp(&g, &inputs);
        assert!(kinds.contains(&"if"), "{kinds:?}");
    }
}

#[test]
fn a_loop_with_a_constant_trip_count_and_scan_outputs_is_compiled() {
    // Short loops of small bodies may be unrolled by the pipeline; longer ones stay.
    for iters in [0, 1, 7, 40] {
        let g = recurrence_loop(iters, 8, true);
        let kinds = cpu_matches_interp(&g, &recurrence_inputs(8, 2));
        if iters == 40 {
            assert!(kinds.contains(&"loop"), "{kinds:?}");
            assert!(!kinds.contains(&"fallback"), "{kinds:?}");
        }
    }
}

/// A while loop: `x ← 2x` while `sum(x) < limit`, with a trip count given at run time;
/// its outputs are the final x and the iteration count reached.
fn doubling_loop() -> Graph {
    let mut body = Graph::new("double");
    let i = typed_param(&mut body, "i", DType::I64, &[]);
    typed_param(&mut body, "cond", DType::Bool, &[]);
    let x = param(&mut body, "x", &[4]);
    let n = typed_param(&mut body, "n", DType::I64, &[]);
    let limit = param(&mut body, "limit", &[]);
    let two = common::constant(&mut body, Tensor::scalar(2.0f32));
    let x2 = op(&mut body, "Mul", &[x, two], Attrs::new());
    let s = op(
        &mut body,
        "ReduceSum",
        &[x2],
        Attrs::new().with("keepdims", Attr::Int(0)),
    );
    let go = op(&mut body, "Less", &[s, limit], Attrs::new());
    let one = common::constant(&mut body, Tensor::scalar(1i64));
    let i1 = op(&mut body, "Add", &[i, one], Attrs::new());
    let n1 = op(&mut body, "Max", &[n, i1], Attrs::new());
    body.add_output("go", go).unwrap();
    body.add_output("x", x2).unwrap();
    body.add_output("n", n1).unwrap();
    let mut g = Graph::new("while");
    let m = typed_param(&mut g, "m", DType::I64, &[]);
    let c = typed_param(&mut g, "c", DType::Bool, &[]);
    let x = param(&mut g, "x", &[4]);
    let n0 = common::constant(&mut g, Tensor::scalar(0i64));
    let limit = param(&mut g, "limit", &[]);
    let attrs = Attrs::new()
        .with("body", graph_attr(body))
        .with("captures", Attr::Int(1));
    let l = g
        .add_op(
            "Loop",
            &[Some(m), Some(c), Some(x), Some(n0), Some(limit)],
            attrs,
            "w",
        )
        .unwrap();
    g.add_output("x", l.out(0)).unwrap();
    g.add_output("n", l.out(1)).unwrap();
    g
}

#[test]
fn a_while_loop_stops_when_its_condition_turns_false() {
    let g = doubling_loop();
    let x = Tensor::from_vec(&[4], vec![0.5f32, 1.0, -0.25, 0.75]).unwrap();
    for (m, c, limit) in [
        (100i64, true, 50.0f32),
        (3, true, 1e9),
        (10, false, 50.0),
        (0, true, 50.0),
    ] {
        let inputs = vec![
            Tensor::scalar(m),
            bool_scalar(c),
            x.clone(),
            Tensor::scalar(limit),
        ];
        let kinds = cpu_matches_interp(&g, &inputs);
        assert!(kinds.contains(&"loop"), "{kinds:?}");
    }
}

/// `Scan` over axis 1 of x [2, 5, 3], in reverse: a running sum (state [2, 3]) and each
/// step's `state·w` stacked along output axis 1.
fn scan_graph(dtype: DType) -> Graph {
    let mut body = Graph::new("acc");
    let s = typed_param(&mut body, "s", dtype, &[2, 3]);
    let x = typed_param(&mut body, "x", dtype, &[2, 3]);
    let w = typed_param(&mut body, "w", dtype, &[3]);
    let s2 = op(&mut body, "Add", &[s, x], Attrs::new());
    let y = op(&mut body, "Mul", &[s2, w], Attrs::new());
    let y = op(&mut body, "Tanh", &[y], Attrs::new());
    body.add_output("s", s2).unwrap();
    body.add_output("y", y).unwrap();
    let mut g = Graph::new("scan");
    let s0 = typed_param(&mut g, "s0", dtype, &[2, 3]);
    let x = typed_param(&mut g, "x", dtype, &[2, 5, 3]);
    let w = typed_param(&mut g, "w", dtype, &[3]);
    let attrs = Attrs::new()
        .with("body", graph_attr(body))
        .with("num_scan_inputs", Attr::Int(1))
        .with("scan_input_axes", Attr::Ints(vec![1]))
        .with("scan_input_directions", Attr::Ints(vec![1]))
        .with("scan_output_axes", Attr::Ints(vec![-2]))
        .with("captures", Attr::Int(1));
    let l = g.op("Scan", &[s0, x, w], attrs, "scan").unwrap();
    g.add_output("s", l.out(0)).unwrap();
    g.add_output("ys", l.out(1)).unwrap();
    g
}

#[test]
fn scan_reads_and_writes_rows_along_any_axis_in_either_direction() {
    let g = scan_graph(DType::F32);
    let mut rng = Rng(3);
    let inputs = vec![
        rng.f32_tensor(&[2, 3], 1.0),
        rng.f32_tensor(&[2, 5, 3], 1.0),
        rng.f32_tensor(&[3], 1.0),
    ];
    let kinds = cpu_matches_interp(&g, &inputs);
    assert!(kinds.contains(&"scan"), "{kinds:?}");
}

#[test]
fn a_loop_inside_an_if_is_compiled_inside_the_branch() {
    let mut g = Graph::new("nested");
    let c = typed_param(&mut g, "c", DType::Bool, &[]);
    let h0 = param(&mut g, "h0", &[1, 8]);
    let w = param(&mut g, "w", &[8, 8]);
    let b = param(&mut g, "b", &[8]);
    let looped = {
        // The recurrence graph itself is a closed graph of (h0, w, b): a branch.
        let mut l = recurrence_loop(3, 8, false);
        l.name = "then".into();
        l
    };
    let mut other = Graph::new("else");
    let oh = param(&mut other, "h0", &[1, 8]);
    param(&mut other, "w", &[8, 8]);
    param(&mut other, "b", &[8]);
    let neg = op(&mut other, "Neg", &[oh], Attrs::new());
    other.add_output("h", neg).unwrap();
    let attrs = Attrs::new()
        .with("then_branch", graph_attr(looped))
        .with("else_branch", graph_attr(other))
        .with("captures", Attr::Int(3));
    let r = op(&mut g, "If", &[c, h0, w, b], attrs);
    g.add_output("h", r).unwrap();
    let mut inputs = vec![bool_scalar(true)];
    inputs.extend(recurrence_inputs(8, 4));
    let kinds = cpu_matches_interp(&g, &inputs);
    assert_eq!(kinds, ["if"]);
}

// ---------------------------------------------------------------------------------------
// Gradients

/// The gradient of `sum(outputs[0]²)` (plus `sum(outputs[1])` when there is one) checked
/// against finite differences on the interpreter, and the CPU backend's gradients
/// against the interpreter's.
fn check_control_gradients(g: &Graph, params: &[Value], inputs: &[Tensor], first_param: usize) {
    let mut g = g.clone();
    let outs: Vec<Value> = g.outputs().iter().map(|o| o.value).collect();
    let sq = op(&mut g, "Mul", &[outs[0], outs[0]], Attrs::new());
    let keep = Attrs::new().with("keepdims", Attr::Int(0));
    let mut loss = op(&mut g, "ReduceSum", &[sq], keep.clone());
    if let Some(&second) = outs.get(1) {
        let s = op(&mut g, "ReduceSum", &[second], keep);
        loss = op(&mut g, "Add", &[loss, s], Attrs::new());
    }
    check_gradients(&g, loss, params, inputs, first_param);
    let grads = grad(&mut g, loss, params).unwrap();
    for (k, gv) in grads.iter().enumerate() {
        g.add_output(&format!("grad{k}"), *gv).unwrap();
    }
    cpu_matches_interp(&g, inputs);
}

fn f64_inputs(rng: &mut Rng, shapes: &[&[usize]]) -> Vec<Tensor> {
    shapes
        .iter()
        .map(|s| rng.f32_tensor(s, 1.0).cast(DType::F64))
        .collect()
}

#[test]
fn the_gradient_of_if_is_the_taken_branch_s_gradient() {
    let g = if_graph(DType::F64);
    let params: Vec<Value> = g.inputs()[1..].iter().map(|&p| p.into()).collect();
    let mut rng = Rng(7);
    for c in [true, false] {
        let mut inputs = vec![bool_scalar(c)];
        inputs.extend(f64_inputs(&mut rng, &[&[2, 3], &[2, 3]]));
        check_control_gradients(&g, &params, &inputs, 1);
    }
}

/// The recurrence in f64 with a constant trip count, scan outputs included.
fn f64_recurrence(iters: i64) -> Graph {
    let text = kiln::ir::text::print(&recurrence_loop(iters, 3, true)).replace("f32", "f64");
    kiln::ir::text::parse(&text, "recurrence.kir", None).unwrap()
}

#[test]
fn the_gradient_of_a_loop_with_a_constant_trip_count() {
    let g = f64_recurrence(3);
    let params: Vec<Value> = g.inputs().iter().map(|&p| p.into()).collect();
    let mut rng = Rng(8);
    let inputs = f64_inputs(&mut rng, &[&[1, 3], &[3, 3], &[3]]);
    check_control_gradients(&g, &params, &inputs, 0);
}

#[test]
fn the_gradient_of_a_scan() {
    let g = scan_graph(DType::F64);
    let params: Vec<Value> = g.inputs().iter().map(|&p| p.into()).collect();
    let mut rng = Rng(9);
    let inputs = f64_inputs(&mut rng, &[&[2, 3], &[2, 5, 3], &[3]]);
    check_control_gradients(&g, &params, &inputs, 0);
}

#[test]
fn a_loop_whose_trip_count_is_an_input_has_no_gradient_and_says_why() {
    let mut g = doubling_loop();
    let x: Value = g.inputs()[2].into();
    let out = g.outputs()[0].value;
    let keep = Attrs::new().with("keepdims", Attr::Int(0));
    let loss = op(&mut g, "ReduceSum", &[out], keep);
    let err = grad(&mut g, loss, &[x]).unwrap_err().to_string();
    assert!(
        err.contains("constant trip count") && err.contains("Loop"),
        "{err}"
    );
}
