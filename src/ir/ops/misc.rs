//! Conversions: Cast and CastLike.
//!
//! Kiln names dtypes by their text spelling (`to = "f32"`); the ONNX importer maps
//! ONNX's integer type codes onto these names.
use super::util::out;
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::ops::{InPlace, Origin};
use crate::ir::{AttrKind, Attrs, DType, TensorType};
use crate::tensor::{lowbit, Tensor};

struct Cast;

const CAST: OpSchema = OpSchema {
    name: "Cast",
    family: "misc",
    inputs: &["input"],
    outputs: &["output"],
    attrs: &[AttrSpec::req("to", AttrKind::String), SATURATE, ROUND_MODE],
    doc: "Converts to dtype `to` (\"f32\", \"i64\", \"bool\", ...): floats to integers \
          truncate toward zero and saturate (NaN gives 0), integers wrap like a C cast, \
          anything to bool is != 0; to the 4- and 2-bit integers, floats truncate and wrap. \
          Floats round to nearest even into float8/float4.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

const SATURATE: AttrSpec = AttrSpec::opt(
    "saturate",
    AttrKind::Int,
    "1: out-of-range values become the largest finite float8 of their sign (0: infinity \
     or NaN)",
);
const ROUND_MODE: AttrSpec = AttrSpec::opt(
    "round_mode",
    AttrKind::String,
    "\"up\": how values round to f8e8m0 (up, down, nearest)",
);

/// `x` cast to `to` under the node's `saturate` and `round_mode`.
fn cast_with_attrs(x: &Tensor, to: DType, attrs: &Attrs) -> Result<Tensor, String> {
    let saturate = attrs.int_or("saturate", 1)? != 0;
    let mode = attrs.string_or("round_mode", "up")?.parse()?;
    lowbit::cast(x, to, saturate, mode)
}

/// Checks `round_mode` at build time so a bad one fails when the node is added.
fn check_round_mode(attrs: &Attrs) -> Result<(), String> {
    attrs
        .string_or("round_mode", "up")?
        .parse::<lowbit::E8M0Rounding>()
        .map(|_| ())
}

fn target(attrs: &Attrs) -> Result<DType, String> {
    attrs
        .string_or("to", "")?
        .parse()
        .map_err(|e| format!("to: {e}"))
}

impl Op for Cast {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::Strings
    }
    fn schema(&self) -> &OpSchema {
        &CAST
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        check_round_mode(cx.attrs)?;
        Ok(out(target(cx.attrs)?, x.shape.clone()))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        Ok(vec![cast_with_attrs(
            cx.input(0)?,
            target(cx.attrs)?,
            cx.attrs,
        )?])
    }
}

struct CastLike;

const CAST_LIKE: OpSchema = OpSchema {
    name: "CastLike",
    family: "misc",
    inputs: &["input", "target_type"],
    outputs: &["output"],
    attrs: &[SATURATE, ROUND_MODE],
    doc: "Cast to the dtype of `target_type` (whose values are not read).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for CastLike {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::Strings
    }
    fn schema(&self) -> &OpSchema {
        &CAST_LIKE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        check_round_mode(cx.attrs)?;
        Ok(out(cx.input(1)?.dtype, cx.input(0)?.shape.clone()))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        Ok(vec![cast_with_attrs(
            cx.input(0)?,
            cx.input(1)?.dtype(),
            cx.attrs,
        )?])
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
    in_place: InPlace::No,
    origin: Origin::Onnx,
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
    in_place: InPlace::No,
    origin: Origin::Onnx,
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

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    let mut v = vec![leak(Cast), leak(CastLike), leak(BitCast), leak(Shrink)];
    v.extend(windows());
    v
}

// ---------------------------------------------------------------- window functions

/// Which window: the cosine terms of `a0 - a1 cos(2πn/N) + a2 cos(4πn/N)`.
struct Window {
    schema: OpSchema,
    terms: [f64; 3],
}

const WINDOW_ATTRS: &[AttrSpec] = &[
    AttrSpec::opt("output_datatype", AttrKind::String, "f32"),
    AttrSpec::opt("periodic", AttrKind::Int, "1"),
];

impl Op for Window {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let size = cx.input(0)?;
        if !size.dtype.is_int() || size.rank() != 0 {
            return Err(format!("size must be an integer scalar, got {size}"));
        }
        let dtype: DType = cx.attrs.string_or("output_datatype", "f32")?.parse()?;
        let dim = match cx.const_input(0) {
            Some(c) => crate::ir::Dim::Fixed(c.to_i64_vec()[0].max(0) as usize),
            None => cx.fresh_dim(0, 0),
        };
        Ok(out(dtype, crate::ir::Shape::new([dim])))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let n = cx.input(0)?.to_i64_vec()[0].max(0) as usize;
        super::util::check_size(&[n])?;
        let dtype: DType = cx.attrs.string_or("output_datatype", "f32")?.parse()?;
        let periodic = cx.attrs.int_or("periodic", 1)? != 0;
        let denom = if periodic { n as f64 } else { n as f64 - 1.0 };
        let [a0, a1, a2] = self.terms;
        let w: Vec<f64> = (0..n)
            .map(|i| {
                let x = 2.0 * std::f64::consts::PI * i as f64 / denom;
                a0 - a1 * x.cos() + a2 * (2.0 * x).cos()
            })
            .collect();
        Ok(vec![Tensor::from_f64s(dtype, &[n], &w)?])
    }
}

fn window(name: &'static str, doc: &'static str, terms: [f64; 3]) -> &'static dyn Op {
    leak(Window {
        schema: OpSchema {
            name,
            family: "misc",
            inputs: &["size"],
            outputs: &["output"],
            attrs: WINDOW_ATTRS,
            doc,
            in_place: InPlace::No,
            origin: Origin::Onnx,
        },
        terms,
    })
}

pub(crate) fn windows() -> Vec<&'static dyn Op> {
    vec![
        window(
            "HannWindow",
            "0.5 - 0.5 cos(2πn/N), N = size (periodic) or size - 1.",
            [0.5, 0.5, 0.0],
        ),
        window(
            "HammingWindow",
            "25/46 - 21/46 cos(2πn/N).",
            [25.0 / 46.0, 21.0 / 46.0, 0.0],
        ),
        window(
            "BlackmanWindow",
            "0.42 - 0.5 cos(2πn/N) + 0.08 cos(4πn/N).",
            [0.42, 0.5, 0.08],
        ),
    ]
}
