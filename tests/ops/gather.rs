//! Indexing ops, on the examples of the ONNX operator docs and hand-worked cases.
use kiln::ir::{Attr, Attrs};
use kiln::Tensor;

use crate::ops::harness::*;

fn axis(a: i64) -> Attrs {
    attrs(&[("axis", Attr::Int(a))])
}

#[test]
fn gather_along_any_axis_with_negative_indices() {
    let data = f32s(&[3, 2], &[1.0, 1.2, 2.3, 3.4, 4.5, 5.7]);
    let idx = i64s(&[2, 2], &[0, 1, 1, 2]);
    let y = run1(
        "Gather",
        vec![Input(data.clone()), Input(idx)],
        Attrs::new(),
    );
    assert_eq!(
        y,
        f32s(&[2, 2, 2], &[1.0, 1.2, 2.3, 3.4, 2.3, 3.4, 4.5, 5.7])
    );
    let data = f32s(&[3, 3], &[1.0, 1.2, 1.9, 2.3, 3.4, 3.9, 4.5, 5.7, 5.9]);
    let y = run1(
        "Gather",
        vec![Symbolic(data.clone()), Input(i32s(&[1, 2], &[0, -1]))],
        axis(1),
    );
    assert_eq!(y, f32s(&[3, 1, 2], &[1.0, 1.9, 2.3, 3.9, 4.5, 5.9]));
    // A scalar index drops the axis; empty indices give an empty result.
    let y = run1(
        "Gather",
        vec![Input(data.clone()), Input(i64s(&[], &[2]))],
        Attrs::new(),
    );
    assert_eq!(y, f32s(&[3], &[4.5, 5.7, 5.9]));
    let y = run1(
        "Gather",
        vec![Input(data.clone()), Input(i64s(&[0], &[]))],
        Attrs::new(),
    );
    assert_eq!(y.shape(), &[0, 3]);
    let e = run_err(
        "Gather",
        vec![Input(data.clone()), Input(i64s(&[1], &[3]))],
        Attrs::new(),
    );
    assert!(
        e.contains("index 3 is out of range for an axis of size 3"),
        "{e}"
    );
    let e = run_err(
        "Gather",
        vec![Input(data), Input(f32s(&[1], &[0.0]))],
        Attrs::new(),
    );
    assert!(e.contains("i32 or i64"), "{e}");
}

#[test]
fn gather_elements_follows_onnx_examples() {
    let data = i64s(&[2, 2], &[1, 2, 3, 4]);
    let y = run1(
        "GatherElements",
        vec![Input(data), Input(i64s(&[2, 2], &[0, 0, 1, 0]))],
        axis(1),
    );
    assert_eq!(y, i64s(&[2, 2], &[1, 1, 4, 3]));
    let data = i64s(&[3, 3], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let y = run1(
        "GatherElements",
        vec![
            Input(data.clone()),
            Input(i64s(&[2, 3], &[1, 2, 0, 2, 0, -3])),
        ],
        Attrs::new(),
    );
    assert_eq!(y, i64s(&[2, 3], &[4, 8, 3, 7, 2, 3]));
    let e = run_err(
        "GatherElements",
        vec![Input(data), Input(i64s(&[3], &[0, 0, 0]))],
        Attrs::new(),
    );
    assert!(e.contains("data's rank"), "{e}");
}

#[test]
fn scatter_elements_with_and_without_reduction() {
    let data = f32s(&[3, 3], &[0.0; 9]);
    let idx = i64s(&[2, 3], &[1, 0, 2, 0, 2, 1]);
    let upd = f32s(&[2, 3], &[1.0, 1.1, 1.2, 2.0, 2.1, 2.2]);
    let y = run1(
        "ScatterElements",
        vec![Input(data), Input(idx), Input(upd)],
        Attrs::new(),
    );
    assert_eq!(
        y,
        f32s(&[3, 3], &[2.0, 1.1, 0.0, 1.0, 0.0, 2.2, 0.0, 2.1, 1.2])
    );
    let data = f32s(&[1, 5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
    let y = run1(
        "ScatterElements",
        vec![
            Input(data.clone()),
            Input(i64s(&[1, 2], &[1, -2])),
            Input(f32s(&[1, 2], &[1.1, 2.1])),
        ],
        axis(1),
    );
    assert_eq!(y, f32s(&[1, 5], &[1.0, 1.1, 3.0, 2.1, 5.0]));
    let add = attrs(&[
        ("axis", Attr::Int(1)),
        ("reduction", Attr::String("add".into())),
    ]);
    let y = run1(
        "ScatterElements",
        vec![
            Input(data.clone()),
            Input(i64s(&[1, 2], &[1, 1])),
            Input(f32s(&[1, 2], &[1.1, 2.1])),
        ],
        add,
    );
    assert_close(&y, &f32s(&[1, 5], &[1.0, 5.2, 3.0, 4.0, 5.0]), 1e-6, 0.0);
    let max = attrs(&[
        ("axis", Attr::Int(1)),
        ("reduction", Attr::String("max".into())),
    ]);
    let y = run1(
        "ScatterElements",
        vec![
            Input(data.clone()),
            Input(i64s(&[1, 2], &[0, 4])),
            Input(f32s(&[1, 2], &[0.5, 9.0])),
        ],
        max,
    );
    assert_eq!(y, f32s(&[1, 5], &[1.0, 2.0, 3.0, 4.0, 9.0]));
    let e = run_err(
        "ScatterElements",
        vec![
            Input(data),
            Input(i64s(&[1, 2], &[0, 1])),
            Input(f32s(&[1, 1], &[0.0])),
        ],
        Attrs::new(),
    );
    assert!(e.contains("shape of indices"), "{e}");
}

#[test]
fn one_hot_with_negative_and_out_of_range_indices() {
    let idx = i64s(&[3], &[1, -1, 5]);
    let y = run1(
        "OneHot",
        vec![
            Input(idx.clone()),
            Const(i64s(&[], &[4])),
            Input(f32s(&[2], &[0.0, 3.0])),
        ],
        Attrs::new(),
    );
    assert_eq!(
        y,
        f32s(
            &[3, 4],
            &[0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0]
        )
    );
    let y = run1(
        "OneHot",
        vec![
            Input(idx),
            Input(i64s(&[1], &[4])),
            Input(i32s(&[2], &[0, 1])),
        ],
        axis(0),
    );
    assert_eq!(y, i32s(&[4, 3], &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0]));
    let e = run_err(
        "OneHot",
        vec![
            Input(i64s(&[1], &[0])),
            Const(i64s(&[], &[0])),
            Input(f32s(&[2], &[0.0, 1.0])),
        ],
        Attrs::new(),
    );
    assert!(e.contains("depth must be >= 1"), "{e}");
}

#[test]
fn top_k_largest_smallest_and_ties() {
    let x = i64s(&[3, 4], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
    let out = run(
        "TopK",
        vec![Input(x), Const(i64s(&[1], &[3]))],
        Attrs::new(),
    )
    .unwrap();
    assert_eq!(out[0], i64s(&[3, 3], &[3, 2, 1, 7, 6, 5, 11, 10, 9]));
    assert_eq!(out[1], i64s(&[3, 3], &[3, 2, 1, 3, 2, 1, 3, 2, 1]));
    let x = f32s(&[5], &[2.0, 1.0, 2.0, 0.5, 1.0]);
    let smallest = attrs(&[("largest", Attr::Int(0))]);
    let out = run(
        "TopK",
        vec![Symbolic(x.clone()), Input(i64s(&[1], &[3]))],
        smallest,
    )
    .unwrap();
    assert_eq!(out[0], f32s(&[3], &[0.5, 1.0, 1.0]));
    assert_eq!(out[1], i64s(&[3], &[3, 1, 4]));
    let out = run(
        "TopK",
        vec![Input(x.clone()), Const(i64s(&[1], &[2]))],
        axis(0),
    )
    .unwrap();
    assert_eq!(out[1], i64s(&[2], &[0, 2]), "equal values keep index order");
    let e = run_err(
        "TopK",
        vec![Input(x), Const(i64s(&[1], &[6]))],
        Attrs::new(),
    );
    assert!(e.contains("K = 6 is out of range"), "{e}");
}

#[test]
fn cum_sum_exclusive_reverse() {
    let x = f64s(&[5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
    let flags = |e: i64, r: i64| attrs(&[("exclusive", Attr::Int(e)), ("reverse", Attr::Int(r))]);
    let ax = || Const(i64s(&[], &[0]));
    assert_eq!(
        run1("CumSum", vec![Input(x.clone()), ax()], Attrs::new()),
        f64s(&[5], &[1.0, 3.0, 6.0, 10.0, 15.0])
    );
    assert_eq!(
        run1("CumSum", vec![Input(x.clone()), ax()], flags(1, 0)),
        f64s(&[5], &[0.0, 1.0, 3.0, 6.0, 10.0])
    );
    assert_eq!(
        run1("CumSum", vec![Input(x.clone()), ax()], flags(0, 1)),
        f64s(&[5], &[15.0, 14.0, 12.0, 9.0, 5.0])
    );
    assert_eq!(
        run1("CumSum", vec![Input(x), ax()], flags(1, 1)),
        f64s(&[5], &[14.0, 12.0, 9.0, 5.0, 0.0])
    );
    let m = i32s(&[2, 3], &[1, 2, 3, 4, 5, 6]);
    let y = run1(
        "CumSum",
        vec![Symbolic(m.clone()), Input(i32s(&[], &[-1]))],
        Attrs::new(),
    );
    assert_eq!(y, i32s(&[2, 3], &[1, 3, 6, 4, 9, 15]));
    let e = run_err(
        "CumSum",
        vec![Input(m), Const(i64s(&[], &[2]))],
        Attrs::new(),
    );
    assert!(e.contains("axis 2 is out of range"), "{e}");
}

#[test]
fn cum_prod_exclusive_reverse() {
    let x = f64s(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let flags = |e: i64, r: i64| attrs(&[("exclusive", Attr::Int(e)), ("reverse", Attr::Int(r))]);
    let ax = || Const(i64s(&[], &[0]));
    assert_eq!(
        run1("CumProd", vec![Input(x.clone()), ax()], Attrs::new()),
        f64s(&[4], &[1.0, 2.0, 6.0, 24.0])
    );
    assert_eq!(
        run1("CumProd", vec![Input(x), ax()], flags(1, 1)),
        f64s(&[4], &[24.0, 12.0, 4.0, 1.0])
    );
    let m = i32s(&[2, 2], &[2, 3, 4, 5]);
    let y = run1(
        "CumProd",
        vec![Input(m), Input(i32s(&[], &[0]))],
        flags(1, 0),
    );
    assert_eq!(y, i32s(&[2, 2], &[1, 1, 2, 3]));
}

#[test]
fn trilu_keeps_a_triangle() {
    let x = i64s(&[3, 3], &[0, 1, 2, 3, 4, 5, 6, 7, 8]);
    let y = run1("Trilu", vec![Input(x.clone())], Attrs::new());
    assert_eq!(y, i64s(&[3, 3], &[0, 1, 2, 0, 4, 5, 0, 0, 8]));
    let lower = attrs(&[("upper", Attr::Int(0))]);
    let y = run1(
        "Trilu",
        vec![Input(x.clone()), Const(i64s(&[], &[-1]))],
        lower,
    );
    assert_eq!(y, i64s(&[3, 3], &[0, 0, 0, 3, 0, 0, 6, 7, 0]));
    let y = run1(
        "Trilu",
        vec![
            Symbolic(f32s(&[1, 2, 3], &[1.0; 6])),
            Input(i64s(&[], &[1])),
        ],
        Attrs::new(),
    );
    assert_eq!(y, f32s(&[1, 2, 3], &[0.0, 1.0, 1.0, 0.0, 0.0, 1.0]));
    let e = run_err("Trilu", vec![Input(i64s(&[3], &[1, 2, 3]))], Attrs::new());
    assert!(e.contains("rank >= 2"), "{e}");
}

#[test]
fn non_zero_lists_indices_row_major() {
    let y = run1(
        "NonZero",
        vec![Input(f32s(&[2, 2], &[1.0, 0.0, 1.0, 1.0]))],
        Attrs::new(),
    );
    assert_eq!(y, i64s(&[2, 3], &[0, 1, 1, 0, 0, 1]));
    let y = run1(
        "NonZero",
        vec![Input(bools(&[3], &[false, false, false]))],
        Attrs::new(),
    );
    assert_eq!(y.shape(), &[1, 0]);
}

#[test]
fn gather_nd_with_and_without_batch_dims() {
    // ONNX examples.
    let data = i64s(&[2, 2], &[0, 1, 2, 3]);
    let y = run1(
        "GatherND",
        vec![Input(data.clone()), Input(i64s(&[2, 2], &[0, 0, 1, 1]))],
        Attrs::new(),
    );
    assert_eq!(y, i64s(&[2], &[0, 3]));
    let y = run1(
        "GatherND",
        vec![Input(data), Input(i64s(&[2, 1], &[1, 0]))],
        Attrs::new(),
    );
    assert_eq!(y, i64s(&[2, 2], &[2, 3, 0, 1]));
    let data = i64s(&[2, 2, 2], &[0, 1, 2, 3, 4, 5, 6, 7]);
    let b1 = attrs(&[("batch_dims", Attr::Int(1))]);
    let y = run1(
        "GatherND",
        vec![Input(data.clone()), Input(i64s(&[2, 1], &[1, 0]))],
        b1,
    );
    assert_eq!(y, i64s(&[2, 2], &[2, 3, 4, 5]));
    let e = run_err(
        "GatherND",
        vec![Input(data), Input(i64s(&[1, 1], &[2]))],
        Attrs::new(),
    );
    assert!(e.contains("index 2 is out of range"), "{e}");
}

#[test]
fn non_max_suppression_keeps_the_best_of_overlapping_boxes() {
    // Boxes 0 and 1 overlap almost entirely (IoU 0.81); box 2 is apart.
    let boxes = f32s(
        &[1, 3, 4],
        &[0.0, 0.0, 1.0, 1.0, 0.0, 0.1, 1.0, 1.0, 0.0, 5.0, 1.0, 6.0],
    );
    let scores = f32s(&[1, 1, 3], &[0.8, 0.9, 0.7]);
    let args = |max: i64, score: f32| {
        vec![
            Input(boxes.clone()),
            Input(scores.clone()),
            Input(i64s(&[1], &[max])),
            Input(f32s(&[1], &[0.5])),
            Input(f32s(&[1], &[score])),
        ]
    };
    let y = run1("NonMaxSuppression", args(10, 0.0), Attrs::new());
    assert_eq!(y, i64s(&[2, 3], &[0, 0, 1, 0, 0, 2]));
    assert_eq!(
        run1("NonMaxSuppression", args(1, 0.0), Attrs::new()),
        i64s(&[1, 3], &[0, 0, 1])
    );
    assert_eq!(
        run1("NonMaxSuppression", args(10, 0.95), Attrs::new()).shape(),
        &[0, 3]
    );
    let e = run_err(
        "NonMaxSuppression",
        vec![Input(f32s(&[3, 4], &[0.0; 12])), Input(scores)],
        Attrs::new(),
    );
    assert!(e.contains("[B, N, 4]"), "{e}");
}

#[test]
fn scatter_nd_slices_and_reductions() {
    let data = || {
        Input(f64s(
            &[2, 3, 4],
            &(0..24).map(|v| v as f64).collect::<Vec<_>>(),
        ))
    };
    // Two updates land on [1, -1] = [1, 2]: added in index order.
    let idx = i64s(&[3, 2], &[1, -1, 0, 0, 1, -1]);
    let upd = f64s(
        &[3, 4],
        &(0..12).map(|v| v as f64 * 10.0).collect::<Vec<_>>(),
    );
    let y = run1(
        "ScatterND",
        vec![data(), Input(idx), Input(upd)],
        attrs(&[("reduction", Attr::String("add".into()))]),
    );
    let mut want: Vec<f64> = (0..24).map(|v| v as f64).collect();
    want[..4].copy_from_slice(&[40.0, 51.0, 62.0, 73.0]);
    want[20..].copy_from_slice(&[100.0, 121.0, 142.0, 163.0]);
    assert_eq!(y, f64s(&[2, 3, 4], &want));
    // One coordinate: a whole [3, 4] block is replaced.
    let y = run1(
        "ScatterND",
        vec![
            data(),
            Input(i64s(&[1, 1], &[1])),
            Symbolic(f64s(&[1, 3, 4], &[1.0; 12])),
        ],
        Attrs::new(),
    );
    let mut want: Vec<f64> = (0..24).map(|v| v as f64).collect();
    want[12..].fill(1.0);
    assert_eq!(y, f64s(&[2, 3, 4], &want));
    let e = run_err(
        "ScatterND",
        vec![
            data(),
            Input(i64s(&[1, 1], &[2])),
            Input(f64s(&[1, 3, 4], &[0.0; 12])),
        ],
        Attrs::new(),
    );
    assert!(
        e.contains("index 2 is out of range for axis 0 of size 2"),
        "{e}"
    );
}

#[test]
fn reverse_sequence_reverses_each_prefix() {
    // time_axis 0, batch_axis 1: column b reverses its first lens[b] rows.
    let x = i64s(&[3, 3], &[0, 1, 2, 3, 4, 5, 6, 7, 8]);
    let y = run1(
        "ReverseSequence",
        vec![Input(x.clone()), Input(i64s(&[3], &[3, 2, 0]))],
        Attrs::new(),
    );
    assert_eq!(y, i64s(&[3, 3], &[6, 4, 2, 3, 1, 5, 0, 7, 8]));
    let y = run1(
        "ReverseSequence",
        vec![Symbolic(x.clone()), Input(i64s(&[3], &[1, 2, 3]))],
        attrs(&[("batch_axis", Attr::Int(0)), ("time_axis", Attr::Int(1))]),
    );
    assert_eq!(y, i64s(&[3, 3], &[0, 1, 2, 4, 3, 5, 8, 7, 6]));
    let e = run_err(
        "ReverseSequence",
        vec![Input(x), Input(i64s(&[3], &[4, 0, 0]))],
        Attrs::new(),
    );
    assert!(e.contains("a length <= 3"), "{e}");
}

#[test]
fn unique_elements_and_slices() {
    let x = i64s(&[3, 3], &[1, 0, 0, 1, 0, 0, 2, 3, 4]);
    let out = run("Unique", vec![Input(x.clone())], Attrs::new()).unwrap();
    assert_eq!(out[0], i64s(&[5], &[0, 1, 2, 3, 4]));
    assert_eq!(out[1], i64s(&[5], &[1, 0, 6, 7, 8]));
    assert_eq!(out[2], i64s(&[9], &[1, 0, 0, 1, 0, 0, 2, 3, 4]));
    assert_eq!(out[3], i64s(&[5], &[4, 2, 1, 1, 1]));
    let out = run(
        "Unique",
        vec![Symbolic(x.clone())],
        attrs(&[("axis", Attr::Int(0))]),
    )
    .unwrap();
    assert_eq!(out[0], i64s(&[2, 3], &[1, 0, 0, 2, 3, 4]));
    assert_eq!(out[1], i64s(&[2], &[0, 2]));
    assert_eq!(out[2], i64s(&[3], &[0, 0, 1]));
    assert_eq!(out[3], i64s(&[2], &[2, 1]));
    // Unsorted keeps first-occurrence order; -0 equals 0.
    let f = f32s(&[4], &[2.0, -0.0, 2.0, 0.0]);
    let out = run("Unique", vec![Input(f)], attrs(&[("sorted", Attr::Int(0))])).unwrap();
    assert_eq!(out[0], f32s(&[2], &[2.0, -0.0]));
    assert_eq!(out[3], i64s(&[2], &[2, 2]));
}

/// Integer reductions wrap like C (as numpy, ONNX's reference, does), and compare u64
/// unsigned: they are not computed in f64 and saturated.
#[test]
fn scatter_reductions_on_integers_wrap() {
    let red = |r: &str| attrs(&[("reduction", Attr::String(r.into()))]);
    let u8s = |v: &[u8]| Tensor::from_vec(&[v.len()], v.to_vec()).unwrap();
    let y = run1(
        "ScatterElements",
        vec![
            Input(u8s(&[250, 1])),
            Input(i64s(&[1], &[0])),
            Input(u8s(&[10])),
        ],
        red("add"),
    );
    assert_eq!(y, u8s(&[4, 1]));
    let big = u64::MAX - 1;
    let u64s = |v: &[u64]| Tensor::from_vec(&[v.len(), 1], v.to_vec()).unwrap();
    let y = run1(
        "ScatterND",
        vec![
            Input(u64s(&[big, 3])),
            Input(i64s(&[2, 1], &[0, 1])),
            Input(u64s(&[7, u64::MAX])),
        ],
        red("max"),
    );
    assert_eq!(y, u64s(&[big, u64::MAX]));
}
