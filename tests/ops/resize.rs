//! Resize against the ONNX reference (`onnx.reference.ops.op_resize`, onnx 1.23.2) on
//! `ramp` data.
use kiln::ir::{Attr, Attrs};
use kiln::Tensor;

use crate::ops::harness::*;

fn x() -> Tensor {
    ramp(&[1, 1, 3, 4], 7, 3.0)
}

fn s(v: &str) -> Attr {
    Attr::String(v.into())
}

#[test]
fn resize_cubic_align_corners_to_sizes() {
    let y = run1(
        "Resize",
        vec![Input(x()), Absent, Absent, Const(i64s(&[4], &[1, 1, 2, 5]))],
        attrs(&[
            ("mode", s("cubic")),
            ("coordinate_transformation_mode", s("align_corners")),
        ]),
    );
    let want = [
        -1.5,
        -1.166015625,
        -0.75,
        -0.333984375,
        0.0,
        -1.0,
        -0.666015625,
        -0.25,
        0.166015625,
        0.5,
    ];
    assert_close(&y, &f64s(&[1, 1, 2, 5], &want), 1e-12, 1e-12);
}

#[test]
fn resize_antialiased_linear_on_axes() {
    let y = run1(
        "Resize",
        vec![Input(x()), Absent, Const(f64s(&[2], &[0.6, 0.5]))],
        attrs(&[
            ("mode", s("linear")),
            ("antialias", Attr::Int(1)),
            ("axes", Attr::Ints(vec![2, 3])),
        ]),
    );
    assert_close(
        &y,
        &f64s(&[1, 1, 1, 2], &[-0.43750000000000006, -0.21875]),
        1e-12,
        1e-12,
    );
}

#[test]
fn resize_tf_crop_and_resize_extrapolates() {
    let a = attrs(&[
        ("mode", s("linear")),
        ("coordinate_transformation_mode", s("tf_crop_and_resize")),
        ("extrapolation_value", Attr::Float(7.0)),
        ("axes", Attr::Ints(vec![3])),
    ]);
    let y = run1(
        "Resize",
        vec![
            Symbolic(x()),
            Input(f64s(&[2], &[-0.5, 0.9])),
            Absent,
            Input(i64s(&[1], &[3])),
        ],
        a,
    );
    let want = [
        7.0,
        -1.2000000000000002,
        -0.15000000000000036,
        7.0,
        0.7999999999999998,
        -0.5999999999999979,
        7.0,
        -0.7000000000000002,
        0.34999999999999964,
    ];
    assert_close(&y, &f64s(&[1, 1, 3, 3], &want), 1e-12, 1e-12);
}

#[test]
fn resize_integers_round_and_policies_fit_the_box() {
    let u = Tensor::from_vec(&[1, 1, 2, 2], vec![10u8, 20, 30, 41]).unwrap();
    let y = run1(
        "Resize",
        vec![Input(u), Absent, Const(f32s(&[4], &[1.0, 1.0, 1.5, 1.5]))],
        attrs(&[("mode", s("linear"))]),
    );
    let want = Tensor::from_vec(&[1, 1, 3, 3], vec![10u8, 15, 20, 20, 25, 30, 30, 36, 41]);
    assert_eq!(y, want.unwrap());
    let y = run1(
        "Resize",
        vec![Input(x()), Absent, Absent, Const(i64s(&[2], &[6, 6]))],
        attrs(&[
            ("axes", Attr::Ints(vec![2, 3])),
            ("keep_aspect_ratio_policy", s("not_larger")),
        ]),
    );
    assert_eq!(y.shape(), &[1, 1, 5, 6]);
}

#[test]
fn resize_errors() {
    let e = run_err(
        "Resize",
        vec![
            Input(x()),
            Absent,
            Const(f32s(&[4], &[1.0; 4])),
            Const(i64s(&[4], &[1; 4])),
        ],
        Attrs::new(),
    );
    assert!(e.contains("give scales or sizes, not both"), "{e}");
    let e = run_err(
        "Resize",
        vec![Input(x()), Absent, Const(f32s(&[4], &[1.0; 4]))],
        attrs(&[("antialias", Attr::Int(1))]),
    );
    assert!(e.contains("antialias applies to linear and cubic"), "{e}");
    let e = run_err(
        "Resize",
        vec![Input(x()), Absent, Const(f32s(&[3], &[1.0; 3]))],
        Attrs::new(),
    );
    assert!(e.contains("scales has 3 values for 4 axes"), "{e}");
}

#[test]
fn grid_sample_modes_and_paddings() {
    // The reference denormalizes in f32, hence the 1e-6 tolerance.
    let grid = || {
        Input(f64s(
            &[1, 2, 2, 2],
            &[-1.2, -0.3, 0.25, 0.9, 1.3, 1.1, 0.0, -0.7],
        ))
    };
    let x = || Input(ramp(&[1, 1, 3, 4], 7, 3.0));
    let cases: [(&str, &str, i64, [f64; 4]); 3] = [
        (
            "cubic",
            "reflection",
            0,
            [
                -0.26823420344011417,
                -0.2559370994567871,
                0.7546556516815404,
                -0.8329402059316635,
            ],
        ),
        ("nearest", "border", 0, [0.5, 0.0, 0.5, -0.5]),
        (
            "linear",
            "zeros",
            1,
            [
                -0.07000001549720736,
                0.08750003576278687,
                0.2475000047683693,
                -0.1499999761581421,
            ],
        ),
    ];
    for (mode, padding, align, want) in cases {
        let y = run1(
            "GridSample",
            vec![x(), grid()],
            attrs(&[
                ("mode", s(mode)),
                ("padding_mode", s(padding)),
                ("align_corners", Attr::Int(align)),
            ]),
        );
        assert_close(&y, &f64s(&[1, 1, 2, 2], &want), 1e-6, 0.0);
    }
    let e = run_err(
        "GridSample",
        vec![x(), Input(f64s(&[1, 2, 2, 3], &[0.0; 12]))],
        Attrs::new(),
    );
    assert!(e.contains("3 coordinates for 2 spatial axes"), "{e}");
}

#[test]
fn affine_grid_maps_each_pixel() {
    // The reference returns f32; hence the 1e-6 tolerance.
    let theta = || Input(f64s(&[1, 2, 3], &[1.0, 0.5, 0.1, -0.2, 1.0, 0.3]));
    let size = || Const(i64s(&[4], &[1, 1, 2, 3]));
    let y = run1("AffineGrid", vec![theta(), size()], Attrs::new());
    let want = [
        -0.8166666626930237,
        -0.06666667014360428,
        -0.15000000596046448,
        -0.20000000298023224,
        0.5166666507720947,
        -0.3333333432674408,
        -0.3166666626930237,
        0.9333333373069763,
        0.3499999940395355,
        0.800000011920929,
        1.0166666507720947,
        0.6666666865348816,
    ];
    assert_close(&y, &f64s(&[1, 2, 3, 2], &want), 1e-6, 0.0);
    let y = run1(
        "AffineGrid",
        vec![theta(), size()],
        attrs(&[("align_corners", Attr::Int(1))]),
    );
    let want = [
        -1.4, -0.5, -0.4, -0.7, 0.6, -0.9, -0.4, 1.5, 0.6, 1.3, 1.6, 1.1,
    ];
    assert_close(&y, &f64s(&[1, 2, 3, 2], &want), 1e-6, 0.0);
    let e = run_err(
        "AffineGrid",
        vec![theta(), Const(i64s(&[5], &[1, 1, 2, 3, 4]))],
        Attrs::new(),
    );
    assert!(e.contains("does not fit size"), "{e}");
}
