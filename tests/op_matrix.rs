//! The op × dtype coverage matrix of the `cpu` backend, generated from the catalogue: for
//! every op, every dtype column, and every form its generator makes (shapes of ranks 0–6,
//! size-1 and empty dims, broadcasting, negative axes, attribute variants), a one-op graph
//! is built; where the catalogue accepts it, it is compiled on `cpu` with the fallback off
//! (`allow-fallback = 0`) and run against the reference interpreter at the dtype's
//! tolerance. An op without a generator says so in its row.
//!
//! The table lands in STATUS.md between the `op-matrix` markers; this test fails when
//! the code's matrix differs from it (`BLESS=1 cargo test --test it op_matrix::` rewrites
//! it), so a cell that gets worse cannot land unseen. `OP_MATRIX_SHOW=<op>` prints the
//! outcome of each of that op's forms.
use crate::common::{self, Rng};

#[path = "op_matrix/host.rs"]
mod host;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kiln::backend::cpu::CpuBackend;
use kiln::backend::interp::InterpExecutable;
use kiln::backend::Executable;
use kiln::ir::ops::{catalogue, Op, Origin};
use kiln::ir::{Attr, Attrs, Container, DType, Dim, Graph, Shape, TensorType, Value};
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
    /// A run-time input of the column's dtype with named axes (name, size).
    Named(Vec<(&'static str, usize)>),
    /// A run-time input of another dtype.
    T(DType, Vec<usize>),
    /// A run-time integer input (indices) of this dtype and shape, in `lo..hi`.
    I(DType, Vec<usize>, i64, i64),
    /// A constant (shape and axis operands, which inference reads).
    C(Tensor),
    /// An omitted optional input.
    Absent,
    /// A run-time sequence of tensors of the column's dtype, of these shapes.
    Seq(Vec<Vec<usize>>),
    /// A run-time optional of the column's dtype: full (of this shape) or empty.
    Opt(Option<Vec<usize>>),
    /// A run-time tensor of short words (strings have no column: shown under f32).
    Str(Vec<usize>),
}

/// One generated case: operands and attributes, and a label for reports.
struct Form {
    ins: Vec<In>,
    attrs: Attrs,
    label: String,
    /// How many of the node's outputs the graph returns (the rest are dead).
    outputs: usize,
    /// Attributes that depend on the column's dtype (control-flow bodies).
    typed_attrs: Option<fn(DType) -> Attrs>,
}

fn form(label: impl Into<String>, ins: Vec<In>, attrs: Attrs) -> Form {
    Form {
        ins,
        attrs,
        label: label.into(),
        outputs: usize::MAX,
        typed_attrs: None,
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
        "Conv" => conv_forms(),
        "MaxPool" | "AveragePool" | "LpPool" => pool_forms(name),
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => vec![
            form("2-D", vec![x(&[2, 3, 5, 4])], Attrs::new()),
            form("1-D", vec![x(&[1, 4, 7])], Attrs::new()),
            form("3-D", vec![x(&[1, 2, 3, 2, 2])], Attrs::new()),
        ],
        "MatMul" => [
            (&[3, 4][..], &[4, 5][..]),
            (&[2, 3, 4][..], &[4, 5][..]),
            (&[2, 1, 3, 4][..], &[3, 4, 2][..]),
            (&[4][..], &[4, 3][..]),
            (&[2, 3, 4][..], &[4][..]),
            (&[0, 4][..], &[4, 3][..]),
        ]
        .iter()
        .map(|(a, b)| form(format!("{a:?} × {b:?}"), vec![x(a), x(b)], Attrs::new()))
        .collect(),
        "Gemm" => {
            let mut v = vec![];
            for (ta, tb) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                let a = if ta == 1 { vec![4, 3] } else { vec![3, 4] };
                let b = if tb == 1 { vec![5, 4] } else { vec![4, 5] };
                let at = int("transA", ta).with("transB", Attr::Int(tb));
                v.push(form(
                    format!("transA {ta} transB {tb}"),
                    vec![In::X(a), In::X(b)],
                    at,
                ));
            }
            let ab = Attrs::new()
                .with("alpha", Attr::Float(0.5))
                .with("beta", Attr::Float(2.0));
            for c in [&[5usize][..], &[3, 5][..], &[1][..], &[3, 1][..]] {
                v.push(form(
                    format!("alpha, beta, C {c:?}"),
                    vec![x(&[3, 4]), x(&[4, 5]), x(c)],
                    ab.clone(),
                ));
            }
            v
        }
        "Gather" => [
            (0i64, &[4usize, 3][..]),
            (1, &[2, 5, 3][..]),
            (-1, &[3, 4][..]),
        ]
        .iter()
        .flat_map(|&(axis, shape)| {
            let n = shape[axis.rem_euclid(shape.len() as i64) as usize] as i64;
            [
                form(
                    format!("axis {axis}, run-time indices"),
                    vec![x(shape), In::I(DType::I64, vec![2, 2], -n, n)],
                    int("axis", axis),
                ),
                form(
                    format!("axis {axis}, scalar index"),
                    vec![x(shape), In::C(Tensor::scalar(n - 1))],
                    int("axis", axis),
                ),
                form(
                    format!("axis {axis}, i32 indices"),
                    vec![x(shape), In::I(DType::I32, vec![3], 0, n)],
                    int("axis", axis),
                ),
            ]
        })
        .collect(),
        "GatherElements" => vec![
            form(
                "axis 0",
                vec![x(&[3, 4]), In::I(DType::I64, vec![2, 4], -3, 3)],
                Attrs::new(),
            ),
            form(
                "axis -1",
                vec![x(&[2, 3, 4]), In::I(DType::I64, vec![2, 3, 2], 0, 4)],
                int("axis", -1),
            ),
        ],
        "GatherND" => vec![
            form(
                "batch_dims 0",
                vec![x(&[3, 4, 2]), In::I(DType::I64, vec![5, 2], 0, 3)],
                Attrs::new(),
            ),
            form(
                "whole slices",
                vec![x(&[3, 4]), In::I(DType::I64, vec![2, 1], -3, 3)],
                Attrs::new(),
            ),
            form(
                "batch_dims 1",
                vec![x(&[2, 3, 4]), In::I(DType::I64, vec![2, 1, 2], 0, 3)],
                int("batch_dims", 1),
            ),
        ],
        "ScatterElements" => ["none", "add", "mul", "max", "min"]
            .iter()
            .flat_map(|r| {
                let a = |axis| int("axis", axis).with("reduction", Attr::String(r.to_string()));
                // Distinct indices along the axis, so that no reduction's order matters.
                let idx = Tensor::from_vec(&[2, 3], vec![2i64, 0, 1, 0, 1, 2]).unwrap();
                [
                    form(
                        format!("{r}, axis 0"),
                        vec![x(&[3, 3]), In::C(idx.clone()), x(&[2, 3])],
                        a(0),
                    ),
                    form(
                        format!("{r}, axis -1"),
                        vec![x(&[2, 4]), In::C(idx.clone()), x(&[2, 3])],
                        a(-1),
                    ),
                ]
            })
            .collect(),
        "ScatterND" => ["none", "add", "mul", "max", "min"]
            .iter()
            .map(|r| {
                let idx = Tensor::from_vec(&[2, 1], vec![2i64, 0]).unwrap();
                let a = Attrs::new().with("reduction", Attr::String(r.to_string()));
                form(
                    format!("{r}, rows"),
                    vec![x(&[4, 3]), In::C(idx), x(&[2, 3])],
                    a,
                )
            })
            .collect(),
        "Concat" => vec![
            form("axis 0", vec![x(&[2, 3]), x(&[1, 3])], int("axis", 0)),
            form(
                "axis -1, three",
                vec![x(&[2, 3]), x(&[2, 1]), x(&[2, 2])],
                int("axis", -1),
            ),
            form("empty part", vec![x(&[2, 3]), x(&[0, 3])], int("axis", 0)),
            form("one input", vec![x(&[4])], int("axis", 0)),
        ],
        "Split" => vec![
            form(
                "even, 2 outputs",
                vec![x(&[4, 3])],
                int("axis", 0).with("num_outputs", Attr::Int(2)),
            ),
            form(
                "sizes, axis -1",
                vec![x(&[2, 5]), i64s(&[2, 3])],
                int("axis", -1),
            ),
        ],
        "Slice" => vec![
            form(
                "starts, ends",
                vec![x(&[5, 4]), i64s(&[1]), i64s(&[4])],
                Attrs::new(),
            ),
            form(
                "negative step",
                vec![
                    x(&[5, 4]),
                    i64s(&[-1]),
                    i64s(&[-6]),
                    i64s(&[1]),
                    i64s(&[-2]),
                ],
                Attrs::new(),
            ),
            form(
                "clamped, two axes",
                vec![
                    x(&[3, 4, 5]),
                    i64s(&[0, 1]),
                    i64s(&[100, -1]),
                    i64s(&[0, 2]),
                ],
                Attrs::new(),
            ),
            form(
                "empty result",
                vec![x(&[5]), i64s(&[3]), i64s(&[3])],
                Attrs::new(),
            ),
        ],
        "Pad" => ["constant", "reflect", "edge", "wrap"]
            .iter()
            .flat_map(|m| {
                let a = Attrs::new().with("mode", Attr::String(m.to_string()));
                [
                    form(
                        m.to_string(),
                        vec![x(&[3, 4]), i64s(&[1, 2, 0, 1])],
                        a.clone(),
                    ),
                    form(
                        format!("{m}, negative"),
                        vec![x(&[3, 4]), i64s(&[0, -1, 1, 0])],
                        a.clone(),
                    ),
                ]
            })
            .collect(),
        "Tile" => vec![
            form("2×1", vec![x(&[2, 3]), i64s(&[2, 1])], Attrs::new()),
            form("rank 1", vec![x(&[3]), i64s(&[3])], Attrs::new()),
        ],
        "Expand" => vec![
            form("to 2×3×4", vec![x(&[3, 1]), i64s(&[2, 3, 4])], Attrs::new()),
            form("scalar", vec![x(&[]), i64s(&[2, 2])], Attrs::new()),
        ],
        "Reshape" => vec![
            form("-1", vec![x(&[2, 3, 4]), i64s(&[6, -1])], Attrs::new()),
            form("0 keeps", vec![x(&[2, 3, 4]), i64s(&[0, 12])], Attrs::new()),
        ],
        "Flatten" => vec![
            form("axis 1", vec![x(&[2, 3, 4])], Attrs::new()),
            form("axis -1", vec![x(&[2, 3, 4])], int("axis", -1)),
            form("axis 0", vec![x(&[2, 3])], int("axis", 0)),
        ],
        "Squeeze" => vec![
            form("all ones", vec![x(&[1, 3, 1])], Attrs::new()),
            form("axes -1", vec![x(&[2, 1]), i64s(&[-1])], Attrs::new()),
        ],
        "Unsqueeze" => vec![
            form("axes 0", vec![x(&[2, 3]), i64s(&[0])], Attrs::new()),
            form("axes -1, 1", vec![x(&[2, 3]), i64s(&[-1, 1])], Attrs::new()),
        ],
        "Shape" | "Size" => vec![
            form("rank 3", vec![x(&[2, 3, 4])], Attrs::new()),
            form("rank 0", vec![x(&[])], Attrs::new()),
        ],
        "TopK" => [(0, 1), (1, 1), (1, 0)]
            .iter()
            .map(|&(largest, sorted)| {
                let a = int("largest", largest)
                    .with("sorted", Attr::Int(sorted))
                    .with("axis", Attr::Int(-1));
                form(
                    format!("largest {largest} sorted {sorted}"),
                    vec![x(&[3, 6]), i64s(&[3])],
                    a,
                )
            })
            .collect(),
        "OneHot" => vec![form(
            "axis -1",
            vec![
                In::I(DType::I64, vec![2, 3], -4, 4),
                In::C(Tensor::scalar(4i64)),
                x(&[2]),
            ],
            Attrs::new(),
        )],
        "LayerNormalization" => vec![
            form(
                "axis -1",
                vec![x(&[2, 3, 4]), x(&[4]), x(&[4])],
                Attrs::new(),
            ),
            form(
                "axis 1, no bias",
                vec![x(&[2, 3, 4]), x(&[3, 4])],
                int("axis", 1),
            ),
        ],
        "InstanceNormalization" => vec![form(
            "2-D",
            vec![x(&[2, 3, 4, 4]), x(&[3]), x(&[3])],
            Attrs::new(),
        )],
        "BatchNormalization" => vec![form(
            "inference",
            vec![
                x(&[2, 3, 4, 4]),
                x(&[3]),
                x(&[3]),
                x(&[3]),
                In::C(Tensor::from_vec(&[3], vec![0.5f32, 1.0, 2.0]).unwrap()),
            ],
            Attrs::new(),
        )],
        "LpNormalization" => vec![
            form("p 2, axis -1", vec![x(&[3, 4])], Attrs::new()),
            form(
                "p 1, axis 0",
                vec![x(&[3, 4])],
                int("p", 1).with("axis", Attr::Int(0)),
            ),
        ],
        "Shrink" => vec![
            form("defaults", vec![x(&[2, 3, 4])], Attrs::new()),
            form(
                "lambd, bias",
                vec![x(&[2, 3, 4])],
                Attrs::new()
                    .with("lambd", Attr::Float(1.0))
                    .with("bias", Attr::Float(0.5)),
            ),
        ],
        // Start, limit and delta run-time scalars of the column's dtype (see `data`).
        "Range" => vec![form(
            "start, limit, delta",
            vec![x(&[]), x(&[]), x(&[])],
            Attrs::new(),
        )],
        "ConvTranspose" => vec![
            form(
                "2-D stride 2",
                vec![x(&[1, 2, 3, 3]), x(&[2, 3, 3, 3])],
                common::ints(&[("strides", &[2, 2])]),
            ),
            form(
                "pads, output_padding",
                vec![x(&[1, 2, 4, 4]), x(&[2, 2, 3, 3]), x(&[2])],
                common::ints(&[
                    ("strides", &[2, 2]),
                    ("pads", &[1, 1, 1, 1]),
                    ("output_padding", &[1, 1]),
                ]),
            ),
            form(
                "1-D groups 2",
                vec![x(&[1, 4, 5]), x(&[4, 1, 3])],
                int("group", 2),
            ),
            form(
                "auto_pad SAME_UPPER",
                vec![x(&[1, 1, 3, 3]), x(&[1, 1, 3, 3])],
                common::ints(&[("strides", &[2, 2])])
                    .with("auto_pad", Attr::String("SAME_UPPER".into())),
            ),
        ],
        "ConvInteger" => vec![
            form(
                "3×3",
                vec![x(&[1, 2, 5, 5]), x(&[3, 2, 3, 3])],
                Attrs::new(),
            ),
            form(
                "zero points",
                vec![x(&[1, 2, 4, 4]), x(&[2, 2, 2, 2]), x(&[]), x(&[])],
                Attrs::new(),
            ),
        ],
        "MatMulInteger" => vec![
            form("2-D", vec![x(&[3, 4]), x(&[4, 5])], Attrs::new()),
            form(
                "zero points, batched",
                vec![x(&[2, 3, 4]), x(&[4, 5]), x(&[]), x(&[])],
                Attrs::new(),
            ),
        ],
        "QuantizeLinear" => [DType::U8, DType::I8, DType::U16, DType::I16]
            .iter()
            .flat_map(|&z| {
                let zp = |dims: &[usize]| {
                    In::C(Tensor::from_i64s(z, dims, &vec![3; dims.iter().product()]).unwrap())
                };
                [
                    form(
                        format!("per-tensor → {z}"),
                        vec![x(&[2, 3, 4]), In::C(Tensor::scalar(0.05f32)), zp(&[])],
                        Attrs::new(),
                    ),
                    form(
                        format!("per-axis 1 → {z}"),
                        vec![
                            x(&[2, 3, 4]),
                            In::C(Tensor::from_vec(&[3], vec![0.05f32, 0.1, 0.2]).unwrap()),
                            zp(&[3]),
                        ],
                        Attrs::new(),
                    ),
                ]
            })
            .collect(),
        "DequantizeLinear" => vec![
            form(
                "per-tensor",
                vec![x(&[2, 3, 4]), In::C(Tensor::scalar(0.05f32)), x(&[])],
                Attrs::new(),
            ),
            form(
                "per-axis 1",
                vec![
                    x(&[2, 3, 4]),
                    In::C(Tensor::from_vec(&[3], vec![0.05f32, 0.1, 0.2]).unwrap()),
                    x(&[3]),
                ],
                Attrs::new(),
            ),
            form(
                "no zero point",
                vec![x(&[5]), In::C(Tensor::scalar(0.5f32))],
                Attrs::new(),
            ),
        ],
        "DynamicQuantizeLinear" => vec![form("2-D", vec![x(&[3, 5])], Attrs::new())],
        "Det" => vec![
            form("3×3", vec![x(&[3, 3])], Attrs::new()),
            form("batched 2×2", vec![x(&[4, 2, 2])], Attrs::new()),
        ],
        "Einsum" => [
            ("ij,jk->ik", &[&[3usize, 4][..], &[4, 5][..]][..]),
            ("bij,bjk->bik", &[&[2, 3, 4][..], &[2, 4, 2][..]][..]),
            ("ii->i", &[&[3, 3][..]][..]),
            ("ij->ji", &[&[2, 3][..]][..]),
            ("i,i->", &[&[4][..], &[4][..]][..]),
        ]
        .iter()
        .map(|(eq, shapes)| {
            let a = Attrs::new().with("equation", Attr::String(eq.to_string()));
            form(*eq, shapes.iter().map(|s| x(s)).collect(), a)
        })
        .collect(),
        "Dropout" => vec![
            form("inference", vec![x(&[2, 3])], Attrs::new()),
            form(
                "ratio, training off",
                vec![
                    x(&[2, 3]),
                    In::C(Tensor::scalar(0.5f32)),
                    In::C(Tensor::scalar(false)),
                ],
                Attrs::new(),
            ),
        ],
        "LRN" => vec![form("size 3", vec![x(&[1, 5, 3, 3])], int("size", 3))],
        "RMSNormalization" => vec![
            form("axis -1", vec![x(&[2, 3, 4]), x(&[4])], Attrs::new()),
            form("axis 1", vec![x(&[2, 3, 4]), x(&[3, 4])], int("axis", 1)),
        ],
        "ReverseSequence" => vec![form(
            "time 0, batch 1",
            vec![
                x(&[4, 3, 2]),
                In::C(Tensor::from_vec(&[3], vec![4i64, 1, 2]).unwrap()),
            ],
            Attrs::new(),
        )],
        "GridSample" => ["linear", "nearest", "cubic"]
            .iter()
            .flat_map(|m| {
                ["zeros", "border", "reflection"].map(move |p| {
                    let a = Attrs::new()
                        .with("mode", Attr::String(m.to_string()))
                        .with("padding_mode", Attr::String(p.into()));
                    form(
                        format!("{m}, {p}"),
                        vec![x(&[1, 2, 4, 4]), x(&[1, 3, 3, 2])],
                        a,
                    )
                })
            })
            .collect(),
        "NegativeLogLikelihoodLoss" => ["none", "sum", "mean"]
            .iter()
            .flat_map(|r| {
                let a = Attrs::new().with("reduction", Attr::String(r.to_string()));
                [
                    form(
                        r.to_string(),
                        vec![x(&[3, 5]), In::I(DType::I64, vec![3], 0, 5)],
                        a.clone(),
                    ),
                    form(
                        format!("{r}, weights, rank 3"),
                        vec![x(&[2, 4, 3]), In::I(DType::I64, vec![2, 3], 0, 4), x(&[4])],
                        a.clone(),
                    ),
                ]
            })
            .collect(),
        "SoftmaxCrossEntropyLoss" => ["none", "sum", "mean"]
            .iter()
            .map(|r| {
                let a = Attrs::new().with("reduction", Attr::String(r.to_string()));
                form(*r, vec![x(&[3, 5]), In::I(DType::I64, vec![3], 0, 5)], a)
            })
            .collect(),
        "MseLoss" => vec![form("mean", vec![x(&[3, 4]), x(&[3, 4])], Attrs::new())],
        // Run-time sizes: constant ones fold away and test no kernel.
        "ConstantOfShape" => vec![form(
            "run-time shape",
            vec![In::I(DType::I64, vec![2], 1, 4)],
            Attrs::new(),
        )],
        "CenterCropPad" => vec![form(
            "crop and pad",
            vec![x(&[4, 3]), i64s(&[2, 5])],
            Attrs::new(),
        )],
        "Resize" => ["nearest", "linear", "cubic"]
            .iter()
            .map(|m| {
                let a = Attrs::new().with("mode", Attr::String(m.to_string()));
                let scales = In::C(Tensor::from_vec(&[4], vec![1.0f32, 1.0, 2.0, 1.5]).unwrap());
                form(
                    format!("{m} ×2, ×1.5"),
                    vec![x(&[1, 2, 3, 4]), In::Absent, scales],
                    a,
                )
            })
            .collect(),
        "NonZero" => vec![form("2-D", vec![x(&[3, 4])], Attrs::new())],
        // An LSTM of hidden size 2 on constant int8 or uint8 weights, forward and both ways.
        "DynamicQuantizeLSTM" => [(false, "forward"), (true, "bidirectional")]
            .iter()
            .map(|&(unsigned, dir)| {
                let d = if dir == "bidirectional" { 2 } else { 1 };
                let ints = |dims: &[usize], seed: usize| {
                    let n: usize = dims.iter().product();
                    let v: Vec<i64> = (0..n)
                        .map(|i| ((i * 37 + seed) % 200) as i64 - 100)
                        .collect();
                    let (dt, v) = match unsigned {
                        true => (DType::U8, v.iter().map(|x| x + 128).collect()),
                        false => (DType::I8, v),
                    };
                    In::C(Tensor::from_i64s(dt, dims, &v).unwrap())
                };
                let zero = ints(&[d], 100);
                let scale = In::C(Tensor::from_vec(&[d], vec![0.004f32; d]).unwrap());
                let ins = vec![
                    x(&[4, 2, 3]),
                    ints(&[d, 3, 8], 1),
                    ints(&[d, 2, 8], 2),
                    In::Absent,
                    In::Absent,
                    In::Absent,
                    In::Absent,
                    In::Absent,
                    scale.clone(),
                    zero.clone(),
                    scale,
                    zero,
                ];
                let attrs = Attrs::new()
                    .with("direction", Attr::String(dir.into()))
                    .with("hidden_size", Attr::Int(2));
                let kind = if unsigned { "uint8" } else { "int8" };
                form(format!("{dir}, {kind} weights"), ins, attrs)
            })
            .collect(),
        // Numbers to numbers (string keys and values are the host program's); X drawn
        // from near the keys (see `data`), a key repeated (the first wins).
        "LabelEncoder" => vec![
            form(
                "int keys to floats",
                vec![x(&[2, 5])],
                Attrs::new()
                    .with("keys_int64s", Attr::Ints(vec![-2, 0, 3, 0]))
                    .with("values_floats", Attr::Floats(vec![0.5, 1.5, -4.0, 9.0]))
                    .with("default_float", Attr::Float(7.25)),
            ),
            form(
                "float keys to ints",
                vec![x(&[2, 5])],
                Attrs::new()
                    .with("keys_floats", Attr::Floats(vec![0.5, -1.0, 0.0, 2.0]))
                    .with("values_int64s", Attr::Ints(vec![10, 20, 30, 40]))
                    .with("default_int64", Attr::Int(-9)),
            ),
        ],
        // Constant sizes and rate, the edge frequencies run-time scalars (see `data`).
        "MelWeightMatrix" => ["f32", "f64", "i32"]
            .iter()
            .map(|&out| {
                let i = |v: i64| In::C(Tensor::scalar(v));
                form(
                    format!("8 mels, 16-point DFT, 8 kHz, into {out}"),
                    vec![i(8), i(16), i(8000), x(&[]), x(&[])],
                    Attrs::new().with("output_datatype", Attr::String(out.into())),
                )
            })
            .collect(),
        // Contracting the axes A and B share by name.
        "Dot" => {
            let named = |axes: &[(&'static str, usize)]| In::Named(axes.to_vec());
            vec![
                form(
                    "matrix product",
                    vec![named(&[("m", 3), ("k", 4)]), named(&[("k", 4), ("n", 2)])],
                    Attrs::new(),
                ),
                form(
                    "batch and two contracted axes, B's order",
                    vec![
                        named(&[("b", 2), ("i", 3), ("j", 2), ("m", 4)]),
                        named(&[("j", 2), ("n", 5), ("i", 3)]),
                    ],
                    Attrs::new(),
                ),
                form(
                    "outer product",
                    vec![named(&[("m", 3)]), named(&[("n", 4)])],
                    Attrs::new(),
                ),
            ]
        }
        "Unique" => vec![
            form("flattened", vec![x(&[6])], Attrs::new()),
            form(
                "axis -1, unsorted",
                vec![x(&[2, 3, 4])],
                int("axis", -1).with("sorted", Attr::Int(0)),
            ),
        ],
        "HannWindow" | "HammingWindow" | "BlackmanWindow" => vec![form(
            "run-time size",
            vec![In::I(DType::I64, vec![], 8, 9)],
            Attrs::new(),
        )],
        "BitCast" => [
            DType::F32,
            DType::I32,
            DType::U32,
            DType::I16,
            DType::U8,
            DType::F16,
        ]
        .iter()
        .map(|to| {
            let a = Attrs::new().with("to", Attr::String(to.to_string()));
            form(format!("to {to}"), vec![x(&[2, 3])], a)
        })
        .collect(),
        "DFT" => vec![
            form("complex, axis -2", vec![x(&[1, 8, 2])], Attrs::new()),
            form(
                "real input, onesided",
                vec![x(&[2, 6, 1])],
                int("onesided", 1),
            ),
            form("inverse", vec![x(&[1, 5, 2])], int("inverse", 1)),
        ],
        "STFT" => vec![form(
            "frame 8 step 4, window",
            vec![x(&[1, 32, 1]), In::C(Tensor::scalar(4i64)), x(&[8])],
            Attrs::new(),
        )],
        "AffineGrid" => vec![form(
            "2-D",
            vec![x(&[2, 2, 3]), i64s(&[2, 1, 3, 4])],
            Attrs::new(),
        )],
        "RotaryEmbedding" => vec![form(
            "4-D, position ids",
            vec![
                x(&[1, 2, 3, 8]),
                x(&[4, 4]),
                x(&[4, 4]),
                In::I(DType::I64, vec![1, 3], 0, 4),
            ],
            Attrs::new(),
        )],
        "Attention" => vec![
            form(
                "4-D",
                vec![x(&[1, 2, 3, 4]), x(&[1, 2, 5, 4]), x(&[1, 2, 5, 4])],
                Attrs::new(),
            ),
            form(
                "causal",
                vec![x(&[1, 2, 4, 4]), x(&[1, 2, 4, 4]), x(&[1, 2, 4, 4])],
                int("is_causal", 1),
            ),
            form(
                "bool mask",
                vec![
                    x(&[1, 1, 3, 4]),
                    x(&[1, 1, 5, 4]),
                    x(&[1, 1, 5, 4]),
                    In::T(DType::Bool, vec![3, 5]),
                ],
                Attrs::new(),
            ),
        ],
        "RNN" | "GRU" | "LSTM" => {
            let gates = match name {
                "RNN" => 1,
                "GRU" => 3,
                _ => 4,
            };
            let (h, i) = (3usize, 2usize);
            ["forward", "reverse", "bidirectional"]
                .iter()
                .map(|d| {
                    let dirs = if *d == "bidirectional" { 2 } else { 1 };
                    let a = Attrs::new()
                        .with("direction", Attr::String(d.to_string()))
                        .with("hidden_size", Attr::Int(h as i64));
                    let ins = vec![
                        x(&[4, 2, i]),
                        x(&[dirs, gates * h, i]),
                        x(&[dirs, gates * h, h]),
                        x(&[dirs, 2 * gates * h]),
                    ];
                    form(*d, ins, a)
                })
                .collect()
        }
        "NonMaxSuppression" => vec![form(
            "one class",
            vec![
                x(&[1, 6, 4]),
                x(&[1, 1, 6]),
                In::C(Tensor::from_vec(&[1], vec![3i64]).unwrap()),
                In::C(Tensor::from_vec(&[1], vec![0.5f32]).unwrap()),
            ],
            Attrs::new(),
        )],
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
        _ => return host::forms(name).ok_or("no generator yet"),
    })
}

/// Convolutions of every geometry: 1-, 2- and 3-D, long kernels, strides larger than the
/// kernel, dilations, groups, asymmetric and auto pads, inputs smaller than the window
/// after padding, with and without a bias.
fn conv_forms() -> Vec<Form> {
    let c = |label: &str, xs: &[usize], ws: &[usize], bias: bool, a: Attrs| {
        let mut ins = vec![x(xs), x(ws)];
        if bias {
            ins.push(x(&[ws[0]]));
        }
        form(label, ins, a)
    };
    let pads = |p: &[i64]| common::ints(&[("pads", p)]);
    vec![
        c("3×3", &[1, 3, 6, 6], &[4, 3, 3, 3], true, Attrs::new()),
        c(
            "1×1 stride 2",
            &[2, 4, 5, 5],
            &[3, 4, 1, 1],
            false,
            common::ints(&[("strides", &[2, 2])]),
        ),
        c(
            "groups 2, pads",
            &[1, 4, 5, 5],
            &[6, 2, 3, 3],
            true,
            common::ints(&[("pads", &[1, 1, 1, 1])]).with("group", Attr::Int(2)),
        ),
        c(
            "depthwise",
            &[1, 3, 5, 5],
            &[3, 1, 3, 3],
            false,
            int("group", 3),
        ),
        c(
            "dilations 2, asymmetric pads",
            &[1, 2, 7, 6],
            &[2, 2, 3, 2],
            true,
            pads(&[2, 0, 1, 1]).with("dilations", Attr::Ints(vec![2, 2])),
        ),
        c(
            "1-D long kernel, stride > kernel",
            &[1, 1, 64],
            &[4, 1, 20],
            true,
            common::ints(&[("strides", &[24])]),
        ),
        c(
            "1-D dilation 9",
            &[1, 2, 40],
            &[3, 2, 3],
            false,
            common::ints(&[("dilations", &[9])]),
        ),
        c(
            "3-D",
            &[1, 2, 4, 4, 4],
            &[3, 2, 2, 2, 2],
            true,
            Attrs::new(),
        ),
        c(
            "window larger than input, padded",
            &[1, 1, 2, 2],
            &[2, 1, 3, 3],
            false,
            pads(&[1, 1, 1, 1]),
        ),
        c(
            "auto_pad SAME_UPPER, stride 2",
            &[1, 2, 5, 5],
            &[2, 2, 3, 3],
            false,
            common::ints(&[("strides", &[2, 2])])
                .with("auto_pad", Attr::String("SAME_UPPER".into())),
        ),
        c(
            "auto_pad SAME_LOWER",
            &[1, 2, 4, 4],
            &[2, 2, 2, 2],
            false,
            Attrs::new().with("auto_pad", Attr::String("SAME_LOWER".into())),
        ),
    ]
}

/// Pools of every window, stride, pad, dilation and ceil mode, in 1, 2 and 3 spatial axes.
fn pool_forms(op: &str) -> Vec<Form> {
    let k = |ks: &[i64]| common::ints(&[("kernel_shape", ks)]);
    let mut v = vec![
        form(
            "2×2 stride 2",
            vec![x(&[1, 3, 6, 6])],
            k(&[2, 2]).with("strides", Attr::Ints(vec![2, 2])),
        ),
        form(
            "3×3 pads 1",
            vec![x(&[2, 2, 5, 5])],
            k(&[3, 3]).with("pads", Attr::Ints(vec![1, 1, 1, 1])),
        ),
        form(
            "ceil mode, stride 2",
            vec![x(&[1, 2, 5, 5])],
            k(&[2, 2])
                .with("strides", Attr::Ints(vec![2, 2]))
                .with("ceil_mode", Attr::Int(1)),
        ),
        form(
            "1-D window 4 stride 3",
            vec![x(&[1, 2, 11])],
            k(&[4]).with("strides", Attr::Ints(vec![3])),
        ),
        form("3-D", vec![x(&[1, 1, 4, 4, 4])], k(&[2, 2, 2])),
        form(
            "asymmetric pads",
            vec![x(&[1, 1, 5, 4])],
            k(&[3, 2]).with("pads", Attr::Ints(vec![0, 1, 2, 0])),
        ),
        form(
            "auto_pad SAME_UPPER",
            vec![x(&[1, 2, 5, 5])],
            k(&[3, 3])
                .with("strides", Attr::Ints(vec![2, 2]))
                .with("auto_pad", Attr::String("SAME_UPPER".into())),
        ),
        form(
            "window larger than input, padded",
            vec![x(&[1, 1, 2, 2])],
            k(&[3, 3]).with("pads", Attr::Ints(vec![1, 1, 1, 1])),
        ),
    ];
    v.push(form(
        "dilations 2",
        vec![x(&[1, 2, 7, 7])],
        k(&[2, 2]).with("dilations", Attr::Ints(vec![2, 2])),
    ));
    if op == "MaxPool" {
        // Most models read only the pooled values; the indices are a form of their own.
        for f in &mut v {
            f.outputs = 1;
        }
        v.push(form("with Indices", vec![x(&[1, 2, 4, 4])], k(&[2, 2])));
    }
    if op == "AveragePool" {
        v.push(form(
            "count_include_pad",
            vec![x(&[1, 2, 5, 5])],
            k(&[3, 3])
                .with("pads", Attr::Ints(vec![1, 1, 1, 1]))
                .with("count_include_pad", Attr::Int(1)),
        ));
    }
    if op == "LpPool" {
        v.push(form(
            "p 1",
            vec![x(&[1, 2, 4, 4])],
            k(&[2, 2]).with("p", Attr::Int(1)),
        ));
    }
    v
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
                "LabelEncoder" => rng.below(6) as i64 - 2,
                // Range from 1 by 2 to a limit above the start or below it.
                "Range" => [1, rng.below(12) as i64, 2][k],
                _ => (rng.next_u64() % 201) as i64 - 100,
            })
            .collect();
        return Tensor::from_i64s(dtype, dims, &v).unwrap();
    }
    let v: Vec<f64> = (0..n)
        .map(|_| match op {
            "Range" => [1.0, rng.uniform(-1.0, 6.0), 0.5][k],
            // Keys, a -0 (equal to the key 0), NaN (matching none), a value no key has.
            "LabelEncoder" => [0.5, -1.0, 0.0, -0.0, 2.0, f64::NAN, 1.25][rng.below(7)],
            // Edges below the Nyquist frequency of the 8 kHz rate.
            "MelWeightMatrix" if k == 3 => rng.uniform(0.0, 300.0),
            "MelWeightMatrix" => rng.uniform(2500.0, 3900.0),
            _ => rng.uniform(lo, hi),
        })
        .collect();
    Tensor::from_f64s(dtype, dims, &v).unwrap()
}

/// A run-time host object for `i` (a sequence, optional or string operand) and its
/// parameter's type.
fn host_object(rng: &mut Rng, i: &In, dtype: DType) -> (Tensor, TensorType) {
    use kiln::tensor::{Optional, Sequence};
    match i {
        In::Seq(shapes) => {
            let items: Vec<Tensor> = shapes.iter().map(|s| rng.tensor_of(dtype, s)).collect();
            // Item dims that differ are unknown in the element type.
            let element = shapes.first().map(|first| {
                let dims: Vec<Dim> = (0..first.len())
                    .map(|a| {
                        match shapes
                            .iter()
                            .all(|s| s.len() == first.len() && s[a] == first[a])
                        {
                            true => Dim::Fixed(first[a]),
                            false => Dim::Sym("?".into()),
                        }
                    })
                    .collect();
                Shape::new(dims)
            });
            let same_rank = shapes
                .iter()
                .all(|s| Some(s.len()) == shapes.first().map(Vec::len));
            let ty = TensorType::sequence_of(dtype, element.filter(|_| same_rank));
            let value = Tensor::Sequence(Sequence {
                dtype,
                inner: vec![],
                items,
            });
            (value, ty)
        }
        In::Opt(held) => {
            let dims = held.clone().unwrap_or_else(|| vec![2, 3]);
            let ty = TensorType::new(dtype, Shape::fixed(&dims)).wrapped(Container::Opt, None);
            let value = Tensor::Optional(Optional {
                dtype,
                inner: vec![],
                value: held.as_ref().map(|d| Box::new(rng.tensor_of(dtype, d))),
            });
            (value, ty)
        }
        In::Str(dims) => {
            const WORDS: [&str; 8] = [
                "monday", "Tuesday", "a b", "", "kiln", "ÄÖ ü", "tuesday", "ab a",
            ];
            let n: usize = dims.iter().product();
            let v: Vec<String> = (0..n)
                .map(|_| WORDS[rng.below(WORDS.len())].to_string())
                .collect();
            let value = Tensor::from_strings(dims, v).unwrap();
            (value, TensorType::new(DType::String, Shape::fixed(dims)))
        }
        _ => unreachable!("not a host object"),
    }
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
    // A form with no operand of the column's dtype is one case, shown under f32.
    let of_column = |i: &In| matches!(i, In::X(_) | In::Named(_) | In::Seq(_) | In::Opt(_));
    if dtype != DType::F32 && !f.ins.iter().any(of_column) {
        return None;
    }
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
            In::Named(axes) => {
                let dims: Vec<usize> = axes.iter().map(|a| a.1).collect();
                values.push(data(rng, op, k, dtype, &dims));
                let shape = Shape::named(
                    dims.iter().map(|&d| Dim::Fixed(d)).collect(),
                    axes.iter().map(|a| Some(a.0.to_string())).collect(),
                );
                let ty = TensorType::new(dtype, shape);
                Some(g.add_parameter(&format!("x{k}"), ty).ok()?.into())
            }
            In::I(d, dims, lo, hi) => {
                let n: usize = dims.iter().product();
                let span = (hi - lo).max(1) as usize;
                let v: Vec<i64> = (0..n).map(|_| lo + rng.below(span) as i64).collect();
                values.push(Tensor::from_i64s(*d, dims, &v).unwrap());
                let ty = TensorType::new(*d, Shape::fixed(dims));
                Some(g.add_parameter(&format!("x{k}"), ty).ok()?.into())
            }
            In::C(t) => Some(common::constant(&mut g, t.clone())),
            In::Absent => None,
            In::Seq(_) | In::Opt(_) | In::Str(_) => {
                let (value, ty) = host_object(rng, i, dtype);
                values.push(value);
                Some(g.add_parameter(&format!("x{k}"), ty).ok()?.into())
            }
        };
        ins.push(v);
    }
    let mut attrs = f.attrs.clone();
    if let Some(typed) = f.typed_attrs {
        for (k, v) in typed(dtype).iter() {
            attrs = attrs.with(k, v.clone());
        }
    }
    let id = g.add_op(op, &ins, attrs, "y").ok()?;
    for k in 0..g.node(id).outputs.len().min(f.outputs) {
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
        let no_kernel = ["no cpu kernel", "no cpu program", "runs on the"]
            .iter()
            .any(|m| e.contains(m));
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
                if std::env::var("OP_MATRIX_SHOW").is_ok_and(|o| o == *name) {
                    eprintln!("{name} {dtype} {}: {outcome:?}", f.label);
                }
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
                let e = e.split(" (KILN_ALLOW_FALLBACK").next().unwrap_or("");
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
