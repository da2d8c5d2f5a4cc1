//! Bit operations, hand-computed.
use kiln::ir::{Attr, Attrs};
use kiln::Tensor;

use crate::ops::harness::*;

fn u8s(shape: &[usize], v: &[u8]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

#[test]
fn shifts_drop_bits_and_sign_extend() {
    let dir = |d: &str| attrs(&[("direction", Attr::String(d.into()))]);
    let x = u8s(&[3], &[16, 4, 1]);
    let y = run1(
        "BitShift",
        vec![Input(x.clone()), Input(u8s(&[3], &[1, 2, 3]))],
        dir("RIGHT"),
    );
    assert_eq!(y, u8s(&[3], &[8, 1, 0]));
    let y = run1(
        "BitShift",
        vec![Input(u8s(&[2], &[200, 1])), Input(u8s(&[], &[1]))],
        dir("LEFT"),
    );
    assert_eq!(y, u8s(&[2], &[144, 2]), "200 << 1 drops the top bit");
    let big = Tensor::from_vec(&[1], vec![u64::MAX]).unwrap();
    let y = run1(
        "BitShift",
        vec![
            Input(big.clone()),
            Input(Tensor::from_vec(&[1], vec![60u64]).unwrap()),
        ],
        dir("RIGHT"),
    );
    assert_eq!(y, Tensor::from_vec(&[1], vec![15u64]).unwrap());
    // Signed: left wraps, right is arithmetic, shifts out of 0..8 clear (or give -1).
    let i8s = |v: &[i8]| Tensor::from_vec(&[v.len()], v.to_vec()).unwrap();
    let y = run1(
        "BitShift",
        vec![Input(i8s(&[64, -3, 5, 1])), Input(i8s(&[1, 1, -1, 8]))],
        dir("LEFT"),
    );
    assert_eq!(y, i8s(&[-128, -6, 0, 0]));
    let y = run1(
        "BitShift",
        vec![Input(i8s(&[-7, -7, 7, -1])), Input(i8s(&[1, 9, 9, -2]))],
        dir("RIGHT"),
    );
    assert_eq!(y, i8s(&[-4, -1, 0, -1]));
    let e = run_err("BitShift", vec![Input(x.clone()), Input(x)], dir("UP"));
    assert!(e.contains("LEFT or RIGHT"), "{e}");
}

#[test]
fn and_or_xor_not_broadcast() {
    let a = i32s(&[2, 2], &[12, 10, -1, 0]);
    let b = i32s(&[2], &[10, 6]);
    assert_eq!(
        run1(
            "BitwiseAnd",
            vec![Input(a.clone()), Input(b.clone())],
            Attrs::new()
        ),
        i32s(&[2, 2], &[8, 2, 10, 0])
    );
    assert_eq!(
        run1(
            "BitwiseOr",
            vec![Symbolic(a.clone()), Input(b.clone())],
            Attrs::new()
        ),
        i32s(&[2, 2], &[14, 14, -1, 6])
    );
    assert_eq!(
        run1("BitwiseXor", vec![Input(a.clone()), Input(b)], Attrs::new()),
        i32s(&[2, 2], &[6, 12, -11, 6])
    );
    assert_eq!(
        run1("BitwiseNot", vec![Input(u8s(&[2], &[0, 15]))], Attrs::new()),
        u8s(&[2], &[255, 240])
    );
    assert_eq!(
        run1("BitwiseNot", vec![Input(a)], Attrs::new()),
        i32s(&[2, 2], &[-13, -11, 0, -1])
    );
    let e = run_err(
        "BitwiseAnd",
        vec![Input(f32s(&[1], &[1.0])), Input(f32s(&[1], &[1.0]))],
        Attrs::new(),
    );
    assert!(e.contains("integer"), "{e}");
}
