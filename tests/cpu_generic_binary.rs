//! The CPU backend's elementwise kernels of every dtype (`steps::elementwise_any`)
//! against the reference interpreter, compiled with `allow_fallback: false`:
//! comparisons, And/Or/Xor, the bitwise ops and BitShift, Mod (both `fmod`s), Pow of
//! mixed and integer dtypes, variadic Sum/Mean/Max/Min, Clip with constant, run-time
//! and omitted bounds, PRelu, and `Fused` chains the f32 loop declines; broadcasting,
//! size-1, empty and rank-0 operands; at 1 and 2 threads, each asserting its step kind.
use crate::common;

use common::{constant, op, typed_param, Rng};
use kiln::backend::cpu::CpuBackend;
use kiln::backend::{backend_with, Device};
use kiln::ir::{text, Attr, Attrs, DType, Graph};
use kiln::passes::CompileOptions;
use kiln::Tensor;

fn cpu(threads: usize) -> CpuBackend {
    CpuBackend::new(CompileOptions {
        threads,
        allow_fallback: false,
        ..Default::default()
    })
}

/// `g` lowers with a `kind` step (and no fallback) and gives the interpreter's outputs
/// (exactly for integers and bool, within `tol` for floats) at 1 and 2 threads.
fn check(g: &Graph, inputs: &[Tensor], kind: &str, tol: f64) {
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let exe = cpu(1)
        .compile_cpu(g)
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)));
    let kinds: Vec<&str> = exe
        .step_report(&shapes)
        .unwrap()
        .iter()
        .map(|s| s.kind)
        .collect();
    assert!(
        kinds.contains(&kind) && !kinds.contains(&"fallback"),
        "want a {kind} step and no fallback, got {kinds:?}\n{}",
        text::print(g)
    );
    let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
    let want = interp.compile(g).unwrap().run(inputs).unwrap();
    for threads in [1, 2] {
        let got = kiln::backend::Backend::compile(&cpu(threads), g)
            .unwrap()
            .run(inputs)
            .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)));
        for (i, (w, o)) in want.iter().zip(&got).enumerate() {
            let tol = if w.dtype().is_float() { tol } else { 0.0 };
            o.check_close(w, tol, tol).unwrap_or_else(|e| {
                panic!("output {i}, {threads} thread(s): {e}\n{}", text::print(g))
            });
        }
    }
}

/// Small values of `dtype` (so that comparisons meet equal operands), none zero when
/// `nonzero`.
fn data(rng: &mut Rng, dtype: DType, dims: &[usize], nonzero: bool) -> Tensor {
    let n: usize = dims.iter().product();
    let signed = !matches!(dtype, DType::U8 | DType::U16 | DType::U32 | DType::U64);
    let v: Vec<f64> = (0..n)
        .map(|_| {
            let mut v = if dtype.is_float() {
                (rng.uniform(-4.0, 4.0) * 4.0).round() / 4.0
            } else {
                rng.below(9) as f64 - if signed { 4.0 } else { 0.0 }
            };
            if nonzero && v == 0.0 {
                v = 3.0;
            }
            v
        })
        .collect();
    Tensor::from_f64s(dtype, dims, &v).unwrap()
}

const INTS: [DType; 8] = [
    DType::I8,
    DType::U8,
    DType::I16,
    DType::U16,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U64,
];

/// Two of [`PAIRS`], in turn by `k`, so that every form meets every op but a test
/// stays short.
fn pairs(k: usize) -> impl Iterator<Item = (&'static [usize], &'static [usize])> {
    PAIRS.into_iter().skip(k % 3).step_by(3)
}

/// Operand shape pairs: equal, broadcast both ways, size-1 dims, rank 0, empty.
const PAIRS: [(&[usize], &[usize]); 6] = [
    (&[3, 4, 5], &[3, 4, 5]),
    (&[3, 4, 5], &[5]),
    (&[1, 4, 1], &[3, 1, 5]),
    (&[], &[2, 3]),
    (&[], &[]),
    (&[2, 0, 3], &[3]),
];

/// `name(a, b)` on operands of `da` and `db`, checked as `kind`.
#[allow(clippy::too_many_arguments)]
fn binary_case(
    rng: &mut Rng,
    name: &str,
    attrs: Attrs,
    (da, db): (DType, DType),
    (sa, sb): (&[usize], &[usize]),
    nonzero: bool,
    kind: &str,
) {
    let mut g = Graph::new(name);
    let a = typed_param(&mut g, "a", da, sa);
    let b = typed_param(&mut g, "b", db, sb);
    let y = op(&mut g, name, &[a, b], attrs);
    g.add_output("y", y).unwrap();
    // Pow's base is nonzero too (0 to a negative power is an error).
    let inputs = [
        data(rng, da, sa, nonzero && name == "Pow"),
        data(rng, db, sb, nonzero),
    ];
    check(&g, &inputs, kind, 1e-6);
}

/// Comparisons of the dtypes the backward family's `compare` does not take (and Equal
/// on bool), every broadcast form.
#[test]
fn comparisons_of_every_dtype() {
    let mut rng = Rng(1);
    let dtypes = [
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F64,
    ];
    for name in ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"] {
        for d in dtypes {
            for shapes in pairs(rng.below(3)) {
                binary_case(
                    &mut rng,
                    name,
                    Attrs::new(),
                    (d, d),
                    shapes,
                    false,
                    "compare-any",
                );
            }
        }
    }
    for shapes in pairs(rng.below(3)) {
        let bools = (DType::Bool, DType::Bool);
        binary_case(
            &mut rng,
            "Equal",
            Attrs::new(),
            bools,
            shapes,
            false,
            "compare-any",
        );
        for name in ["And", "Or", "Xor"] {
            binary_case(&mut rng, name, Attrs::new(), bools, shapes, false, "logic");
        }
    }
}

/// BitwiseAnd/Or/Xor and both shifts on every integer dtype, shifts of up to the
/// width and more.
#[test]
fn bitwise_and_shifts() {
    let mut rng = Rng(2);
    for d in INTS {
        for shapes in pairs(rng.below(3)) {
            for name in ["BitwiseAnd", "BitwiseOr", "BitwiseXor"] {
                binary_case(
                    &mut rng,
                    name,
                    Attrs::new(),
                    (d, d),
                    shapes,
                    false,
                    "bitwise",
                );
            }
        }
        let bits = 8 * d.size_in_bytes() as i64;
        for direction in ["LEFT", "RIGHT"] {
            let mut g = Graph::new("shift");
            let a = typed_param(&mut g, "a", d, &[2, 5]);
            let b = typed_param(&mut g, "b", d, &[5]);
            let attrs = Attrs::new().with("direction", Attr::String(direction.into()));
            let y = op(&mut g, "BitShift", &[a, b], attrs);
            g.add_output("y", y).unwrap();
            let x = [-128i64, -3, 1, 77, 127, 5, -1, 100, 9, 64];
            let s = [0, 1, bits - 1, bits, bits + 3];
            let inputs = [
                Tensor::from_i64s(d, &[2, 5], &x).unwrap(),
                Tensor::from_i64s(d, &[5], &s).unwrap(),
            ];
            check(&g, &inputs, "bitwise", 0.0);
        }
    }
}

/// Mod with both `fmod`s on integers and floats, mixed signs; an integer modulo by
/// zero is a run-time error, not a panic.
#[test]
fn mods() {
    let mut rng = Rng(3);
    let dtypes = INTS
        .iter()
        .copied()
        .chain([DType::F32, DType::F64, DType::F16]);
    for d in dtypes {
        for fmod in [0, 1] {
            for shapes in pairs(rng.below(3)) {
                let attrs = Attrs::new().with("fmod", Attr::Int(fmod));
                binary_case(&mut rng, "Mod", attrs, (d, d), shapes, true, "mod");
            }
        }
    }
    let mut g = Graph::new("mod0");
    let a = typed_param(&mut g, "a", DType::I32, &[3]);
    let b = typed_param(&mut g, "b", DType::I32, &[3]);
    let y = op(&mut g, "Mod", &[a, b], Attrs::new());
    g.add_output("y", y).unwrap();
    let exe = kiln::backend::Backend::compile(&cpu(1), &g).unwrap();
    let err = exe
        .run(&[
            Tensor::from_i64s(DType::I32, &[3], &[1, 2, 3]).unwrap(),
            Tensor::from_i64s(DType::I32, &[3], &[1, 0, 3]).unwrap(),
        ])
        .unwrap_err();
    assert!(err.to_string().contains("modulo by zero"), "{err}");
}

/// Pow with an exponent of another dtype, and integer Pow (negative exponents too).
#[test]
fn pows_of_mixed_dtypes() {
    let mut rng = Rng(4);
    let dtype_pairs = [
        (DType::F32, DType::I64),
        (DType::F32, DType::I32),
        (DType::F32, DType::U32),
        (DType::F32, DType::U64),
        (DType::I32, DType::F32),
        (DType::I64, DType::F32),
        (DType::I32, DType::I32),
        (DType::I64, DType::I64),
        (DType::U8, DType::U8),
        (DType::F16, DType::F32),
        (DType::F64, DType::I8),
    ];
    for dtypes in dtype_pairs {
        for shapes in pairs(rng.below(3)) {
            binary_case(
                &mut rng,
                "Pow",
                Attrs::new(),
                dtypes,
                shapes,
                true,
                "pow-any",
            );
        }
    }
}

/// Sum, Mean, Max and Min of one to three inputs broadcast together (two-input Max and
/// Min are the `binary` and `binary-elem` steps').
#[test]
fn variadic_ops() {
    let mut rng = Rng(5);
    let shapes: [&[usize]; 3] = [&[3, 1, 5], &[4, 1], &[]];
    let dtypes = [
        DType::F32,
        DType::F16,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::U8,
    ];
    for d in dtypes {
        for name in ["Sum", "Mean", "Max", "Min"] {
            if name == "Mean" && !d.is_float() {
                continue;
            }
            for n in 1..=3 {
                if n == 2 && (name == "Max" || name == "Min") {
                    continue;
                }
                let mut g = Graph::new(name);
                let xs: Vec<_> = (0..n)
                    .map(|k| typed_param(&mut g, &format!("x{k}"), d, shapes[k]))
                    .collect();
                let y = op(&mut g, name, &xs, Attrs::new());
                g.add_output("y", y).unwrap();
                let inputs: Vec<Tensor> = (0..n)
                    .map(|k| data(&mut rng, d, shapes[k], false))
                    .collect();
                check(&g, &inputs, "variadic", 1e-6);
            }
        }
    }
}

/// Clip with constant bounds, run-time bounds and an omitted bound, on floats and
/// integers; PRelu with a per-channel, a scalar and a full slope.
#[test]
fn clips_and_prelus() {
    let mut rng = Rng(6);
    for d in [
        DType::F32,
        DType::F16,
        DType::F64,
        DType::I8,
        DType::U8,
        DType::I64,
    ] {
        for form in 0..4 {
            let mut g = Graph::new("clip");
            let x = typed_param(&mut g, "x", d, &[2, 3, 4]);
            let mut inputs = vec![data(&mut rng, d, &[2, 3, 4], false)];
            let lo_v = Tensor::from_f64s(d, &[], &[-1.0]).unwrap();
            let hi_v = Tensor::from_f64s(d, &[], &[2.0]).unwrap();
            let args = match form {
                // Constant bounds.
                0 => vec![Some(constant(&mut g, lo_v)), Some(constant(&mut g, hi_v))],
                // Run-time bounds.
                1 => {
                    inputs.push(lo_v);
                    inputs.push(hi_v);
                    vec![
                        Some(typed_param(&mut g, "lo", d, &[])),
                        Some(typed_param(&mut g, "hi", d, &[])),
                    ]
                }
                // Only a maximum, or none at all.
                2 => vec![None, Some(constant(&mut g, hi_v))],
                _ => vec![],
            };
            let mut ins = vec![Some(x)];
            ins.extend(args);
            let y = g.add_op("Clip", &ins, Attrs::new(), "").unwrap();
            g.add_output("y", y.into()).unwrap();
            check(&g, &inputs, "clip", 1e-6);
        }
    }
    for d in [DType::F32, DType::F16, DType::F64] {
        for slope in [&[3usize, 1, 1][..], &[], &[2, 3, 4, 5], &[5]] {
            let mut g = Graph::new("prelu");
            let x = typed_param(&mut g, "x", d, &[2, 3, 4, 5]);
            let s = typed_param(&mut g, "s", d, slope);
            let y = op(&mut g, "PRelu", &[x, s], Attrs::new());
            g.add_output("y", y).unwrap();
            let inputs = [
                data(&mut rng, d, &[2, 3, 4, 5], false),
                data(&mut rng, d, slope, false),
            ];
            check(&g, &inputs, "prelu", 1e-6);
        }
    }
}

/// `Fused` chains the f32 loop declines: an i64 comparison choosing between f32s (an
/// attention mask), f16 comparisons or-ed into bool, a run-time-bounded f32 Clip; and an integer Mod
/// whose output may take its operand's buffer.
#[test]
fn fused_chains() {
    let mut rng = Rng(7);
    let mut g = Graph::new("mask");
    let i = typed_param(&mut g, "i", DType::I64, &[3, 1]);
    let j = typed_param(&mut g, "j", DType::I64, &[1, 6]);
    let x = typed_param(&mut g, "x", DType::F32, &[]);
    let z = typed_param(&mut g, "z", DType::F32, &[1]);
    let s = op(&mut g, "Add", &[i, j], Attrs::new());
    let k = constant(&mut g, Tensor::from_i64s(DType::I64, &[], &[4]).unwrap());
    let c = op(&mut g, "Less", &[s, k], Attrs::new());
    let y = op(&mut g, "Where", &[c, x, z], Attrs::new());
    g.add_output("y", y).unwrap();
    let inputs = [
        data(&mut rng, DType::I64, &[3, 1], false),
        data(&mut rng, DType::I64, &[1, 6], false),
        data(&mut rng, DType::F32, &[], false),
        data(&mut rng, DType::F32, &[1], false),
    ];
    check(&g, &inputs, "fused-any", 0.0);

    let mut g = Graph::new("ge");
    let a = typed_param(&mut g, "a", DType::F16, &[3, 4, 5]);
    let b = typed_param(&mut g, "b", DType::F16, &[5]);
    let gt = op(&mut g, "Greater", &[a, b], Attrs::new());
    let eq = op(&mut g, "Equal", &[a, b], Attrs::new());
    let y = op(&mut g, "Or", &[gt, eq], Attrs::new());
    g.add_output("y", y).unwrap();
    let inputs = [
        data(&mut rng, DType::F16, &[3, 4, 5], false),
        data(&mut rng, DType::F16, &[5], false),
    ];
    check(&g, &inputs, "fused-any", 0.0);

    let mut g = Graph::new("clip");
    let a = typed_param(&mut g, "a", DType::F32, &[4, 5]);
    let b = typed_param(&mut g, "b", DType::F32, &[5]);
    let lo = typed_param(&mut g, "lo", DType::F32, &[]);
    let hi = typed_param(&mut g, "hi", DType::F32, &[]);
    let t = op(&mut g, "Add", &[a, b], Attrs::new());
    let y = op(&mut g, "Clip", &[t, lo, hi], Attrs::new());
    g.add_output("y", y).unwrap();
    let inputs = [
        data(&mut rng, DType::F32, &[4, 5], false),
        data(&mut rng, DType::F32, &[5], false),
        Tensor::from_f64s(DType::F32, &[], &[-1.0]).unwrap(),
        Tensor::from_f64s(DType::F32, &[], &[1.5]).unwrap(),
    ];
    check(&g, &inputs, "fused-any", 0.0);

    let mut g = Graph::new("inplace");
    let a = typed_param(&mut g, "a", DType::I16, &[3, 3]);
    let b = typed_param(&mut g, "b", DType::I16, &[3]);
    let perm = Attrs::new().with("perm", Attr::Ints(vec![1, 0]));
    let t = op(&mut g, "Transpose", &[a], perm);
    let y = op(&mut g, "Mod", &[t, b], Attrs::new());
    g.add_output("y", y).unwrap();
    let inputs = [
        data(&mut rng, DType::I16, &[3, 3], false),
        data(&mut rng, DType::I16, &[3], true),
    ];
    check(&g, &inputs, "mod", 0.0);
}
