//! Conv and ConvTranspose against a naive numpy reference (nested loops over
//! `itertools.product`, the ONNX formulas written out) on `ramp` data.
use kiln::ir::{Attr, Attrs};

use crate::ops::harness::*;

fn ints(name: &str, v: &[i64]) -> (String, Attr) {
    (name.into(), Attr::Ints(v.to_vec()))
}

fn at(pairs: Vec<(String, Attr)>) -> Attrs {
    let mut a = Attrs::new();
    for (k, v) in pairs {
        a.set(&k, v);
    }
    a
}

#[test]
fn conv_2d_padded_with_bias() {
    let x = ramp(&[1, 2, 4, 4], 7, 3.0);
    let w = ramp(&[3, 2, 3, 3], 5, 3.0);
    let b = f64s(&[3], &[0.5, -1.0, 2.0]);
    let y = run1(
        "Conv",
        vec![Input(x.clone()), Input(w.clone()), Input(b.clone())],
        at(vec![ints("pads", &[1, 1, 1, 1])]),
    );
    let want = [
        0.25, 0.0, 2.5, 1.5, 1.5, 0.5, 2.25, -3.5, 0.75, 4.0, 0.5, 2.5, -1.0, 4.25, -0.5, -2.0,
        1.5, -0.5, -0.75, 0.5, 0.0, -2.5, -1.5, 0.0, -5.0, -3.75, 4.25, -3.75, 1.0, 1.0, 0.0, 1.5,
        4.75, 2.25, 1.75, 2.75, 4.25, 2.75, 1.75, 1.75, 3.75, 0.5, 1.25, 4.5, 0.0, 2.25, 3.75,
        -0.5,
    ];
    assert_close(&y, &f64s(&[1, 3, 4, 4], &want), 1e-12, 0.0);
    // SAME_UPPER with stride 1 is the same padding; a symbolic batch resolves at run time.
    let same = attrs(&[("auto_pad", Attr::String("SAME_UPPER".into()))]);
    let y2 = run1("Conv", vec![Symbolic(x), Input(w), Input(b)], same);
    assert_close(&y2, &y, 1e-12, 0.0);
}

#[test]
fn conv_groups_strides_dilations() {
    let x = ramp(&[2, 4, 5, 5], 11, 5.0);
    let w = ramp(&[4, 2, 2, 2], 3, 1.0);
    let a = at(vec![
        ints("strides", &[2, 2]),
        ints("dilations", &[2, 2]),
        ("group".into(), Attr::Int(2)),
    ]);
    let y = run1("Conv", vec![Input(x), Input(w), Absent], a);
    let want = [
        4.25, 1.0, 1.75, 1.25, -1.5, -1.5, 1.25, -1.5, 4.25, -0.75, 1.25, 1.75, -2.75, -3.25, 0.25,
        -3.0, 1.25, 0.75, 4.25, 1.0, -1.5, -1.5, -1.5, -1.5, 1.75, -3.25, 4.25, -0.75, -3.0, -0.75,
        -2.75, -3.25,
    ];
    assert_close(&y, &f64s(&[2, 4, 2, 2], &want), 1e-12, 0.0);
}

#[test]
fn conv_1d_auto_padding_and_3d() {
    let w = f64s(&[1, 1, 3], &[1.0, 2.0, -1.0]);
    let upper = at(vec![
        ("auto_pad".into(), Attr::String("SAME_UPPER".into())),
        ints("strides", &[2]),
    ]);
    let y = run1(
        "Conv",
        vec![Input(ramp(&[1, 1, 5], 7, 3.0)), Input(w.clone()), Absent],
        upper,
    );
    assert_close(&y, &f64s(&[1, 1, 3], &[-2.0, -2.0, 1.0]), 1e-12, 0.0);
    let lower = at(vec![
        ("auto_pad".into(), Attr::String("SAME_LOWER".into())),
        ints("strides", &[2]),
    ]);
    let y = run1(
        "Conv",
        vec![Input(ramp(&[1, 1, 6], 7, 3.0)), Input(w.clone()), Absent],
        lower,
    );
    assert_close(&y, &f64s(&[1, 1, 3], &[-2.0, -2.0, 0.0]), 1e-12, 0.0);
    let valid = attrs(&[("auto_pad", Attr::String("VALID".into()))]);
    assert_eq!(
        run1(
            "Conv",
            vec![Input(ramp(&[1, 1, 5], 7, 3.0)), Input(w), Absent],
            valid
        )
        .shape(),
        &[1, 1, 3]
    );
    let y = run1(
        "Conv",
        vec![
            Input(ramp(&[1, 1, 3, 3, 3], 7, 3.0)),
            Input(ramp(&[2, 1, 2, 2, 2], 5, 3.0)),
            Absent,
        ],
        Attrs::new(),
    );
    let want = [
        1.25, 0.25, -1.75, 2.5, 1.0, -1.75, -2.0, -1.25, -2.5, 1.0, -0.75, 2.75, -2.5, -0.75, 2.75,
        -0.75,
    ];
    assert_close(&y, &f64s(&[1, 2, 2, 2, 2], &want), 1e-12, 0.0);
    // An empty batch gives an empty result.
    let y = run1(
        "Conv",
        vec![
            Input(f32s(&[0, 1, 4], &[])),
            Input(f32s(&[1, 1, 2], &[1.0, 1.0])),
            Absent,
        ],
        Attrs::new(),
    );
    assert_eq!(y.shape(), &[0, 1, 3]);
}

#[test]
fn conv_errors_name_the_problem() {
    let x = ramp(&[1, 2, 4, 4], 7, 3.0);
    let e = run_err(
        "Conv",
        vec![Input(x.clone()), Input(ramp(&[3, 3, 3, 3], 5, 3.0)), Absent],
        Attrs::new(),
    );
    assert!(e.contains("X has 2 channels, W expects 3 x group 1"), "{e}");
    let w = ramp(&[3, 2, 3, 3], 5, 3.0);
    let e = run_err(
        "Conv",
        vec![Input(x.clone()), Input(w.clone()), Absent],
        at(vec![ints("kernel_shape", &[2, 2])]),
    );
    assert!(e.contains("kernel_shape [2, 2] does not match"), "{e}");
    let e = run_err(
        "Conv",
        vec![Input(x.clone()), Input(w.clone()), Absent],
        at(vec![ints("pads", &[1, 1])]),
    );
    assert!(e.contains("pads has 2 values, 4 needed"), "{e}");
    let e = run_err(
        "Conv",
        vec![Input(x.clone()), Input(w.clone()), Absent],
        at(vec![ints("strides", &[0, 1])]),
    );
    assert!(e.contains("strides must be >= 1"), "{e}");
    let e = run_err(
        "Conv",
        vec![
            Input(x.clone()),
            Input(w.clone()),
            Input(f64s(&[2], &[0.0; 2])),
        ],
        Attrs::new(),
    );
    assert!(e.contains("B must be [3]"), "{e}");
    let e = run_err(
        "Conv",
        vec![Input(ramp(&[1, 2, 2, 2], 7, 3.0)), Input(w), Absent],
        Attrs::new(),
    );
    assert!(e.contains("larger than the padded input"), "{e}");
}

#[test]
fn conv_transpose_strided_padded_with_output_padding() {
    let x = ramp(&[1, 2, 3, 3], 7, 3.0);
    let w = ramp(&[2, 3, 3, 3], 5, 3.0);
    let a = at(vec![
        ints("strides", &[2, 2]),
        ints("pads", &[1, 1, 1, 1]),
        ints("output_padding", &[1, 1]),
    ]);
    let y = run1("ConvTranspose", vec![Input(x), Input(w), Absent], a);
    let want = [
        -0.25, 2.5, -0.5, 0.75, -0.75, 0.5, 0.5, 0.75, 0.0, 0.25, -0.5, -2.0, -1.0, -2.75, -1.25,
        0.75, 2.0, -0.75, -1.0, -0.75, 2.0, -1.25, -0.25, 2.75, 1.75, -1.0, -0.25, 2.5, -0.5, 1.5,
        -1.25, 3.0, 0.5, 1.75, 0.5, 0.0, 0.75, 0.25, 0.0, 0.0, -0.75, -0.75, 1.0, 0.75, -0.5, 2.5,
        -0.25, -0.5, -1.5, -0.5, -2.25, -2.5, 2.25, 2.0, -1.75, -2.75, 2.0, 0.75, 0.5, -0.25, 1.5,
        2.25, 0.75, 0.25, 0.0, -0.5, -1.5, 1.25, 1.5, 2.0, 1.0, 0.5, 0.5, 1.75, 0.5, 0.5, 0.5,
        -0.75, 1.5, -1.75, 0.25, 1.0, 2.5, -0.25, 0.5, -2.0, 0.5, -3.25, -1.25, 2.25, 1.25, -2.25,
        -1.75, 4.0, -1.25, 0.5, -1.25, 3.0, 0.5, 1.75, 0.5, 0.0, -1.75, -1.75, 2.5, 1.0, 1.5, 1.0,
    ];
    assert_close(&y, &f64s(&[1, 3, 6, 6], &want), 1e-12, 0.0);
}

#[test]
fn conv_transpose_groups_bias_and_output_shape() {
    let y = run1(
        "ConvTranspose",
        vec![
            Input(ramp(&[1, 2, 3], 7, 3.0)),
            Input(ramp(&[2, 2, 2], 5, 3.0)),
            Input(f64s(&[4], &[1.0, -1.0, 0.5, 0.0])),
        ],
        attrs(&[("group", Attr::Int(2))]),
    );
    let want = [
        3.25, 4.0, 2.75, 1.5, -0.25, -0.5, -0.75, -1.0, 0.5, 0.75, 0.25, -1.0, 0.0, -0.5, -1.25,
        -0.5,
    ];
    assert_close(&y, &f64s(&[1, 4, 4], &want), 1e-12, 0.0);
    // output_shape 6 of a full 7: one pad, at the start (NOTSET puts the odd one first).
    let x = ramp(&[1, 1, 3], 7, 3.0);
    let w = f64s(&[1, 1, 3], &[1.0, 2.0, 3.0]);
    let y = run1(
        "ConvTranspose",
        vec![Input(x.clone()), Input(w.clone()), Absent],
        at(vec![ints("strides", &[2]), ints("output_shape", &[6])]),
    );
    assert_close(
        &y,
        &f64s(&[1, 1, 6], &[-3.0, -5.5, -2.0, -3.5, -1.0, -1.5]),
        1e-12,
        0.0,
    );
    let e = run_err(
        "ConvTranspose",
        vec![Input(x), Input(w), Absent],
        at(vec![ints("strides", &[2]), ints("output_shape", &[9])]),
    );
    assert!(e.contains("larger than the full output"), "{e}");
}
