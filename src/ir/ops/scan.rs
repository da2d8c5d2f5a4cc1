//! Ops that walk an axis in sequence order: CumSum and CumProd (running sum or
//! product, optionally exclusive and/or reversed) and ReverseSequence (each batch
//! entry's first `sequence_lens` steps reversed along the time axis).
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, Axis};

use super::util::remap;
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::shape::norm_axis;
use crate::ir::{AttrKind, DType, TensorType};
use crate::match_tensor;
use crate::tensor::Tensor;

// ---------------------------------------------------------------- CumSum / CumProd

/// CumSum, or CumProd when `product`.
struct Cumulative {
    schema: OpSchema,
    product: bool,
}

const CUMULATIVE_ATTRS: &[AttrSpec] = &[
    AttrSpec::opt("exclusive", AttrKind::Int, "0"),
    AttrSpec::opt("reverse", AttrKind::Int, "0"),
];

impl Op for Cumulative {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, axis) = (cx.input(0)?, cx.input(1)?);
        if !x.dtype.is_numeric() {
            return Err(format!("x must be numeric, got {}", x.dtype));
        }
        if !matches!(axis.dtype, DType::I32 | DType::I64) || axis.rank() > 1 {
            return Err(format!("axis must be an i32/i64 scalar, got {axis}"));
        }
        if let Some(c) = cx.const_input(1) {
            x.shape.norm_axis(c.to_i64_vec()[0])?;
        }
        Ok(vec![x.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let axis_v = cx.input(1)?.to_i64_vec();
        let axis = norm_axis(*axis_v.first().ok_or("axis is empty")?, x.rank())?;
        let exclusive = cx.attrs.int_or("exclusive", 0)? != 0;
        let reverse = cx.attrs.int_or("reverse", 0)? != 0;
        // The running total starts at the identity; an exclusive scan shifts by one.
        let scan = |mut a: ArrayD<f64>| {
            for mut lane in a.lanes_mut(Axis(axis)) {
                let n = lane.len();
                let mut acc = if self.product { 1.0 } else { 0.0 };
                for s in 0..n {
                    let i = if reverse { n - 1 - s } else { s };
                    let v = lane[i];
                    let next = if self.product { acc * v } else { acc + v };
                    lane[i] = if exclusive { acc } else { next };
                    acc = next;
                }
            }
            a
        };
        let scan_ints = |mut a: ArrayD<i64>| {
            for mut lane in a.lanes_mut(Axis(axis)) {
                let n = lane.len();
                let mut acc: i64 = if self.product { 1 } else { 0 };
                for s in 0..n {
                    let i = if reverse { n - 1 - s } else { s };
                    let v = lane[i];
                    let next = if self.product {
                        acc.wrapping_mul(v)
                    } else {
                        acc.wrapping_add(v)
                    };
                    lane[i] = if exclusive { acc } else { next };
                    acc = next;
                }
            }
            a
        };
        Ok(vec![if x.dtype().is_float() {
            Tensor::from_f64_array(x.dtype(), scan(x.to_f64_array()))
        } else {
            Tensor::from_i64_array(x.dtype(), scan_ints(x.to_i64_array()))
        }])
    }
}

// ---------------------------------------------------------------- ReverseSequence

struct ReverseSequence;

const REVERSE_SEQUENCE: OpSchema = OpSchema {
    name: "ReverseSequence",
    family: "gather",
    inputs: &["input", "sequence_lens"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("batch_axis", AttrKind::Int, "1"),
        AttrSpec::opt("time_axis", AttrKind::Int, "0"),
    ],
    doc: "For each batch entry b, the first sequence_lens[b] steps along time_axis in \
          reverse order; the rest unchanged.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

fn batch_time_axes(attrs: &crate::ir::Attrs, rank: usize) -> Result<(usize, usize), String> {
    let b = norm_axis(attrs.int_or("batch_axis", 1)?, rank)?;
    let t = norm_axis(attrs.int_or("time_axis", 0)?, rank)?;
    if b > 1 || t > 1 || b == t {
        return Err(format!(
            "batch_axis and time_axis must be 0 and 1 in some order, got {b} and {t}"
        ));
    }
    Ok((b, t))
}

impl Op for ReverseSequence {
    fn schema(&self) -> &OpSchema {
        &REVERSE_SEQUENCE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, lens) = (cx.input(0)?, cx.input(1)?);
        if x.rank() < 2 {
            return Err(format!("input must have rank 2 or more, got {x}"));
        }
        batch_time_axes(cx.attrs, x.rank())?;
        if lens.dtype != DType::I64 || lens.rank() != 1 {
            return Err(format!("sequence_lens must be i64[batch], got {lens}"));
        }
        Ok(vec![x.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (x, lens) = (cx.input(0)?, cx.input(1)?.to_i64_vec());
        let (b, t) = batch_time_axes(cx.attrs, x.rank())?;
        let steps = x.shape()[t] as i64;
        if lens.len() != x.shape()[b] || lens.iter().any(|&l| l < 0 || l > steps) {
            return Err(format!(
                "sequence_lens {lens:?} must give each of {} batch entries a length <= {steps}",
                x.shape()[b]
            ));
        }
        let shape = x.shape().to_vec();
        let src = |o: &[usize], p: &mut Vec<usize>| {
            p.extend_from_slice(o);
            let len = lens[o[b]] as usize;
            if o[t] < len {
                p[t] = len - 1 - o[t];
            }
            true
        };
        Ok(vec![
            match_tensor!(x, a => remap(a, &shape, Default::default(), src)),
        ])
    }
}

pub fn ops() -> Vec<&'static dyn Op> {
    vec![
        leak(ReverseSequence),
        leak(Cumulative {
            schema: OpSchema {
                name: "CumSum",
                family: "gather",
                inputs: &["x", "axis"],
                outputs: &["y"],
                attrs: CUMULATIVE_ATTRS,
                doc: "Running sum along the scalar `axis` input, optionally exclusive and/or \
                      reversed.",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            product: false,
        }),
        leak(Cumulative {
            schema: OpSchema {
                name: "CumProd",
                family: "gather",
                inputs: &["x", "axis"],
                outputs: &["y"],
                attrs: CUMULATIVE_ATTRS,
                doc: "Running product along the scalar `axis` input, optionally exclusive \
                      and/or reversed.",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            product: true,
        }),
    ]
}
