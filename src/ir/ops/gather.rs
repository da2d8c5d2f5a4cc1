//! Gathering: Gather, GatherElements and GatherND read `data` at the positions an
//! index tensor names.
//!
//! Index operands may be i32 or i64 and negative (counting from the end); an index out
//! of range is a run-time error naming it. The helpers that check and resolve indices
//! are shared with [`super::scatter`].
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, IxDyn};

use super::util::{out, remap};
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::shape::norm_axis;
use crate::ir::{AttrKind, DType, Shape, TensorType};
use crate::match_tensor;
use crate::tensor::{Elem, Tensor};

pub(super) fn index_type(t: &TensorType, i: usize) -> Result<(), String> {
    if matches!(t.dtype, DType::I32 | DType::I64) {
        Ok(())
    } else {
        Err(format!(
            "input {i} (indices) must be i32 or i64, got {}",
            t.dtype
        ))
    }
}

/// Indices resolved against an axis of size `d`: negatives wrap once, the rest must fit.
pub(super) fn resolve(indices: &Tensor, d: usize) -> Result<ArrayD<usize>, String> {
    let a = indices.to_i64_array();
    for &k in a.iter() {
        if k < -(d as i64) || k >= d as i64 {
            return Err(format!("index {k} is out of range for an axis of size {d}"));
        }
    }
    Ok(a.mapv(|k| if k < 0 { k + d as i64 } else { k } as usize))
}

const AXIS0: &[AttrSpec] = &[AttrSpec::opt("axis", AttrKind::Int, "0")];

// ---------------------------------------------------------------- Gather

struct Gather;

const GATHER: OpSchema = OpSchema {
    name: "Gather",
    family: "gather",
    inputs: &["data", "indices"],
    outputs: &["output"],
    attrs: AXIS0,
    doc: "Picks slices of `data` along `axis` at `indices`: output shape is \
          data[:axis] + indices + data[axis+1:].",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for Gather {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &GATHER
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, idx) = (cx.input(0)?, cx.input(1)?);
        index_type(idx, 1)?;
        if x.rank() == 0 {
            return Err("data must have rank >= 1".into());
        }
        let axis = x.shape.norm_axis(cx.attrs.int_or("axis", 0)?)?;
        let mut axes = x.shape.axes[..axis].to_vec();
        axes.extend(idx.shape.axes.iter().cloned());
        axes.extend(x.shape.axes[axis + 1..].iter().cloned());
        Ok(out(x.dtype, Shape { axes }))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (x, idx) = (cx.input(0)?, cx.input(1)?);
        let axis = norm_axis(cx.attrs.int_or("axis", 0)?, x.rank())?;
        let k = resolve(idx, x.shape()[axis])?;
        let q = idx.rank();
        let mut shape = x.shape()[..axis].to_vec();
        shape.extend(idx.shape());
        shape.extend(&x.shape()[axis + 1..]);
        let y = match_tensor!(x, a => remap(a, &shape, Elem::from_i64(0), |o, src| {
            src.extend(&o[..axis]);
            src.push(k[IxDyn(&o[axis..axis + q])]);
            src.extend(&o[axis + q..]);
            true
        }));
        Ok(vec![y])
    }
}

// ---------------------------------------------------------------- GatherElements

struct GatherElements;

const GATHER_ELEMENTS: OpSchema = OpSchema {
    name: "GatherElements",
    family: "gather",
    inputs: &["data", "indices"],
    outputs: &["output"],
    attrs: AXIS0,
    doc: "output[i] = data[i with its `axis` coordinate replaced by indices[i]]; indices \
          has data's rank.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

pub(super) fn same_rank(x: &TensorType, idx: &TensorType) -> Result<(), String> {
    if x.rank() != idx.rank() || x.rank() == 0 {
        return Err(format!("indices ({idx}) must have data's rank ({x})"));
    }
    Ok(())
}

impl Op for GatherElements {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &GATHER_ELEMENTS
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, idx) = (cx.input(0)?, cx.input(1)?);
        index_type(idx, 1)?;
        same_rank(x, idx)?;
        x.shape.norm_axis(cx.attrs.int_or("axis", 0)?)?;
        Ok(out(x.dtype, idx.shape.clone()))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (x, idx) = (cx.input(0)?, cx.input(1)?);
        let axis = norm_axis(cx.attrs.int_or("axis", 0)?, x.rank())?;
        let k = resolve(idx, x.shape()[axis])?;
        for (a, (&i, &d)) in idx.shape().iter().zip(x.shape()).enumerate() {
            if a != axis && i > d {
                return Err(format!(
                    "indices is {:?}, larger than data {:?} at axis {a}",
                    idx.shape(),
                    x.shape()
                ));
            }
        }
        let y = match_tensor!(x, a => remap(a, idx.shape(), Elem::from_i64(0), |o, src| {
            src.extend(o);
            src[axis] = k[IxDyn(o)];
            true
        }));
        Ok(vec![y])
    }
}

// ---------------------------------------------------------------- GatherND

struct GatherNd;

const GATHER_ND: OpSchema = OpSchema {
    name: "GatherND",
    family: "gather",
    inputs: &["data", "indices"],
    outputs: &["output"],
    attrs: &[AttrSpec::opt("batch_dims", AttrKind::Int, "0")],
    doc: "Slices of `data` at the index tuples in the last axis of `indices`: output is \
          indices[:-1] + data[batch_dims + indices[-1]:]; the first batch_dims axes are shared.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for GatherNd {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &GATHER_ND
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, idx) = (cx.input(0)?, cx.input(1)?);
        index_type(idx, 1)?;
        let b = cx.attrs.int_or("batch_dims", 0)?.max(0) as usize;
        let k = idx
            .shape
            .axes
            .last()
            .and_then(|a| a.dim.fixed())
            .ok_or("the last axis of indices must be static")?;
        if idx.rank() < 1 || b >= idx.rank() || b + k > x.rank() {
            return Err(format!(
                "indices {idx} with batch_dims {b} do not fit data {x}"
            ));
        }
        let mut axes = idx.shape.axes[..idx.rank() - 1].to_vec();
        axes.extend(x.shape.axes[b + k..].iter().cloned());
        Ok(out(x.dtype, Shape { axes }))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (x, idx) = (cx.input(0)?, cx.input(1)?);
        let b = cx.attrs.int_or("batch_dims", 0)?.max(0) as usize;
        let q = idx.rank();
        let k = idx.shape()[q - 1];
        let ix = idx.to_i64_array();
        let mut shape = idx.shape()[..q - 1].to_vec();
        shape.extend(&x.shape()[b + k..]);
        // Resolve every index tuple first, so that the copy below cannot fail.
        for (pos, &v) in ix.indexed_iter() {
            let d = x.shape()[b + pos[q - 1]] as i64;
            if v < -d || v >= d {
                return Err(format!("index {v} is out of range for an axis of size {d}"));
            }
        }
        let y = match_tensor!(x, a => remap(a, &shape, Elem::from_i64(0), |o, src| {
            src.extend(&o[..b]);
            let mut at: Vec<usize> = o[..q - 1].to_vec();
            at.push(0);
            for j in 0..k {
                at[q - 1] = j;
                let d = x.shape()[b + j] as i64;
                let v = ix[IxDyn(&at)];
                src.push(if v < 0 { v + d } else { v } as usize);
            }
            src.extend(&o[q - 1..]);
            true
        }));
        Ok(vec![y])
    }
}

pub fn ops() -> Vec<&'static dyn Op> {
    vec![leak(GatherNd), leak(Gather), leak(GatherElements)]
}
