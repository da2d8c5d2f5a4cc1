//! DFT, STFT and MelWeightMatrix against the ONNX reference (onnx 1.23.2, numpy's FFT).
use kiln::ir::Attr;

use crate::ops::harness::*;

fn signal(n: usize, k: usize, off: f64, parts: usize) -> kiln::Tensor {
    f64s(
        &[1, n / parts, parts],
        &(0..n)
            .map(|i| ((i % k) as f64 - off) * 0.5)
            .collect::<Vec<_>>(),
    )
}

fn flags(inverse: i64, onesided: i64) -> kiln::ir::Attrs {
    attrs(&[
        ("inverse", Attr::Int(inverse)),
        ("onesided", Attr::Int(onesided)),
    ])
}

#[test]
fn dft_forward_inverse_and_real_inverse() {
    let y = run1("DFT", vec![Symbolic(signal(5, 7, 3.0, 1))], flags(0, 1));
    let want = [
        -2.5,
        0.0,
        -1.25,
        1.7204774005889667,
        -1.25,
        0.40614962029113294,
    ];
    assert_close(&y, &f64s(&[1, 3, 2], &want), 1e-12, 1e-12);
    // Inverse, zero-padded to 6, axis given as an input.
    let y = run1(
        "DFT",
        vec![
            Input(signal(8, 5, 2.0, 2)),
            Const(i64s(&[], &[6])),
            Const(i64s(&[], &[-2])),
        ],
        flags(1, 0),
    );
    let want = [
        -0.08333333333333333,
        -0.16666666666666666,
        -0.09449788301796344,
        0.1860042339640731,
        -0.549839684279443,
        -0.1860042339640731,
        0.08333333333333331,
        -0.33333333333333326,
        -0.11682698238722367,
        0.10267090063073976,
        -0.23883545031536985,
        -0.10267090063073976,
    ];
    assert_close(&y, &f64s(&[1, 6, 2], &want), 1e-12, 1e-12);
    let y = run1("DFT", vec![Input(signal(8, 5, 2.0, 2))], flags(1, 1));
    let want = [
        0.08333333333333333,
        -0.10566243270259357,
        -0.8496793685588859,
        0.25,
        0.01634603522555267,
        -0.3943375672974064,
    ];
    assert_close(&y, &f64s(&[1, 6, 1], &want), 1e-12, 1e-12);
    let e = run_err(
        "DFT",
        vec![Input(signal(5, 7, 3.0, 1)), Absent, Const(i64s(&[], &[2]))],
        flags(0, 0),
    );
    assert!(e.contains("cannot be the last axis"), "{e}");
}

#[test]
fn stft_with_a_window() {
    let y = run1(
        "STFT",
        vec![
            Input(signal(10, 7, 3.0, 1)),
            Const(i64s(&[], &[3])),
            Input(f64s(&[4], &[0.5, 1.0, 1.0, 0.5])),
        ],
        kiln::ir::Attrs::new(),
    );
    let want = [
        -2.25, 0.0, -0.25, 1.0, -0.25, 0.0, 2.25, 0.0, -1.0, 0.25, -0.25, 0.0, -2.0, 0.0, 1.75,
        1.25, 1.5, 0.0,
    ];
    assert_close(&y, &f64s(&[1, 3, 3, 2], &want), 1e-12, 1e-12);
    let e = run_err(
        "STFT",
        vec![Input(signal(10, 7, 3.0, 1)), Const(i64s(&[], &[0]))],
        kiln::ir::Attrs::new(),
    );
    assert!(e.contains("do not fit"), "{e}");
}

#[test]
fn mel_weight_matrix_filters() {
    let y = run1(
        "MelWeightMatrix",
        vec![
            Const(i64s(&[], &[3])),
            Const(i64s(&[], &[16])),
            Const(i64s(&[], &[8000])),
            Const(f32s(&[], &[100.0])),
            Const(f32s(&[], &[3000.0])),
        ],
        kiln::ir::Attrs::new(),
    );
    let mut want = vec![0.0f32; 27];
    for (i, v) in [(0, 1.0), (4, 1.0), (8, 1.0), (11, 0.5)] {
        want[i] = v;
    }
    assert_eq!(y, f32s(&[9, 3], &want));
}
