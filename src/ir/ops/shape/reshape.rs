//! Reshape, Flatten, Squeeze, Unsqueeze, Identity, Transpose, Expand.
use crate::ir::ops::{InPlace, Origin};
use ndarray::IxDyn;

use super::{const_ints, product, static_len};
use crate::ir::ops::util::out;
use crate::ir::ops::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::shape::{broadcast_shapes, norm_axis, Axis};
use crate::ir::{AttrKind, Dim, Shape, TensorType};
use crate::tensor::{Elem, Tensor};
use crate::{map_tensor, match_tensor};

fn reshaped(t: &Tensor, shape: &[usize]) -> Result<Tensor, String> {
    let n: usize = shape.iter().product();
    if n != t.len() {
        return Err(format!(
            "cannot reshape {:?} ({} elements) to {shape:?}",
            t.shape(),
            t.len()
        ));
    }
    Ok(map_tensor!(t, a => a
        .as_standard_layout()
        .into_owned()
        .into_shape_with_order(IxDyn(shape))
        .map_err(|e| e.to_string())?))
}

// ---------------------------------------------------------------- Reshape

struct Reshape;

const RESHAPE: OpSchema = OpSchema {
    name: "Reshape",
    family: "shape",
    inputs: &["data", "shape"],
    outputs: &["reshaped"],
    attrs: &[AttrSpec::opt("allowzero", AttrKind::Int, "0")],
    doc: "Same elements, new shape: 0 copies the input's dim (unless allowzero), -1 is \
          inferred.",
    in_place: InPlace::View,
    origin: Origin::Onnx,
};

/// The target shape from the shape operand, against input dims `x` (symbolic allowed).
fn reshape_dims(
    x: &[Dim],
    spec: &[i64],
    allowzero: bool,
    fresh: impl Fn(usize) -> Dim,
) -> Result<Vec<Dim>, String> {
    let mut dims: Vec<Option<Dim>> = vec![];
    let mut infer_at = None;
    for (i, &s) in spec.iter().enumerate() {
        dims.push(match s {
            -1 if infer_at.is_some() => return Err("shape has more than one -1".into()),
            -1 => {
                infer_at = Some(i);
                None
            }
            0 if !allowzero => Some(x.get(i).cloned().ok_or_else(|| {
                format!("shape[{i}] is 0 (copy) but the input has rank {}", x.len())
            })?),
            s if s >= 0 => Some(Dim::Fixed(s as usize)),
            s => return Err(format!("shape[{i}] is {s}; dims are >= 0, -1 or 0")),
        });
    }
    let known: Vec<Dim> = dims.iter().flatten().cloned().collect();
    if let Some(at) = infer_at {
        // The missing dim: the input's fixed product over the output's, once the
        // symbols common to both cancel.
        let mut syms_in: Vec<&Dim> = x.iter().filter(|d| d.fixed().is_none()).collect();
        let mut ok = true;
        for d in known.iter().filter(|d| d.fixed().is_none()) {
            match syms_in.iter().position(|s| *s == d) {
                Some(p) => {
                    syms_in.remove(p);
                }
                None => ok = false,
            }
        }
        let fixed = |ds: &[Dim]| {
            ds.iter()
                .filter_map(|d| d.fixed())
                .try_fold(1usize, |n, d| n.checked_mul(d))
                .ok_or_else(|| format!("{ds:?} has too many elements"))
        };
        let (fixed_in, fixed_out) = (fixed(x)?, fixed(&known)?);
        dims[at] = Some(match (ok, syms_in.as_slice()) {
            (true, []) if fixed_out == 0 => return Err("cannot infer -1 next to a 0 dim".into()),
            (true, []) if fixed_in % fixed_out != 0 => {
                return Err(format!(
                    "cannot reshape {} elements into a multiple of {fixed_out}",
                    fixed_in
                ))
            }
            (true, []) => Dim::Fixed(fixed_in / fixed_out),
            (true, [s]) if fixed_in == fixed_out => (*s).clone(),
            _ => fresh(at),
        });
    } else if let (Some(a), Some(b)) = (product(x), product(&known)) {
        if a != b {
            return Err(format!("cannot reshape {a} elements into {b}"));
        }
    }
    Ok(dims.into_iter().map(|d| d.expect("filled")).collect())
}

impl Op for Reshape {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &RESHAPE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let allowzero = cx.attrs.int_or("allowzero", 0)? != 0;
        let dims = match const_ints(cx, 1, "shape")? {
            Some(spec) => reshape_dims(&x.shape.dims(), &spec, allowzero, |a| cx.fresh_dim(0, a))?,
            None => {
                let n = static_len(cx, 1).ok_or("the shape input needs a static length")?;
                (0..n).map(|a| cx.fresh_dim(0, a)).collect()
            }
        };
        Ok(out(x.dtype, Shape::new(dims)))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let spec = cx.input(1)?.to_i64_vec();
        let allowzero = cx.attrs.int_or("allowzero", 0)? != 0;
        let dims: Vec<Dim> = x.shape().iter().map(|&d| Dim::Fixed(d)).collect();
        let shape = reshape_dims(&dims, &spec, allowzero, |_| Dim::Fixed(0))?;
        let shape: Vec<usize> = shape.iter().map(|d| d.fixed().unwrap_or(0)).collect();
        Ok(vec![reshaped(x, &shape)?])
    }
}

// ---------------------------------------------------------------- Flatten

struct Flatten;

const FLATTEN: OpSchema = OpSchema {
    name: "Flatten",
    family: "shape",
    inputs: &["input"],
    outputs: &["output"],
    attrs: &[AttrSpec::opt("axis", AttrKind::Int, "1")],
    doc: "To 2-D: [d0 * ... * d(axis-1), d(axis) * ... * dn].",
    in_place: InPlace::View,
    origin: Origin::Onnx,
};

fn flatten_axis(cx_axis: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    if cx_axis < -r || cx_axis > r {
        return Err(format!("axis {cx_axis} is out of range [-{r}, {r}]"));
    }
    Ok(if cx_axis < 0 { cx_axis + r } else { cx_axis } as usize)
}

impl Op for Flatten {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &FLATTEN
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let axis = flatten_axis(cx.attrs.int_or("axis", 1)?, x.rank())?;
        let dims = x.shape.dims();
        let group = |ds: &[Dim], k: usize| match (ds, product(ds)) {
            (_, Some(n)) => Dim::Fixed(n),
            ([d], None) => d.clone(),
            _ => cx.fresh_dim(0, k),
        };
        Ok(out(
            x.dtype,
            Shape::new([group(&dims[..axis], 0), group(&dims[axis..], 1)]),
        ))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let axis = flatten_axis(cx.attrs.int_or("axis", 1)?, x.rank())?;
        let s = x.shape();
        Ok(vec![reshaped(
            x,
            &[s[..axis].iter().product(), s[axis..].iter().product()],
        )?])
    }
}

// ---------------------------------------------------------------- Squeeze / Unsqueeze

struct Squeeze;

const SQUEEZE: OpSchema = OpSchema {
    name: "Squeeze",
    family: "shape",
    inputs: &["data", "axes?"],
    outputs: &["squeezed"],
    attrs: &[],
    doc: "Removes the listed size-1 axes (all size-1 axes when axes is omitted: of unknown rank while a dim is symbolic).",
    in_place: InPlace::View,
    origin: Origin::Onnx,
};

fn squeeze_axes(dims: &[Dim], axes: Option<&[i64]>) -> Result<Vec<usize>, String> {
    match axes {
        None => Ok((0..dims.len()).filter(|&i| dims[i].is_one()).collect()),
        Some(list) => {
            let mut v = vec![];
            for &a in list {
                let i = norm_axis(a, dims.len())?;
                if matches!(dims[i], Dim::Fixed(n) if n != 1) {
                    return Err(format!("cannot squeeze axis {a}: its size is {}", dims[i]));
                }
                v.push(i);
            }
            Ok(v)
        }
    }
}

impl Op for Squeeze {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &SQUEEZE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let shape = match (cx.opt_input(1), const_ints(cx, 1, "axes")?) {
            (Some(_), None) => {
                let n = static_len(cx, 1).ok_or("the axes input needs a static length")?;
                Shape::new((0..x.rank().saturating_sub(n)).map(|a| cx.fresh_dim(0, a)))
            }
            // Without axes every size-1 axis goes, symbolic ones bound to 1 included: the
            // rank is known once the shapes are bound.
            (None, None) if x.shape.dims().iter().any(|d| matches!(d, Dim::Sym(_))) => {
                return Ok(vec![TensorType::unranked(x.dtype)]);
            }
            (_, axes) => {
                let drop = squeeze_axes(&x.shape.dims(), axes.as_deref())?;
                let axes: Vec<Axis> = (0..x.rank())
                    .filter(|i| !drop.contains(i))
                    .map(|i| x.shape.axes[i].clone())
                    .collect();
                Shape { axes }
            }
        };
        Ok(out(x.dtype, shape))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let axes = cx.opt_input(1).map(|t| t.to_i64_vec());
        let dims: Vec<Dim> = x.shape().iter().map(|&d| Dim::Fixed(d)).collect();
        let drop = squeeze_axes(&dims, axes.as_deref())?;
        let shape: Vec<usize> = (0..x.rank())
            .filter(|i| !drop.contains(i))
            .map(|i| x.shape()[i])
            .collect();
        Ok(vec![reshaped(x, &shape)?])
    }
}

struct Unsqueeze;

const UNSQUEEZE: OpSchema = OpSchema {
    name: "Unsqueeze",
    family: "shape",
    inputs: &["data", "axes"],
    outputs: &["expanded"],
    attrs: &[],
    doc: "Inserts size-1 axes at the listed positions of the output.",
    in_place: InPlace::View,
    origin: Origin::Onnx,
};

/// The output axes: size-1 at `axes` (of the output rank), the input's elsewhere.
fn unsqueeze(x: &Shape, axes: &[i64]) -> Result<Shape, String> {
    let rank = x.rank() + axes.len();
    let mut at = axes
        .iter()
        .map(|&a| norm_axis(a, rank))
        .collect::<Result<Vec<_>, _>>()?;
    at.sort_unstable();
    if at.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("axes {axes:?} repeat an axis"));
    }
    let mut src = x.axes.iter();
    let axes = (0..rank)
        .map(|i| {
            if at.contains(&i) {
                Axis {
                    dim: Dim::Fixed(1),
                    name: None,
                }
            } else {
                src.next().expect("rank adds up").clone()
            }
        })
        .collect();
    Ok(Shape { axes })
}

impl Op for Unsqueeze {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &UNSQUEEZE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let shape = match const_ints(cx, 1, "axes")? {
            Some(axes) => unsqueeze(&x.shape, &axes)?,
            None => {
                let n = static_len(cx, 1).ok_or("the axes input needs a static length")?;
                Shape::new((0..x.rank() + n).map(|a| cx.fresh_dim(0, a)))
            }
        };
        Ok(out(x.dtype, shape))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let s = unsqueeze(&Shape::fixed(x.shape()), &cx.input(1)?.to_i64_vec())?;
        Ok(vec![reshaped(x, &s.to_fixed().expect("fixed"))?])
    }
}

// ---------------------------------------------------------------- Identity

struct Identity;

const IDENTITY: OpSchema = OpSchema {
    name: "Identity",
    family: "shape",
    inputs: &["input"],
    outputs: &["output"],
    attrs: &[],
    doc: "The input, unchanged.",
    in_place: InPlace::View,
    origin: Origin::Onnx,
};

impl Op for Identity {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::Any
    }
    fn schema(&self) -> &OpSchema {
        &IDENTITY
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        Ok(vec![cx.input(0)?.clone()])
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        Ok(vec![cx.input(0)?.clone()])
    }
}

// ---------------------------------------------------------------- Transpose

struct Transpose;

const TRANSPOSE: OpSchema = OpSchema {
    name: "Transpose",
    family: "shape",
    inputs: &["data"],
    outputs: &["transposed"],
    attrs: &[AttrSpec::opt("perm", AttrKind::Ints, "reversed axes")],
    doc: "Permutes the axes: output axis i is input axis perm[i] (names move with axes).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

fn perm_of(perm: Option<&[i64]>, rank: usize) -> Result<Vec<usize>, String> {
    let Some(p) = perm else {
        return Ok((0..rank).rev().collect());
    };
    let mut seen = vec![false; rank];
    let mut out = vec![];
    for &a in p {
        let i = norm_axis(a, rank).map_err(|e| format!("perm: {e}"))?;
        if std::mem::replace(&mut seen[i], true) {
            return Err(format!("perm {p:?} repeats axis {a}"));
        }
        out.push(i);
    }
    if out.len() != rank {
        return Err(format!(
            "perm {p:?} has {} entries for rank {rank}",
            p.len()
        ));
    }
    Ok(out)
}

impl Op for Transpose {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &TRANSPOSE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let perm = perm_of(cx.attrs.ints("perm")?, x.rank())?;
        let axes = perm.iter().map(|&i| x.shape.axes[i].clone()).collect();
        Ok(out(x.dtype, Shape { axes }))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let perm = perm_of(cx.attrs.ints("perm")?, x.rank())?;
        Ok(vec![
            map_tensor!(x, a => a.clone().permuted_axes(IxDyn(&perm)).as_standard_layout().into_owned()),
        ])
    }
}

// ---------------------------------------------------------------- Expand

struct Expand;

const EXPAND: OpSchema = OpSchema {
    name: "Expand",
    family: "shape",
    inputs: &["input", "shape"],
    outputs: &["output"],
    attrs: &[],
    doc: "Broadcasts the input against `shape` (numpy rules, both ways).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

fn expand_to<T: Elem>(a: &ndarray::ArrayD<T>, shape: &[usize]) -> Result<Tensor, String> {
    let v = a
        .broadcast(IxDyn(shape))
        .ok_or_else(|| format!("cannot expand {:?} to {shape:?}", a.shape()))?;
    Ok(T::wrap(v.to_owned()))
}

impl Op for Expand {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &EXPAND
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let shape = match const_ints(cx, 1, "shape")? {
            Some(spec) => {
                let target = spec
                    .iter()
                    .map(|&d| {
                        usize::try_from(d)
                            .map(Dim::Fixed)
                            .map_err(|_| format!("shape has {d}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                broadcast_shapes(&x.shape, &Shape::new(target))?
            }
            None => {
                let n = static_len(cx, 1).ok_or("the shape input needs a static length")?;
                Shape::new((0..n.max(x.rank())).map(|a| cx.fresh_dim(0, a)))
            }
        };
        Ok(out(x.dtype, shape))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let spec = cx.input(1)?.to_i64_vec();
        let target = Shape::fixed(&spec.iter().map(|&d| d.max(0) as usize).collect::<Vec<_>>());
        let shape = broadcast_shapes(&Shape::fixed(x.shape()), &target)?;
        let shape = shape.to_fixed().expect("fixed");
        crate::ir::ops::util::check_size(&shape)?;
        match_tensor!(x, a => expand_to(a, &shape)).map(|t| vec![t])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![
        leak(Reshape),
        leak(Flatten),
        leak(Squeeze),
        leak(Unsqueeze),
        leak(Identity),
        leak(Transpose),
        leak(Expand),
    ]
}
