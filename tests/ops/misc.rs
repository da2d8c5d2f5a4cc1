//! Cast and CastLike.
use kiln::ir::{Attr, Attrs};

use crate::ops::harness::*;

fn to(d: &str) -> Attrs {
    attrs(&[("to", Attr::String(d.into()))])
}

#[test]
fn cast_truncates_saturates_and_wraps() {
    let x = f32s(&[5], &[1.7, -1.7, f32::NAN, 300.0, -300.0]);
    assert_eq!(
        run1("Cast", vec![Input(x.clone())], to("i8")),
        kiln::Tensor::from_vec(&[5], vec![1i8, -1, 0, 127, -128]).unwrap()
    );
    assert_eq!(
        run1("Cast", vec![Input(x)], to("bool")),
        bools(&[5], &[true, true, true, true, true])
    );
    assert_eq!(
        run1("Cast", vec![Input(i64s(&[2], &[0, 2]))], to("bool")),
        bools(&[2], &[false, true])
    );
    assert_eq!(
        run1("Cast", vec![Input(i64s(&[2], &[257, -1]))], to("u8")),
        kiln::Tensor::from_vec(&[2], vec![1u8, 255]).unwrap()
    );
    let h = run1(
        "Cast",
        vec![Symbolic(f64s(&[2], &[0.1, 65536.0]))],
        to("f16"),
    );
    assert_eq!(h.to_f64_vec(), vec![0.0999755859375, f64::INFINITY]);
    assert_eq!(
        run1("Cast", vec![Input(f32s(&[0], &[]))], to("i64")).shape(),
        &[0]
    );
    let e = run_err("Cast", vec![Input(f32s(&[1], &[1.0]))], to("float"));
    assert!(e.contains("to: unknown dtype 'float'"), "{e}");
    let e = run_err("Cast", vec![Input(f32s(&[1], &[1.0]))], Attrs::new());
    assert!(e.contains("missing required attribute 'to'"), "{e}");
}

#[test]
fn cast_like_takes_the_target_dtype() {
    let y = run1(
        "CastLike",
        vec![Input(f64s(&[2], &[2.5, -0.5])), Input(i32s(&[0], &[]))],
        Attrs::new(),
    );
    assert_eq!(y, i32s(&[2], &[2, 0]));
}

#[test]
fn shrink_and_bit_cast() {
    let x = f32s(&[5], &[-2.0, -0.5, 0.0, 0.5, 2.0]);
    let y = run1(
        "Shrink",
        vec![Input(x)],
        attrs(&[("bias", Attr::Float(1.0)), ("lambd", Attr::Float(1.0))]),
    );
    assert_eq!(y, f32s(&[5], &[-1.0, 0.0, 0.0, 0.0, 1.0]));
    let y = run1("BitCast", vec![Input(f32s(&[2], &[1.0, -2.0]))], to("i32"));
    assert_eq!(y, i32s(&[2], &[0x3f80_0000, 0xc000_0000u32 as i32]));
    let y = run1("BitCast", vec![Input(y)], to("f32"));
    assert_eq!(y, f32s(&[2], &[1.0, -2.0]));
    let e = run_err("BitCast", vec![Input(f32s(&[1], &[1.0]))], to("f64"));
    assert!(e.contains("sizes differ"), "{e}");
}

#[test]
fn window_functions_periodic_and_symmetric() {
    let n = || Const(i64s(&[], &[5]));
    let y = run1("HannWindow", vec![n()], Attrs::new());
    assert_close(
        &y,
        &f32s(
            &[5],
            &[0.0, 0.345_491_5, 0.904_508_5, 0.904_508_5, 0.345_491_5],
        ),
        1e-6,
        0.0,
    );
    let sym = attrs(&[("periodic", Attr::Int(0))]);
    let y = run1("HammingWindow", vec![n()], sym);
    assert_close(
        &y,
        &f32s(
            &[5],
            &[0.086_956_52, 0.543_478_25, 1.0, 0.543_478_25, 0.086_956_52],
        ),
        1e-6,
        0.0,
    );
    let f64_out = attrs(&[("output_datatype", Attr::String("f64".into()))]);
    let y = run1("BlackmanWindow", vec![Input(i64s(&[], &[5]))], f64_out);
    assert_close(
        &y,
        &f64s(
            &[5],
            &[0.0, 0.200_770_14, 0.849_229_87, 0.849_229_87, 0.200_770_14],
        ),
        1e-7,
        0.0,
    );
}
