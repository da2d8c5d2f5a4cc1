//! Scattering: ScatterElements and ScatterND write `updates` into a copy of `data` at
//! the positions an index tensor names (optionally combining with what is there), and
//! OneHot writes `on_value` at each index's position in a tensor of `off_value`.
//!
//! Index operands may be i32 or i64 and negative (counting from the end); an index out
//! of range is a run-time error naming it.
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, Dimension, IxDyn};

use super::gather::{index_type, resolve, same_rank};
use super::util::{out, same_dtype};
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::shape::norm_axis;
use crate::ir::{AttrKind, DType, Dim, TensorType};
use crate::match_tensor;
use crate::tensor::{Elem, Tensor};

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
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// How ScatterElements and ScatterND combine an update with the value it lands on: in
/// f64 for floats, in i64 wrapping like C for integers (as numpy, ONNX's reference, does).
#[derive(Clone, Copy)]
struct Combine {
    float: fn(f64, f64) -> f64,
    int: fn(i64, i64) -> i64,
    /// `int` on u64 values held as i64 bits (max and min compare them unsigned).
    u64: fn(i64, i64) -> i64,
}

fn reduction(s: &str) -> Result<Option<Combine>, String> {
    Ok(Some(match s {
        "none" => return Ok(None),
        "add" => Combine {
            float: |a, b| a + b,
            int: i64::wrapping_add,
            u64: i64::wrapping_add,
        },
        "mul" => Combine {
            float: |a, b| a * b,
            int: i64::wrapping_mul,
            u64: i64::wrapping_mul,
        },
        "max" => Combine {
            float: f64::max,
            int: i64::max,
            u64: |a, b| (a as u64).max(b as u64) as i64,
        },
        "min" => Combine {
            float: f64::min,
            int: i64::min,
            u64: |a, b| (a as u64).min(b as u64) as i64,
        },
        r => {
            return Err(format!(
                "reduction '{r}' is not one of none, add, mul, max, min"
            ))
        }
    }))
}

/// `x` with each update `u[k]` combined into the element `at(k)` (flat indices), in the
/// domain [`Combine`] says.
fn combine_into(
    x: &Tensor,
    u: &Tensor,
    f: Combine,
    mut at: impl FnMut(usize) -> Result<usize, String>,
) -> Result<Tensor, String> {
    fn go<T: Copy>(
        y: &mut [T],
        u: &[T],
        f: fn(T, T) -> T,
        at: &mut impl FnMut(usize) -> Result<usize, String>,
    ) -> Result<(), String> {
        for (k, &v) in u.iter().enumerate() {
            let p = at(k)?;
            y[p] = f(y[p], v);
        }
        Ok(())
    }
    if x.dtype().is_int() {
        let mut y = x.to_i64_array().as_standard_layout().into_owned();
        let u = u.to_i64_array().as_standard_layout().into_owned();
        let (ys, us) = (
            y.as_slice_mut().ok_or("not contiguous")?,
            u.as_slice().ok_or("not contiguous")?,
        );
        let int = if x.dtype() == DType::U64 {
            f.u64
        } else {
            f.int
        };
        go(ys, us, int, &mut at)?;
        Ok(Tensor::from_i64_array(x.dtype(), y))
    } else {
        let mut y = x.to_f64_array().as_standard_layout().into_owned();
        let u = u.to_f64_array().as_standard_layout().into_owned();
        let (ys, us) = (
            y.as_slice_mut().ok_or("not contiguous")?,
            u.as_slice().ok_or("not contiguous")?,
        );
        go(ys, us, f.float, &mut at)?;
        Ok(Tensor::from_f64_array(x.dtype(), y))
    }
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
                // Flat positions: updates in standard order, targets in x's.
                let (ushape, xshape) = (upd.shape().to_vec(), x.shape().to_vec());
                let unravel = |mut k: usize| {
                    let mut idx = vec![0; ushape.len()];
                    for (i, &d) in ushape.iter().enumerate().rev() {
                        idx[i] = k % d.max(1);
                        k /= d.max(1);
                    }
                    idx
                };
                combine_into(x, upd, f, |k| {
                    let t = target(&unravel(k))?;
                    Ok(t.iter().zip(&xshape).fold(0, |acc, (&i, &d)| acc * d + i))
                })?
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
    in_place: InPlace::No,
    origin: Origin::Onnx,
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
            Some(f) => combine_into(x, upd, f, |k| {
                Ok(offsets[k / tail_len.max(1)] + k % tail_len.max(1))
            })?,
        };
        Ok(vec![y])
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
    in_place: InPlace::No,
    origin: Origin::Onnx,
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
        if depth.num_elements().is_some_and(|n| n != 1) {
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

pub fn ops() -> Vec<&'static dyn Op> {
    vec![leak(ScatterElements), leak(ScatterNd), leak(OneHot)]
}
