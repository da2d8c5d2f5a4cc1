//! The op × dtype coverage matrix of the `cpu` backend, generated from the catalogue: for
//! every op, every dtype column, and every form its generator makes (shapes of ranks 0–6,
//! size-1 and empty dims, broadcasting, negative axes, attribute variants), a one-op graph
//! is built; where the catalogue accepts it, it is compiled on `cpu` with the fallback off
//! (`allow-fallback = 0`) and run against the reference interpreter at the dtype's
//! tolerance. An op without a generator says so in its row.
//!
//! The table lands in STATUS.md between the `op-matrix` markers; this test fails when
//! the code's matrix differs from it (`BLESS=1 cargo test --test it op_matrix::` rewrites
//! it), so a cell that gets worse cannot land unseen.
use crate::common::{self, Rng};

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kiln::backend::cpu::CpuBackend;
use kiln::backend::interp::InterpExecutable;
use kiln::backend::Executable;
use kiln::ir::ops::{catalogue, Op, Origin};
use kiln::ir::{Attr, Attrs, DType, Graph, Shape, TensorType, Value};
use kiln::passes::CompileOptions;
use kiln::Tensor;

/// The matrix's columns.
const DTYPES: [DType; 13] = [
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
];

/// One operand of a generated case.
#[derive(Clone)]
enum In {
    /// A run-time input of the column's dtype and this shape.
    X(Vec<usize>),
    /// A run-time input of another dtype.
    T(DType, Vec<usize>),
    /// A constant (shape and axis operands, which inference reads).
    C(Tensor),
    /// An omitted optional input.
    Absent,
}

/// One generated case: operands and attributes, and a label for reports.
struct Form {
    ins: Vec<In>,
    attrs: Attrs,
    label: String,
}

fn form(label: impl Into<String>, ins: Vec<In>, attrs: Attrs) -> Form {
    Form {
        ins,
        attrs,
        label: label.into(),
    }
}

fn x(dims: &[usize]) -> In {
    In::X(dims.to_vec())
}

fn i64s(v: &[i64]) -> In {
    In::C(Tensor::from_vec(&[v.len()], v.to_vec()).unwrap())
}

fn int(k: &str, v: i64) -> Attrs {
    Attrs::new().with(k, Attr::Int(v))
}

/// Shapes a one-input elementwise op is tried on: ranks 0, 1, 3 and 6, an empty dim.
const UNARY_SHAPES: [&[usize]; 5] = [&[2, 3, 4], &[], &[1], &[0, 5], &[1, 2, 1, 3, 1, 2]];

/// Operand shapes a two-input elementwise op is tried on: equal, trailing and two-sided
/// broadcasting, a scalar operand, an empty dim, rank 6.
const BINARY_SHAPES: [(&[usize], &[usize]); 6] = [
    (&[2, 3, 4], &[2, 3, 4]),
    (&[2, 3, 4], &[4]),
    (&[2, 1, 4], &[3, 1]),
    (&[], &[2, 3]),
    (&[0, 3], &[1, 3]),
    (&[1, 2, 1, 2, 1, 2], &[2, 1, 2, 1, 2, 1]),
];

/// The cases of `op` in the column `dtype`, or `None` when the op has no generator (the
/// reason says why).
fn forms(op: &dyn Op) -> Result<Vec<Form>, &'static str> {
    let s = op.schema();
    let name = s.name;
    let required = s.inputs.iter().filter(|i| !i.ends_with('?')).count();
    let variadic = s.inputs.iter().any(|i| i.ends_with("..."));
    let elementwise = matches!(s.family, "elementwise" | "bitwise");
    Ok(match name {
        "Cast" => DTYPES
            .iter()
            .map(|to| {
                let a = Attrs::new().with("to", Attr::String(to.to_string()));
                form(format!("to {to}"), vec![x(&[2, 3, 4])], a)
            })
            .collect(),
        "CastLike" => DTYPES
            .iter()
            .map(|&to| {
                let ins = vec![x(&[2, 3, 4]), In::T(to, vec![1])];
                form(format!("like {to}"), ins, Attrs::new())
            })
            .collect(),
        "BitShift" => ["LEFT", "RIGHT"]
            .iter()
            .flat_map(|d| {
                BINARY_SHAPES.iter().map(move |(a, b)| {
                    let attrs = Attrs::new().with("direction", Attr::String(d.to_string()));
                    form(format!("{d} {a:?} {b:?}"), vec![x(a), x(b)], attrs)
                })
            })
            .collect(),
        "Mod" => [0, 1]
            .iter()
            .flat_map(|&fmod| {
                BINARY_SHAPES.iter().map(move |(a, b)| {
                    form(
                        format!("fmod {fmod} {a:?} {b:?}"),
                        vec![x(a), x(b)],
                        int("fmod", fmod),
                    )
                })
            })
            .collect(),
        "Where" => BINARY_SHAPES
            .iter()
            .map(|(a, b)| {
                let ins = vec![In::T(DType::Bool, a.to_vec()), x(a), x(b)];
                form(format!("{a:?} {b:?}"), ins, Attrs::new())
            })
            .collect(),
        "Clip" => vec![
            form("no bounds", vec![x(&[2, 3, 4])], Attrs::new()),
            form(
                "min, max",
                vec![x(&[2, 3, 4]), x(&[]), x(&[])],
                Attrs::new(),
            ),
            form(
                "max only",
                vec![x(&[2, 3]), In::Absent, x(&[])],
                Attrs::new(),
            ),
            form("rank 0", vec![x(&[]), x(&[]), x(&[])], Attrs::new()),
        ],
        "PRelu" => [
            (&[2, 3, 4, 4][..], &[3, 1, 1][..]),
            (&[2, 3, 4][..], &[1][..]),
            (&[2, 3, 4][..], &[2, 3, 4][..]),
            (&[5][..], &[5][..]),
        ]
        .iter()
        .map(|(a, b)| form(format!("{a:?} slope {b:?}"), vec![x(a), x(b)], Attrs::new()))
        .collect(),
        "ReduceL1" | "ReduceL2" | "ReduceLogSum" | "ReduceLogSumExp" | "ReduceMax"
        | "ReduceMean" | "ReduceMin" | "ReduceProd" | "ReduceSum" | "ReduceSumSquare" => {
            let mut v = vec![
                form("all axes", vec![x(&[2, 3, 4])], Attrs::new()),
                form("axes [1]", vec![x(&[2, 3, 4]), i64s(&[1])], Attrs::new()),
                form(
                    "axes [-1], keepdims 0",
                    vec![x(&[2, 3, 4]), i64s(&[-1])],
                    int("keepdims", 0),
                ),
                form(
                    "axes [0, 2]",
                    vec![x(&[2, 3, 4]), i64s(&[0, 2])],
                    Attrs::new(),
                ),
                form("rank 0", vec![x(&[])], Attrs::new()),
                form(
                    "rank 6, axes [-2]",
                    vec![x(&[1, 2, 1, 2, 3, 2]), i64s(&[-2])],
                    Attrs::new(),
                ),
                form(
                    "no axes, noop_with_empty_axes",
                    vec![x(&[2, 3])],
                    int("noop_with_empty_axes", 1),
                ),
            ];
            if !matches!(
                name,
                "ReduceMax" | "ReduceMin" | "ReduceLogSum" | "ReduceLogSumExp"
            ) {
                v.push(form(
                    "empty dim reduced",
                    vec![x(&[0, 3]), i64s(&[0])],
                    Attrs::new(),
                ));
            }
            v
        }
        "ArgMax" | "ArgMin" => vec![
            form("axis 0", vec![x(&[3, 4])], Attrs::new()),
            form(
                "axis -1, keepdims 0",
                vec![x(&[2, 3, 4])],
                int("axis", -1).with("keepdims", Attr::Int(0)),
            ),
            form(
                "select_last_index",
                vec![x(&[2, 5])],
                int("axis", 1).with("select_last_index", Attr::Int(1)),
            ),
            form("rank 1", vec![x(&[7])], Attrs::new()),
        ],
        "Softmax" | "LogSoftmax" | "Hardmax" => vec![
            form("axis -1", vec![x(&[2, 3, 5])], Attrs::new()),
            form("axis 1", vec![x(&[2, 3, 5])], int("axis", 1)),
            form("axis 0, rank 1", vec![x(&[6])], int("axis", 0)),
            form("size-1 axis", vec![x(&[4, 1])], Attrs::new()),
        ],
        "CumSum" | "CumProd" => [(0, 0), (1, 0), (0, 1), (1, 1)]
            .iter()
            .flat_map(|&(excl, rev)| {
                [
                    (0i64, &[5usize][..]),
                    (1, &[2, 3, 4][..]),
                    (-1, &[2, 3, 4][..]),
                ]
                .map(move |(axis, shape)| {
                    let a = int("exclusive", excl).with("reverse", Attr::Int(rev));
                    let ins = vec![x(shape), In::C(Tensor::scalar(axis))];
                    form(
                        format!("axis {axis} exclusive {excl} reverse {rev}"),
                        ins,
                        a,
                    )
                })
            })
            .collect(),
        "Transpose" => vec![
            form("default perm", vec![x(&[2, 3, 4])], Attrs::new()),
            form(
                "perm 0 2 1",
                vec![x(&[2, 3, 4])],
                common::ints(&[("perm", &[0, 2, 1])]),
            ),
            form(
                "rank 6",
                vec![x(&[1, 2, 3, 1, 2, 2])],
                common::ints(&[("perm", &[5, 4, 3, 2, 1, 0])]),
            ),
            form("empty dim", vec![x(&[0, 3])], Attrs::new()),
        ],
        "Trilu" => [0i64, 1]
            .iter()
            .flat_map(|&upper| {
                [
                    (&[4usize, 5][..], 0i64),
                    (&[2, 3, 3][..], 1),
                    (&[5, 3][..], -1),
                ]
                .map(move |(shape, k)| {
                    let ins = vec![x(shape), In::C(Tensor::scalar(k))];
                    form(
                        format!("upper {upper} k {k} {shape:?}"),
                        ins,
                        int("upper", upper),
                    )
                })
            })
            .collect(),
        "Identity" | "Abs" | "Neg" | "Sign" | "Not" | "BitwiseNot" | "IsNaN" | "IsInf"
        | "Floor" | "Ceil" | "Round" | "Relu"
            if required == 1 =>
        {
            unary_forms()
        }
        _ if elementwise && variadic => {
            let mut v = vec![form("one operand", vec![x(&[2, 3])], Attrs::new())];
            v.extend(
                BINARY_SHAPES
                    .iter()
                    .map(|(a, b)| form(format!("{a:?} {b:?}"), vec![x(a), x(b)], Attrs::new())),
            );
            v.push(form(
                "three operands",
                vec![x(&[2, 3, 4]), x(&[4]), x(&[3, 1])],
                Attrs::new(),
            ));
            v
        }
        _ if elementwise && required == 1 => unary_forms(),
        _ if elementwise && required == 2 => BINARY_SHAPES
            .iter()
            .map(|(a, b)| form(format!("{a:?} {b:?}"), vec![x(a), x(b)], Attrs::new()))
            .collect(),
        _ => return Err("no generator yet"),
    })
}

fn unary_forms() -> Vec<Form> {
    UNARY_SHAPES
        .iter()
        .map(|s| form(format!("{s:?}"), vec![x(s)], Attrs::new()))
        .collect()
}

/// Ops the matrix leaves out, with the reason its row gives.
fn left_out(op: &dyn Op) -> Option<&'static str> {
    let s = op.schema();
    if matches!(s.name, "Parameter" | "Constant" | "Variable" | "Assign") {
        return Some("a source or a store: a slot, not a step");
    }
    if s.origin == Origin::Kiln && matches!(s.family, "fused" | "layout") {
        return Some("made by the passes: covered through the ops they fuse");
    }
    None
}

/// Test data of `dtype` suited to `op`'s domain (positive where a log or root needs it,
/// inside ±1 for the inverse trigonometric ops, no zero divisors).
fn data(rng: &mut Rng, op: &str, k: usize, dtype: DType, dims: &[usize]) -> Tensor {
    let n: usize = dims.iter().product();
    let (lo, hi) = match op {
        "Acosh" => (1.0, 3.0),
        "Acos" | "Asin" | "Atanh" => (-0.9, 0.9),
        "Log" | "Sqrt" | "ReduceLogSum" | "ReduceL2" => (0.1, 3.0),
        "Pow" if k == 0 => (0.5, 2.0),
        "Pow" => (-2.0, 2.0),
        "ReduceProd" | "CumProd" => (0.5, 1.5),
        _ => (-2.0, 2.0),
    };
    if dtype == DType::Bool || !(dtype.is_int() || dtype.is_float()) {
        return rng.tensor_of(dtype, dims);
    }
    if dtype.is_int() {
        let divisor = matches!(op, "Div" | "Mod") && k == 1;
        let v: Vec<i64> = (0..n)
            .map(|_| match op {
                _ if divisor => (1 + rng.below(9) as i64) * if rng.below(2) == 0 { 1 } else { -1 },
                "Pow" if k == 1 => rng.below(4) as i64,
                "Pow" | "ReduceProd" | "CumProd" => rng.below(7) as i64 - 3,
                "BitShift" if k == 1 => rng.below(8) as i64,
                _ => (rng.next_u64() % 201) as i64 - 100,
            })
            .collect();
        return Tensor::from_i64s(dtype, dims, &v).unwrap();
    }
    let v: Vec<f64> = (0..n).map(|_| rng.uniform(lo, hi)).collect();
    Tensor::from_f64s(dtype, dims, &v).unwrap()
}

/// The outcome of one cell.
#[derive(Default)]
struct Cell {
    /// Forms the catalogue accepted, and of those, forms that compiled to kernels and
    /// agreed with the interpreter.
    accepted: usize,
    passed: usize,
    /// The first form that ran on no kernel, or disagreed: (label, reason).
    no_kernel: Option<(String, String)>,
    wrong: Option<(String, String)>,
}

impl Cell {
    fn mark(&self) -> &'static str {
        match self {
            Cell { accepted: 0, .. } => "·",
            Cell { wrong: Some(_), .. } => "≠",
            Cell {
                no_kernel: Some(_), ..
            } => "✘",
            _ => "✔",
        }
    }
}

/// Tolerance (absolute = relative) of a dtype's results.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        DType::F16 => 2e-3,
        DType::BF16 => 1e-2,
        DType::F64 => 1e-12,
        _ => 0.0,
    }
}

/// One form in one column: `None` when the catalogue refuses it.
fn run_form(op: &str, dtype: DType, f: &Form, rng: &mut Rng) -> Option<Result<(), (bool, String)>> {
    let mut g = Graph::new("matrix");
    let mut ins: Vec<Option<Value>> = vec![];
    let mut values = vec![];
    for (k, i) in f.ins.iter().enumerate() {
        let v = match i {
            In::X(dims) | In::T(_, dims) => {
                let d = if let In::T(d, _) = i { *d } else { dtype };
                values.push(data(rng, op, k, d, dims));
                let ty = TensorType::new(d, Shape::fixed(dims));
                Some(g.add_parameter(&format!("x{k}"), ty).ok()?.into())
            }
            In::C(t) => Some(common::constant(&mut g, t.clone())),
            In::Absent => None,
        };
        ins.push(v);
    }
    let id = g.add_op(op, &ins, f.attrs.clone(), "y").ok()?;
    for k in 0..g.node(id).outputs.len() {
        g.add_output(&format!("y{k}"), id.out(k as u32)).ok()?;
    }
    let want = InterpExecutable::new(g.clone()).ok()?.run(&values).ok()?;
    let cpu = CpuBackend::new(CompileOptions {
        threads: 1,
        allow_fallback: false,
        ..Default::default()
    });
    let shapes: Vec<Vec<usize>> = values.iter().map(|t| t.shape().to_vec()).collect();
    let outcome = (|| {
        let exe = cpu.compile_cpu(&g).map_err(|e| e.to_string())?;
        if let Some(s) = exe
            .step_report(&shapes)
            .map_err(|e| e.to_string())?
            .iter()
            .find(|s| s.is_fallback())
        {
            return Err(format!("{} runs on the {}", s.node, s.kind));
        }
        let got = exe.run(&values).map_err(|e| format!("run: {e}"))?;
        let tol = tolerance(dtype);
        for (k, (o, w)) in got.iter().zip(&want).enumerate() {
            o.check_close(w, tol, tol)
                .map_err(|e| format!("output {k}: {e}"))?;
        }
        Ok(())
    })();
    Some(outcome.map_err(|e| {
        let no_kernel = e.contains("no cpu kernel") || e.contains("runs on the");
        (no_kernel, e.lines().next().unwrap_or("").to_string())
    }))
}

/// The matrix as Markdown: a row per op, a column per dtype, then the first failing form
/// of each cell that is not ✔.
fn matrix() -> String {
    let mut rows = String::new();
    let mut gaps = String::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    let header: Vec<String> = DTYPES.iter().map(|d| d.to_string()).collect();
    writeln!(rows, "| op | {} |", header.join(" | ")).unwrap();
    writeln!(rows, "|---|{}", "---|".repeat(DTYPES.len())).unwrap();
    for (name, op) in catalogue() {
        if let Some(why) = left_out(*op) {
            *counts.entry("left out").or_default() += 1;
            writeln!(gaps, "- `{name}`: {why}").unwrap();
            continue;
        }
        let forms = match forms(*op) {
            Ok(f) => f,
            Err(why) => {
                *counts.entry("no generator").or_default() += 1;
                writeln!(gaps, "- `{name}`: {why}").unwrap();
                continue;
            }
        };
        let mut marks = vec![];
        for (c, &dtype) in DTYPES.iter().enumerate() {
            let mut rng = Rng(1 + c as u64);
            let mut cell = Cell::default();
            for f in &forms {
                let Some(outcome) = run_form(name, dtype, f, &mut rng) else {
                    continue;
                };
                cell.accepted += 1;
                match outcome {
                    Ok(()) => cell.passed += 1,
                    Err((true, e)) => {
                        cell.no_kernel.get_or_insert((f.label.clone(), e));
                    }
                    Err((false, e)) => {
                        cell.wrong.get_or_insert((f.label.clone(), e));
                    }
                }
            }
            let mark = cell.mark();
            *counts.entry(mark).or_default() += 1;
            if let Some((label, e)) = cell.wrong.as_ref().or(cell.no_kernel.as_ref()) {
                // The reason without its numbers, so that the record is stable.
                let e: String = e.chars().take(160).collect();
                writeln!(gaps, "- `{name}` {dtype} {mark} ({label}): {e}").unwrap();
            }
            marks.push(mark);
        }
        writeln!(rows, "| `{name}` | {} |", marks.join(" | ")).unwrap();
    }
    let summary: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    format!(
        "Cells: {}. ✔ every generated form compiled to kernels and agreed with the \
         interpreter; ✘ some form has no kernel; ≠ some form disagreed; · the catalogue \
         accepts no form of that dtype.\n\n{rows}\nWhat is not ✔, with its first failing form:\n\n{gaps}",
        summary.join(", ")
    )
}

const BEGIN: &str = "<!-- op-matrix: generated by tests/op_matrix.rs; BLESS=1 rewrites it -->\n";
const END: &str = "<!-- op-matrix end -->";

#[test]
fn op_matrix_is_as_status_records() {
    let got = matrix();
    let path = common::root().join("STATUS.md");
    let status = std::fs::read_to_string(&path).unwrap();
    let (Some(at), Some(end)) = (status.find(BEGIN), status.find(END)) else {
        panic!("STATUS.md has no op-matrix markers");
    };
    let recorded = &status[at + BEGIN.len()..end];
    if recorded == got {
        return;
    }
    if std::env::var_os("BLESS").is_some() {
        let new = format!("{}{BEGIN}{got}{}", &status[..at], &status[end..]);
        std::fs::write(&path, new).unwrap();
        return;
    }
    let diff: Vec<String> = got
        .lines()
        .filter(|l| !recorded.lines().any(|r| r == *l))
        .take(20)
        .map(str::to_string)
        .collect();
    panic!(
        "the op matrix differs from STATUS.md's (BLESS=1 cargo test --test it op_matrix:: rewrites it); new lines:\n{}",
        diff.join("\n")
    );
}
