//! Linear quantization, hand-computed from the ONNX formulas.
use kiln::ir::{Attr, Attrs};
use kiln::Tensor;

use crate::harness::*;

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
