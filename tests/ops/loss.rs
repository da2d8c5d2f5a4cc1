//! Losses, hand-computed: loss[n] = -input[n, target[n]] * weight[target[n]].
use kiln::ir::{Attr, Attrs};

use crate::ops::harness::*;

fn red(r: &str) -> Attrs {
    attrs(&[("reduction", Attr::String(r.into()))])
}

#[test]
fn nll_loss_reductions_weights_and_ignore_index() {
    let logp = f64s(&[2, 3], &[-1.0, -2.0, -3.0, -0.5, -1.5, -2.5]);
    let target = i64s(&[2], &[2, 0]);
    let w = f64s(&[3], &[1.0, 2.0, 3.0]);
    let run_nll = |a: Attrs| {
        run1(
            "NegativeLogLikelihoodLoss",
            vec![Input(logp.clone()), Input(target.clone()), Input(w.clone())],
            a,
        )
    };
    assert_eq!(run_nll(red("none")), f64s(&[2], &[9.0, 0.5]));
    assert_eq!(run_nll(red("sum")), f64s(&[], &[9.5]));
    assert_eq!(run_nll(Attrs::new()), f64s(&[], &[2.375]));
    let ignore = attrs(&[("ignore_index", Attr::Int(0))]);
    assert_eq!(run_nll(ignore), f64s(&[], &[3.0]));
    // Without weights the mean is over the targets; [N, C, d] inputs work per position.
    let y = run1(
        "NegativeLogLikelihoodLoss",
        vec![Symbolic(logp.clone()), Input(i32s(&[2], &[1, 1])), Absent],
        Attrs::new(),
    );
    assert_eq!(y, f64s(&[], &[1.75]));
    let e = run_err(
        "NegativeLogLikelihoodLoss",
        vec![Input(logp.clone()), Input(i64s(&[2], &[3, 0])), Absent],
        Attrs::new(),
    );
    assert!(e.contains("target 3 is out of range for 3 classes"), "{e}");
    let e = run_err(
        "NegativeLogLikelihoodLoss",
        vec![Input(logp), Input(f32s(&[2], &[0.0; 2])), Absent],
        Attrs::new(),
    );
    assert!(e.contains("i32 or i64"), "{e}");
}

#[test]
fn softmax_cross_entropy_gives_loss_and_log_prob() {
    let scores = f64s(&[1, 3], &[1.0, 2.0, 3.0]);
    let out = run(
        "SoftmaxCrossEntropyLoss",
        vec![Input(scores), Input(i64s(&[1], &[2])), Absent],
        Attrs::new(),
    )
    .unwrap();
    assert_close(&out[0], &f64s(&[], &[0.40760596444438013]), 1e-12, 0.0);
    let want = [
        -2.4076059644443806,
        -1.4076059644443801,
        -0.40760596444438013,
    ];
    assert_close(&out[1], &f64s(&[1, 3], &want), 1e-12, 0.0);
    let e = run_err(
        "SoftmaxCrossEntropyLoss",
        vec![Input(f64s(&[3], &[0.0; 3])), Input(i64s(&[], &[0])), Absent],
        red("max"),
    );
    assert!(
        e.contains("reduction 'max'") || e.contains("[N, C, d...]"),
        "{e}"
    );
}

#[test]
fn mse_loss_reductions_and_operand_checks() {
    let p = f64s(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let t = f64s(&[2, 2], &[0.5, 2.0, 5.0, 1.0]);
    let mse = |a: Attrs| run1("MseLoss", vec![Input(p.clone()), Input(t.clone())], a);
    assert_eq!(mse(red("none")), f64s(&[2, 2], &[0.25, 0.0, 4.0, 9.0]));
    assert_eq!(mse(red("sum")), f64s(&[], &[13.25]));
    assert_eq!(mse(Attrs::new()), f64s(&[], &[3.3125]));
    // f32 and symbolic dims.
    let y = run1(
        "MseLoss",
        vec![
            Symbolic(f32s(&[3], &[1.0, -1.0, 0.0])),
            Symbolic(f32s(&[3], &[0.0, 1.0, 0.0])),
        ],
        Attrs::new(),
    );
    assert_close(&y, &f32s(&[], &[5.0 / 3.0]), 1e-6, 0.0);
    let e = run_err(
        "MseLoss",
        vec![Input(p.clone()), Input(f64s(&[4], &[0.0; 4]))],
        Attrs::new(),
    );
    assert!(
        e.contains("'op'") && e.contains("input 1 (target) must have the type of input 0"),
        "{e}"
    );
    let e = run_err(
        "MseLoss",
        vec![Input(p.clone()), Input(f32s(&[2, 2], &[0.0; 4]))],
        Attrs::new(),
    );
    assert!(e.contains("input 1 (target)"), "{e}");
    let e = run_err(
        "MseLoss",
        vec![Input(i64s(&[1], &[1])), Input(i64s(&[1], &[1]))],
        Attrs::new(),
    );
    assert!(e.contains("input 0 must be a float type"), "{e}");
    let e = run_err("MseLoss", vec![Input(p.clone()), Input(t)], red("max"));
    assert!(
        e.contains("reduction 'max' is not one of none, sum, mean"),
        "{e}"
    );
}
