//! Indexing: Gather, GatherElements, ScatterElements, ScatterND, ReverseSequence, Unique, OneHot, TopK, CumSum, CumProd.
//!
//! Index operands may be i32 or i64 and negative (counting from the end); an index out
//! of range is a run-time error naming it.
use ndarray::{ArrayD, Axis, Dimension, IxDyn};

use super::util::{out, remap, same_dtype};
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::shape::norm_axis;
use crate::ir::{AttrKind, DType, Dim, Shape, TensorType};
use crate::match_tensor;
use crate::tensor::{Elem, Tensor};

fn index_type(t: &TensorType, i: usize) -> Result<(), String> {
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
fn resolve(indices: &Tensor, d: usize) -> Result<ArrayD<usize>, String> {
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
};

impl Op for Gather {
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
};

fn same_rank(x: &TensorType, idx: &TensorType) -> Result<(), String> {
    if x.rank() != idx.rank() || x.rank() == 0 {
        return Err(format!("indices ({idx}) must have data's rank ({x})"));
    }
    Ok(())
}

impl Op for GatherElements {
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

// ---------------------------------------------------------------- ScatterElements

struct ScatterElements;

const SCATTER_ELEMENTS: OpSchema = OpSchema {
    name: "ScatterElements",
    family: "gather",
    inputs: &["data", "indices", "updates"],
    outputs: &["output"],
    attrs: &[
        AttrSpec::opt("axis", AttrKind::Int, "0"),
        AttrSpec::opt("reduction", AttrKind::String, "none"),
    ],
    doc: "A copy of data where output[i with its `axis` coordinate replaced by \
          indices[i]] = updates[i], or combined with it by reduction add/mul/max/min \
          (in index order).",
};

/// How ScatterElements combines an update with the value it lands on.
type Combine = fn(f64, f64) -> f64;

fn reduction(s: &str) -> Result<Option<Combine>, String> {
    Ok(match s {
        "none" => None,
        "add" => Some(|a, b| a + b),
        "mul" => Some(|a, b| a * b),
        "max" => Some(f64::max),
        "min" => Some(f64::min),
        r => {
            return Err(format!(
                "reduction '{r}' is not one of none, add, mul, max, min"
            ))
        }
    })
}

impl Op for ScatterElements {
    fn schema(&self) -> &OpSchema {
        &SCATTER_ELEMENTS
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, idx, upd) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
        index_type(idx, 1)?;
        same_rank(x, idx)?;
        same_dtype("ScatterElements", &[x, upd])?;
        // Two different symbols may be one size (a gradient flattens two tensors of one
        // shape, each Reshape naming its own symbol): assumed equal here, checked at
        // run time, as broadcasting does.
        let (di, du) = (idx.shape.dims(), upd.shape.dims());
        let may_match = di.len() == du.len()
            && di
                .iter()
                .zip(&du)
                .all(|(a, b)| a == b || a.fixed().is_none() || b.fixed().is_none());
        if !may_match {
            return Err(format!(
                "updates ({upd}) must have the shape of indices ({idx})"
            ));
        }
        x.shape.norm_axis(cx.attrs.int_or("axis", 0)?)?;
        if reduction(cx.attrs.string_or("reduction", "none")?)?.is_some() && !x.dtype.is_numeric() {
            return Err("a reduction needs numeric data".into());
        }
        Ok(vec![x.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (x, idx, upd) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
        let axis = norm_axis(cx.attrs.int_or("axis", 0)?, x.rank())?;
        let k = resolve(idx, x.shape()[axis])?;
        if idx.shape() != upd.shape() {
            return Err("updates and indices differ in shape".into());
        }
        let target = |o: &[usize]| -> Result<Vec<usize>, String> {
            let mut p = o.to_vec();
            p[axis] = k[IxDyn(o)];
            for (a, (&i, &d)) in p.iter().zip(x.shape()).enumerate() {
                if i >= d {
                    return Err(format!("indices reach {i} on axis {a} of size {d}"));
                }
            }
            Ok(p)
        };
        let y = match reduction(cx.attrs.string_or("reduction", "none")?)? {
            None => {
                fn scatter<T: Elem>(
                    x: &ArrayD<T>,
                    u: &Tensor,
                    mut at: impl FnMut(&[usize]) -> Result<Vec<usize>, String>,
                ) -> Result<Tensor, String> {
                    let u = T::view(u).ok_or("updates has another dtype")?;
                    let mut y = x.clone();
                    for (o, &v) in u.indexed_iter() {
                        y[IxDyn(&at(o.slice())?)] = v;
                    }
                    Ok(T::wrap(y))
                }
                match_tensor!(x, a => scatter(a, upd, target))?
            }
            Some(f) => {
                let mut y = x.to_f64_array();
                for (o, &v) in upd.to_f64_array().indexed_iter() {
                    let p = IxDyn(&target(o.slice())?);
                    let cur = y[&p];
                    y[&p] = f(cur, v);
                }
                Tensor::from_f64_array(x.dtype(), y)
            }
        };
        Ok(vec![y])
    }
}

// ---------------------------------------------------------------- ScatterND

struct ScatterNd;

const SCATTER_ND: OpSchema = OpSchema {
    name: "ScatterND",
    family: "gather",
    inputs: &["data", "indices", "updates"],
    outputs: &["output"],
    attrs: &[AttrSpec::opt("reduction", AttrKind::String, "none")],
    doc: "A copy of data where each index tuple indices[p, :] (k coordinates) receives \
          the slice updates[p] of data's trailing axes, or is combined with it by \
          reduction add/mul/max/min (in index order). updates is \
          indices.shape[:-1] + data.shape[k:].",
};

impl Op for ScatterNd {
    fn schema(&self) -> &OpSchema {
        &SCATTER_ND
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, idx, upd) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
        if idx.dtype != DType::I64 {
            return Err(format!("input 1 (indices) must be i64, got {}", idx.dtype));
        }
        same_dtype("ScatterND", &[x, upd])?;
        if idx.rank() == 0 {
            return Err("indices must have rank 1 or more".into());
        }
        if let Some(k) = idx.shape.dim(idx.rank() - 1).fixed() {
            if k > x.rank() {
                return Err(format!("indices address {k} axes of data {x}"));
            }
            let mut want = idx.shape.dims()[..idx.rank() - 1].to_vec();
            want.extend_from_slice(&x.shape.dims()[k..]);
            if upd.rank() != want.len() {
                return Err(format!(
                    "updates ({upd}) must have shape indices.shape[:-1] + data.shape[{k}:]"
                ));
            }
        }
        if reduction(cx.attrs.string_or("reduction", "none")?)?.is_some() && !x.dtype.is_numeric() {
            return Err("a reduction needs numeric data".into());
        }
        Ok(vec![x.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (x, idx, upd) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
        let combine = reduction(cx.attrs.string_or("reduction", "none")?)?;
        let ishape = idx.shape();
        let k = ishape[ishape.len() - 1];
        let (outer, tail) = (&ishape[..ishape.len() - 1], &x.shape()[k.min(x.rank())..]);
        let mut want = outer.to_vec();
        want.extend_from_slice(tail);
        if k > x.rank() || upd.shape() != want.as_slice() {
            return Err(format!(
                "updates {:?} must be {want:?} for indices {ishape:?} into data {:?}",
                upd.shape(),
                x.shape()
            ));
        }
        let idx = idx.to_i64_array();
        let idx = idx.as_standard_layout();
        let flat = idx.as_slice().ok_or("indices are not contiguous")?;
        let tail_len: usize = tail.iter().product();
        // Each update slice's flat offset into data.
        let count: usize = outer.iter().product();
        let mut offsets = vec![0; if k == 0 { count } else { 0 }];
        for tuple in flat.chunks(k.max(1)).take(if k == 0 { 0 } else { count }) {
            let mut off = 0usize;
            for (a, &i) in tuple.iter().enumerate().take(k) {
                let d = x.shape()[a] as i64;
                if i < -d || i >= d {
                    return Err(format!(
                        "index {i} is out of range for axis {a} of size {d}"
                    ));
                }
                off = off * d as usize + (if i < 0 { i + d } else { i }) as usize;
            }
            offsets.push(off * tail_len);
        }
        let y = match combine {
            None => {
                fn scatter<T: Elem>(
                    x: &ArrayD<T>,
                    u: &Tensor,
                    offsets: &[usize],
                    n: usize,
                ) -> Result<Tensor, String> {
                    let u = T::view(u).ok_or("updates has another dtype")?;
                    let u = u.as_standard_layout();
                    let u = u.as_slice().ok_or("updates are not contiguous")?;
                    let mut y = x.as_standard_layout().into_owned();
                    let ys = y.as_slice_mut().ok_or("data is not contiguous")?;
                    for (p, &off) in offsets.iter().enumerate() {
                        ys[off..off + n].copy_from_slice(&u[p * n..(p + 1) * n]);
                    }
                    Ok(T::wrap(y))
                }
                match_tensor!(x, a => scatter(a, upd, &offsets, tail_len))?
            }
            Some(f) => {
                let mut y = x.to_f64_array().as_standard_layout().into_owned();
                let u = upd.to_f64_array();
                let u = u.as_standard_layout();
                let (ys, us) = (
                    y.as_slice_mut().ok_or("data is not contiguous")?,
                    u.as_slice().ok_or("updates are not contiguous")?,
                );
                for (p, &off) in offsets.iter().enumerate() {
                    for e in 0..tail_len {
                        ys[off + e] = f(ys[off + e], us[p * tail_len + e]);
                    }
                }
                Tensor::from_f64_array(x.dtype(), y)
            }
        };
        Ok(vec![y])
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

// ---------------------------------------------------------------- Unique

struct Unique;

const UNIQUE: OpSchema = OpSchema {
    name: "Unique",
    family: "gather",
    inputs: &["X"],
    outputs: &["Y", "indices", "inverse_indices", "counts"],
    attrs: &[
        AttrSpec::opt("axis", AttrKind::Int, "none: the flattened input"),
        AttrSpec::opt("sorted", AttrKind::Int, "1"),
    ],
    doc: "The distinct elements of X (or its distinct slices along `axis`), ascending \
          when sorted, else in order of first occurrence; indices (i64) of each one's \
          first occurrence, inverse_indices mapping every element (slice) of X to its \
          entry of Y, and counts. Always has all four outputs.",
};

/// X's elements (or slices along `axis`), each as a list of exact, totally ordered
/// integer keys: floats by their bits (with -0 as 0), 64-bit integers unwrapped.
fn unique_keys(x: &Tensor, axis: Option<usize>) -> Vec<Vec<i128>> {
    let keys: ArrayD<i128> = if x.dtype().is_float() {
        x.to_f64_array().mapv(|v| {
            let b = (if v == 0.0 { 0.0 } else { v }).to_bits() as i64;
            (if b < 0 { b ^ i64::MAX } else { b }) as i128
        })
    } else if x.dtype() == DType::U64 {
        x.to_i64_array().mapv(|v| v as u64 as i128)
    } else {
        x.to_i64_array().mapv(|v| v as i128)
    };
    match axis {
        None => keys.iter().map(|&v| vec![v]).collect(),
        Some(ax) => keys
            .axis_iter(Axis(ax))
            .map(|s| s.iter().copied().collect())
            .collect(),
    }
}

impl Op for Unique {
    fn schema(&self) -> &OpSchema {
        &UNIQUE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        if !x.dtype.is_numeric() {
            return Err(format!("X must be numeric, got {}", x.dtype));
        }
        let u = cx.fresh_dim(0, 0);
        let (y, inverse) = match cx.attrs.int("axis")? {
            None => (
                Shape::new([u.clone()]),
                Shape::new([x
                    .shape
                    .num_elements()
                    .map_or(cx.fresh_dim(2, 0), Dim::Fixed)]),
            ),
            Some(a) => {
                let ax = x.shape.norm_axis(a)?;
                let mut y = x.shape.clone();
                y.axes[ax].dim = cx.fresh_dim(0, ax);
                y.axes[ax].name = None;
                let u = y.axes[ax].dim.clone();
                return Ok(vec![
                    TensorType::new(x.dtype, y),
                    TensorType::new(DType::I64, Shape::new([u.clone()])),
                    TensorType::new(DType::I64, Shape::new([x.shape.dim(ax).clone()])),
                    TensorType::new(DType::I64, Shape::new([u])),
                ]);
            }
        };
        Ok(vec![
            TensorType::new(x.dtype, y),
            TensorType::new(DType::I64, Shape::new([u.clone()])),
            TensorType::new(DType::I64, inverse),
            TensorType::new(DType::I64, Shape::new([u])),
        ])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let axis = cx
            .attrs
            .int("axis")?
            .map(|a| norm_axis(a, x.rank()))
            .transpose()?;
        let sorted = cx.attrs.int_or("sorted", 1)? != 0;
        let keys = unique_keys(x, axis);
        // First occurrences, in order of appearance.
        let mut first: Vec<usize> = vec![];
        let mut slot: Vec<usize> = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            match first.iter().position(|&f| keys[f] == *k) {
                Some(j) => slot.push(j),
                None => {
                    slot.push(first.len());
                    first.push(i);
                }
            }
        }
        // Output order of the distinct entries.
        let mut order: Vec<usize> = (0..first.len()).collect();
        if sorted {
            order.sort_by(|&a, &b| keys[first[a]].cmp(&keys[first[b]]));
        }
        let mut rank_of = vec![0; order.len()];
        for (r, &j) in order.iter().enumerate() {
            rank_of[j] = r;
        }
        let picks: Vec<usize> = order.iter().map(|&j| first[j]).collect();
        let mut counts = vec![0i64; order.len()];
        for &j in &slot {
            counts[rank_of[j]] += 1;
        }
        let inverse: Vec<i64> = slot.iter().map(|&j| rank_of[j] as i64).collect();
        let n = picks.len();
        let mut shape = x.shape().to_vec();
        let ax = match axis {
            Some(ax) => ax,
            None => {
                shape = vec![x.len()];
                0
            }
        };
        shape[ax] = n;
        let flat;
        let x = match axis {
            Some(_) => x,
            None => {
                flat = crate::map_tensor!(x.clone(), a => a
                    .as_standard_layout()
                    .into_owned()
                    .into_shape_with_order(IxDyn(&[x.len()]))
                    .map_err(|e| e.to_string())?);
                &flat
            }
        };
        let src = |o: &[usize], p: &mut Vec<usize>| {
            p.extend_from_slice(o);
            p[ax] = picks[o[ax]];
            true
        };
        let y = match_tensor!(x, a => remap(a, &shape, Default::default(), src));
        let ints = |v: Vec<i64>| Tensor::from_vec(&[v.len()], v);
        Ok(vec![
            y,
            ints(picks.iter().map(|&i| i as i64).collect())?,
            ints(inverse)?,
            ints(counts)?,
        ])
    }
}

// ---------------------------------------------------------------- OneHot

struct OneHot;

const ONE_HOT: OpSchema = OpSchema {
    name: "OneHot",
    family: "gather",
    inputs: &["indices", "depth", "values"],
    outputs: &["output"],
    attrs: &[AttrSpec::opt("axis", AttrKind::Int, "-1")],
    doc: "values[1] where the new `axis` coordinate equals the index (negative indices \
          count from depth), values[0] elsewhere; indices out of range give all values[0].",
};

impl Op for OneHot {
    fn schema(&self) -> &OpSchema {
        &ONE_HOT
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (idx, depth, values) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
        if !idx.dtype.is_numeric() || !depth.dtype.is_numeric() {
            return Err("indices and depth must be numeric".into());
        }
        if depth.shape.num_elements().is_some_and(|n| n != 1) {
            return Err(format!("depth must hold one value, got {depth}"));
        }
        if values.rank() != 1 || values.shape.dim(0).fixed().is_some_and(|n| n != 2) {
            return Err(format!("values must be [off, on], got {values}"));
        }
        let r = idx.rank() + 1;
        let axis = norm_axis(cx.attrs.int_or("axis", -1)?, r)?;
        let d = match cx.const_input(1) {
            Some(c) => {
                let v = c.to_f64_vec()[0];
                if v < 1.0 {
                    return Err(format!("depth must be >= 1, got {v}"));
                }
                Dim::Fixed(v as usize)
            }
            None => cx.fresh_dim(0, axis),
        };
        let mut shape = idx.shape.clone();
        shape
            .axes
            .insert(axis, crate::ir::Axis { dim: d, name: None });
        Ok(out(values.dtype, shape))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (idx, depth, values) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
        let d = depth.to_f64_vec()[0];
        if d < 1.0 {
            return Err(format!("depth must be >= 1, got {d}"));
        }
        let d = d as usize;
        let axis = norm_axis(cx.attrs.int_or("axis", -1)?, idx.rank() + 1)?;
        let k = idx.to_f64_array().mapv(|v| {
            let v = v.trunc() as i64;
            if v < 0 {
                v + d as i64
            } else {
                v
            }
        });
        let mut shape = idx.shape().to_vec();
        shape.insert(axis, d);
        crate::ir::ops::util::check_size(&shape)?;
        fn fill<T: Elem>(v: &ArrayD<T>, k: &ArrayD<i64>, shape: &[usize], axis: usize) -> Tensor {
            let (off, on) = (v[[0].as_ref()], v[[1].as_ref()]);
            T::wrap(ArrayD::from_shape_fn(IxDyn(shape), |o| {
                let mut src: Vec<usize> = o.slice().to_vec();
                let c = src.remove(axis) as i64;
                if k[IxDyn(&src)] == c {
                    on
                } else {
                    off
                }
            }))
        }
        if values.len() != 2 {
            return Err(format!("values must hold 2 values, got {}", values.len()));
        }
        let y = match_tensor!(values, v => fill(v, &k, &shape, axis));
        Ok(vec![y])
    }
}

// ---------------------------------------------------------------- TopK

struct TopK;

const TOP_K: OpSchema = OpSchema {
    name: "TopK",
    family: "gather",
    inputs: &["X", "K"],
    outputs: &["Values", "Indices"],
    attrs: &[
        AttrSpec::opt("axis", AttrKind::Int, "-1"),
        AttrSpec::opt("largest", AttrKind::Int, "1"),
        AttrSpec::opt("sorted", AttrKind::Int, "1"),
    ],
    doc: "The K largest (or smallest) values along `axis` and their i64 indices, best \
          first; equal values keep index order. Always sorted (sorted = 0 allows any order).",
};

impl Op for TopK {
    fn schema(&self) -> &OpSchema {
        &TOP_K
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, k) = (cx.input(0)?, cx.input(1)?);
        if !x.dtype.is_numeric() {
            return Err(format!("X must be numeric, got {}", x.dtype));
        }
        if k.dtype != DType::I64 || k.shape.num_elements().is_some_and(|n| n != 1) {
            return Err(format!("K must be a one-element i64 tensor, got {k}"));
        }
        let axis = x.shape.norm_axis(cx.attrs.int_or("axis", -1)?)?;
        let mut shape = x.shape.clone();
        shape.axes[axis].dim = match cx.const_input(1) {
            Some(c) => {
                let k = c.to_i64_vec()[0];
                if k < 0 || x.shape.dim(axis).fixed().is_some_and(|d| k as usize > d) {
                    return Err(format!(
                        "K = {k} is out of range for axis size {}",
                        x.shape.dim(axis)
                    ));
                }
                Dim::Fixed(k as usize)
            }
            None => cx.fresh_dim(0, axis),
        };
        Ok(vec![
            TensorType::new(x.dtype, shape.clone()),
            TensorType::new(DType::I64, shape),
        ])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let k = cx.input(1)?.to_i64_vec()[0];
        let axis = norm_axis(cx.attrs.int_or("axis", -1)?, x.rank())?;
        let d = x.shape()[axis];
        if k < 0 || k as usize > d {
            return Err(format!("K = {k} is out of range for axis size {d}"));
        }
        let k = k as usize;
        let largest = cx.attrs.int_or("largest", 1)? != 0;
        let a = x.to_f64_array();
        let mut shape = x.shape().to_vec();
        shape[axis] = k;
        let mut vals = ArrayD::zeros(IxDyn(&shape));
        let mut idxs = ArrayD::<i64>::zeros(IxDyn(&shape));
        for ((lane, mut vl), mut il) in a
            .lanes(Axis(axis))
            .into_iter()
            .zip(vals.lanes_mut(Axis(axis)))
            .zip(idxs.lanes_mut(Axis(axis)))
        {
            let mut order: Vec<usize> = (0..d).collect();
            // A stable sort keeps equal values in index order.
            order.sort_by(|&i, &j| {
                let (p, q) = (lane[i], lane[j]);
                let c = p.partial_cmp(&q).unwrap_or(std::cmp::Ordering::Equal);
                if largest {
                    c.reverse()
                } else {
                    c
                }
            });
            for (slot, &i) in order.iter().take(k).enumerate() {
                vl[slot] = lane[i];
                il[slot] = i as i64;
            }
        }
        let values = if x.dtype().is_float() {
            Tensor::from_f64_array(x.dtype(), vals)
        } else {
            Tensor::from_i64_array(x.dtype(), vals.mapv(|v| v as i64))
        };
        Ok(vec![values, Tensor::I64(idxs)])
    }
}

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

// ---------------------------------------------------------------- Trilu / NonZero

struct Trilu;

const TRILU: OpSchema = OpSchema {
    name: "Trilu",
    family: "gather",
    inputs: &["input", "k?"],
    outputs: &["output"],
    attrs: &[AttrSpec::opt("upper", AttrKind::Int, "1")],
    doc: "Keeps the upper (or lower) triangle of the last two axes, from diagonal k (a \
          scalar, default 0); zeros elsewhere.",
};

impl Op for Trilu {
    fn schema(&self) -> &OpSchema {
        &TRILU
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        if x.rank() < 2 {
            return Err(format!("input must have rank >= 2, got {x}"));
        }
        if let Some(k) = cx.opt_input(1) {
            if k.dtype != DType::I64 || k.shape.num_elements().is_some_and(|n| n != 1) {
                return Err(format!("k must be one i64 value, got {k}"));
            }
        }
        Ok(vec![x.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let k = cx
            .opt_input(1)
            .map_or(0, |t| t.to_i64_vec().first().copied().unwrap_or(0));
        let upper = cx.attrs.int_or("upper", 1)? != 0;
        let r = x.rank();
        let shape = x.shape().to_vec();
        let keep = move |o: &[usize]| {
            let (i, j) = (o[r - 2] as i64, o[r - 1] as i64);
            if upper {
                j - i >= k
            } else {
                j - i <= k
            }
        };
        let y = match_tensor!(x, a => remap(a, &shape, Elem::from_i64(0), |o, src| {
            src.extend(o);
            keep(o)
        }));
        Ok(vec![y])
    }
}

struct NonZero;

const NON_ZERO: OpSchema = OpSchema {
    name: "NonZero",
    family: "gather",
    inputs: &["X"],
    outputs: &["Y"],
    attrs: &[],
    doc: "The indices of the non-zero elements, as i64 [rank, count] in row-major order.",
};

impl Op for NonZero {
    fn schema(&self) -> &OpSchema {
        &NON_ZERO
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let shape = Shape::new([Dim::Fixed(x.rank()), cx.fresh_dim(0, 1)]);
        Ok(out(DType::I64, shape))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let a = x.to_f64_array();
        let hits: Vec<Vec<usize>> = a
            .indexed_iter()
            .filter(|(_, &v)| v != 0.0)
            .map(|(i, _)| i.slice().to_vec())
            .collect();
        let (r, n) = (x.rank(), hits.len());
        let mut v = vec![0i64; r * n];
        for (col, idx) in hits.iter().enumerate() {
            for (row, &i) in idx.iter().enumerate() {
                v[row * n + col] = i as i64;
            }
        }
        Ok(vec![Tensor::from_vec(&[r, n], v)?])
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
};

impl Op for GatherNd {
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

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![
        leak(Nms),
        leak(GatherNd),
        leak(Trilu),
        leak(NonZero),
        leak(Gather),
        leak(GatherElements),
        leak(ScatterElements),
        leak(ScatterNd),
        leak(ReverseSequence),
        leak(Unique),
        leak(OneHot),
        leak(TopK),
        leak(Cumulative {
            schema: OpSchema {
                name: "CumSum",
                family: "gather",
                inputs: &["x", "axis"],
                outputs: &["y"],
                attrs: CUMULATIVE_ATTRS,
                doc: "Running sum along the scalar `axis` input, optionally exclusive and/or \
                      reversed.",
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
            },
            product: true,
        }),
    ]
}

// ---------------------------------------------------------------- NonMaxSuppression

struct Nms;

const NMS: OpSchema = OpSchema {
    name: "NonMaxSuppression",
    family: "gather",
    inputs: &[
        "boxes",
        "scores",
        "max_output_boxes_per_class?",
        "iou_threshold?",
        "score_threshold?",
    ],
    outputs: &["selected_indices"],
    attrs: &[AttrSpec::opt("center_point_box", AttrKind::Int, "0")],
    doc: "Greedy non-maximum suppression per batch and class: boxes [B, N, 4], scores \\
          [B, C, N]; returns i64 [selected, 3] rows (batch, class, box), best score first.",
};

/// A box as (y1, x1, y2, x2) with y1 <= y2 and x1 <= x2.
fn corners(b: &[f64], center: bool) -> [f64; 4] {
    if center {
        let (xc, yc, w, h) = (b[0], b[1], b[2], b[3]);
        [yc - h / 2.0, xc - w / 2.0, yc + h / 2.0, xc + w / 2.0]
    } else {
        [
            b[0].min(b[2]),
            b[1].min(b[3]),
            b[0].max(b[2]),
            b[1].max(b[3]),
        ]
    }
}

fn iou(a: [f64; 4], b: [f64; 4]) -> f64 {
    let h = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let w = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = h * w;
    let union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
    if union <= 0.0 {
        0.0
    } else {
        inter / union
    }
}

impl Op for Nms {
    fn schema(&self) -> &OpSchema {
        &NMS
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (boxes, scores) = (cx.input(0)?, cx.input(1)?);
        if boxes.rank() != 3 || scores.rank() != 3 || !boxes.dtype.is_float() {
            return Err(format!(
                "boxes must be float [B, N, 4] and scores [B, C, N], got {boxes} and {scores}"
            ));
        }
        Ok(out(
            DType::I64,
            Shape::new([cx.fresh_dim(0, 0), Dim::Fixed(3)]),
        ))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let boxes = cx.input(0)?.to_f64_array();
        let scores = cx.input(1)?.to_f64_array();
        let scalar = |i: usize, default: f64| {
            cx.opt_input(i)
                .and_then(|t| t.to_f64_vec().first().copied())
                .unwrap_or(default)
        };
        let max_out = scalar(2, 0.0).max(0.0) as usize;
        let iou_threshold = scalar(3, 0.0);
        let score_threshold = cx
            .opt_input(4)
            .and_then(|t| t.to_f64_vec().first().copied());
        let center = cx.attrs.int_or("center_point_box", 0)? == 1;
        let (nb, n) = (boxes.shape()[0], boxes.shape()[1]);
        let (sb, nc, sn) = (scores.shape()[0], scores.shape()[1], scores.shape()[2]);
        if boxes.shape()[2] != 4 || sb != nb || sn != n {
            return Err(format!(
                "boxes {:?} and scores {:?} do not match",
                boxes.shape(),
                scores.shape()
            ));
        }
        let mut rows: Vec<i64> = vec![];
        for b in 0..nb {
            let bx: Vec<[f64; 4]> = (0..n)
                .map(|i| {
                    corners(
                        &[
                            boxes[[b, i, 0]],
                            boxes[[b, i, 1]],
                            boxes[[b, i, 2]],
                            boxes[[b, i, 3]],
                        ],
                        center,
                    )
                })
                .collect();
            for c in 0..nc {
                let mut cand: Vec<usize> = (0..n)
                    .filter(|&i| score_threshold.is_none_or(|t| scores[[b, c, i]] > t))
                    .collect();
                // Stable: equal scores keep box order.
                cand.sort_by(|&i, &j| {
                    scores[[b, c, j]]
                        .partial_cmp(&scores[[b, c, i]])
                        .unwrap_or(std::cmp::Ordering::Equal)
                });
                let mut kept: Vec<usize> = vec![];
                for i in cand {
                    if kept.len() >= max_out {
                        break;
                    }
                    if kept.iter().all(|&k| iou(bx[k], bx[i]) <= iou_threshold) {
                        kept.push(i);
                        rows.extend([b as i64, c as i64, i as i64]);
                    }
                }
            }
        }
        Ok(vec![Tensor::from_vec(&[rows.len() / 3, 3], rows)?])
    }
}
