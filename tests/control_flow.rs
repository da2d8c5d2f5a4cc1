//! Control flow in the IR: If, Loop and Scan built through the Rust API, evaluated by
//! the interpreter against hand-computed results, printed and parsed back, and the
//! verifier's errors for each malformed body, each naming the node and the body.
use std::sync::Arc;

use kiln::backend::{backend_for, Device, Executable};
use kiln::ir::text::{parse, print};
use kiln::ir::{verify, Attr, Attrs, DType, Dim, Graph, Shape, TensorType, Value};
use kiln::Tensor;

use crate::common;
use common::{op, param, typed_param};

fn scalar(dtype: DType) -> TensorType {
    TensorType::new(dtype, Shape::scalar())
}

fn sym(dtype: DType, dims: &[&str]) -> TensorType {
    TensorType::new(
        dtype,
        Shape::new(dims.iter().map(|s| Dim::Sym(s.to_string()))),
    )
}

fn body_attr(g: Graph) -> Attr {
    Attr::Graph(Arc::new(g))
}

fn run(g: &Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    let exe = backend_for(Device::Interp).unwrap().compile(g).unwrap();
    exe.run(inputs)
        .unwrap_or_else(|e| panic!("{e}\n{}", print(g)))
}

fn f32s(dims: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_vec(dims, v.to_vec()).unwrap()
}

fn assert_round_trip(g: &Graph) {
    let text = print(g);
    let back = parse(&text, "test.kir", None).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(print(&back), text);
}

/// A body `x -> x * k` (or `x + k`) over one f32[N] parameter.
fn unary_body(name: &str, op_name: &str, k: f32) -> Graph {
    let mut b = Graph::new(name);
    let x: Value = b
        .add_parameter("x", sym(DType::F32, &["N"]))
        .unwrap()
        .into();
    let c = b.scalar("k", DType::F32, k as f64).unwrap();
    let y = op(&mut b, op_name, &[x, c], Attrs::new());
    b.add_output("y", y).unwrap();
    b
}

fn if_graph() -> Graph {
    let mut g = Graph::new("if");
    let c = typed_param(&mut g, "c", DType::Bool, &[]);
    let x = param(&mut g, "x", &[3]);
    let attrs = Attrs::new()
        .with("then_branch", body_attr(unary_body("then", "Mul", 2.0)))
        .with("else_branch", body_attr(unary_body("else", "Add", 10.0)))
        .with("captures", Attr::Int(1));
    let y = op(&mut g, "If", &[c, x], attrs);
    g.add_output("y", y).unwrap();
    g
}

#[test]
fn if_runs_the_chosen_branch() {
    let g = if_graph();
    assert_eq!(
        g.value_type(g.outputs()[0].value).unwrap().to_string(),
        "f32[3]"
    );
    let x = f32s(&[3], &[1.0, 2.0, 3.0]);
    let y = run(&g, &[Tensor::scalar(true), x.clone()]);
    assert_eq!(y[0], f32s(&[3], &[2.0, 4.0, 6.0]));
    let y = run(&g, &[Tensor::scalar(false), x]);
    assert_eq!(y[0], f32s(&[3], &[11.0, 12.0, 13.0]));
    assert_round_trip(&g);
}

#[test]
fn if_gives_a_fresh_symbol_where_the_branches_disagree() {
    let mut g = Graph::new("if");
    let c = typed_param(&mut g, "c", DType::Bool, &[]);
    let mut then = Graph::new("then");
    let a = then.ints("a", &[1, 2]).unwrap();
    then.add_output("y", a).unwrap();
    let mut other = Graph::new("else");
    let b = other.ints("b", &[1, 2, 3]).unwrap();
    other.add_output("y", b).unwrap();
    let attrs = Attrs::new()
        .with("then_branch", body_attr(then))
        .with("else_branch", body_attr(other));
    let y = g.op("If", &[c], attrs, "choose").unwrap();
    assert_eq!(g.node(y).outputs[0].to_string(), "i64[choose.0.0]");
    g.add_output("y", y.into()).unwrap();
    assert_eq!(
        run(&g, &[Tensor::scalar(false)])[0].to_i64_vec(),
        vec![1, 2, 3]
    );
    assert_round_trip(&g);
}

/// `torch.squeeze(x, -1)` as exporters write it: `If(Shape(x)[-1] == 1, Squeeze(x, -1),
/// Identity(x))` over `x: f32[N, K]`, then `* 2`. The branches differ in rank.
fn squeeze_if_graph() -> Graph {
    let mut g = Graph::new("squeeze_if");
    let x: Value = g
        .add_parameter("x", sym(DType::F32, &["N", "K"]))
        .unwrap()
        .into();
    let last = Attrs::new().with("start", Attr::Int(-1));
    let k = op(&mut g, "Shape", &[x], last);
    let one = g.ints("one", &[1]).unwrap();
    let is_one = op(&mut g, "Equal", &[k, one], Attrs::new());
    let mut then = Graph::new("squeeze");
    let p: Value = then
        .add_parameter("x", sym(DType::F32, &["N", "K"]))
        .unwrap()
        .into();
    let axes = then.ints("axes", &[-1]).unwrap();
    let squeezed = op(&mut then, "Squeeze", &[p, axes], Attrs::new());
    then.add_output("y", squeezed).unwrap();
    let mut other = Graph::new("keep");
    let p: Value = other
        .add_parameter("x", sym(DType::F32, &["N", "K"]))
        .unwrap()
        .into();
    let kept = op(&mut other, "Identity", &[p], Attrs::new());
    other.add_output("y", kept).unwrap();
    let attrs = Attrs::new()
        .with("then_branch", body_attr(then))
        .with("else_branch", body_attr(other))
        .with("captures", Attr::Int(1));
    let y = op(&mut g, "If", &[is_one, x], attrs);
    let two = g.scalar("two", DType::F32, 2.0).unwrap();
    let z = op(&mut g, "Mul", &[y, two], Attrs::new());
    g.add_output("z", z).unwrap();
    g
}

#[test]
fn an_if_whose_branches_differ_in_rank_settles_once_the_shapes_are_bound() {
    let g = squeeze_if_graph();
    verify(&g).unwrap();
    // The rank depends on K: unknown, and so is everything computed from it.
    assert_eq!(
        g.value_type(g.outputs()[0].value).unwrap().to_string(),
        "f32"
    );
    assert_round_trip(&g);
    let column = f32s(&[2, 1], &[1.0, 2.0]);
    let wide = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(
        run(&g, std::slice::from_ref(&column))[0],
        f32s(&[2], &[2.0, 4.0])
    );
    assert_eq!(run(&g, std::slice::from_ref(&wide))[0].shape(), &[2, 3]);
    // On cpu each shape settles the condition: the If is inlined and the program is
    // compiled, not handed to the interpreter.
    let cpu = kiln::backend::cpu::CpuBackend::new(kiln::passes::CompileOptions {
        threads: 1,
        ..Default::default()
    });
    let exe = cpu.compile_cpu(&g).unwrap();
    for x in [column, wide] {
        let inputs = std::slice::from_ref(&x);
        assert_eq!(exe.run(inputs).unwrap(), run(&g, inputs));
        let kinds = exe.step_kinds(&[x.shape().to_vec()]).unwrap();
        assert!(
            kinds.is_some(),
            "fell back to the interpreter for {:?}",
            x.shape()
        );
    }
}

/// `Loop(M, cond, acc, captured)`: acc += captured * i, stopping when acc > limit;
/// scan output: acc after each step.
fn loop_graph(limit: f32) -> Graph {
    let mut body = Graph::new("step");
    let i: Value = body.add_parameter("i", scalar(DType::I64)).unwrap().into();
    body.add_parameter("cond_in", scalar(DType::Bool)).unwrap();
    let acc: Value = body
        .add_parameter("acc", sym(DType::F32, &["N"]))
        .unwrap()
        .into();
    let w: Value = body
        .add_parameter("w", sym(DType::F32, &["N"]))
        .unwrap()
        .into();
    let fi = op(
        &mut body,
        "Cast",
        &[i],
        Attrs::new().with("to", Attr::String("f32".into())),
    );
    let wi = op(&mut body, "Mul", &[w, fi], Attrs::new());
    let next = op(&mut body, "Add", &[acc, wi], Attrs::new());
    let total = op(
        &mut body,
        "ReduceSum",
        &[next],
        Attrs::new().with("keepdims", Attr::Int(0)),
    );
    let lim = body.scalar("limit", DType::F32, limit as f64).unwrap();
    let go = op(&mut body, "LessOrEqual", &[total, lim], Attrs::new());
    body.add_output("cond", go).unwrap();
    body.add_output("acc", next).unwrap();
    body.add_output("seen", next).unwrap();

    let mut g = Graph::new("loop");
    let m = typed_param(&mut g, "m", DType::I64, &[]);
    let c = typed_param(&mut g, "c", DType::Bool, &[]);
    let a = param(&mut g, "a", &[2]);
    let w = param(&mut g, "w", &[2]);
    let attrs = Attrs::new()
        .with("body", body_attr(body))
        .with("captures", Attr::Int(1));
    let l = g.op("Loop", &[m, c, a, w], attrs, "loop").unwrap();
    g.add_output("acc", l.out(0)).unwrap();
    g.add_output("seen", l.out(1)).unwrap();
    g
}

#[test]
fn loop_carries_values_and_stacks_scan_outputs() {
    let g = loop_graph(100.0);
    let types: Vec<String> = g
        .node(g.find("loop").unwrap())
        .outputs
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert_eq!(types, ["f32[2]", "f32[loop.1.0, 2]"]);
    let a = f32s(&[2], &[0.0, 1.0]);
    let w = f32s(&[2], &[1.0, 2.0]);
    let out = run(
        &g,
        &[
            Tensor::scalar(3i64),
            Tensor::scalar(true),
            a.clone(),
            w.clone(),
        ],
    );
    // i = 0, 1, 2: acc = [0,1] + [0,0] + [1,2] + [2,4].
    assert_eq!(out[0], f32s(&[2], &[3.0, 7.0]));
    assert_eq!(out[1], f32s(&[3, 2], &[0.0, 1.0, 1.0, 3.0, 3.0, 7.0]));
    // The condition stops it early: after i = 1 the sum is 4 > 3.
    let g = loop_graph(3.0);
    let out = run(
        &g,
        &[
            Tensor::scalar(10i64),
            Tensor::scalar(true),
            a.clone(),
            w.clone(),
        ],
    );
    assert_eq!(out[0], f32s(&[2], &[1.0, 3.0]));
    assert_eq!(out[1].shape(), &[2, 2]);
    // A false cond runs nothing: the scan output is empty.
    let out = run(
        &g,
        &[Tensor::scalar(10i64), Tensor::scalar(false), a.clone(), w],
    );
    assert_eq!(out[0], a);
    assert_eq!(out[1].shape(), &[0, 2]);
    assert_round_trip(&g);
}

/// Scan: a running sum over the rows of x (reversed when `reverse`), outputs stacked.
fn scan_graph(reverse: bool) -> Graph {
    let mut body = Graph::new("add_row");
    let s: Value = body
        .add_parameter("sum", sym(DType::F32, &["K"]))
        .unwrap()
        .into();
    let r: Value = body
        .add_parameter("row", sym(DType::F32, &["K"]))
        .unwrap()
        .into();
    let t = op(&mut body, "Add", &[s, r], Attrs::new());
    body.add_output("sum_out", t).unwrap();
    body.add_output("scan_out", t).unwrap();
    let mut g = Graph::new("scan");
    let init = param(&mut g, "init", &[2]);
    let x = param(&mut g, "x", &[3, 2]);
    let attrs = Attrs::new()
        .with("body", body_attr(body))
        .with("num_scan_inputs", Attr::Int(1))
        .with("scan_input_directions", Attr::Ints(vec![reverse as i64]))
        .with("scan_output_axes", Attr::Ints(vec![1]));
    let n = g.op("Scan", &[init, x], attrs, "scan").unwrap();
    g.add_output("sum", n.out(0)).unwrap();
    g.add_output("partial", n.out(1)).unwrap();
    g
}

#[test]
fn scan_walks_the_scan_axis_in_either_direction() {
    let x = f32s(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let zero = f32s(&[2], &[0.0, 0.0]);
    let g = scan_graph(false);
    let types: Vec<String> = g
        .node(g.find("scan").unwrap())
        .outputs
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert_eq!(types, ["f32[2]", "f32[2, 3]"]);
    let out = run(&g, &[zero.clone(), x.clone()]);
    assert_eq!(out[0], f32s(&[2], &[9.0, 12.0]));
    // Output axis 1: partial[k, step].
    assert_eq!(out[1], f32s(&[2, 3], &[1.0, 4.0, 9.0, 2.0, 6.0, 12.0]));
    let g = scan_graph(true);
    let out = run(&g, &[zero, x]);
    assert_eq!(out[1], f32s(&[2, 3], &[5.0, 8.0, 9.0, 6.0, 10.0, 12.0]));
    assert_round_trip(&g);
}

#[test]
fn control_flow_runs_on_cpu_too() {
    let g = loop_graph(100.0);
    let a = f32s(&[2], &[0.0, 1.0]);
    let w = f32s(&[2], &[1.0, 2.0]);
    let inputs = [Tensor::scalar(3i64), Tensor::scalar(true), a, w];
    let want = run(&g, &inputs);
    let exe = backend_for(Device::Cpu).unwrap().compile(&g).unwrap();
    assert_eq!(exe.run(&inputs).unwrap(), want);
    let g = if_graph();
    let inputs = [Tensor::scalar(false), f32s(&[3], &[1.0, 2.0, 3.0])];
    let exe = backend_for(Device::Cpu).unwrap().compile(&g).unwrap();
    assert_eq!(exe.run(&inputs).unwrap(), run(&g, &inputs));
}

fn expect_err(r: kiln::Result<impl std::fmt::Debug>, want: &[&str]) {
    let e = r.expect_err("should fail").to_string();
    for w in want {
        assert!(e.contains(w), "'{w}' not in: {e}");
    }
}

#[test]
fn bad_bodies_are_errors_naming_the_node_and_the_body() {
    let mut g = Graph::new("g");
    let c = typed_param(&mut g, "c", DType::Bool, &[]);
    let x = param(&mut g, "x", &[3]);
    let i = typed_param(&mut g, "i", DType::I64, &[3]);
    let branches = |t: Graph, e: Graph| {
        Attrs::new()
            .with("then_branch", body_attr(t))
            .with("else_branch", body_attr(e))
            .with("captures", Attr::Int(1))
    };
    // A capture of the wrong dtype.
    let attrs = branches(unary_body("t", "Mul", 1.0), unary_body("e", "Mul", 1.0));
    expect_err(
        g.op("If", &[c, i], attrs, "bad_dtype"),
        &["bad_dtype", "then_branch", "input 0"],
    );
    // Branches of different dtypes.
    let mut flat = Graph::new("flat");
    flat.add_parameter("x", sym(DType::F32, &["N"])).unwrap();
    let s = flat.scalar("s", DType::I64, 1.0).unwrap();
    flat.add_output("y", s).unwrap();
    let attrs = branches(unary_body("t", "Mul", 1.0), flat);
    expect_err(
        g.op("If", &[c, x], attrs, "bad_dtype_branch"),
        &["bad_dtype_branch", "then_branch gives f32, else_branch i64"],
    );
    // The wrong number of body inputs.
    let attrs = branches(unary_body("t", "Mul", 1.0), unary_body("e", "Mul", 1.0))
        .with("captures", Attr::Int(0));
    expect_err(
        g.op("If", &[c, x], attrs, "bad_captures"),
        &["bad_captures", "captures"],
    );
    // cond that is not a bool scalar.
    let attrs = branches(unary_body("t", "Mul", 1.0), unary_body("e", "Mul", 1.0));
    expect_err(
        g.op("If", &[x, x], attrs, "bad_cond"),
        &["bad_cond", "cond"],
    );
    // A Loop whose body changes a carried value's dtype.
    let mut body = Graph::new("step");
    body.add_parameter("i", scalar(DType::I64)).unwrap();
    let cin: Value = body.add_parameter("c", scalar(DType::Bool)).unwrap().into();
    let v: Value = body
        .add_parameter("v", sym(DType::F32, &["N"]))
        .unwrap()
        .into();
    let vi = op(
        &mut body,
        "Cast",
        &[v],
        Attrs::new().with("to", Attr::String("i64".into())),
    );
    body.add_output("c", cin).unwrap();
    body.add_output("v", vi).unwrap();
    let attrs = Attrs::new().with("body", body_attr(body));
    let m = typed_param(&mut g, "m", DType::I64, &[]);
    expect_err(
        g.add_op(
            "Loop",
            &[Some(m), None, Some(x)],
            attrs.clone(),
            "bad_carry",
        ),
        &["bad_carry", "carried value 0", "i64"],
    );
    // A Loop whose cond is not a bool scalar.
    expect_err(
        g.add_op("Loop", &[Some(m), Some(x), Some(x)], attrs, "bad_loop_cond"),
        &["bad_loop_cond", "cond"],
    );
    // Scan inputs whose scan axes disagree in length.
    let mut sb = Graph::new("sb");
    let a: Value = sb.add_parameter("a", scalar(DType::F32)).unwrap().into();
    sb.add_parameter("b", scalar(DType::F32)).unwrap();
    sb.add_output("a", a).unwrap();
    let y = param(&mut g, "y", &[4]);
    let attrs = Attrs::new()
        .with("body", body_attr(sb))
        .with("num_scan_inputs", Attr::Int(2));
    expect_err(
        g.op("Scan", &[x, y], attrs, "bad_scan"),
        &["bad_scan", "scan input 1", "4", "3"],
    );
}

#[test]
fn bodies_nest_at_most_64_deep_and_hold_no_state() {
    // An If nested `depth` levels deep around a constant.
    fn nested(depth: usize) -> Graph {
        let mut g = Graph::new(&format!("level{depth}"));
        if depth == 0 {
            let k = g.scalar("k", DType::F32, 1.0).unwrap();
            g.add_output("y", k).unwrap();
            return g;
        }
        let c = g.add_constant_value("c", Tensor::scalar(true)).unwrap();
        // Only one branch nests: verifying both of two shared bodies per level would
        // visit 2^depth graphs.
        let attrs = Attrs::new()
            .with("then_branch", body_attr(nested(depth - 1)))
            .with("else_branch", body_attr(nested(0)));
        let y = g.op("If", &[c.into()], attrs, "if").unwrap();
        g.add_output("y", y.into()).unwrap();
        g
    }
    verify(&nested(64)).unwrap();
    assert_eq!(run(&nested(64), &[])[0], Tensor::scalar(1.0f32));
    expect_err(verify(&nested(65)), &["deeper than 64"]);
    let text = print(&nested(65));
    expect_err(
        parse(&text, "deep.kir", None),
        &["deep.kir", "deeper than 64"],
    );

    let mut body = Graph::new("stateful");
    let v = body
        .add_variable(
            "v",
            TensorType::new(DType::F32, Shape::scalar()),
            Tensor::scalar(0f32),
        )
        .unwrap();
    body.add_output("v", v.into()).unwrap();
    let mut g = Graph::new("g");
    let c = typed_param(&mut g, "c", DType::Bool, &[]);
    let attrs = Attrs::new()
        .with("then_branch", body_attr(body.clone()))
        .with("else_branch", body_attr(body));
    g.op("If", &[c], attrs, "if").unwrap();
    expect_err(
        verify(&g),
        &["'if'", "else_branch", "'stateful'", "cannot hold state"],
    );
}

fn optimized(g: &Graph) -> Graph {
    let o = kiln::passes::CompileOptions {
        verify: true,
        ..Default::default()
    };
    let mut after = g.clone();
    kiln::passes::run_pipeline(&mut after, &o).unwrap_or_else(|e| panic!("{e}\n{}", print(g)));
    after
}

fn count(g: &Graph, op: &str) -> usize {
    g.nodes().iter().filter(|n| n.op == op).count()
}

#[test]
fn simplify_inlines_an_if_on_a_constant_condition() {
    for cond in [true, false] {
        let mut g = if_graph();
        // The same graph with cond a constant.
        let k = g.add_constant_value("k", Tensor::scalar(cond)).unwrap();
        let at = g.nodes().iter().position(|n| n.op == "If").unwrap();
        let n = kiln::ir::NodeId(at as u32);
        g.node_mut(n).inputs[0] = Some(k.into());
        let x = f32s(&[3], &[1.0, -2.0, 3.0]);
        let inputs = [Tensor::scalar(!cond), x];
        let before = run(&g, &inputs);
        let after = optimized(&g);
        assert_eq!(count(&after, "If"), 0, "{}", print(&after));
        assert_eq!(run(&after, &inputs), before);
    }
}

/// `Loop(trips)` adding the iteration number to a carried f32[2] and giving its square
/// as a scan output; the body passes its condition on.
fn counting_loop(trips: i64) -> Graph {
    let mut body = Graph::new("step");
    let i: Value = body.add_parameter("i", scalar(DType::I64)).unwrap().into();
    let c: Value = body.add_parameter("c", scalar(DType::Bool)).unwrap().into();
    let acc: Value = body
        .add_parameter("acc", sym(DType::F32, &["N"]))
        .unwrap()
        .into();
    let to_f32 = Attrs::new().with("to", Attr::String("f32".into()));
    let fi = op(&mut body, "Cast", &[i], to_f32);
    let next = op(&mut body, "Add", &[acc, fi], Attrs::new());
    let sq = op(&mut body, "Mul", &[next, next], Attrs::new());
    body.add_output("c", c).unwrap();
    body.add_output("acc", next).unwrap();
    body.add_output("sq", sq).unwrap();
    let mut g = Graph::new("g");
    let m = g.add_constant_value("m", Tensor::scalar(trips)).unwrap();
    let a = param(&mut g, "a", &[2]);
    let attrs = Attrs::new().with("body", body_attr(body));
    let l = g
        .add_op("Loop", &[Some(m.into()), None, Some(a)], attrs, "loop")
        .unwrap();
    g.add_output("acc", l.out(0)).unwrap();
    g.add_output("sq", l.out(1)).unwrap();
    g
}

#[test]
fn simplify_unrolls_a_small_constant_loop() {
    let g = counting_loop(4);
    assert_eq!(
        g.value_type(g.outputs()[1].value).unwrap().to_string(),
        "f32[4, 2]"
    );
    let inputs = [f32s(&[2], &[0.5, -1.0])];
    let before = run(&g, &inputs);
    assert_eq!(before[0], f32s(&[2], &[6.5, 5.0]));
    let after = optimized(&g);
    assert_eq!(count(&after, "Loop"), 0, "{}", print(&after));
    assert_eq!(run(&after, &inputs), before);
    // Past the limit it stays a loop.
    let g = counting_loop(100);
    let after = optimized(&g);
    assert_eq!(count(&after, "Loop"), 1);
    assert_eq!(run(&after, &inputs), run(&g, &inputs));
}

#[test]
fn the_pipeline_runs_inside_bodies() {
    let mut body = Graph::new("b");
    let x: Value = body
        .add_parameter("x", sym(DType::F32, &["N"]))
        .unwrap()
        .into();
    let one = body.scalar("one", DType::F32, 1.0).unwrap();
    let y = op(&mut body, "Mul", &[x, one], Attrs::new());
    body.add_output("y", y).unwrap();
    let mut g = Graph::new("g");
    let c = typed_param(&mut g, "c", DType::Bool, &[]);
    let x = param(&mut g, "x", &[3]);
    let attrs = Attrs::new()
        .with("then_branch", body_attr(body.clone()))
        .with("else_branch", body_attr(body))
        .with("captures", Attr::Int(1));
    let y = op(&mut g, "If", &[c, x], attrs);
    g.add_output("y", y).unwrap();
    let after = optimized(&g);
    let n = after.nodes().iter().find(|n| n.op == "If").unwrap();
    let then = n.attrs.graph("then_branch").unwrap().unwrap();
    assert_eq!(count(then, "Mul"), 0, "{}", print(&after));
    let inputs = [Tensor::scalar(true), f32s(&[3], &[1.0, 2.0, 3.0])];
    assert_eq!(run(&after, &inputs), run(&g, &inputs));
}

fn fixture() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/onnx/control_flow.onnx")
}

/// `tests/onnx/control_flow.onnx` (written and checked against onnxruntime by
/// `tests/onnx/control_flow.py`): If whose else branch holds a Loop reading `x` from two
/// scopes up, and a Scan; the expected values are onnxruntime's.
#[test]
fn onnx_subgraphs_import_with_captures_and_run() {
    let g = kiln::frontend::onnx::import_file(&fixture()).unwrap();
    let iff = g.nodes().iter().find(|n| n.op == "If").unwrap();
    // x is captured (the constant `two` is copied into the branch instead).
    assert_eq!(iff.attrs.int("captures").unwrap(), Some(2), "{}", print(&g));
    let other = iff.attrs.graph("else_branch").unwrap().unwrap();
    let lp = other.nodes().iter().find(|n| n.op == "Loop").unwrap();
    assert_eq!(lp.attrs.int("captures").unwrap(), Some(1), "{}", print(&g));
    assert_round_trip(&g);
    let x = f32s(&[3], &[1.0, 2.0, 3.0]);
    let m = f32s(&[2, 3], &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    for (c, want) in [(true, [2.0, 4.0, 6.0]), (false, [3.0, 6.0, 9.0])] {
        let inputs = [
            x.clone(),
            Tensor::scalar(2i64),
            Tensor::scalar(c),
            m.clone(),
        ];
        for device in [Device::Interp, Device::Cpu] {
            let exe = backend_for(device).unwrap().compile(&g).unwrap();
            let out = exe.run(&inputs).unwrap();
            assert_eq!(out[0], f32s(&[3], &want), "{device:?}");
            assert_eq!(out[1], f32s(&[3], &[4.0, 5.0, 6.0]));
            assert_eq!(out[2], f32s(&[2, 3], &[4.0, 6.0, 8.0, 8.0, 10.0, 12.0]));
        }
    }
}

#[test]
fn a_graph_attribute_on_another_op_is_an_error_naming_the_node() {
    use kiln::frontend::onnx::proto::ModelProto;
    use prost::Message;
    let bytes = std::fs::read(fixture()).unwrap();
    let mut m = ModelProto::decode(bytes.as_slice()).unwrap();
    let graph = m.graph.as_mut().unwrap();
    graph.node[0].op_type = Some("Relu".into());
    let e = kiln::frontend::onnx::import_bytes(&m.encode_to_vec(), None).unwrap_err();
    let e = e.to_string();
    assert!(
        e.contains("Relu") && e.contains("only If, Loop and Scan"),
        "{e}"
    );
    // A body that names a value no scope defines.
    let mut m = ModelProto::decode(bytes.as_slice()).unwrap();
    let graph = m.graph.as_mut().unwrap();
    let then = graph.node[0]
        .attribute
        .iter_mut()
        .find(|a| a.name() == "then_branch")
        .unwrap();
    then.g.as_mut().unwrap().node[0].input[0] = "nowhere".into();
    let e = kiln::frontend::onnx::import_bytes(&m.encode_to_vec(), None).unwrap_err();
    let e = e.to_string();
    assert!(e.contains("then_branch") && e.contains("nowhere"), "{e}");
}
