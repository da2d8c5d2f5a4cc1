//! Concat and Split.
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, Axis as NdAxis};

use super::const_ints;
use crate::ir::ops::util::same_dtype;
use crate::ir::ops::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::shape::{merge_names, norm_axis};
use crate::ir::{AttrKind, Dim, TensorType};
use crate::match_tensor;
use crate::tensor::{Elem, Tensor};

// ---------------------------------------------------------------- Concat

struct Concat;

const CONCAT: OpSchema = OpSchema {
    name: "Concat",
    family: "shape",
    inputs: &["inputs..."],
    outputs: &["concat_result"],
    attrs: &[AttrSpec::req("axis", AttrKind::Int)],
    doc: "Joins the inputs along `axis`; the other dims (and names) must agree.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

fn concat_all<T: Elem>(first: &ArrayD<T>, rest: &[&Tensor], axis: usize) -> Result<Tensor, String> {
    let mut views = vec![first.view()];
    for t in rest {
        views.push(T::view(t).ok_or("inputs differ in dtype")?.view());
    }
    ndarray::concatenate(NdAxis(axis), &views)
        .map(T::wrap)
        .map_err(|e| format!("cannot concatenate: {e}"))
}

impl Op for Concat {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &CONCAT
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let n = cx.inputs.len();
        if n == 0 {
            return Err("Concat needs at least one input".into());
        }
        let ts: Vec<&TensorType> = (0..n).map(|i| cx.input(i)).collect::<Result<_, _>>()?;
        let dtype = same_dtype("Concat", &ts)?;
        let rank = ts[0].rank();
        let axis = norm_axis(cx.attrs.req_int("axis")?, rank)?;
        let mut shape = ts[0].shape.clone();
        let mut total = Some(0usize);
        for (i, t) in ts.iter().enumerate() {
            if t.rank() != rank {
                return Err(format!(
                    "input {i} has rank {}, input 0 has rank {rank}",
                    t.rank()
                ));
            }
            for (k, (a, b)) in shape.axes.iter_mut().zip(&t.shape.axes).enumerate() {
                a.name = merge_names(a.name.as_deref(), b.name.as_deref())
                    .map_err(|e| format!("input {i}, axis {k}: {e}"))?;
                if k == axis {
                    continue;
                }
                match (&a.dim, &b.dim) {
                    (Dim::Fixed(x), Dim::Fixed(y)) if x != y => {
                        return Err(format!(
                            "input {i} is {} at axis {k}, input 0 is {}",
                            b.dim, a.dim
                        ))
                    }
                    (Dim::Sym(_), Dim::Fixed(_)) => a.dim = b.dim.clone(),
                    _ => {}
                }
            }
            total = total.zip(t.shape.dim(axis).fixed()).map(|(s, d)| s + d);
        }
        shape.axes[axis].dim = match (n, total) {
            (_, Some(t)) => Dim::Fixed(t),
            (1, None) => ts[0].shape.dim(axis).clone(),
            _ => cx.fresh_dim(0, axis),
        };
        Ok(vec![TensorType::new(dtype, shape)])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let ts: Vec<&Tensor> = (0..cx.inputs.len())
            .map(|i| cx.input(i))
            .collect::<Result<_, _>>()?;
        let axis = norm_axis(cx.attrs.req_int("axis")?, ts[0].rank())?;
        let y = match_tensor!(ts[0], a => concat_all(a, &ts[1..], axis))?;
        Ok(vec![y])
    }
}

// ---------------------------------------------------------------- Split

struct Split;

const SPLIT: OpSchema = OpSchema {
    name: "Split",
    family: "shape",
    inputs: &["input", "split?"],
    outputs: &["outputs..."],
    attrs: &[
        AttrSpec::opt("axis", AttrKind::Int, "0"),
        AttrSpec::opt("num_outputs", AttrKind::Int, "required without split"),
    ],
    doc: "Splits along `axis` into the sizes in `split`, or into `num_outputs` parts of \
          ceil(d / num_outputs) (the last one smaller).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// The part sizes for an axis of size `d`.
fn parts(d: usize, split: Option<&[i64]>, num: Option<i64>) -> Result<Vec<usize>, String> {
    match (split, num) {
        // A run-time split comes with its part count (the importer sets it from the
        // node's outputs); once the split is known the two must agree.
        (Some(s), Some(n)) if s.len() as i64 != n => Err(format!(
            "split {s:?} has {} parts, num_outputs says {n}",
            s.len()
        )),
        (Some(s), _) => {
            let v: Vec<usize> = s
                .iter()
                .map(|&x| usize::try_from(x).map_err(|_| format!("split has {x}")))
                .collect::<Result<_, _>>()?;
            if v.iter().sum::<usize>() != d {
                return Err(format!("split {s:?} does not add up to the axis size {d}"));
            }
            Ok(v)
        }
        (None, Some(n)) if n >= 1 => {
            let n = n as usize;
            let chunk = d.div_ceil(n);
            if chunk * (n - 1) > d && d > 0 {
                return Err(format!("cannot split {d} into {n} parts of {chunk}"));
            }
            Ok((0..n)
                .map(|k| chunk.min(d.saturating_sub(k * chunk)))
                .collect())
        }
        (None, Some(n)) => Err(format!("num_outputs must be >= 1, got {n}")),
        (None, None) => Err("give split or num_outputs".into()),
    }
}

impl Op for Split {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &SPLIT
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let axis = x.shape.norm_axis(cx.attrs.int_or("axis", 0)?)?;
        let split = const_ints(cx, 1, "split")?;
        let num = cx.attrs.int("num_outputs")?;
        // A split computed at run time needs num_outputs for the number of outputs.
        let dynamic = cx.opt_input(1).is_some() && split.is_none();
        let count = match (&split, num) {
            (Some(s), _) => s.len(),
            (None, Some(n)) => n.max(0) as usize,
            (None, None) if dynamic => {
                return Err("a split computed at run time needs num_outputs".into())
            }
            (None, None) => return Err("give split or num_outputs".into()),
        };
        let sizes = match x.shape.dim(axis) {
            _ if dynamic => None,
            Dim::Fixed(d) => Some(parts(*d, split.as_deref(), num)?),
            Dim::Sym(_) => {
                parts(0, None, num.or(Some(1))).ok();
                None
            }
        };
        Ok((0..count)
            .map(|k| {
                let mut t = x.clone();
                t.shape.axes[axis].dim = match &sizes {
                    Some(s) => Dim::Fixed(s[k]),
                    None => match &split {
                        Some(s) => Dim::Fixed(s[k].max(0) as usize),
                        None => cx.fresh_dim(k, axis),
                    },
                };
                t
            })
            .collect())
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let axis = norm_axis(cx.attrs.int_or("axis", 0)?, x.rank())?;
        let split = cx.opt_input(1).map(|t| t.to_i64_vec());
        // With a split, num_outputs only fixed the output count (checked here).
        let num = cx.attrs.int("num_outputs")?;
        let sizes = parts(
            x.shape()[axis],
            split.as_deref(),
            if split.is_some() { None } else { num },
        )?;
        if num.is_some_and(|n| n as usize != sizes.len()) {
            return Err(format!(
                "split has {} parts, num_outputs is {}",
                sizes.len(),
                num.unwrap_or(0)
            ));
        }
        let mut start = 0;
        let mut outs = vec![];
        for s in sizes {
            let range = ndarray::Slice::from(start..start + s);
            outs.push(crate::map_tensor!(x, a => a.slice_axis(NdAxis(axis), range).to_owned()));
            start += s;
        }
        Ok(outs)
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(Concat), leak(Split)]
}
