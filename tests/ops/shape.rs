//! Shape and data-movement ops. Expectations are written out by hand or taken from
//! numpy (`x[2:0:-1, ::-2]`, `np.pad(..., mode=...)`, `np.tile`, `np.arange`).
use kiln::ir::{Attr, Attrs};
use kiln::Tensor;

use crate::ops::harness::*;

fn iota(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    i64s(shape, &(0..n as i64).collect::<Vec<_>>())
}

fn ints(v: &[i64]) -> Arg {
    Const(i64s(&[v.len()], v))
}

fn axis(a: i64) -> Attrs {
    attrs(&[("axis", Attr::Int(a))])
}

#[test]
fn reshape_copies_zero_and_infers_minus_one() {
    let x = iota(&[2, 3, 4]);
    let y = run1(
        "Reshape",
        vec![Input(x.clone()), ints(&[0, -1])],
        Attrs::new(),
    );
    assert_eq!(y, iota(&[2, 12]));
    let y = run1(
        "Reshape",
        vec![Symbolic(x.clone()), ints(&[-1, 4])],
        Attrs::new(),
    );
    assert_eq!(y, iota(&[6, 4]));
    // The shape may also come at run time.
    let y = run1(
        "Reshape",
        vec![Input(x.clone()), Input(i64s(&[2], &[4, 6]))],
        Attrs::new(),
    );
    assert_eq!(y, iota(&[4, 6]));
    let y = run1(
        "Reshape",
        vec![Input(iota(&[0, 3])), ints(&[3, 0])],
        attrs(&[("allowzero", Attr::Int(1))]),
    );
    assert_eq!(y.shape(), &[3, 0]);
    let e = run_err(
        "Reshape",
        vec![Input(x.clone()), ints(&[5, -1])],
        Attrs::new(),
    );
    assert!(e.contains("cannot reshape"), "{e}");
    let e = run_err("Reshape", vec![Input(x), ints(&[-1, -1])], Attrs::new());
    assert!(e.contains("more than one -1"), "{e}");
}

#[test]
fn reshape_keeps_a_symbol_it_can_cancel() {
    let (g, _) = build(
        "Reshape",
        vec![Symbolic(iota(&[2, 3])), ints(&[-1])],
        Attrs::new(),
    )
    .unwrap();
    let ty = g
        .value_type(g.find("op").unwrap().into())
        .unwrap()
        .to_string();
    assert_eq!(
        ty, "i64[op.0.0]",
        "s0_0 * s0_1 is a product no symbol names"
    );
    let (g, _) = build(
        "Reshape",
        vec![Symbolic(iota(&[2, 3])), ints(&[0, -1])],
        Attrs::new(),
    )
    .unwrap();
    let ty = g
        .value_type(g.find("op").unwrap().into())
        .unwrap()
        .to_string();
    assert_eq!(ty, "i64[s0_0, s0_1]");
}

#[test]
fn flatten_squeeze_unsqueeze_identity() {
    let x = iota(&[2, 3, 4]);
    assert_eq!(
        run1("Flatten", vec![Input(x.clone())], Attrs::new()),
        iota(&[2, 12])
    );
    assert_eq!(
        run1("Flatten", vec![Input(x.clone())], axis(0)),
        iota(&[1, 24])
    );
    assert_eq!(
        run1("Flatten", vec![Symbolic(x.clone())], axis(-1)),
        iota(&[6, 4])
    );
    let e = run_err("Flatten", vec![Input(x.clone())], axis(4));
    assert!(e.contains("out of range"), "{e}");
    let x1 = iota(&[1, 3, 1]);
    assert_eq!(
        run1("Squeeze", vec![Input(x1.clone())], Attrs::new()),
        iota(&[3])
    );
    assert_eq!(
        run1(
            "Squeeze",
            vec![Input(x1.clone()), ints(&[-1])],
            Attrs::new()
        ),
        iota(&[1, 3])
    );
    // Without axes a symbolic dim that is 1 at run time goes too (onnxruntime agrees).
    assert_eq!(
        run1("Squeeze", vec![Symbolic(x1.clone())], Attrs::new()),
        iota(&[3])
    );
    let e = run_err("Squeeze", vec![Input(x1), ints(&[1])], Attrs::new());
    assert!(e.contains("its size is 3"), "{e}");
    assert_eq!(
        run1(
            "Unsqueeze",
            vec![Input(iota(&[3])), ints(&[0, -1])],
            Attrs::new()
        ),
        iota(&[1, 3, 1])
    );
    let e = run_err(
        "Unsqueeze",
        vec![Input(iota(&[3])), ints(&[0, 0])],
        Attrs::new(),
    );
    assert!(e.contains("repeat"), "{e}");
    let b = bools(&[2], &[true, false]);
    assert_eq!(run1("Identity", vec![Input(b.clone())], Attrs::new()), b);
}

#[test]
fn transpose_permutes_and_defaults_to_reversal() {
    let x = iota(&[2, 3]);
    let want = i64s(&[3, 2], &[0, 3, 1, 4, 2, 5]);
    assert_eq!(
        run1("Transpose", vec![Input(x.clone())], Attrs::new()),
        want
    );
    let y = run1(
        "Transpose",
        vec![Symbolic(iota(&[2, 1, 3]))],
        attrs(&[("perm", Attr::Ints(vec![2, 0, 1]))]),
    );
    assert_eq!(y, i64s(&[3, 2, 1], &[0, 3, 1, 4, 2, 5]));
    let e = run_err(
        "Transpose",
        vec![Input(x.clone())],
        attrs(&[("perm", Attr::Ints(vec![0, 0]))]),
    );
    assert!(e.contains("repeats"), "{e}");
    let e = run_err(
        "Transpose",
        vec![Input(x)],
        attrs(&[("perm", Attr::Ints(vec![0]))]),
    );
    assert!(e.contains("1 entries for rank 2"), "{e}");
}

#[test]
fn expand_broadcasts_both_ways() {
    let x = f32s(&[3, 1], &[1.0, 2.0, 3.0]);
    let y = run1(
        "Expand",
        vec![Input(x.clone()), ints(&[2, 1, 2])],
        Attrs::new(),
    );
    assert_eq!(
        y,
        f32s(
            &[2, 3, 2],
            &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
        )
    );
    let e = run_err("Expand", vec![Input(x), ints(&[2, 2])], Attrs::new());
    assert!(e.contains("cannot broadcast"), "{e}");
}

#[test]
fn slice_with_negative_steps_and_clamping() {
    let x = iota(&[3, 4]);
    let y = run1(
        "Slice",
        vec![
            Input(x.clone()),
            ints(&[2, -1]),
            ints(&[0, i64::MIN]),
            ints(&[0, 1]),
            ints(&[-1, -2]),
        ],
        Attrs::new(),
    );
    assert_eq!(y, i64s(&[2, 2], &[11, 9, 7, 5]));
    let y = run1(
        "Slice",
        vec![
            Symbolic(x.clone()),
            ints(&[-2, 1]),
            ints(&[10, 3]),
            Absent,
            Absent,
        ],
        Attrs::new(),
    );
    assert_eq!(y, i64s(&[2, 2], &[5, 6, 9, 10]));
    let y = run1(
        "Slice",
        vec![Input(x.clone()), ints(&[3]), ints(&[1]), ints(&[1]), Absent],
        Attrs::new(),
    );
    assert_eq!(y.shape(), &[3, 0]);
    let e = run_err(
        "Slice",
        vec![
            Input(x.clone()),
            ints(&[0]),
            ints(&[1]),
            ints(&[0]),
            ints(&[0]),
        ],
        Attrs::new(),
    );
    assert!(e.contains("steps must not be 0"), "{e}");
    let e = run_err(
        "Slice",
        vec![Input(x), ints(&[0, 0]), ints(&[1]), Absent, Absent],
        Attrs::new(),
    );
    assert!(e.contains("same length"), "{e}");
}

#[test]
fn pad_modes() {
    let a = i64s(&[3], &[1, 2, 3]);
    let pad = |p: &[i64], mode: &str| {
        run1(
            "Pad",
            vec![Input(a.clone()), ints(p)],
            attrs(&[("mode", Attr::String(mode.into()))]),
        )
    };
    assert_eq!(pad(&[2, 2], "reflect"), i64s(&[7], &[3, 2, 1, 2, 3, 2, 1]));
    assert_eq!(pad(&[2, 1], "edge"), i64s(&[6], &[1, 1, 1, 2, 3, 3]));
    assert_eq!(pad(&[2, 2], "wrap"), i64s(&[7], &[2, 3, 1, 2, 3, 1, 2]));
    assert_eq!(pad(&[-1, 0], "constant"), i64s(&[2], &[2, 3]));
    let y = run1(
        "Pad",
        vec![
            Input(iota(&[2, 2])),
            ints(&[1, 0, 0, 2]),
            Const(i64s(&[], &[9])),
        ],
        Attrs::new(),
    );
    assert_eq!(y, i64s(&[3, 4], &[9, 9, 9, 9, 0, 1, 9, 9, 2, 3, 9, 9]));
    let y = run1(
        "Pad",
        vec![Input(iota(&[2, 2])), ints(&[1, 1]), Absent, ints(&[-1])],
        Attrs::new(),
    );
    assert_eq!(y, i64s(&[2, 4], &[0, 0, 1, 0, 0, 2, 3, 0]));
    let e = run_err("Pad", vec![Input(a.clone()), ints(&[1])], Attrs::new());
    assert!(e.contains("pads has 1 values"), "{e}");
    let e = run_err(
        "Pad",
        vec![Input(a), ints(&[1, 1])],
        attrs(&[("mode", Attr::String("mirror".into()))]),
    );
    assert!(e.contains("mode 'mirror'"), "{e}");
}

#[test]
fn tile_repeats() {
    let y = run1(
        "Tile",
        vec![Input(iota(&[2, 2])), ints(&[2, 1])],
        Attrs::new(),
    );
    assert_eq!(y, i64s(&[4, 2], &[0, 1, 2, 3, 0, 1, 2, 3]));
    assert_eq!(
        run1("Tile", vec![Symbolic(iota(&[2])), ints(&[0])], Attrs::new()).shape(),
        &[0]
    );
    let e = run_err("Tile", vec![Input(iota(&[2])), ints(&[1, 1])], Attrs::new());
    assert!(e.contains("repeats has 2 values for rank 1"), "{e}");
}

#[test]
fn concat_and_split() {
    let a = iota(&[2, 2]);
    let b = i64s(&[2, 1], &[7, 8]);
    let y = run1(
        "Concat",
        vec![Input(a.clone()), Symbolic(b.clone())],
        axis(-1),
    );
    assert_eq!(y, i64s(&[2, 3], &[0, 1, 7, 2, 3, 8]));
    let e = run_err("Concat", vec![Input(a.clone()), Input(b.clone())], axis(0));
    assert!(e.contains("input 1 is 1 at axis 1, input 0 is 2"), "{e}");
    let e = run_err(
        "Concat",
        vec![Input(a), Input(f32s(&[2, 1], &[0.0; 2]))],
        axis(1),
    );
    assert!(e.contains("dtype mismatch"), "{e}");
    let x = iota(&[5]);
    let parts = run("Split", vec![Input(x.clone()), ints(&[2, 3])], Attrs::new()).unwrap();
    assert_eq!(parts, vec![i64s(&[2], &[0, 1]), i64s(&[3], &[2, 3, 4])]);
    let parts = run(
        "Split",
        vec![Input(x.clone())],
        attrs(&[("num_outputs", Attr::Int(2))]),
    )
    .unwrap();
    assert_eq!(parts, vec![i64s(&[3], &[0, 1, 2]), i64s(&[2], &[3, 4])]);
    let e = run_err("Split", vec![Input(x.clone()), ints(&[2, 2])], Attrs::new());
    assert!(e.contains("does not add up"), "{e}");
    let e = run_err("Split", vec![Input(x)], Attrs::new());
    assert!(e.contains("num_outputs"), "{e}");
    // A split known only at run time: num_outputs gives the count.
    let two = attrs(&[("num_outputs", Attr::Int(2))]);
    let parts = run(
        "Split",
        vec![Input(iota(&[5])), Input(i64s(&[2], &[4, 1]))],
        two,
    )
    .unwrap();
    assert_eq!(parts, vec![i64s(&[4], &[0, 1, 2, 3]), i64s(&[1], &[4])]);
    let e = run_err(
        "Split",
        vec![Input(iota(&[5])), Input(i64s(&[2], &[4, 1]))],
        Attrs::new(),
    );
    assert!(e.contains("run time needs num_outputs"), "{e}");
}

#[test]
fn shape_size_constant_of_shape_range() {
    let x = iota(&[2, 3, 4]);
    assert_eq!(
        run1("Shape", vec![Symbolic(x.clone())], Attrs::new()),
        i64s(&[3], &[2, 3, 4])
    );
    let y = run1(
        "Shape",
        vec![Input(x.clone())],
        attrs(&[("start", Attr::Int(-2)), ("end", Attr::Int(10))]),
    );
    assert_eq!(y, i64s(&[2], &[3, 4]));
    assert_eq!(
        run1("Size", vec![Symbolic(x)], Attrs::new()),
        i64s(&[], &[24])
    );
    let y = run1(
        "ConstantOfShape",
        vec![ints(&[2, 2])],
        attrs(&[("value", Attr::Float(1.5))]),
    );
    assert_eq!(y, f32s(&[2, 2], &[1.5; 4]));
    let y = run1(
        "ConstantOfShape",
        vec![Input(i64s(&[1], &[3]))],
        attrs(&[
            ("value", Attr::Int(7)),
            ("dtype", Attr::String("i32".into())),
        ]),
    );
    assert_eq!(y, i32s(&[3], &[7, 7, 7]));
    let e = run_err(
        "ConstantOfShape",
        vec![ints(&[2])],
        attrs(&[("dtype", Attr::String("f8".into()))]),
    );
    assert!(e.contains("unknown dtype 'f8'"), "{e}");
    let y = run1(
        "Range",
        vec![
            Const(f64s(&[], &[1.0])),
            Const(f64s(&[], &[2.0])),
            Const(f64s(&[], &[0.3])),
        ],
        Attrs::new(),
    );
    assert_close(
        &y,
        &f64s(&[4], &[1.0, 1.3, 1.6, 1.9000000000000001]),
        1e-15,
        0.0,
    );
    let y = run1(
        "Range",
        vec![
            Input(i64s(&[], &[10])),
            Input(i64s(&[], &[0])),
            Input(i64s(&[], &[-3])),
        ],
        Attrs::new(),
    );
    assert_eq!(y, i64s(&[4], &[10, 7, 4, 1]));
    let e = run_err(
        "Range",
        vec![
            Input(i64s(&[], &[0])),
            Input(i64s(&[], &[5])),
            Input(i64s(&[], &[0])),
        ],
        Attrs::new(),
    );
    assert!(e.contains("delta must not be 0"), "{e}");
}

#[test]
fn absurd_shape_operands_are_errors_not_aborts() {
    let e = run_err(
        "ConstantOfShape",
        vec![ints(&[1 << 20, 1 << 20])],
        Attrs::new(),
    );
    assert!(
        e.contains("larger than the reference interpreter's limit"),
        "{e}"
    );
    let e = run_err(
        "Tile",
        vec![Input(iota(&[2])), Input(i64s(&[1], &[i64::MAX]))],
        Attrs::new(),
    );
    assert!(e.contains("overflow") || e.contains("limit"), "{e}");
    let e = run_err(
        "Expand",
        vec![Input(iota(&[1])), Input(i64s(&[2], &[1 << 20, 1 << 20]))],
        Attrs::new(),
    );
    assert!(e.contains("limit"), "{e}");
    let big = |v: f64| Input(f64s(&[], &[v]));
    let e = run_err("Range", vec![big(0.0), big(1e15), big(1.0)], Attrs::new());
    assert!(e.contains("limit"), "{e}");
}

#[test]
fn center_crop_pad_crops_and_pads_around_the_centre() {
    let x = i64s(&[3, 4], &(0..12).collect::<Vec<_>>());
    // Axis 0: 3 -> 5 (one zero row before, one after); axis 1: 4 -> 1 (the second
    // column: the extra cropped element goes at the end).
    let y = run1(
        "CenterCropPad",
        vec![Symbolic(x.clone()), Const(i64s(&[2], &[5, 1]))],
        Attrs::new(),
    );
    assert_eq!(y, i64s(&[5, 1], &[0, 1, 5, 9, 0]));
    let y = run1(
        "CenterCropPad",
        vec![Input(x.clone()), Input(i64s(&[1], &[2]))],
        attrs(&[("axes", Attr::Ints(vec![-1]))]),
    );
    assert_eq!(y, i64s(&[3, 2], &[1, 2, 5, 6, 9, 10]));
    let e = run_err(
        "CenterCropPad",
        vec![Input(x), Const(i64s(&[1], &[2]))],
        Attrs::new(),
    );
    assert!(e.contains("shape has 1 values for 2 axes"), "{e}");
}
