//! Normalizations and softmaxes, against numpy on `ramp` data.
use kiln::ir::{Attr, Attrs};

use crate::ops::harness::*;

fn axis(a: i64) -> Attrs {
    attrs(&[("axis", Attr::Int(a))])
}

#[test]
fn softmax_and_log_softmax_along_any_axis() {
    let x = ramp(&[2, 3], 5, 3.0);
    let y = run1("Softmax", vec![Input(x.clone())], axis(0));
    let want = [
        0.18242552380635632,
        0.18242552380635632,
        0.7310585786300049,
        0.8175744761936437,
        0.8175744761936437,
        0.2689414213699951,
    ];
    assert_close(&y, &f64s(&[2, 3], &want), 1e-15, 1e-12);
    let y = run1("Softmax", vec![Symbolic(x.clone())], Attrs::new());
    let want = [
        0.1863237232258476,
        0.3071958857184984,
        0.506480391055654,
        0.3482074278837349,
        0.5740969929676946,
        0.0776955791485706,
    ];
    assert_close(&y, &f64s(&[2, 3], &want), 1e-15, 1e-12);
    let y = run1("LogSoftmax", vec![Input(x.clone())], axis(-1));
    let want = [
        -1.6802696706417346,
        -1.1802696706417346,
        -0.6802696706417346,
        -1.0549569196419906,
        -0.5549569196419907,
        -2.5549569196419903,
    ];
    assert_close(&y, &f64s(&[2, 3], &want), 1e-15, 1e-12);
    // Large logits do not overflow; f32 rounds once.
    let y = run1(
        "Softmax",
        vec![Input(f32s(&[2], &[1000.0, 1000.0]))],
        Attrs::new(),
    );
    assert_eq!(y, f32s(&[2], &[0.5, 0.5]));
    assert_eq!(
        run1("Softmax", vec![Input(f32s(&[0, 3], &[]))], Attrs::new()).shape(),
        &[0, 3]
    );
    let e = run_err("Softmax", vec![Input(x)], axis(2));
    assert!(e.contains("axis 2 is out of range"), "{e}");
    let e = run_err("Softmax", vec![Input(i64s(&[2], &[1, 2]))], Attrs::new());
    assert!(e.contains("float"), "{e}");
}

#[test]
fn hardmax_marks_the_first_maximum() {
    let x = f32s(&[2, 3], &[1.0, 3.0, 3.0, -1.0, -2.0, -3.0]);
    let y = run1("Hardmax", vec![Input(x)], Attrs::new());
    assert_eq!(y, f32s(&[2, 3], &[0.0, 1.0, 0.0, 1.0, 0.0, 0.0]));
}

#[test]
fn batch_normalization_inference() {
    let x = ramp(&[2, 3, 2], 5, 3.0);
    let p = |v: [f64; 3]| Input(f64s(&[3], &v));
    let y = run1(
        "BatchNormalization",
        vec![
            Input(x.clone()),
            p([1.0, 0.5, 2.0]),
            p([0.0, 1.0, -1.0]),
            p([0.5, -0.5, 0.0]),
            p([1.0, 0.25, 4.0]),
        ],
        Attrs::new(),
    );
    let want = [
        -1.9999900000749995,
        -1.4999925000562495,
        1.0,
        1.49999000029999,
        -0.5000006249988281,
        -2.4999981250035157,
        -1.4999925000562495,
        -0.9999950000374997,
        1.49999000029999,
        1.99998000059998,
        -2.4999981250035157,
        -1.9999987500023437,
    ];
    assert_close(&y, &f64s(&[2, 3, 2], &want), 1e-12, 1e-12);
    let e = run_err(
        "BatchNormalization",
        vec![
            Input(x.clone()),
            p([1.0; 3]),
            p([0.0; 3]),
            p([0.0; 3]),
            Input(f64s(&[2], &[1.0; 2])),
        ],
        Attrs::new(),
    );
    assert!(e.contains("input 4 (input_var) must be [3]"), "{e}");
    let e = run_err(
        "BatchNormalization",
        vec![Input(x), p([1.0; 3]), p([0.0; 3]), p([0.0; 3]), p([1.0; 3])],
        attrs(&[("training_mode", Attr::Int(1))]),
    );
    assert!(e.contains("training_mode"), "{e}");
}

#[test]
fn layer_normalization_over_trailing_axes_with_stats() {
    let x = ramp(&[2, 2, 3], 5, 3.0);
    let scale = ramp(&[2, 3], 4, 1.0);
    let b = f64s(&[3], &[0.5, -0.5, 0.25]);
    let out = run(
        "LayerNormalization",
        vec![Input(x), Input(scale), Input(b)],
        axis(1),
    )
    .unwrap();
    let want = [
        1.0590119632899175,
        -0.5,
        0.36180239265798353,
        1.3944191412638682,
        -1.2826167486058846,
        0.25,
        0.810083401722056,
        -0.5,
        0.6841167624108784,
        2.1124336889546913,
        0.18218348378852312,
        0.25,
    ];
    assert_close(&out[0], &f64s(&[2, 2, 3], &want), 1e-9, 1e-9);
    assert_close(
        &out[1],
        &f32s(&[2, 1, 1], &[-0.6666667, -0.5833333]),
        1e-6,
        0.0,
    );
    assert_close(
        &out[2],
        &f32s(&[2, 1, 1], &[1.3416287, 1.4884003]),
        1e-6,
        0.0,
    );
    let e = run_err(
        "LayerNormalization",
        vec![
            Input(ramp(&[2, 3], 5, 3.0)),
            Input(ramp(&[4], 5, 3.0)),
            Absent,
        ],
        Attrs::new(),
    );
    assert!(e.contains("input 1"), "{e}");
}

#[test]
fn instance_normalization_per_sample_and_channel() {
    let x = ramp(&[2, 2, 3], 5, 3.0);
    let y = run1(
        "InstanceNormalization",
        vec![
            Input(x),
            Input(f64s(&[2], &[1.0, 2.0])),
            Input(f64s(&[2], &[0.5, -1.0])),
        ],
        Attrs::new(),
    );
    let want = [
        -0.7247081306987702,
        0.5,
        1.7247081306987702,
        -0.2155408902992243,
        0.9611477742519392,
        -3.745606883952715,
        -0.7247081306987702,
        0.5,
        1.7247081306987702,
        1.7456068839527146,
        -2.9611477742519394,
        -1.7844591097007758,
    ];
    assert_close(&y, &f64s(&[2, 2, 3], &want), 1e-9, 1e-9);
    let e = run_err(
        "InstanceNormalization",
        vec![
            Input(ramp(&[2, 2], 5, 3.0)),
            Input(f64s(&[2], &[1.0; 2])),
            Input(f64s(&[2], &[0.0; 2])),
        ],
        Attrs::new(),
    );
    assert!(e.contains("[N, C, D1, ...]"), "{e}");
}

#[test]
fn lp_normalization_l1_and_l2() {
    let x = ramp(&[2, 3], 5, 3.0);
    let y = run1("LpNormalization", vec![Input(x.clone())], Attrs::new());
    let want = [
        -0.8017837257372732,
        -0.5345224838248488,
        -0.2672612419124244,
        0.0,
        0.31622776601683794,
        -0.9486832980505138,
    ];
    assert_close(&y, &f64s(&[2, 3], &want), 1e-15, 1e-12);
    let y = run1(
        "LpNormalization",
        vec![Input(x.clone())],
        attrs(&[("axis", Attr::Int(0)), ("p", Attr::Int(1))]),
    );
    let want = [
        -1.0,
        -0.6666666666666666,
        -0.25,
        0.0,
        0.3333333333333333,
        -0.75,
    ];
    assert_close(&y, &f64s(&[2, 3], &want), 1e-15, 1e-12);
    let e = run_err(
        "LpNormalization",
        vec![Input(x)],
        attrs(&[("p", Attr::Int(3))]),
    );
    assert!(e.contains("p must be 1 or 2"), "{e}");
}

#[test]
fn rms_normalization_over_trailing_axes() {
    let x = f64s(&[2, 2], &[3.0, 4.0, 1.0, -1.0]);
    let y = run1(
        "RMSNormalization",
        vec![Input(x.clone()), Input(f64s(&[2], &[1.0, 2.0]))],
        attrs(&[("epsilon", Attr::Float(0.0))]),
    );
    // rms of [3, 4] is sqrt(12.5); of [1, -1] is 1.
    let r = 12.5f64.sqrt();
    assert_close(
        &y,
        &f64s(&[2, 2], &[3.0 / r, 8.0 / r, 1.0, -2.0]),
        1e-12,
        0.0,
    );
    let y = run1(
        "RMSNormalization",
        vec![Input(x.clone()), Input(f64s(&[], &[1.0]))],
        attrs(&[("axis", Attr::Int(0)), ("epsilon", Attr::Float(0.0))]),
    );
    let all = (27.0f64 / 4.0).sqrt();
    assert_close(
        &y,
        &f64s(&[2, 2], &[3.0 / all, 4.0 / all, 1.0 / all, -1.0 / all]),
        1e-12,
        0.0,
    );
    let e = run_err(
        "RMSNormalization",
        vec![Input(x), Input(f64s(&[3], &[1.0; 3]))],
        Attrs::new(),
    );
    assert!(e.contains("scale"), "{e}");
}

#[test]
fn lrn_across_channels() {
    let x = f64s(
        &[1, 4, 2, 1],
        &(0..8).map(|i| i as f64 * 0.5).collect::<Vec<_>>(),
    );
    let a = attrs(&[("size", Attr::Int(3)), ("alpha", Attr::Float(0.1))]);
    let y = run1("LRN", vec![Input(x)], a);
    let want = [
        0.0,
        0.470867184319084,
        0.8908198951074957,
        1.238022164413067,
        1.5006569687168565,
        1.6854035904506017,
        2.29013378703247,
        2.441196178539243,
    ];
    assert_close(&y, &f64s(&[1, 4, 2, 1], &want), 1e-12, 0.0);
}
