//! Contractions: MatMul, Gemm, Einsum, Dot. Expectations from numpy (`a @ b`,
//! `np.einsum`) on the deterministic data of `ramp`.
use kiln::ir::{Attr, DType, Dim, Graph, Shape, TensorType};
use kiln::Tensor;

use crate::ops::harness::*;

/// `((i % k) - off) * 0.5` over `shape`: numpy's `(np.arange(n) % k - off) * 0.5`.
fn ramp(shape: &[usize], k: usize, off: f64) -> Vec<f64> {
    let n: usize = shape.iter().product();
    (0..n).map(|i| ((i % k) as f64 - off) * 0.5).collect()
}

fn t(shape: &[usize], k: usize) -> Tensor {
    f64s(shape, &ramp(shape, k, 3.0))
}

fn eq(e: &str) -> Attrs {
    attrs(&[("equation", Attr::String(e.into()))])
}
use kiln::ir::Attrs;

#[test]
fn matmul_2d_and_promoted_vectors() {
    let (a, b) = (t(&[2, 3], 7), t(&[3, 2], 5));
    let y = run1(
        "MatMul",
        vec![Input(a.clone()), Input(b.clone())],
        Attrs::new(),
    );
    assert_close(&y, &f64s(&[2, 2], &[2.5, 2.25, 0.25, -1.5]), 0.0, 1e-12);
    let y = run1("MatMul", vec![Input(t(&[3], 7)), Input(b)], Attrs::new());
    assert_close(&y, &f64s(&[2], &[2.5, 2.25]), 0.0, 1e-12);
    let y = run1("MatMul", vec![Input(a), Input(t(&[3], 5))], Attrs::new());
    assert_close(&y, &f64s(&[2], &[3.5, -1.0]), 0.0, 1e-12);
    let y = run1(
        "MatMul",
        vec![Input(t(&[3], 7)), Input(t(&[3], 5))],
        Attrs::new(),
    );
    assert_close(&y, &f64s(&[], &[3.5]), 0.0, 1e-12);
}

const BATCHED: [f64; 24] = [
    2.5, 2.25, 0.25, -1.5, 2.25, 0.75, -1.5, -0.75, 0.75, 1.75, -0.75, -1.25, -2.0, 0.0, 1.0,
    -0.25, 0.0, -0.5, -0.25, -0.25, -0.5, 2.75, -0.25, -0.25,
];

#[test]
fn matmul_broadcasts_batch_axes_and_resolves_symbols() {
    let (a, b) = (t(&[2, 1, 2, 3], 7), t(&[3, 3, 2], 5));
    let y = run1("MatMul", vec![Input(a), Input(b)], Attrs::new());
    assert_close(&y, &f64s(&[2, 3, 2, 2], &BATCHED), 0.0, 1e-12);
    // Symbols bind at run time (distinct symbols are assumed equal, so no size-1 axes).
    let y = run1(
        "MatMul",
        vec![Symbolic(t(&[2, 3], 7)), Symbolic(t(&[3, 2], 5))],
        Attrs::new(),
    );
    assert_close(&y, &f64s(&[2, 2], &[2.5, 2.25, 0.25, -1.5]), 0.0, 1e-12);
}

#[test]
fn matmul_integers_and_empty_operands() {
    let a = i64s(&[2, 2], &[1, 2, 3, 4]);
    let y = run1("MatMul", vec![Input(a.clone()), Input(a)], Attrs::new());
    assert_eq!(y, i64s(&[2, 2], &[7, 10, 15, 22]));
    // K = 0: a sum over nothing.
    let y = run1(
        "MatMul",
        vec![Input(f32s(&[2, 0], &[])), Input(f32s(&[0, 3], &[]))],
        Attrs::new(),
    );
    assert_eq!(y, f32s(&[2, 3], &[0.0; 6]));
    let y = run1(
        "MatMul",
        vec![Input(f32s(&[0, 2], &[])), Input(f32s(&[2, 3], &[0.0; 6]))],
        Attrs::new(),
    );
    assert_eq!(y.shape(), &[0, 3]);
}

#[test]
fn matmul_errors_name_the_dims() {
    let e = run_err(
        "MatMul",
        vec![Input(t(&[2, 3], 7)), Input(t(&[4, 2], 5))],
        Attrs::new(),
    );
    assert!(
        e.contains("inner dims differ") && e.contains("3 vs 4"),
        "{e}"
    );
    let e = run_err(
        "MatMul",
        vec![Input(f32s(&[1, 1], &[1.0])), Input(f64s(&[1, 1], &[1.0]))],
        Attrs::new(),
    );
    assert!(e.contains("dtype mismatch"), "{e}");
    let e = run_err(
        "MatMul",
        vec![Input(t(&[2, 2, 3], 7)), Input(t(&[3, 3, 2], 5))],
        Attrs::new(),
    );
    assert!(e.contains("broadcast"), "{e}");
}

#[test]
fn gemm_transposes_scales_and_broadcasts_c() {
    let a = t(&[3, 2], 7);
    let b = t(&[4, 3], 5);
    let c = f64s(&[4], &ramp(&[4], 3, 1.0));
    let at = attrs(&[
        ("alpha", Attr::Float(0.5)),
        ("beta", Attr::Float(2.0)),
        ("transA", Attr::Int(1)),
        ("transB", Attr::Int(1)),
    ]);
    let y = run1(
        "Gemm",
        vec![Input(a.clone()), Input(b.clone()), Input(c)],
        at.clone(),
    );
    let want = [0.25, -0.5, 1.875, -1.25, -0.5, -0.75, 1.5, -1.75];
    assert_close(&y, &f64s(&[2, 4], &want), 0.0, 1e-12);
    let y = run1(
        "Gemm",
        vec![Input(a.clone()), Input(b.clone()), Absent],
        at.clone(),
    );
    assert_eq!(y.shape(), &[2, 4]);
    let e = run_err("Gemm", vec![Input(a), Input(b), Input(t(&[3], 5))], at);
    assert!(e.contains("C"), "{e}");
}

#[test]
fn einsum_attention_forms() {
    let q = t(&[1, 2, 3, 4], 7);
    let k = t(&[1, 2, 5, 4], 5);
    let y = run1("Einsum", vec![Input(q), Input(k)], eq("bhqd,bhkd->bhqk"));
    let want = [
        3.5, 1.25, 0.25, 0.5, 2.0, -2.5, -2.0, -0.25, 2.75, -1.75, 2.0, 0.0, -0.75, -0.25, 1.5,
        -2.25, 0.25, 4.0, 0.25, -2.25, 0.5, -1.25, -1.75, -1.0, 1.0, -0.25, 4.25, 1.25, -0.5, -1.0,
    ];
    assert_close(&y, &f64s(&[1, 2, 3, 5], &want), 0.0, 1e-12);
    let p = t(&[1, 2, 3, 5], 4);
    let v = t(&[1, 2, 5, 4], 6);
    let y = run1(
        "Einsum",
        vec![Symbolic(p), Symbolic(v)],
        eq("bhqk,bhkd->bhqd"),
    );
    let want = [
        1.25, -1.0, 4.25, 2.0, 3.0, 1.0, 3.5, 1.5, 2.75, 1.0, 0.75, -1.0, 2.0, 0.5, 2.0, 0.5, 4.25,
        2.0, 1.25, -1.0, 3.5, 1.5, -0.5, -2.5,
    ];
    assert_close(&y, &f64s(&[1, 2, 3, 4], &want), 0.0, 1e-12);
}

#[test]
fn einsum_bilinear_diagonal_trace_ellipsis_implicit() {
    let y = run1(
        "Einsum",
        vec![
            Input(t(&[2, 3], 7)),
            Input(t(&[4, 3, 2], 5)),
            Input(f64s(&[2, 2], &ramp(&[2, 2], 3, 3.0))),
        ],
        eq("bi,oij,bj->bo"),
    );
    let want = [-6.0, -4.125, -2.875, -2.875, 2.125, 1.875, 2.25, 1.375];
    assert_close(&y, &f64s(&[2, 4], &want), 0.0, 1e-12);
    let m = t(&[3, 3], 5);
    let y = run1("Einsum", vec![Input(m.clone())], eq("ii->i"));
    assert_close(&y, &f64s(&[3], &[-1.5, 0.5, 0.0]), 0.0, 1e-12);
    let y = run1("Einsum", vec![Input(m)], eq("ii"));
    assert_close(&y, &f64s(&[], &[-1.0]), 0.0, 1e-12);
    let y = run1(
        "Einsum",
        vec![Input(t(&[2, 1, 2, 3], 7)), Input(t(&[3, 3, 2], 5))],
        eq("...ij,...jk->...ik"),
    );
    assert_close(&y, &f64s(&[2, 3, 2, 2], &BATCHED), 0.0, 1e-12);
    let y = run1(
        "Einsum",
        vec![Input(t(&[2, 3], 7)), Input(t(&[3, 2], 5))],
        eq("ij,jk"),
    );
    assert_close(&y, &f64s(&[2, 2], &[2.5, 2.25, 0.25, -1.5]), 0.0, 1e-12);
}

#[test]
fn einsum_errors() {
    let e = run_err(
        "Einsum",
        vec![Input(t(&[2, 3], 7)), Input(t(&[4, 2], 5))],
        eq("ij,jk->ik"),
    );
    assert!(e.contains("label sizes differ"), "{e}");
    let e = run_err("Einsum", vec![Input(t(&[2, 3], 7))], eq("ij,jk->ik"));
    assert!(e.contains("2 operands"), "{e}");
    let e = run_err("Einsum", vec![Input(t(&[2, 3], 7))], eq("i$->i"));
    assert!(e.contains("unexpected"), "{e}");
    let e = run_err("Einsum", vec![Input(t(&[2, 3], 7))], eq("ij->iz"));
    assert!(e.contains("'z'"), "{e}");
    let e = run_err("Einsum", vec![Input(t(&[2, 3], 7))], eq("ijk->i"));
    assert!(e.contains("rank 2"), "{e}");
}

/// A two-input graph with named parameters, run on `a` and `b`.
fn dot(
    a_names: [&str; 2],
    a: Tensor,
    b_names: [&str; 2],
    b: Tensor,
) -> kiln::Result<(Shape, Tensor)> {
    use kiln::backend::{interp::InterpExecutable, Executable};
    let named = |names: [&str; 2], t: &Tensor| {
        let dims = t.shape().iter().map(|&d| Dim::Fixed(d)).collect();
        TensorType::new(
            DType::F64,
            Shape::named(dims, names.iter().map(|n| Some(n.to_string())).collect()),
        )
    };
    let mut g = Graph::new("dot");
    let pa = g.add_parameter("a", named(a_names, &a))?;
    let pb = g.add_parameter("b", named(b_names, &b))?;
    let y = g.op("Dot", &[pa.into(), pb.into()], Attrs::new(), "y")?;
    g.add_output("y", y.into())?;
    let shape = g.node(y).outputs[0].shape.clone();
    let out = InterpExecutable::new(g)?.run(&[a, b])?;
    Ok((shape, out.into_iter().next().unwrap()))
}

#[test]
fn dot_contracts_shared_axis_names() {
    let (shape, y) = dot(["B", "K"], t(&[2, 3], 7), ["K", "N"], t(&[3, 4], 5)).unwrap();
    assert_eq!(shape.to_string(), "[B:2, N:4]");
    let want = [1.75, 2.75, 2.5, 1.0, 0.25, -0.25, -2.0, -1.25];
    assert_close(&y, &f64s(&[2, 4], &want), 0.0, 1e-12);
    // Order of B's axes does not matter: K is found by name.
    let bt = run1(
        "Transpose",
        vec![Input(t(&[3, 4], 5))],
        attrs(&[("perm", Attr::Ints(vec![1, 0]))]),
    );
    let (_, y2) = dot(["B", "K"], t(&[2, 3], 7), ["N", "K"], bt).unwrap();
    assert_close(&y2, &y, 0.0, 1e-12);
}

#[test]
fn dot_errors_name_both_axes() {
    let e = dot(["B", "K"], t(&[2, 3], 7), ["K", "N"], t(&[4, 4], 5))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("axis 'K' is 3 in input 0 but 4 in input 1") && e.contains("'y'"),
        "{e}"
    );
    let e = run_err(
        "Dot",
        vec![Input(t(&[2, 3], 7)), Input(t(&[3, 4], 5))],
        Attrs::new(),
    );
    assert!(e.contains("named axes"), "{e}");
}

#[test]
fn det_of_each_matrix() {
    // numpy.linalg.det: 2x2 -> -2; a permutation-needing 3x3 -> 3; batched.
    let x = f64s(
        &[2, 3, 3],
        &[
            1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0,
            -3.0,
        ],
    );
    let y = run1("Det", vec![Symbolic(x)], Attrs::new());
    assert_close(&y, &f64s(&[2], &[-2.0, 3.0]), 1e-12, 0.0);
    let y = run1(
        "Det",
        vec![Input(f32s(&[2, 2], &[4.0, 2.0, 2.0, 1.0]))],
        Attrs::new(),
    );
    assert_eq!(y, f32s(&[], &[0.0]));
    let e = run_err("Det", vec![Input(f64s(&[2, 3], &[0.0; 6]))], Attrs::new());
    assert!(e.contains("square"), "{e}");
}
