//! Reductions and ArgMax/ArgMin against numpy (`np.sum(x, axis=(0, 2), keepdims=True)`
//! etc.) on `ramp` data.
use kiln::ir::{Attr, Attrs, DType, Dim, Graph, Shape, TensorType};
use kiln::Tensor;

use crate::ops::harness::*;

/// numpy's `((np.arange(n) % 7) - 3) * 0.5` over `shape`.
fn ramp(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    f64s(
        shape,
        &(0..n)
            .map(|i| ((i % 7) as f64 - 3.0) * 0.5)
            .collect::<Vec<_>>(),
    )
}

fn axes(v: &[i64]) -> Arg {
    Const(i64s(&[v.len()], v))
}

#[test]
fn every_reduction_over_two_axes_keepdims() {
    let x = ramp(&[2, 3, 4]);
    let cases: &[(&str, [f64; 3])] = &[
        ("ReduceSum", [-3.0, 2.5, -2.5]),
        ("ReduceMean", [-0.375, 0.3125, -0.3125]),
        ("ReduceMax", [1.5, 1.5, 1.5]),
        ("ReduceMin", [-1.5, -1.5, -1.5]),
        ("ReduceL1", [8.0, 6.5, 6.5]),
        (
            "ReduceL2",
            [3.1622776601683795, 2.692582403567252, 2.692582403567252],
        ),
        (
            "ReduceLogSumExp",
            [2.3014365097397196, 2.711069378031729, 2.2302682069749307],
        ),
        ("ReduceSumSquare", [10.0, 7.25, 7.25]),
    ];
    for (op, want) in cases {
        let y = run1(op, vec![Input(x.clone()), axes(&[0, -1])], Attrs::new());
        assert_close(&y, &f64s(&[1, 3, 1], want), 1e-12, 1e-12);
        // Symbolic input dims, axes read from the constant.
        let y = run1(op, vec![Symbolic(x.clone()), axes(&[2, 0])], Attrs::new());
        assert_close(&y, &f64s(&[1, 3, 1], want), 1e-12, 1e-12);
    }
}

#[test]
fn prod_and_log_sum_without_keepdims() {
    let x = f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let no_keep = attrs(&[("keepdims", Attr::Int(0))]);
    let y = run1(
        "ReduceProd",
        vec![Input(x.clone()), axes(&[1])],
        no_keep.clone(),
    );
    assert_eq!(y, f32s(&[2], &[6.0, 120.0]));
    let y = run1("ReduceLogSum", vec![Input(x), axes(&[1])], no_keep);
    assert_close(&y, &f32s(&[2], &[6f32.ln(), 15f32.ln()]), 1e-6, 0.0);
}

#[test]
fn omitted_axes_reduce_everything_unless_noop() {
    let x = i64s(&[2, 2], &[1, 2, 3, 4]);
    let y = run1("ReduceSum", vec![Input(x.clone())], Attrs::new());
    assert_eq!(y, i64s(&[1, 1], &[10]));
    let y = run1(
        "ReduceSum",
        vec![Input(x.clone()), axes(&[])],
        attrs(&[("keepdims", Attr::Int(0))]),
    );
    assert_eq!(y, i64s(&[], &[10]));
    let y = run1(
        "ReduceMax",
        vec![Input(x.clone())],
        attrs(&[("noop_with_empty_axes", Attr::Int(1))]),
    );
    assert_eq!(y, x);
}

#[test]
fn integer_reductions_stay_exact() {
    let big = i64s(&[2], &[i64::MAX - 1, 1]);
    assert_eq!(
        run1("ReduceSum", vec![Input(big)], Attrs::new()),
        i64s(&[1], &[i64::MAX])
    );
    let x = i32s(&[3], &[-4, 2, 7]);
    assert_eq!(
        run1("ReduceMin", vec![Input(x.clone())], Attrs::new()),
        i32s(&[1], &[-4])
    );
    assert_eq!(
        run1("ReduceL1", vec![Input(x.clone())], Attrs::new()),
        i32s(&[1], &[13])
    );
    let e = run_err("ReduceMean", vec![Input(x)], Attrs::new());
    assert!(e.contains("float"), "{e}");
}

#[test]
fn empty_reductions_give_identities() {
    let x = f32s(&[2, 0], &[]);
    let a = axes(&[1]);
    assert_eq!(
        run1("ReduceSum", vec![Input(x.clone()), a], Attrs::new()),
        f32s(&[2, 1], &[0.0, 0.0])
    );
    assert_eq!(
        run1(
            "ReduceProd",
            vec![Input(x.clone()), axes(&[1])],
            Attrs::new()
        ),
        f32s(&[2, 1], &[1.0, 1.0])
    );
    let y = run1(
        "ReduceMax",
        vec![Input(x.clone()), axes(&[1])],
        Attrs::new(),
    );
    assert_eq!(y, f32s(&[2, 1], &[f32::NEG_INFINITY; 2]));
    // Reducing the non-empty axis of an empty tensor leaves it empty.
    assert_eq!(
        run1("ReduceSum", vec![Input(x), axes(&[0])], Attrs::new()).shape(),
        &[1, 0]
    );
}

#[test]
fn axes_computed_at_run_time() {
    let x = ramp(&[2, 3, 4]);
    let y = run1(
        "ReduceSum",
        vec![Input(x.clone()), Input(i64s(&[2], &[0, 2]))],
        Attrs::new(),
    );
    assert_close(&y, &f64s(&[1, 3, 1], &[-3.0, 2.5, -2.5]), 1e-12, 0.0);
    let y = run1(
        "ReduceSum",
        vec![Input(x), Input(i64s(&[2], &[0, 2]))],
        attrs(&[("keepdims", Attr::Int(0))]),
    );
    assert_close(&y, &f64s(&[3], &[-3.0, 2.5, -2.5]), 1e-12, 0.0);
}

#[test]
fn axis_names_select_axes_kiln_only() {
    let mut g = Graph::new("names");
    let dims = vec![Dim::Sym("N".into()), Dim::Fixed(3), Dim::Fixed(4)];
    let names = vec![Some("N".into()), Some("C".into()), Some("W".into())];
    let x = g
        .add_parameter("x", TensorType::new(DType::F64, Shape::named(dims, names)))
        .unwrap();
    let at = attrs(&[("axis_names", Attr::Strings(vec!["N".into(), "W".into()]))]);
    let y = g.op("ReduceSum", &[x.into()], at, "sum").unwrap();
    assert_eq!(g.node(y).outputs[0].to_string(), "f64[N:1, C:3, W:1]");
    g.add_output("y", y.into()).unwrap();
    use kiln::backend::{interp::InterpExecutable, Executable};
    let out = InterpExecutable::new(g.clone())
        .unwrap()
        .run(&[ramp(&[2, 3, 4])])
        .unwrap();
    assert_close(&out[0], &f64s(&[1, 3, 1], &[-3.0, 2.5, -2.5]), 1e-12, 0.0);
    let bad = attrs(&[("axis_names", Attr::Strings(vec!["H".into()]))]);
    let e = g
        .op("ReduceMean", &[x.into()], bad, "bad")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no axis is named 'H' (named axes: N, C, W)") && e.contains("'bad'"),
        "{e}"
    );
}

#[test]
fn reduce_errors() {
    let x = ramp(&[2, 3]);
    let e = run_err(
        "ReduceSum",
        vec![Input(x.clone()), axes(&[2])],
        Attrs::new(),
    );
    assert!(e.contains("axis 2 is out of range for rank 2"), "{e}");
    let e = run_err(
        "ReduceSum",
        vec![Input(x.clone()), axes(&[1, -1])],
        Attrs::new(),
    );
    assert!(e.contains("repeat"), "{e}");
    let e = run_err(
        "ReduceSum",
        vec![Input(x), Const(i32s(&[1], &[0]))],
        Attrs::new(),
    );
    assert!(e.contains("axes"), "{e}");
    let e = run_err("ReduceSum", vec![Input(bools(&[1], &[true]))], Attrs::new());
    assert!(e.contains("numeric"), "{e}");
}

#[test]
fn arg_max_and_min() {
    let x = ramp(&[2, 3, 4]);
    let y = run1(
        "ArgMax",
        vec![Input(x.clone())],
        attrs(&[("axis", Attr::Int(1)), ("keepdims", Attr::Int(0))]),
    );
    assert_eq!(y, i64s(&[2, 4], &[1, 1, 1, 2, 2, 0, 1, 1]));
    let y = run1(
        "ArgMin",
        vec![Input(x.clone())],
        attrs(&[("axis", Attr::Int(-1))]),
    );
    assert_eq!(y, i64s(&[2, 3, 1], &[0, 3, 0, 2, 0, 1]));
    let ties = i32s(&[4], &[3, 1, 3, 1]);
    assert_eq!(
        run1("ArgMax", vec![Input(ties.clone())], Attrs::new()),
        i64s(&[1], &[0])
    );
    let last = attrs(&[("select_last_index", Attr::Int(1))]);
    assert_eq!(
        run1("ArgMax", vec![Input(ties.clone())], last.clone()),
        i64s(&[1], &[2])
    );
    assert_eq!(run1("ArgMin", vec![Input(ties)], last), i64s(&[1], &[3]));
    let e = run_err("ArgMax", vec![Input(f32s(&[0], &[]))], Attrs::new());
    assert!(e.contains("empty axis"), "{e}");
}

#[test]
fn reduce_max_and_min_of_bools_are_any_and_all() {
    let b = bools(&[2, 2], &[true, false, false, false]);
    let axes = || Const(i64s(&[1], &[1]));
    let keep0 = attrs(&[("keepdims", kiln::ir::Attr::Int(0))]);
    assert_eq!(
        run1("ReduceMax", vec![Input(b.clone()), axes()], keep0.clone()),
        bools(&[2], &[true, false])
    );
    assert_eq!(
        run1("ReduceMin", vec![Input(b), axes()], keep0.clone()),
        bools(&[2], &[false, false])
    );
    // Over an empty set: any is false, all is true.
    let empty = bools(&[2, 0], &[]);
    assert_eq!(
        run1(
            "ReduceMax",
            vec![Input(empty.clone()), axes()],
            keep0.clone()
        ),
        bools(&[2], &[false, false])
    );
    assert_eq!(
        run1("ReduceMin", vec![Input(empty), axes()], keep0),
        bools(&[2], &[true, true])
    );
}
