//! Dropout: inference-mode identity, the training-mode mask as a pure function of
//! (seed, counter, element), its statistics, and the same masks on every backend and
//! thread count.
use kiln::backend::{backend_with, Device};
use kiln::ir::{Attr, Attrs};
use kiln::passes::CompileOptions;
use kiln::Tensor;

use crate::ops::harness::*;

fn seed(s: i64) -> Attrs {
    attrs(&[("seed", Attr::Int(s))])
}

/// Training-mode dropout of `x` with `ratio`, `seed` and `counter`: (output, mask).
fn train(x: Tensor, ratio: f64, s: i64, counter: i64) -> (Tensor, Tensor) {
    let mut out = run(
        "Dropout",
        vec![
            Input(x),
            Input(f64s(&[], &[ratio])),
            Input(bools(&[], &[true])),
            Input(i64s(&[], &[counter])),
        ],
        seed(s),
    )
    .unwrap();
    let mask = out.pop().unwrap();
    (out.pop().unwrap(), mask)
}

fn mask_bits(mask: &Tensor) -> String {
    mask.to_f64_vec()
        .iter()
        .map(|&m| if m != 0.0 { '1' } else { '0' })
        .collect()
}

#[test]
fn dropout_in_inference_mode_is_the_identity() {
    let x = ramp(&[2, 3], 5, 2.0);
    let all = bools(&[2, 3], &[true; 6]);
    for args in [
        vec![Input(x.clone())],
        vec![Input(x.clone()), Input(f32s(&[], &[0.9]))],
        vec![
            Input(x.clone()),
            Absent,
            Input(bools(&[], &[false])),
            Input(i64s(&[], &[3])),
        ],
    ] {
        let out = run("Dropout", args, seed(1)).unwrap();
        assert_eq!(out, vec![x.clone(), all.clone()]);
    }
}

#[test]
fn dropout_masks_are_a_pure_function_of_seed_counter_and_element() {
    // Expected bits from an independent Python implementation of the generator
    // (splitmix64 finalizer chain, see src/ir/ops/random.rs), ratio 0.5.
    for (s, counter, want) in [
        (0, 0, "000010000011000000110111"),
        (42, 7, "110101101101111001011101"),
        (-5, 3, "110110010100001100100000"),
    ] {
        let x = f64s(&[4, 6], &[1.0; 24]);
        let (y, mask) = train(x, 0.5, s, counter);
        assert_eq!(mask_bits(&mask), want, "seed {s}, counter {counter}");
        // Kept elements are scaled by 1 / (1 - ratio), the others are 0.
        let want_y: Vec<f64> = want
            .chars()
            .map(|c| if c == '1' { 2.0 } else { 0.0 })
            .collect();
        assert_eq!(y, f64s(&[4, 6], &want_y));
        // Element i's bit does not depend on the shape: a longer flat tensor starts alike.
        let (_, long) = train(f64s(&[50], &[1.0; 50]), 0.5, s, counter);
        assert!(mask_bits(&long).starts_with(want));
    }
    // Another counter or seed, another mask; the same ones, the same mask.
    let x = ramp(&[64], 7, 3.0);
    let (a, ma) = train(x.clone(), 0.5, 1, 0);
    let (b, mb) = train(x.clone(), 0.5, 1, 0);
    assert_eq!((a, ma.clone()), (b, mb));
    assert_ne!(mask_bits(&ma), mask_bits(&train(x.clone(), 0.5, 1, 1).1));
    assert_ne!(mask_bits(&ma), mask_bits(&train(x, 0.5, 2, 0).1));
}

#[test]
fn dropout_keeps_about_one_minus_ratio() {
    let n = 20_000;
    for ratio in [0.1, 0.3, 0.75] {
        let x = f32s(&[n], &vec![3.0; n]);
        let (y, mask) = train(x, ratio, 9, 11);
        let kept = mask.to_f64_vec().iter().filter(|&&m| m != 0.0).count() as f64 / n as f64;
        // Five standard deviations of a binomial proportion.
        let sd = (ratio * (1.0 - ratio) / n as f64).sqrt();
        assert!(
            (kept - (1.0 - ratio)).abs() < 5.0 * sd,
            "ratio {ratio}: kept {kept}"
        );
        let scaled = (3.0 / (1.0 - ratio)) as f32;
        for (v, m) in y.to_f64_vec().iter().zip(mask.to_f64_vec()) {
            assert_eq!(*v as f32, if m != 0.0 { scaled } else { 0.0 });
        }
    }
    // Ratio 0 keeps everything, unscaled.
    let x = ramp(&[3, 4], 5, 2.0);
    let (y, mask) = train(x.clone(), 0.0, 5, 5);
    assert_eq!((y, mask), (x, bools(&[3, 4], &[true; 12])));
}

#[test]
fn dropout_is_the_same_on_every_backend_and_thread_count() {
    let x = ramp(&[3, 257], 11, 5.0);
    let (g, inputs) = build(
        "Dropout",
        vec![
            Input(x),
            Const(f32s(&[], &[0.4])),
            Const(bools(&[], &[true])),
            Input(i64s(&[], &[123])),
        ],
        seed(77),
    )
    .unwrap();
    let oracle = backend_with(Device::Interp, CompileOptions::default())
        .unwrap()
        .compile(&g)
        .unwrap()
        .run(&inputs)
        .unwrap();
    for threads in [1, 2, 4] {
        let got = backend_with(
            Device::Cpu,
            CompileOptions {
                threads,
                ..Default::default()
            },
        )
        .unwrap()
        .compile(&g)
        .unwrap()
        .run(&inputs)
        .unwrap();
        assert_eq!(got, oracle, "cpu with {threads} threads");
    }
}

#[test]
fn dropout_rejects_bad_operands_naming_them() {
    let x = ramp(&[4], 3, 1.0);
    let t = || Input(bools(&[], &[true]));
    let e = run_err(
        "Dropout",
        vec![Input(x.clone()), Const(f64s(&[], &[1.0])), t()],
        Attrs::new(),
    );
    assert!(
        e.contains("'op'") && e.contains("ratio must be in [0, 1), got 1"),
        "{e}"
    );
    // A run-time ratio is checked when it is known.
    let e = run_err(
        "Dropout",
        vec![Input(x.clone()), Input(f64s(&[], &[-0.25])), t()],
        Attrs::new(),
    );
    assert!(e.contains("ratio must be in [0, 1), got -0.25"), "{e}");
    let e = run_err("Dropout", vec![Input(i64s(&[2], &[1, 2]))], Attrs::new());
    assert!(e.contains("input 0 (data) must be a float type"), "{e}");
    let e = run_err(
        "Dropout",
        vec![Input(x.clone()), Input(f64s(&[2], &[0.1, 0.2]))],
        Attrs::new(),
    );
    assert!(e.contains("input 1 (ratio) must be a float scalar"), "{e}");
    let e = run_err(
        "Dropout",
        vec![Input(x.clone()), Absent, Input(f32s(&[], &[1.0]))],
        Attrs::new(),
    );
    assert!(
        e.contains("input 2 (training_mode) must be a bool scalar"),
        "{e}"
    );
    let e = run_err(
        "Dropout",
        vec![Input(x), Absent, t(), Input(f64s(&[], &[1.0]))],
        Attrs::new(),
    );
    assert!(
        e.contains("input 3 (counter) must be an integer scalar"),
        "{e}"
    );
}
