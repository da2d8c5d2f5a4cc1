//! The CPU backend's one-input elementwise kernels (`steps/unary.rs`) against the
//! reference interpreter, bit for bit: Cast and CastLike between every pair of dtypes
//! (float8, float4 and the sub-byte integers included, `saturate = 0`, e8m0's rounding
//! modes), BitCast, the unary math ops and activations on f64/f16/bf16 (and those the f32
//! paths leave on f32), their integer forms, Not, BitwiseNot, IsNaN and IsInf; rank 0,
//! empty and size-1 shapes, and ops the planner runs in place. Every graph compiles with
//! the fallback off, and each asserts the kernels it lowered to.
use crate::common;

use common::{constant, op, typed_param, Rng};
use kiln::backend::cpu::CpuBackend;
use kiln::backend::{backend_with, Device};
use kiln::ir::{text, Attr, Attrs, DType, Graph};
use kiln::passes::CompileOptions;
use kiln::Tensor;

/// The fallback off; no folding or fusing, so that each node is its own step.
fn options() -> CompileOptions {
    CompileOptions {
        allow_fallback: false,
        threads: 1,
        disabled: vec!["constant-fold".into(), "fuse-elementwise".into()],
        ..Default::default()
    }
}

/// `g` lowers with the fallback off to steps of `kinds` only (and at least one of
/// the first), and gives the interpreter's outputs exactly (their bytes).
fn check(g: &Graph, inputs: &[Tensor], kinds: &[&str]) {
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let exe = CpuBackend::new(options())
        .compile_cpu(g)
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)));
    let got_kinds: Vec<&str> = exe
        .step_report(&shapes)
        .unwrap()
        .iter()
        .map(|s| s.kind)
        .collect();
    assert!(
        got_kinds.contains(&kinds[0]) && got_kinds.iter().all(|k| kinds.contains(k)),
        "want {kinds:?} steps, got {got_kinds:?}\n{}",
        text::print(g)
    );
    let interp = backend_with(Device::Interp, options()).unwrap();
    let want = interp.compile(g).unwrap().run(inputs).unwrap();
    let cpu = backend_with(Device::Cpu, options()).unwrap();
    let got = cpu
        .compile(g)
        .unwrap()
        .run(inputs)
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)));
    for (i, (w, o)) in want.iter().zip(&got).enumerate() {
        assert_eq!(
            (o.dtype(), o.shape()),
            (w.dtype(), w.shape()),
            "output {i}\n{}",
            text::print(g)
        );
        assert!(
            same(o, w),
            "output {i}: got {o:?}, want {w:?}\n{}",
            text::print(g)
        );
    }
}

/// Whether `o` is `w` bit for bit, but for f32 denormals, which the CPU backend flushes
/// to zero (`backend/cpu/denormals.rs`).
fn same(o: &Tensor, w: &Tensor) -> bool {
    if o.to_le_bytes() == w.to_le_bytes() {
        return true;
    }
    let tiny = |v: f64| v.abs() < f64::from(f32::MIN_POSITIVE);
    o.dtype() == DType::F32
        && o.to_f64_vec()
            .iter()
            .zip(w.to_f64_vec())
            .all(|(&a, b)| a.to_bits() == b.to_bits() || (tiny(a) && tiny(b)))
}

/// Values of `dtype`: random ones and, for floats, the specials (±0, ±inf, NaN).
fn data(rng: &mut Rng, dtype: DType, dims: &[usize], scale: f64) -> Tensor {
    let n: usize = dims.iter().product();
    if dtype.is_int() || dtype == DType::Bool {
        return rng.tensor_of(dtype, dims);
    }
    let specials = [
        0.0,
        -0.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        1.0,
        -1.0,
    ];
    let v: Vec<f64> = (0..n)
        .map(|k| match specials.get(k.wrapping_sub(3)) {
            Some(&s) if n > 12 => s,
            _ => rng.uniform(-scale, scale),
        })
        .collect();
    Tensor::from_f64s(dtype, dims, &v).unwrap()
}

fn attr_f(pairs: &[(&str, f64)]) -> Attrs {
    pairs
        .iter()
        .fold(Attrs::new(), |a, (k, v)| a.with(k, Attr::Float(*v)))
}

/// Every float op with its attribute forms.
fn float_ops() -> Vec<(&'static str, Attrs)> {
    let plain = [
        "Neg",
        "Abs",
        "Sign",
        "Relu",
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Tanh",
        "Sigmoid",
        "Erf",
        "Sin",
        "Cos",
        "Tan",
        "Asin",
        "Acos",
        "Atan",
        "Sinh",
        "Cosh",
        "Asinh",
        "Acosh",
        "Atanh",
        "Floor",
        "Ceil",
        "Round",
        "Softplus",
        "Softsign",
        "Mish",
        "HardSwish",
        "LeakyRelu",
        "Elu",
        "Celu",
        "ThresholdedRelu",
        "Selu",
        "HardSigmoid",
        "Gelu",
        "Shrink",
    ];
    let mut ops: Vec<(&str, Attrs)> = plain.iter().map(|&o| (o, Attrs::new())).collect();
    ops.extend([
        ("LeakyRelu", attr_f(&[("alpha", 0.3)])),
        ("Elu", attr_f(&[("alpha", 0.5)])),
        ("Celu", attr_f(&[("alpha", 2.0)])),
        ("ThresholdedRelu", attr_f(&[("alpha", 0.25)])),
        ("Selu", attr_f(&[("alpha", 1.5), ("gamma", 2.0)])),
        ("HardSigmoid", attr_f(&[("alpha", 0.3), ("beta", 0.4)])),
        (
            "Gelu",
            Attrs::new().with("approximate", Attr::String("tanh".into())),
        ),
        ("Shrink", attr_f(&[("lambd", 1.0), ("bias", 0.25)])),
        ("Shrink", attr_f(&[("lambd", 0.0), ("bias", -1.5)])),
    ]);
    ops
}

/// The predicates with IsInf's flag combinations.
fn predicates() -> Vec<(&'static str, Attrs)> {
    let mut ops = vec![("IsNaN", Attrs::new()), ("IsInf", Attrs::new())];
    for (pos, neg) in [(1, 0), (0, 1), (0, 0)] {
        let a = Attrs::new()
            .with("detect_positive", Attr::Int(pos))
            .with("detect_negative", Attr::Int(neg));
        ops.push(("IsInf", a));
    }
    ops
}

/// Ops on f32 that the f32 elementwise paths do not take (the rest are theirs).
const F32_OPS: &[&str] = &[
    "Sign", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
    "Shrink",
];

const SHAPES: &[&[usize]] = &[&[3, 5, 2], &[], &[0, 3], &[1, 1]];

/// The float ops and predicates on every float dtype and shape, from data in and
/// beyond the ops' domains (NaN where the op is undefined, compared bit for bit).
#[test]
fn float_ops_and_predicates_on_every_float_dtype() {
    let mut rng = Rng(11);
    for dtype in [DType::F64, DType::F16, DType::BF16, DType::F32] {
        for dims in SHAPES {
            let mut g = Graph::new("unary");
            let x = typed_param(&mut g, "x", dtype, dims);
            let ops = float_ops()
                .into_iter()
                .filter(|(o, _)| dtype != DType::F32 || F32_OPS.contains(o));
            for (k, (name, attrs)) in ops.chain(predicates()).enumerate() {
                let y = op(&mut g, name, &[x], attrs);
                g.add_output(&format!("y{k}_{name}"), y).unwrap();
            }
            let inputs = [data(&mut rng, dtype, dims, 3.0)];
            check(&g, &inputs, &["unary-elem", "float-class"]);
        }
    }
}

/// Chains of ops whose outputs the planner puts in their input's buffer.
#[test]
fn chains_run_in_place() {
    let mut rng = Rng(12);
    for dtype in [DType::F16, DType::F64, DType::I32] {
        let mut g = Graph::new("chain");
        let x = typed_param(&mut g, "x", dtype, &[4, 33]);
        let mut v = op(&mut g, "Neg", &[x], Attrs::new());
        let chain: &[&str] = if dtype.is_int() {
            &["Abs", "BitwiseNot", "Sign", "Relu"]
        } else {
            &["Sin", "Exp", "Atan", "Celu", "Shrink"]
        };
        for name in chain {
            v = op(&mut g, name, &[v], Attrs::new());
        }
        g.add_output("y", v).unwrap();
        let inputs = [data(&mut rng, dtype, &[4, 33], 2.0)];
        let kind = if dtype.is_int() {
            "unary-int"
        } else {
            "unary-elem"
        };
        check(&g, &inputs, &[kind, "unary-int"]);
    }
}

/// The integer forms (Neg, Abs, Sign, Relu on signed types; Abs, Sign on unsigned),
/// BitwiseNot on every integer, Not on bool, Shrink on integers (through f64).
#[test]
fn integer_forms() {
    let mut rng = Rng(13);
    let ints = [
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
    ];
    for dtype in ints {
        for dims in SHAPES {
            let mut g = Graph::new("int");
            let x = typed_param(&mut g, "x", dtype, dims);
            let mut names = vec!["Abs", "Sign", "BitwiseNot"];
            if dtype.to_string().starts_with('i') {
                names.extend(["Neg", "Relu"]);
            }
            for name in names {
                let y = op(&mut g, name, &[x], Attrs::new());
                g.add_output(&format!("y_{name}"), y).unwrap();
            }
            let s = op(
                &mut g,
                "Shrink",
                &[x],
                attr_f(&[("lambd", 10.0), ("bias", 3.0)]),
            );
            g.add_output("shrink", s).unwrap();
            check(
                &g,
                &[rng.tensor_of(dtype, dims)],
                &["unary-int", "unary-elem"],
            );
        }
    }
    let mut g = Graph::new("not");
    let x = typed_param(&mut g, "x", DType::Bool, &[3, 4]);
    let y = op(&mut g, "Not", &[x], Attrs::new());
    g.add_output("y", y).unwrap();
    check(&g, &[rng.tensor_of(DType::Bool, &[3, 4])], &["unary-int"]);
}

/// Every dtype with an element type.
const ALL: [DType; 23] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I8,
    DType::U8,
    DType::I16,
    DType::U16,
    DType::I32,
    DType::U32,
    DType::I64,
    DType::U64,
    DType::Bool,
    DType::F8E4M3FN,
    DType::F8E4M3FNUZ,
    DType::F8E5M2,
    DType::F8E5M2FNUZ,
    DType::F8E8M0,
    DType::F4E2M1,
    DType::I4,
    DType::U4,
    DType::I2,
    DType::U2,
];

fn cast_attrs(to: DType) -> Attrs {
    Attrs::new().with("to", Attr::String(to.to_string()))
}

/// Cast and CastLike between every pair of dtypes, from random values and, from the
/// floats, specials and values out of the small formats' range.
#[test]
fn casts_between_every_pair() {
    let mut rng = Rng(14);
    for from in ALL {
        for dims in [&[4usize, 6][..], &[]] {
            let mut g = Graph::new("cast");
            let x = typed_param(&mut g, "x", from, dims);
            for to in ALL {
                let y = op(&mut g, "Cast", &[x], cast_attrs(to));
                g.add_output(&format!("cast_{to}"), y).unwrap();
                let t = typed_param(&mut g, &format!("t_{to}"), to, &[2]);
                let y = op(&mut g, "CastLike", &[x, t], Attrs::new());
                g.add_output(&format!("like_{to}"), y).unwrap();
            }
            let mut inputs = vec![data(&mut rng, from, dims, 600.0)];
            inputs.extend(ALL.map(|to| rng.tensor_of(to, &[2])));
            check(&g, &inputs, &["cast"]);
        }
    }
}

/// Cast into float8 with `saturate = 0` and into e8m0 under every rounding mode, from
/// f32, f16 and f64 values in and out of range.
#[test]
fn float8_casts_without_saturation_and_e8m0_rounding() {
    let mut rng = Rng(15);
    for from in [DType::F32, DType::F16, DType::F64, DType::I32] {
        let mut g = Graph::new("f8");
        let x = typed_param(&mut g, "x", from, &[40]);
        let targets = [
            DType::F8E4M3FN,
            DType::F8E4M3FNUZ,
            DType::F8E5M2,
            DType::F8E5M2FNUZ,
            DType::F8E8M0,
        ];
        for to in targets {
            for saturate in [0, 1] {
                for mode in ["up", "down", "nearest"] {
                    let a = cast_attrs(to)
                        .with("saturate", Attr::Int(saturate))
                        .with("round_mode", Attr::String(mode.into()));
                    let y = op(&mut g, "Cast", &[x], a);
                    g.add_output(&format!("y_{to}_{saturate}_{mode}"), y)
                        .unwrap();
                }
            }
        }
        let inputs = [data(&mut rng, from, &[40], 70000.0)];
        check(&g, &inputs, &["cast"]);
    }
}

/// Casts from constants: their bytes store int4/int2 as the low bits only.
#[test]
fn casts_from_low_bit_constants() {
    for from in [
        DType::I4,
        DType::I2,
        DType::U4,
        DType::F4E2M1,
        DType::F8E5M2,
    ] {
        let mut g = Graph::new("const");
        let v: Vec<f64> = (-8..8).map(f64::from).collect();
        let c = constant(&mut g, Tensor::from_f64s(from, &[16], &v).unwrap());
        for to in [DType::F32, DType::I8, DType::F16, DType::I4] {
            if to == from {
                continue;
            }
            let y = op(&mut g, "Cast", &[c], cast_attrs(to));
            g.add_output(&format!("y_{to}"), y).unwrap();
        }
        check(&g, &[], &["cast"]);
    }
}

/// BitCast between dtypes of equal size, the checked ones (into bool and the low-bit
/// types) included, and a byte that is no bool as a run error.
#[test]
fn bitcasts() {
    let mut rng = Rng(16);
    let pairs = [
        (DType::F32, DType::I32),
        (DType::I32, DType::F32),
        (DType::U32, DType::I32),
        (DType::F64, DType::I64),
        (DType::I64, DType::F64),
        (DType::F16, DType::BF16),
        (DType::U16, DType::I16),
        (DType::I8, DType::U8),
        (DType::Bool, DType::U8),
        (DType::I4, DType::U8),
        (DType::I2, DType::I8),
        (DType::F8E4M3FN, DType::U8),
        (DType::F8E5M2, DType::F8E4M3FN),
        (DType::U4, DType::I4),
        (DType::Bool, DType::Bool),
    ];
    for (from, to) in pairs {
        for dims in [&[3usize, 4][..], &[], &[0]] {
            let mut g = Graph::new("bitcast");
            let x = typed_param(&mut g, "x", from, dims);
            let y = op(&mut g, "BitCast", &[x], cast_attrs(to));
            g.add_output("y", y).unwrap();
            check(&g, &[rng.tensor_of(from, dims)], &["bitcast"]);
        }
    }
    let mut g = Graph::new("bad");
    let x = typed_param(&mut g, "x", DType::U8, &[3]);
    let y = op(&mut g, "BitCast", &[x], cast_attrs(DType::Bool));
    g.add_output("y", y).unwrap();
    let ok = Tensor::from_vec(&[3], vec![0u8, 1, 1]).unwrap();
    check(&g, std::slice::from_ref(&ok), &["bitcast"]);
    let bad = Tensor::from_vec(&[3], vec![0u8, 7, 1]).unwrap();
    let cpu = backend_with(Device::Cpu, options()).unwrap();
    let err = cpu.compile(&g).unwrap().run(&[bad]).unwrap_err();
    assert!(err.to_string().contains("not a bool"), "{err}");
}
