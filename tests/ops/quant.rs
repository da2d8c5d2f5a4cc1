//! Linear quantization, hand-computed from the ONNX formulas.
use kiln::ir::{Attr, Attrs, DType};
use kiln::Tensor;

use crate::ops::harness::*;

fn u8s(shape: &[usize], v: &[u8]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

fn i8s(shape: &[usize], v: &[i8]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

#[test]
fn quantize_rounds_half_to_even_and_saturates() {
    let x = f32s(&[6], &[0.0, 2.0, 3.0, 1000.0, -254.0, 5.0]);
    let y = run1(
        "QuantizeLinear",
        vec![
            Input(x.clone()),
            Input(f32s(&[], &[2.0])),
            Input(u8s(&[], &[128])),
        ],
        Attrs::new(),
    );
    // 3 / 2 = 1.5 rounds to 2; 5 / 2 = 2.5 rounds to 2.
    assert_eq!(y, u8s(&[6], &[128, 129, 130, 255, 1, 130]));
    let y = run1(
        "QuantizeLinear",
        vec![Input(x), Input(f32s(&[], &[2.0])), Input(i8s(&[], &[0]))],
        Attrs::new(),
    );
    assert_eq!(y, i8s(&[6], &[0, 1, 2, 127, -127, 2]));
    // Without a zero point the output is u8.
    let y = run1(
        "QuantizeLinear",
        vec![Input(f32s(&[2], &[1.0, -1.0])), Input(f32s(&[], &[1.0]))],
        Attrs::new(),
    );
    assert_eq!(y, u8s(&[2], &[1, 0]));
}

#[test]
fn dequantize_per_tensor_per_axis_and_blocked() {
    let x = u8s(&[2, 2], &[10, 20, 30, 40]);
    let y = run1(
        "DequantizeLinear",
        vec![
            Input(x.clone()),
            Input(f32s(&[], &[0.5])),
            Input(u8s(&[], &[10])),
        ],
        Attrs::new(),
    );
    assert_eq!(y, f32s(&[2, 2], &[0.0, 5.0, 10.0, 15.0]));
    let axis0 = attrs(&[("axis", Attr::Int(0))]);
    let y = run1(
        "DequantizeLinear",
        vec![Input(x.clone()), Input(f32s(&[2], &[1.0, 2.0])), Absent],
        axis0,
    );
    assert_eq!(y, f32s(&[2, 2], &[10.0, 20.0, 60.0, 80.0]));
    let blocked = attrs(&[("axis", Attr::Int(1)), ("block_size", Attr::Int(2))]);
    let y = run1(
        "DequantizeLinear",
        vec![Input(x.clone()), Input(f32s(&[2, 1], &[1.0, 0.1])), Absent],
        blocked,
    );
    assert_close(&y, &f32s(&[2, 2], &[10.0, 20.0, 3.0, 4.0]), 1e-6, 0.0);
    let e = run_err(
        "DequantizeLinear",
        vec![Input(x), Input(f32s(&[3, 3], &[1.0; 9])), Absent],
        Attrs::new(),
    );
    assert!(e.contains("scale"), "{e}");
}

#[test]
fn dynamic_quantize_from_the_data_range() {
    let out = run(
        "DynamicQuantizeLinear",
        vec![Input(f32s(&[3], &[0.0, 2.0, -3.0]))],
        Attrs::new(),
    )
    .unwrap();
    let scale = (5.0f32 / 255.0) as f64;
    assert_close(&out[1], &f32s(&[], &[scale as f32]), 1e-9, 0.0);
    let zp = (3.0 / scale).round();
    assert_eq!(out[2], u8s(&[], &[zp as u8]));
    assert_eq!(
        out[0],
        u8s(&[3], &[zp as u8, ((2.0 / scale).round() + zp) as u8, 0])
    );
}

/// Cases where the f32 arithmetic ONNX and onnxruntime use gives other u8 results than
/// f64 would: `x`, then onnxruntime 1.23's y, the scale's bits and the zero point.
#[test]
fn dynamic_quantize_computes_in_f32_as_onnxruntime() {
    let cases: [(&[f32], &[u8], u32, u8); 4] = [
        // range / 255 rounds the range to f32 first: in f64 the scale is one ulp
        // larger and 0.12892048 quantizes to 81.
        (
            &[1.0045587, -0.28464618, 0.12892048],
            &[255, 0, 82],
            0x3ba5aa54,
            56,
        ),
        // -min / scale is 172.5 in f32 (a tie, to even), just above it in f64.
        (&[0.6614936, -1.383123], &[254, 0], 0x3c035e5e, 172),
        // An empty range has scale 1.
        (&[0.0, 0.0, 0.0], &[0, 0, 0], 0x3f800000, 0),
        // NaN is left out of the range and quantizes to 0.
        (
            &[1.0, -1.0, 0.5, f32::NAN],
            &[254, 0, 191, 0],
            0x3c008081,
            127,
        ),
    ];
    for (x, y, scale, zero_point) in cases {
        let (g, inputs) = build(
            "DynamicQuantizeLinear",
            vec![Input(f32s(&[x.len()], x))],
            Attrs::new(),
        )
        .unwrap();
        let out = run_both(&g, &inputs);
        assert_eq!(out[0], u8s(&[y.len()], y), "y for {x:?}");
        assert_eq!(
            out[1],
            f32s(&[], &[f32::from_bits(scale)]),
            "scale for {x:?}"
        );
        assert_eq!(out[2], u8s(&[], &[zero_point]), "zero point for {x:?}");
    }
}

/// Runs a built graph on the interpreter and the CPU backend; both must agree.
fn run_both(g: &kiln::Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    use kiln::backend::{backend_for, Device};
    let interp = backend_for(Device::Interp)
        .and_then(|b| b.compile(g))
        .and_then(|e| e.run(inputs))
        .unwrap();
    let cpu = backend_for(Device::Cpu)
        .and_then(|b| b.compile(g))
        .and_then(|e| e.run(inputs))
        .unwrap();
    for (c, i) in cpu.iter().zip(&interp) {
        assert_close(c, i, 0.0, 0.0);
    }
    interp
}

fn f8e4m3fn(shape: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_f64s(DType::F8E4M3FN, shape, v).unwrap()
}

#[test]
fn float8_casts_saturate_or_overflow_through_data_movement() {
    use kiln::ir::{Shape, TensorType};
    let x = f32s(
        &[2, 3],
        &[1.0625, -1000.0, 465.0, 0.001, f32::INFINITY, -0.0],
    );
    for (saturate, big, inf) in [(1, 448.0, 448.0), (0, f64::NAN, f64::NAN)] {
        let mut g = kiln::Graph::new("f8");
        let p = g
            .add_parameter("x", TensorType::new(DType::F32, Shape::fixed(&[2, 3])))
            .unwrap();
        let cast_attrs = attrs(&[
            ("to", Attr::String("f8e4m3fn".into())),
            ("saturate", Attr::Int(saturate)),
        ]);
        let c = g
            .add_op("Cast", &[Some(p.into())], cast_attrs, "c")
            .unwrap();
        let t = g
            .add_op("Transpose", &[Some(c.out(0))], Attrs::new(), "t")
            .unwrap();
        let back = attrs(&[("to", Attr::String("f32".into()))]);
        let y = g.add_op("Cast", &[Some(t.out(0))], back, "y").unwrap();
        g.add_output("f8", t.out(0)).unwrap();
        g.add_output("y", y.out(0)).unwrap();
        let out = run_both(&g, std::slice::from_ref(&x));
        assert_eq!(out[0].dtype(), DType::F8E4M3FN);
        // Ties go to even (1.0625 → 1), 465 overflows, 0.001 rounds to the smallest
        // subnormal; transposed.
        let want = [1.0, 2f64.powi(-9), -big, inf, big, -0.0];
        let got = out[1].to_f64_vec();
        for (g, w) in got.iter().zip(want) {
            assert!(g == &w || (g.is_nan() && w.is_nan()), "{got:?} vs {want:?}");
        }
    }
}

#[test]
fn int4_quantize_and_blocked_dequantize() {
    let i4 = |v: &[i64]| Tensor::from_i64s(DType::I4, &[2, 4], v).unwrap();
    let x = f32s(&[2, 4], &[0.0, 5.0, -40.0, 40.0, 3.0, -3.0, 1.0, 100.0]);
    let q = run1(
        "QuantizeLinear",
        vec![
            Input(x),
            Input(f32s(&[2, 2], &[2.0, 4.0, 1.0, 1.0])),
            Input(Tensor::from_i64s(DType::I4, &[2, 2], &[0, 1, 0, -1]).unwrap()),
        ],
        attrs(&[("axis", Attr::Int(1)), ("block_size", Attr::Int(2))]),
    );
    // 5 / 2 = 2.5 rounds to 2; -40/4 + 1 saturates at -8; 40/4 + 1 at 7.
    assert_eq!(q, i4(&[0, 2, -8, 7, 3, -3, 0, 7]));
    let (g, inputs) = build(
        "DequantizeLinear",
        vec![
            Input(q),
            Input(f32s(&[2, 2], &[2.0, 4.0, 1.0, 1.0])),
            Input(Tensor::from_i64s(DType::I4, &[2, 2], &[0, 1, 0, -1]).unwrap()),
        ],
        attrs(&[("axis", Attr::Int(1)), ("block_size", Attr::Int(2))]),
    )
    .unwrap();
    let y = run_both(&g, &inputs);
    assert_eq!(
        y[0],
        f32s(&[2, 4], &[0.0, 4.0, -36.0, 24.0, 3.0, -3.0, 1.0, 8.0])
    );
}

#[test]
fn float8_quantize_ignores_the_zero_point_and_dequantize_reads_it_as_zero() {
    let x = f32s(&[3], &[3.0, 1000.0, -0.3]);
    let scale = Input(f32s(&[], &[2.0]));
    let zp = || Input(f8e4m3fn(&[], &[0.0]));
    let q = run1(
        "QuantizeLinear",
        vec![Input(x.clone()), scale, zp()],
        Attrs::new(),
    );
    assert_eq!(q, f8e4m3fn(&[3], &[1.5, 448.0, -0.15]));
    let q = run1(
        "QuantizeLinear",
        vec![Input(x), Input(f32s(&[], &[2.0])), zp()],
        attrs(&[("saturate", Attr::Int(0))]),
    );
    assert!(q.to_f64_vec()[1].is_nan());
    let y = run1(
        "DequantizeLinear",
        vec![
            Input(f8e4m3fn(&[2], &[1.5, -448.0])),
            Input(f32s(&[], &[2.0])),
            zp(),
        ],
        Attrs::new(),
    );
    assert_eq!(y, f32s(&[2], &[3.0, -896.0]));
    let e = run_err(
        "QuantizeLinear",
        vec![Input(f32s(&[1], &[1.0])), Input(f32s(&[], &[1.0]))],
        attrs(&[("output_dtype", Attr::String("f8e8m0".into()))]),
    );
    assert!(e.contains("cannot quantize to f8e8m0"), "{e}");
}

#[test]
fn low_bit_inputs_are_refused_by_arithmetic_and_bad_round_modes_by_cast() {
    let e = run_err(
        "Add",
        vec![Input(f8e4m3fn(&[1], &[1.0])), Input(f8e4m3fn(&[1], &[1.0]))],
        Attrs::new(),
    );
    assert!(e.contains("Add does not take f8e4m3fn"), "{e}");
    let e = run_err(
        "Cast",
        vec![Input(f32s(&[1], &[1.0]))],
        attrs(&[
            ("to", Attr::String("f8e8m0".into())),
            ("round_mode", Attr::String("sideways".into())),
        ]),
    );
    assert!(e.contains("round_mode 'sideways'"), "{e}");
    let y = run1(
        "Cast",
        vec![Input(f32s(&[3], &[1.5, 0.2, -3.0]))],
        attrs(&[
            ("to", Attr::String("f8e8m0".into())),
            ("round_mode", Attr::String("down".into())),
        ]),
    );
    assert_eq!(y.to_f64_vec(), vec![1.0, 0.125, 2.0]);
}

#[test]
fn matmul_integer_subtracts_zero_points_per_tensor_and_per_row() {
    // The ONNX documentation's example: A minus 12 times B.
    let a = u8s(&[4, 3], &[11, 7, 3, 10, 6, 2, 9, 5, 1, 8, 4, 0]);
    let b = u8s(&[3, 2], &[1, 4, 2, 5, 3, 6]);
    let y = run1(
        "MatMulInteger",
        vec![
            Input(a.clone()),
            Input(b.clone()),
            Input(u8s(&[], &[12])),
            Input(u8s(&[], &[0])),
        ],
        Attrs::new(),
    );
    let want = [-38, -83, -44, -98, -50, -113, -56, -128];
    assert_eq!(y, i32s(&[4, 2], &want));
    // Per row of A (the same 12 four times) and per column of B (0 and 1).
    let y = run1(
        "MatMulInteger",
        vec![
            Input(a),
            Input(b),
            Input(u8s(&[4], &[12; 4])),
            Input(u8s(&[2], &[0, 1])),
        ],
        Attrs::new(),
    );
    // Column 1 loses 1 from each of B's entries: minus the row sums of A - 12.
    let row_sums = [-15, -18, -21, -24];
    let want: Vec<i32> = (0..8)
        .map(|i| want[i] - if i % 2 == 1 { row_sums[i / 2] } else { 0 })
        .collect();
    assert_eq!(y, i32s(&[4, 2], &want));
    let e = run_err(
        "MatMulInteger",
        vec![Input(f32s(&[1, 1], &[1.0])), Input(u8s(&[1, 1], &[1]))],
        Attrs::new(),
    );
    assert!(e.contains("A must be i8 or u8"), "{e}");
}

#[test]
fn conv_integer_pads_with_the_zero_point() {
    // The ONNX documentation's example: x = 2..=10 minus 1, a 2×2 window of ones.
    let x = u8s(&[1, 1, 3, 3], &[2, 3, 4, 5, 6, 7, 8, 9, 10]);
    let w = u8s(&[1, 1, 2, 2], &[1, 1, 1, 1]);
    let y = run1(
        "ConvInteger",
        vec![Input(x.clone()), Input(w.clone()), Input(u8s(&[], &[1]))],
        Attrs::new(),
    );
    assert_eq!(y, i32s(&[1, 1, 2, 2], &[12, 16, 24, 28]));
    let y = run1(
        "ConvInteger",
        vec![Input(x), Input(w), Input(u8s(&[], &[1]))],
        attrs(&[("pads", Attr::Ints(vec![1, 1, 1, 1]))]),
    );
    let want = [1, 3, 5, 3, 5, 12, 16, 9, 11, 24, 28, 15, 7, 15, 17, 9];
    assert_eq!(y, i32s(&[1, 1, 4, 4], &want));
    // A per-output-channel weight zero point of i8 weights.
    let y = run1(
        "ConvInteger",
        vec![
            Input(u8s(&[1, 1, 1, 2], &[3, 5])),
            Input(i8s(&[2, 1, 1, 1], &[-2, 4])),
            Absent,
            Input(i8s(&[2], &[-1, 2])),
        ],
        Attrs::new(),
    );
    assert_eq!(y, i32s(&[1, 2, 1, 2], &[-3, -5, 6, 10]));
}
