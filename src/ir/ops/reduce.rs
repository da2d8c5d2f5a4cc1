//! Reductions (opset 18: `axes` is an optional input) and ArgMax/ArgMin.
//!
//! Kiln-only: the attribute `axis_names` selects the reduced axes by name instead.
//! Floats reduce in f64; integers (Sum, Prod, Max, Min, L1, SumSquare) in i64.
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, Axis, IxDyn};

use super::util::out;
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::shape::norm_axis;
use crate::ir::{AttrKind, Attrs, DType, Dim, Shape, TensorType};
use crate::tensor::Tensor;

/// What a reduction computes: one per `Reduce*` op. Backends map it to their kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    LogSum,
    LogSumExp,
    SumSquare,
}

impl ReduceKind {
    pub const ALL: [ReduceKind; 10] = [
        ReduceKind::Sum,
        ReduceKind::Mean,
        ReduceKind::Max,
        ReduceKind::Min,
        ReduceKind::Prod,
        ReduceKind::L1,
        ReduceKind::L2,
        ReduceKind::LogSum,
        ReduceKind::LogSumExp,
        ReduceKind::SumSquare,
    ];

    /// The op that computes the kind.
    pub fn op(self) -> &'static str {
        match self {
            ReduceKind::Sum => "ReduceSum",
            ReduceKind::Mean => "ReduceMean",
            ReduceKind::Max => "ReduceMax",
            ReduceKind::Min => "ReduceMin",
            ReduceKind::Prod => "ReduceProd",
            ReduceKind::L1 => "ReduceL1",
            ReduceKind::L2 => "ReduceL2",
            ReduceKind::LogSum => "ReduceLogSum",
            ReduceKind::LogSumExp => "ReduceLogSumExp",
            ReduceKind::SumSquare => "ReduceSumSquare",
        }
    }

    /// The kind an op name asks for (`None` for ops that are not reductions).
    pub fn from_op(op: &str) -> Option<ReduceKind> {
        ReduceKind::ALL.into_iter().find(|k| k.op() == op)
    }

    /// Whether the reduction is defined on integers.
    fn takes_ints(self) -> bool {
        matches!(
            self,
            ReduceKind::Sum
                | ReduceKind::Max
                | ReduceKind::Min
                | ReduceKind::Prod
                | ReduceKind::L1
                | ReduceKind::SumSquare
        )
    }
}

struct Reduce {
    schema: OpSchema,
    kind: ReduceKind,
}

const REDUCE_ATTRS: &[AttrSpec] = &[
    AttrSpec::opt("keepdims", AttrKind::Int, "1"),
    AttrSpec::opt("noop_with_empty_axes", AttrKind::Int, "0"),
    AttrSpec::opt(
        "axis_names",
        AttrKind::Strings,
        "Kiln-only: reduce these named axes",
    ),
];

/// Which axes to reduce: `None` when they are not known before run time.
pub(crate) fn reduce_axes(
    x: &Shape,
    axes_input: Option<Option<Vec<i64>>>,
    attrs: &Attrs,
) -> Result<Option<Vec<usize>>, String> {
    let rank = x.rank();
    let names = attrs.strings("axis_names")?;
    let listed: Option<Vec<i64>> = match (axes_input, names) {
        (Some(_), Some(_)) => {
            return Err("give either the axes input or axis_names, not both".into())
        }
        (Some(None), None) => return Ok(None),
        (Some(Some(v)), None) => Some(v),
        (None, Some(names)) => {
            let mut v = vec![];
            for n in names {
                let i = x.axis_by_name(n).ok_or_else(|| {
                    let have: Vec<&str> = (0..rank).filter_map(|i| x.name(i)).collect();
                    format!("no axis is named '{n}' (named axes: {})", have.join(", "))
                })?;
                v.push(i as i64);
            }
            Some(v)
        }
        (None, None) => None,
    };
    let mut axes = match listed {
        Some(v) if !v.is_empty() => v
            .iter()
            .map(|&a| norm_axis(a, rank))
            .collect::<Result<Vec<_>, _>>()?,
        _ if attrs.int_or("noop_with_empty_axes", 0)? != 0 => vec![],
        _ => (0..rank).collect(),
    };
    axes.sort_unstable();
    if axes.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("axes {axes:?} repeat an axis"));
    }
    Ok(Some(axes))
}

fn reduced_shape(x: &Shape, axes: &[usize], keepdims: bool) -> Shape {
    let mut out = Shape::scalar();
    for (i, a) in x.axes.iter().enumerate() {
        if !axes.contains(&i) {
            out.axes.push(a.clone());
        } else if keepdims {
            let mut a = a.clone();
            a.dim = Dim::Fixed(1);
            out.axes.push(a);
        }
    }
    out
}

impl Op for Reduce {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let bool_ok =
            x.dtype == DType::Bool && matches!(self.kind, ReduceKind::Max | ReduceKind::Min);
        if !(bool_ok || x.dtype.is_float() || (x.dtype.is_int() && self.kind.takes_ints())) {
            let what = if self.kind.takes_ints() {
                "numeric"
            } else {
                "a float type"
            };
            return Err(format!("input 0 must be {what}, got {}", x.dtype));
        }
        let keepdims = cx.attrs.int_or("keepdims", 1)? != 0;
        let axes_input = cx.opt_input(1).map(|t| {
            cx.const_input(1)
                .map(|c| c.to_i64_vec())
                .filter(|_| t.rank() == 1)
        });
        if let Some(t) = cx.opt_input(1) {
            if t.dtype != DType::I64 || t.rank() != 1 {
                return Err(format!("input 1 (axes) must be i64 of rank 1, got {t}"));
            }
        }
        match reduce_axes(&x.shape, axes_input, cx.attrs)? {
            Some(axes) => Ok(out(x.dtype, reduced_shape(&x.shape, &axes, keepdims))),
            None => {
                // Axes computed at run time: with keepdims the rank is known.
                let rank = match (keepdims, cx.input(1)?.shape.dim(0)) {
                    (true, _) => x.rank(),
                    (false, Dim::Fixed(n)) => x.rank().saturating_sub(*n),
                    (false, Dim::Sym(_)) => {
                        return Err("with keepdims = 0, the axes input needs a static length".into())
                    }
                };
                let dims = (0..rank).map(|i| cx.fresh_dim(0, i));
                Ok(out(x.dtype, Shape::new(dims)))
            }
        }
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let keepdims = cx.attrs.int_or("keepdims", 1)? != 0;
        let axes_input = cx.opt_input(1).map(|t| Some(t.to_i64_vec()));
        let axes = reduce_axes(&cx.input_type(0)?.shape, axes_input, cx.attrs)?
            .expect("axes are known at run time");
        let y = if x.dtype().is_float() {
            Tensor::from_f64_array(x.dtype(), reduce_f64(self.kind, x.to_f64_array(), &axes))
        } else if x.dtype() == DType::Bool {
            // Max is any, min is all: the identities clamp to false and true.
            let r = reduce_i64(self.kind, x.to_i64_array(), &axes).mapv(|v| v.clamp(0, 1));
            Tensor::from_i64_array(DType::Bool, r)
        } else {
            Tensor::from_i64_array(x.dtype(), reduce_i64(self.kind, x.to_i64_array(), &axes))
        };
        let mut shape: Vec<usize> = vec![];
        for (i, &d) in x.shape().iter().enumerate() {
            if !axes.contains(&i) {
                shape.push(d);
            } else if keepdims {
                shape.push(1);
            }
        }
        Ok(vec![reshape(y, &shape)?])
    }
}

fn reshape(t: Tensor, shape: &[usize]) -> Result<Tensor, String> {
    Ok(crate::map_tensor!(t, a => a
        .as_standard_layout()
        .into_owned()
        .into_shape_with_order(IxDyn(shape))
        .map_err(|e| e.to_string())?))
}

/// Folds `axes` (sorted) of `a` one at a time, keeping them as size 1.
fn fold<T: Clone>(mut a: ArrayD<T>, axes: &[usize], init: T, f: impl Fn(&T, &T) -> T) -> ArrayD<T> {
    for &ax in axes {
        a = a
            .fold_axis(Axis(ax), init.clone(), |acc, v| f(acc, v))
            .insert_axis(Axis(ax));
    }
    a
}

fn reduce_f64(kind: ReduceKind, a: ArrayD<f64>, axes: &[usize]) -> ArrayD<f64> {
    let count: usize = axes.iter().map(|&ax| a.shape()[ax]).product();
    let sum = |a: ArrayD<f64>| fold(a, axes, 0.0, |x, y| x + y);
    match kind {
        ReduceKind::Sum => sum(a),
        ReduceKind::Mean => sum(a).mapv(|v| v / count as f64),
        ReduceKind::Max => fold(a, axes, f64::NEG_INFINITY, |x, y| {
            if y > x || y.is_nan() {
                *y
            } else {
                *x
            }
        }),
        ReduceKind::Min => fold(a, axes, f64::INFINITY, |x, y| {
            if y < x || y.is_nan() {
                *y
            } else {
                *x
            }
        }),
        ReduceKind::Prod => fold(a, axes, 1.0, |x, y| x * y),
        ReduceKind::L1 => sum(a.mapv(f64::abs)),
        ReduceKind::L2 => sum(a.mapv(|v| v * v)).mapv(f64::sqrt),
        ReduceKind::LogSum => sum(a).mapv(f64::ln),
        ReduceKind::SumSquare => sum(a.mapv(|v| v * v)),
        ReduceKind::LogSumExp => {
            let m = fold(a.clone(), axes, f64::NEG_INFINITY, |x, y| x.max(*y));
            let m = m.mapv(|v| if v.is_finite() { v } else { 0.0 });
            let shifted = &a - &m;
            sum(shifted.mapv(f64::exp)).mapv(f64::ln) + m
        }
    }
}

fn reduce_i64(kind: ReduceKind, a: ArrayD<i64>, axes: &[usize]) -> ArrayD<i64> {
    match kind {
        ReduceKind::Sum => fold(a, axes, 0, |x, y| x.wrapping_add(*y)),
        ReduceKind::Max => fold(a, axes, i64::MIN, |x, y| *x.max(y)),
        ReduceKind::Min => fold(a, axes, i64::MAX, |x, y| *x.min(y)),
        ReduceKind::Prod => fold(a, axes, 1, |x, y| x.wrapping_mul(*y)),
        ReduceKind::L1 => fold(a.mapv(i64::wrapping_abs), axes, 0, |x, y| {
            x.wrapping_add(*y)
        }),
        ReduceKind::SumSquare => fold(a.mapv(|v| v.wrapping_mul(v)), axes, 0, |x, y| {
            x.wrapping_add(*y)
        }),
        _ => unreachable!("infer admits integers only for the kinds above"),
    }
}

fn reduce(kind: ReduceKind, doc: &'static str) -> &'static dyn Op {
    leak(Reduce {
        schema: OpSchema {
            name: kind.op(),
            family: "reduce",
            inputs: &["data", "axes?"],
            outputs: &["reduced"],
            attrs: REDUCE_ATTRS,
            doc,
            in_place: InPlace::No,
            origin: Origin::Onnx,
        },
        kind,
    })
}

// ---------------------------------------------------------------- ArgMax / ArgMin

struct Arg {
    schema: OpSchema,
    max: bool,
}

const ARG_ATTRS: &[AttrSpec] = &[
    AttrSpec::opt("axis", AttrKind::Int, "0"),
    AttrSpec::opt("keepdims", AttrKind::Int, "1"),
    AttrSpec::opt("select_last_index", AttrKind::Int, "0"),
];

impl Op for Arg {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        if !x.dtype.is_numeric() {
            return Err(format!("input 0 must be numeric, got {}", x.dtype));
        }
        let axis = x.shape.norm_axis(cx.attrs.int_or("axis", 0)?)?;
        let keepdims = cx.attrs.int_or("keepdims", 1)? != 0;
        Ok(out(DType::I64, reduced_shape(&x.shape, &[axis], keepdims)))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let axis = norm_axis(cx.attrs.int_or("axis", 0)?, x.rank())?;
        let keepdims = cx.attrs.int_or("keepdims", 1)? != 0;
        let last = cx.attrs.int_or("select_last_index", 0)? != 0;
        if x.shape()[axis] == 0 {
            return Err(format!(
                "cannot take the arg{} of an empty axis",
                if self.max { "max" } else { "min" }
            ));
        }
        let a = x.to_f64_array();
        let mut idx = a.map_axis(Axis(axis), |lane| {
            let mut best = 0;
            for (i, &v) in lane.iter().enumerate() {
                let b = lane[best];
                let better = if self.max { v > b } else { v < b };
                if better || (last && v == b) {
                    best = i;
                }
            }
            best as i64
        });
        if keepdims {
            idx = idx.insert_axis(Axis(axis));
        }
        Ok(vec![Tensor::I64(idx)])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![
        reduce(ReduceKind::Sum, "Sum over `axes` (all when omitted)."),
        reduce(ReduceKind::Mean, "Mean over `axes`."),
        reduce(ReduceKind::Max, "Maximum over `axes`; -inf over an empty set."),
        reduce(ReduceKind::Min, "Minimum over `axes`; +inf over an empty set."),
        reduce(ReduceKind::Prod, "Product over `axes`."),
        reduce(ReduceKind::L1, "Sum of absolute values over `axes`."),
        reduce(ReduceKind::L2, "Square root of the sum of squares over `axes`."),
        reduce(ReduceKind::LogSum, "log of the sum over `axes`."),
        reduce(ReduceKind::LogSumExp, "log(sum(exp(x))) over `axes`, computed stably."),
        reduce(ReduceKind::SumSquare, "Sum of squares over `axes`."),
        leak(Arg {
            schema: OpSchema {
                name: "ArgMax",
                family: "reduce",
                inputs: &["data"],
                outputs: &["reduced"],
                attrs: ARG_ATTRS,
                doc: "Index (i64) of the maximum along `axis`; the first one unless select_last_index.",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            max: true,
        }),
        leak(Arg {
            schema: OpSchema {
                name: "ArgMin",
                family: "reduce",
                inputs: &["data"],
                outputs: &["reduced"],
                attrs: ARG_ATTRS,
                doc: "Index (i64) of the minimum along `axis`; the first one unless select_last_index.",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            max: false,
        }),
    ]
}
