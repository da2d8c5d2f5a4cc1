//! Conversions: Cast and CastLike.
//!
//! Kiln names dtypes by their text spelling (`to = "f32"`); the ONNX importer maps
//! ONNX's integer type codes onto these names.
use super::util::out;
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::{AttrKind, Attrs, DType, TensorType};
use crate::tensor::Tensor;

struct Cast;

const CAST: OpSchema = OpSchema {
    name: "Cast",
    family: "misc",
    inputs: &["input"],
    outputs: &["output"],
    attrs: &[
        AttrSpec::req("to", AttrKind::String),
        AttrSpec::opt("saturate", AttrKind::Int, "1 (float8 only; ignored)"),
    ],
    doc: "Converts to dtype `to` (\"f32\", \"i64\", \"bool\", ...): floats to integers \
          truncate toward zero and saturate (NaN gives 0), integers wrap like a C cast, \
          anything to bool is != 0.",
};

fn target(attrs: &Attrs) -> Result<DType, String> {
    attrs
        .string_or("to", "")?
        .parse()
        .map_err(|e| format!("to: {e}"))
}

impl Op for Cast {
    fn schema(&self) -> &OpSchema {
        &CAST
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        Ok(out(target(cx.attrs)?, x.shape.clone()))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        Ok(vec![cx.input(0)?.cast(target(cx.attrs)?)])
    }
}

struct CastLike;

const CAST_LIKE: OpSchema = OpSchema {
    name: "CastLike",
    family: "misc",
    inputs: &["input", "target_type"],
    outputs: &["output"],
    attrs: &[AttrSpec::opt(
        "saturate",
        AttrKind::Int,
        "1 (float8 only; ignored)",
    )],
    doc: "Cast to the dtype of `target_type` (whose values are not read).",
};

impl Op for CastLike {
    fn schema(&self) -> &OpSchema {
        &CAST_LIKE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        Ok(out(cx.input(1)?.dtype, cx.input(0)?.shape.clone()))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        Ok(vec![cx.input(0)?.cast(cx.input(1)?.dtype())])
    }
}

struct BitCast;

const BIT_CAST: OpSchema = OpSchema {
    name: "BitCast",
    family: "misc",
    inputs: &["input"],
    outputs: &["output"],
    attrs: &[AttrSpec::req("to", AttrKind::String)],
    doc: "Reinterprets the bits as dtype `to` of the same size (\"f32\" <-> \"i32\", ...).",
};

impl Op for BitCast {
    fn schema(&self) -> &OpSchema {
        &BIT_CAST
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let to = target(cx.attrs)?;
        if to.size_in_bytes() != x.dtype.size_in_bytes() {
            return Err(format!(
                "cannot reinterpret {} as {to}: their sizes differ",
                x.dtype
            ));
        }
        Ok(out(to, x.shape.clone()))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        Ok(vec![Tensor::from_le_bytes(
            target(cx.attrs)?,
            x.shape(),
            &x.to_le_bytes(),
        )?])
    }
}

struct Shrink;

const SHRINK: OpSchema = OpSchema {
    name: "Shrink",
    family: "misc",
    inputs: &["input"],
    outputs: &["output"],
    attrs: &[
        AttrSpec::opt("bias", AttrKind::Float, "0.0"),
        AttrSpec::opt("lambd", AttrKind::Float, "0.5"),
    ],
    doc: "x + bias where x < -lambd, x - bias where x > lambd, 0 elsewhere.",
};

impl Op for Shrink {
    fn schema(&self) -> &OpSchema {
        &SHRINK
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        if !x.dtype.is_numeric() {
            return Err(format!("input must be numeric, got {}", x.dtype));
        }
        Ok(vec![x.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let bias = cx.attrs.float_or("bias", 0.0)?;
        let lambd = cx.attrs.float_or("lambd", 0.5)?;
        let f = |v: f64| {
            if v < -lambd {
                v + bias
            } else if v > lambd {
                v - bias
            } else {
                0.0
            }
        };
        Ok(vec![Tensor::from_f64_array(
            x.dtype(),
            x.to_f64_array().mapv(f),
        )])
    }
}

pub fn ops() -> Vec<&'static dyn Op> {
    vec![leak(Cast), leak(CastLike), leak(BitCast), leak(Shrink)]
}
