//! The ops passes create — FusedConv, FusedMatMul, Fused, Reorder — against the
//! catalogue ops they stand for: the same result, exactly, since the reference of a
//! fused op applies the same ops in the same order.
use kiln::ir::{Attr, Attrs};
use kiln::Tensor;

use crate::ops::harness::*;

fn strings(v: &[&str]) -> Attr {
    Attr::Strings(v.iter().map(|s| s.to_string()).collect())
}

fn act(name: &str, extra: &[&str]) -> Vec<(&'static str, Attr)> {
    let mut a = vec![("activation", Attr::String(name.into()))];
    if !extra.is_empty() {
        a.push(("activation_attrs", strings(extra)));
    }
    a
}

#[test]
fn fused_conv_is_conv_plus_residual_then_activation() {
    let x = ramp(&[1, 2, 4, 4], 7, 3.0);
    let w = ramp(&[3, 2, 3, 3], 5, 2.0);
    let b = f64s(&[3], &[0.5, -1.0, 0.25]);
    let z = ramp(&[1, 3, 4, 4], 11, 5.0);
    let pads = ("pads", Attr::Ints(vec![1, 1, 1, 1]));
    let conv = run1(
        "Conv",
        vec![Input(x.clone()), Const(w.clone()), Const(b.clone())],
        attrs(std::slice::from_ref(&pads)),
    );
    let sum = run1("Add", vec![Input(conv), Input(z.clone())], Attrs::new());
    for (name, extra) in [
        ("Relu", vec![]),
        ("LeakyRelu", vec!["alpha=0.2"]),
        ("Sigmoid", vec![]),
        ("Clip", vec!["min=-0.5", "max=1.5"]),
        ("Gelu", vec!["approximate=tanh"]),
    ] {
        let want = match name {
            "Clip" => run1(
                "Clip",
                vec![
                    Input(sum.clone()),
                    Const(f64s(&[], &[-0.5])),
                    Const(f64s(&[], &[1.5])),
                ],
                Attrs::new(),
            ),
            _ => {
                let mut a = Attrs::new();
                for kv in &extra {
                    let (k, v) = kv.split_once('=').unwrap();
                    a.set(
                        k,
                        v.parse::<f64>().map_or(Attr::String(v.into()), Attr::Float),
                    );
                }
                run1(name, vec![Input(sum.clone())], a)
            }
        };
        let mut a = act(name, &extra);
        a.push(pads.clone());
        let got = run1(
            "FusedConv",
            vec![
                Input(x.clone()),
                Const(w.clone()),
                Const(b.clone()),
                Input(z.clone()),
            ],
            attrs(&a),
        );
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn blocked_fused_conv_reads_and_writes_blocks() {
    let x = ramp(&[1, 4, 3, 3], 7, 3.0);
    let w = ramp(&[8, 4, 1, 1], 5, 2.0);
    let plain = run1(
        "FusedConv",
        vec![Input(x.clone()), Const(w.clone())],
        attrs(&act("Relu", &[])),
    );
    let to = |to: &str, c: Option<i64>| {
        let mut a = vec![("to", Attr::String(to.into())), ("block", Attr::Int(4))];
        if let Some(c) = c {
            a.push(("channels", Attr::Int(c)));
        }
        attrs(&a)
    };
    let xb = run1("Reorder", vec![Input(x)], to("blocked", None));
    assert_eq!(xb.shape(), &[1, 1, 3, 3, 4]);
    let mut a = act("Relu", &[]);
    a.push(("block", Attr::Int(4)));
    let yb = run1(
        "FusedConv",
        vec![Input(xb.clone()), Const(w.clone())],
        attrs(&a),
    );
    assert_eq!(yb.shape(), &[1, 2, 3, 3, 4]);
    assert_eq!(
        run1("Reorder", vec![Input(yb)], to("plain", Some(8))),
        plain
    );
    // A blocked conv's X holds W's input channels times the groups.
    let mut g2 = a.clone();
    g2.push(("group", Attr::Int(2)));
    let e = run_err(
        "FusedConv",
        vec![Input(xb.clone()), Const(w.clone())],
        attrs(&g2),
    );
    assert!(e.contains("holding 8 channels"), "{e}");
    let w6 = ramp(&[8, 6, 1, 1], 5, 2.0);
    let e = run_err("FusedConv", vec![Input(xb), Const(w6)], attrs(&a));
    assert!(e.contains("holding 6 channels"), "{e}");
}

#[test]
fn plain_x_fused_conv_reads_plain_and_writes_blocks() {
    // 3 input channels stay plain; 6 output channels in blocks of 4 (2 pad lanes).
    let x = ramp(&[2, 3, 5, 4], 7, 3.0);
    let w = ramp(&[6, 3, 3, 3], 5, 2.0);
    let z = ramp(&[2, 6, 3, 1], 11, 5.0);
    let mut a = act("Relu", &[]);
    a.push(("strides", Attr::Ints(vec![2, 2])));
    a.push(("pads", Attr::Ints(vec![1, 0, 1, 0])));
    let plain = run1(
        "FusedConv",
        vec![Input(x.clone()), Const(w.clone()), Absent, Input(z.clone())],
        attrs(&a),
    );
    let reorder = |to: &str, c: Option<i64>| {
        let mut a = vec![("to", Attr::String(to.into())), ("block", Attr::Int(4))];
        if let Some(c) = c {
            a.push(("channels", Attr::Int(c)));
        }
        attrs(&a)
    };
    // B omitted, Z blocked: inputs X, W, _, Z.
    let zb = run1("Reorder", vec![Input(z)], reorder("blocked", None));
    let mut ab = a.clone();
    ab.push(("block", Attr::Int(4)));
    ab.push(("plain_x", Attr::Int(1)));
    let yb = run1(
        "FusedConv",
        vec![
            Input(x.clone()),
            Const(w.clone()),
            Absent,
            Input(zb.clone()),
        ],
        attrs(&ab),
    );
    assert_eq!(yb.shape(), &[2, 2, 3, 1, 4]);
    assert_eq!(
        run1("Reorder", vec![Input(yb)], reorder("plain", Some(6))),
        plain
    );
    // plain_x needs a block, and is a flag.
    let mut no_block = a.clone();
    no_block.push(("plain_x", Attr::Int(1)));
    let e = run_err(
        "FusedConv",
        vec![Input(x.clone()), Const(w.clone())],
        attrs(&no_block),
    );
    assert!(e.contains("plain_x = 1 needs block > 0"), "{e}");
    let mut two = ab.clone();
    two.retain(|(k, _)| *k != "plain_x");
    two.push(("plain_x", Attr::Int(2)));
    let e = run_err("FusedConv", vec![Input(x), Const(w)], attrs(&two));
    assert!(e.contains("plain_x must be 0 or 1"), "{e}");
}

#[test]
fn fused_matmul_transposes_adds_bias_and_residual() {
    let a = ramp(&[2, 3, 4], 7, 3.0);
    let b = ramp(&[5, 4], 5, 2.0); // used transposed
    let bias = f64s(&[5], &[0.5, -1.0, 0.25, 0.0, 2.0]);
    let z = ramp(&[2, 3, 5], 11, 5.0);
    let bt = run1(
        "Transpose",
        vec![Input(b.clone())],
        attrs(&[("perm", Attr::Ints(vec![1, 0]))]),
    );
    let mm = run1("MatMul", vec![Input(a.clone()), Input(bt)], Attrs::new());
    let mm = run1("Add", vec![Input(mm), Input(bias.clone())], Attrs::new());
    let mm = run1("Add", vec![Input(mm), Input(z.clone())], Attrs::new());
    let want = run1("Tanh", vec![Input(mm)], Attrs::new());
    let mut at = act("Tanh", &[]);
    at.push(("transB", Attr::Int(1)));
    let got = run1(
        "FusedMatMul",
        vec![Input(a.clone()), Input(b.clone()), Input(bias), Input(z)],
        attrs(&at),
    );
    assert_eq!(got, want);
    // A bias that would broadcast the product up is refused, as is an unknown activation.
    let big = ramp(&[4, 2, 3, 5], 3, 1.0);
    let e = run_err(
        "FusedMatMul",
        vec![Input(a.clone()), Input(b.clone()), Input(big)],
        attrs(&[("transB", Attr::Int(1))]),
    );
    assert!(e.contains("must not broadcast"), "{e}");
    let mut swish = act("Swish", &[]);
    swish.push(("transB", Attr::Int(1)));
    let e = run_err("FusedMatMul", vec![Input(a), Input(b)], attrs(&swish));
    assert!(e.contains("unknown activation 'Swish'"), "{e}");
}

#[test]
fn fused_body_runs_its_steps_in_order() {
    let x = ramp(&[2, 3], 5, 2.0);
    let y = f64s(&[3], &[0.5, -1.0, 2.0]);
    let body = strings(&[
        "Mul(i0, i1)",
        "LeakyRelu(t0) alpha=0.1",
        "Where(i2, t1, i0)",
    ]);
    let cond = Tensor::from_vec(&[3], vec![true, false, true]).unwrap();
    let got = run1(
        "Fused",
        vec![Input(x.clone()), Input(y.clone()), Input(cond.clone())],
        attrs(&[("body", body)]),
    );
    let t0 = run1(
        "Mul",
        vec![Input(x.clone()), Input(y.clone())],
        Attrs::new(),
    );
    let t1 = run1(
        "LeakyRelu",
        vec![Input(t0)],
        attrs(&[("alpha", Attr::Float(0.1))]),
    );
    let want = run1(
        "Where",
        vec![Input(cond), Input(t1), Input(x.clone())],
        Attrs::new(),
    );
    assert_eq!(got, want);
    for (body, needle) in [
        (vec!["Conv(i0, i1)"], "only elementwise ops can be fused"),
        (vec!["Relu(t0)"], "operand t0 does not exist here"),
        (vec!["Relu(i5)"], "operand i5 does not exist here"),
        (vec!["Nope(i0)"], "not a catalogue op"),
        (vec!["LeakyRelu(i0) beta=2"], "unknown attribute 'beta'"),
        (vec![], "the body has no steps"),
    ] {
        let e = run_err(
            "Fused",
            vec![Input(x.clone()), Input(y.clone())],
            attrs(&[("body", strings(&body))]),
        );
        assert!(e.contains(needle), "{body:?}: {e}");
    }
}

#[test]
fn fused_conv_integer_is_conv_integer_dequantized() {
    let u8s = |shape: &[usize], k: usize| {
        let n: usize = shape.iter().product();
        Tensor::from_vec(shape, (0..n).map(|i| ((i * 37) % k) as u8).collect()).unwrap()
    };
    let x = u8s(&[1, 2, 5, 4], 251);
    let w = u8s(&[3, 2, 3, 3], 199);
    let (xz, wz) = (u8s(&[], 1), Tensor::from_vec(&[], vec![100u8]).unwrap());
    let bias = i32s(&[1, 3, 1, 1], &[1000, -70000, 3]);
    let scale = f32s(&[], &[0.0123]);
    let z = f32s(
        &[1, 3, 5, 4],
        &(0..60).map(|i| i as f32 * 0.5 - 7.0).collect::<Vec<_>>(),
    );
    let pads = ("pads", Attr::Ints(vec![1, 1, 1, 1]));
    let conv = run1(
        "ConvInteger",
        vec![
            Input(x.clone()),
            Const(w.clone()),
            Input(xz.clone()),
            Const(wz.clone()),
        ],
        attrs(std::slice::from_ref(&pads)),
    );
    let sum = run1("Add", vec![Input(conv), Input(bias.clone())], Attrs::new());
    let cast = run1(
        "Cast",
        vec![Input(sum)],
        Attrs::new().with("to", Attr::String("f32".into())),
    );
    let scaled = run1("Mul", vec![Input(cast), Input(scale.clone())], Attrs::new());
    let want = run1(
        "Relu",
        vec![Input(run1(
            "Add",
            vec![Input(scaled), Input(z.clone())],
            Attrs::new(),
        ))],
        Attrs::new(),
    );
    let mut a = act("Relu", &[]);
    a.push(pads);
    let got = run1(
        "FusedConvInteger",
        vec![
            Input(x),
            Const(w),
            Input(xz),
            Const(wz),
            Input(bias),
            Input(scale),
            Input(z),
        ],
        attrs(&a),
    );
    assert_eq!(got, want);
    // The scale must not widen the output.
    let err = run_err(
        "FusedConvInteger",
        vec![
            Input(u8s(&[1, 2, 5, 4], 7)),
            Const(u8s(&[3, 2, 3, 3], 5)),
            Absent,
            Absent,
            Absent,
            Input(f32s(&[2, 1, 1, 1, 1], &[1.0, 2.0])),
        ],
        Attrs::new(),
    );
    assert!(err.contains("scale"), "{err}");
}
