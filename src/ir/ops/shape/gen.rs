//! Shape, Size, ConstantOfShape, Range: tensors made from shapes and scalars.
use super::{const_ints, static_len};
use crate::ir::ops::util::out;
use crate::ir::ops::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::ops::{InPlace, Origin};
use crate::ir::{AttrKind, Attrs, DType, Dim, Shape, TensorType};
use crate::tensor::Tensor;

// ---------------------------------------------------------------- Shape / Size

struct ShapeOp;

const SHAPE: OpSchema = OpSchema {
    name: "Shape",
    family: "shape",
    inputs: &["data"],
    outputs: &["shape"],
    attrs: &[
        AttrSpec::opt("start", AttrKind::Int, "0"),
        AttrSpec::opt("end", AttrKind::Int, "rank"),
    ],
    doc: "The input's dims [start, end) as a 1-D i64 tensor (negative bounds count from \
          the end and clamp).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

fn shape_range(attrs: &Attrs, rank: usize) -> Result<(usize, usize), String> {
    let r = rank as i64;
    let fix = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = fix(attrs.int_or("start", 0)?);
    let end = fix(attrs.int_or("end", r)?);
    Ok((start, end.max(start)))
}

impl Op for ShapeOp {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::Strings
    }
    fn schema(&self) -> &OpSchema {
        &SHAPE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let (s, e) = shape_range(cx.attrs, x.rank())?;
        Ok(out(DType::I64, Shape::fixed(&[e - s])))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let (s, e) = shape_range(cx.attrs, x.rank())?;
        let v: Vec<i64> = x.shape()[s..e].iter().map(|&d| d as i64).collect();
        Ok(vec![Tensor::from_vec(&[v.len()], v)?])
    }
}

struct Size;

const SIZE: OpSchema = OpSchema {
    name: "Size",
    family: "shape",
    inputs: &["data"],
    outputs: &["size"],
    attrs: &[],
    doc: "The number of elements, as an i64 scalar.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for Size {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::Strings
    }
    fn schema(&self) -> &OpSchema {
        &SIZE
    }
    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        cx.input(0)?;
        Ok(out(DType::I64, Shape::scalar()))
    }
    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        Ok(vec![Tensor::scalar(cx.input(0)?.len() as i64)])
    }
}

// ---------------------------------------------------------------- ConstantOfShape

struct ConstantOfShape;

const CONSTANT_OF_SHAPE: OpSchema = OpSchema {
    name: "ConstantOfShape",
    family: "shape",
    inputs: &["input"],
    outputs: &["output"],
    attrs: &[
        AttrSpec::opt("value", AttrKind::Float, "0.0"),
        AttrSpec::opt("dtype", AttrKind::String, "f32"),
    ],
    doc: "A tensor of shape `input` filled with `value`. Kiln takes the value as a number \
          and its type from `dtype`, where ONNX uses a one-element tensor attribute.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

fn fill_dtype(attrs: &Attrs) -> Result<DType, String> {
    attrs.string_or("dtype", "f32")?.parse()
}

impl Op for ConstantOfShape {
    fn schema(&self) -> &OpSchema {
        &CONSTANT_OF_SHAPE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let dtype = fill_dtype(cx.attrs)?;
        let dims = match const_ints(cx, 0, "input")? {
            Some(v) => v
                .iter()
                .map(|&d| {
                    usize::try_from(d)
                        .map(Dim::Fixed)
                        .map_err(|_| format!("dims must be >= 0, got {d}"))
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => {
                let n = static_len(cx, 0).ok_or("the shape input needs a static length")?;
                (0..n).map(|a| cx.fresh_dim(0, a)).collect()
            }
        };
        Ok(out(dtype, Shape::new(dims)))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let dims = cx.input(0)?.to_i64_vec();
        let shape: Vec<usize> = dims
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("dims must be >= 0, got {d}")))
            .collect::<Result<_, _>>()?;
        crate::ir::ops::util::check_size(&shape)?;
        let n: usize = shape.iter().product();
        let v = cx.attrs.float_or("value", 0.0)?;
        Ok(vec![Tensor::from_f64s(
            fill_dtype(cx.attrs)?,
            &shape,
            &vec![v; n],
        )?])
    }
}

// ---------------------------------------------------------------- Range

struct Range;

const RANGE: OpSchema = OpSchema {
    name: "Range",
    family: "shape",
    inputs: &["start", "limit", "delta"],
    outputs: &["output"],
    attrs: &[],
    doc: "start, start + delta, ... up to (not including) limit; scalars of one numeric dtype.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

fn range_len(start: f64, limit: f64, delta: f64) -> Result<usize, String> {
    if delta == 0.0 {
        return Err("delta must not be 0".into());
    }
    let n = ((limit - start) / delta).ceil();
    if !n.is_finite() {
        return Err(format!("Range({start}, {limit}, {delta}) is not finite"));
    }
    Ok(n.max(0.0) as usize)
}

impl Op for Range {
    fn schema(&self) -> &OpSchema {
        &RANGE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let ts: Vec<&TensorType> = (0..3).map(|i| cx.input(i)).collect::<Result<_, _>>()?;
        let dtype = crate::ir::ops::util::same_dtype("Range", &ts)?;
        if !dtype.is_numeric() {
            return Err(format!("Range takes numbers, got {dtype}"));
        }
        // A one-element vector counts as a scalar, as in onnxruntime (ONNX functions such
        // as AffineGrid's pass sizes taken apart by Split).
        let single = |t: &TensorType| t.rank() == 0 || t.static_dims() == Some(vec![1]);
        if let Some((i, t)) = ts.iter().enumerate().find(|(_, t)| !single(t)) {
            return Err(format!("input {i} must be a scalar, got {t}"));
        }
        let vals: Option<Vec<f64>> = (0..3)
            .map(|i| cx.const_input(i).map(|c| c.to_f64_vec()[0]))
            .collect();
        let dim = match vals {
            Some(v) => Dim::Fixed(range_len(v[0], v[1], v[2])?),
            None => cx.fresh_dim(0, 0),
        };
        Ok(out(dtype, Shape::new([dim])))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let dtype = x.dtype();
        let get = |i: usize| cx.input(i).map(|t| t.to_f64_vec()[0]);
        let (s, l, d) = (get(0)?, get(1)?, get(2)?);
        let n = range_len(s, l, d)?;
        crate::ir::ops::util::check_size(&[n])?;
        if dtype.is_float() {
            let v: Vec<f64> = (0..n).map(|k| s + k as f64 * d).collect();
            Ok(vec![Tensor::from_f64s(dtype, &[n], &v)?])
        } else {
            let get = |i: usize| cx.input(i).map(|t| t.to_i64_vec()[0]);
            let (s, d) = (get(0)?, get(2)?);
            let v: Vec<i64> = (0..n as i64)
                .map(|k| s.wrapping_add(k.wrapping_mul(d)))
                .collect();
            Ok(vec![Tensor::from_i64s(dtype, &[n], &v)?])
        }
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![
        leak(ShapeOp),
        leak(Size),
        leak(ConstantOfShape),
        leak(Range),
    ]
}
