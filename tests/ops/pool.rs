//! Pools against a naive numpy reference (the ONNX formulas as loops) on `ramp` data.
use kiln::ir::{Attr, Attrs};
use kiln::Tensor;

use crate::ops::harness::*;

/// numpy's `((np.arange(20) % 9) - 4) * 0.5` as [1, 1, 4, 5].
fn x() -> Tensor {
    f64s(
        &[1, 1, 4, 5],
        &(0..20)
            .map(|i| ((i % 9) as f64 - 4.0) * 0.5)
            .collect::<Vec<_>>(),
    )
}

fn pool_attrs(k: &[i64], s: &[i64], pads: Option<&[i64]>, extra: &[(&str, i64)]) -> Attrs {
    let mut a = attrs(&[
        ("kernel_shape", Attr::Ints(k.to_vec())),
        ("strides", Attr::Ints(s.to_vec())),
    ]);
    if let Some(p) = pads {
        a.set("pads", Attr::Ints(p.to_vec()));
    }
    for (n, v) in extra {
        a.set(n, Attr::Int(*v));
    }
    a
}

#[test]
fn max_pool_values_and_indices() {
    let out = run(
        "MaxPool",
        vec![Input(x())],
        pool_attrs(&[2, 2], &[2, 2], None, &[]),
    )
    .unwrap();
    assert_eq!(out[0], f64s(&[1, 1, 2, 2], &[1.0, 2.0, 1.5, 2.0]));
    assert_eq!(out[1], i64s(&[1, 1, 2, 2], &[6, 8, 16, 17]));
    let out = run(
        "MaxPool",
        vec![Symbolic(x())],
        pool_attrs(&[2, 2], &[2, 2], None, &[("ceil_mode", 1)]),
    )
    .unwrap();
    assert_eq!(out[0], f64s(&[1, 1, 2, 3], &[1.0, 2.0, 0.0, 1.5, 2.0, 0.5]));
    assert_eq!(out[1], i64s(&[1, 1, 2, 3], &[6, 8, 4, 16, 17, 14]));
    // Column-major spatial indices: (h, w) -> h + w * H.
    let out = run(
        "MaxPool",
        vec![Input(x())],
        pool_attrs(&[2, 2], &[2, 2], None, &[("storage_order", 1)]),
    )
    .unwrap();
    assert_eq!(out[1], i64s(&[1, 1, 2, 2], &[5, 13, 7, 11]));
    // Padding never wins, even against negative values.
    let neg = f32s(&[1, 1, 1, 2], &[-5.0, -7.0]);
    let out = run(
        "MaxPool",
        vec![Input(neg)],
        pool_attrs(&[1, 2], &[1, 1], Some(&[0, 1, 0, 1]), &[]),
    )
    .unwrap();
    assert_eq!(out[0], f32s(&[1, 1, 1, 3], &[-5.0, -5.0, -7.0]));
}

#[test]
fn average_pool_with_and_without_padding_counted() {
    let y = run1(
        "AveragePool",
        vec![Input(x())],
        pool_attrs(&[3, 3], &[2, 2], Some(&[1, 1, 1, 1]), &[]),
    );
    assert_close(
        &y,
        &f64s(&[1, 1, 2, 3], &[-0.5, 0.25, -0.125, 0.25, 0.5, -0.5]),
        1e-12,
        0.0,
    );
    let y = run1(
        "AveragePool",
        vec![Input(x())],
        pool_attrs(
            &[3, 3],
            &[2, 2],
            Some(&[1, 1, 1, 1]),
            &[("count_include_pad", 1)],
        ),
    );
    let want = [
        -0.2222222222222222,
        0.16666666666666666,
        -0.05555555555555555,
        0.16666666666666666,
        0.5,
        -0.3333333333333333,
    ];
    assert_close(&y, &f64s(&[1, 1, 2, 3], &want), 1e-12, 0.0);
    let same = attrs(&[
        ("kernel_shape", Attr::Ints(vec![3])),
        ("auto_pad", Attr::String("SAME_UPPER".into())),
    ]);
    let y = run1(
        "AveragePool",
        vec![Input(f32s(&[1, 1, 3], &[1.0, 2.0, 6.0]))],
        same,
    );
    assert_eq!(y, f32s(&[1, 1, 3], &[1.5, 3.0, 4.0]));
}

#[test]
fn pool_errors() {
    let e = run_err(
        "MaxPool",
        vec![Input(x())],
        attrs(&[("strides", Attr::Ints(vec![1, 1]))]),
    );
    assert!(
        e.contains("missing required attribute 'kernel_shape'"),
        "{e}"
    );
    let e = run_err(
        "AveragePool",
        vec![Input(x())],
        pool_attrs(&[2], &[1], None, &[]),
    );
    assert!(
        e.contains("kernel_shape has 1 values, the input has 2 spatial axes"),
        "{e}"
    );
    let e = run_err(
        "MaxPool",
        vec![Input(f64s(&[2, 2], &[0.0; 4]))],
        pool_attrs(&[1], &[1], None, &[]),
    );
    assert!(e.contains("[N, C, D1, ...]"), "{e}");
}

#[test]
fn global_pools_keep_spatial_axes_as_one() {
    let y = run1("GlobalAveragePool", vec![Symbolic(x())], Attrs::new());
    assert_close(&y, &f64s(&[1, 1, 1, 1], &[-0.175]), 1e-12, 0.0);
    let y = run1("GlobalMaxPool", vec![Input(x())], Attrs::new());
    assert_eq!(y, f64s(&[1, 1, 1, 1], &[2.0]));
    let y = run1(
        "GlobalMaxPool",
        vec![Input(f32s(&[2, 3, 1], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))],
        Attrs::new(),
    );
    assert_eq!(y, f32s(&[2, 3, 1], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
}

#[test]
fn lp_pools_take_the_p_norm_of_each_window() {
    let y = run1(
        "LpPool",
        vec![Input(x())],
        pool_attrs(&[3, 3], &[2, 2], Some(&[1, 1, 1, 1]), &[]),
    );
    let want = [
        2.7386127875258306,
        3.278719262151,
        2.8722813232690143,
        2.7838821814150108,
        4.330127018922194,
        3.8078865529319543,
    ];
    assert_close(&y, &f64s(&[1, 1, 2, 3], &want), 1e-12, 0.0);
    let y = run1(
        "GlobalLpPool",
        vec![Symbolic(x())],
        attrs(&[("p", Attr::Int(3))]),
    );
    assert_close(&y, &f64s(&[1, 1, 1, 1], &[3.9445473020119053]), 1e-12, 0.0);
    let e = run_err(
        "LpPool",
        vec![Input(x())],
        pool_attrs(&[3, 3], &[2, 2], None, &[("p", 0)]),
    );
    assert!(e.contains("p must be 1 or more, got 0"), "{e}");
}

#[test]
fn max_pool_takes_bytes() {
    let x = kiln::Tensor::from_vec(&[1, 1, 4], vec![3u8, 250, 7, 9]).unwrap();
    let y = run("MaxPool", vec![Input(x)], pool_attrs(&[2], &[2], None, &[])).unwrap();
    assert_eq!(
        y[0],
        kiln::Tensor::from_vec(&[1, 1, 2], vec![250u8, 9]).unwrap()
    );
}

/// The layout pass's blocked pools (`block` > 0): Reorder to blocked, pool, Reorder
/// back is the plain pool, with 5 channels in blocks of 4 (3 pad lanes).
#[test]
fn blocked_pools_are_the_plain_pools_on_blocks() {
    let x = ramp(&[2, 5, 5, 6], 7, 3.0);
    let reorder = |to: &str, c: Option<i64>| {
        let mut a = vec![("to", Attr::String(to.into())), ("block", Attr::Int(4))];
        if let Some(c) = c {
            a.push(("channels", Attr::Int(c)));
        }
        attrs(&a)
    };
    let xb = run1("Reorder", vec![Input(x.clone())], reorder("blocked", None));
    let window = pool_attrs(&[3, 2], &[2, 1], Some(&[1, 0, 1, 1]), &[]);
    let mut with_pad = window.clone();
    with_pad.set("count_include_pad", Attr::Int(1));
    for (op, a) in [
        ("MaxPool", window.clone()),
        ("AveragePool", window.clone()),
        ("AveragePool", with_pad),
        ("GlobalMaxPool", Attrs::new()),
        ("GlobalAveragePool", Attrs::new()),
    ] {
        let want = run(op, vec![Input(x.clone())], a.clone())
            .unwrap()
            .remove(0);
        let mut ab = a.clone();
        ab.set("block", Attr::Int(4));
        let out = run(op, vec![Input(xb.clone())], ab).unwrap();
        let yb = &out[0];
        assert_eq!(yb.shape()[..2], [2, 2], "{op}");
        assert_eq!(yb.shape()[yb.rank() - 1], 4, "{op}");
        if op == "MaxPool" {
            // Indices exist in the blocked form too (the layout pass never uses them).
            assert_eq!(out[1].shape(), yb.shape());
        }
        let got = run1(
            "Reorder",
            vec![Input(yb.clone())],
            reorder("plain", Some(5)),
        );
        assert_eq!(got, want, "{op}");
    }
    // `block` 0 is the plain pool; a blocked X must end in its block.
    let mut plain = window.clone();
    plain.set("block", Attr::Int(0));
    assert_eq!(
        run("MaxPool", vec![Input(x.clone())], plain).unwrap(),
        run("MaxPool", vec![Input(x.clone())], window.clone()).unwrap()
    );
    let mut bad = window.clone();
    bad.set("block", Attr::Int(4));
    let e = run_err("MaxPool", vec![Input(x.clone())], bad);
    assert!(e.contains("not [N, CB, spatial..., 4]"), "{e}");
    let e = run_err(
        "GlobalAveragePool",
        vec![Input(xb)],
        attrs(&[("block", Attr::Int(-1))]),
    );
    assert!(e.contains("block must be 0 to 1024"), "{e}");
}
