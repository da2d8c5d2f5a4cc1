//! Linear quantization: QuantizeLinear and DequantizeLinear, per tensor, per axis or
//! blocked, as ONNX defines them. Values compute in f64; quantizing to an integer type
//! (int4/int2 included) rounds half to even and saturates to it; quantizing to float8
//! or float4 rounds `x / scale` to nearest even in that format (the zero point only
//! shifts float4, as ONNX's reference does).
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, Dimension, IxDyn};

use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::shape::norm_axis;
use crate::ir::{AttrKind, Attrs, DType, TensorType};
use crate::tensor::{lowbit, Tensor};

const ATTRS: &[AttrSpec] = &[
    AttrSpec::opt("axis", AttrKind::Int, "1"),
    AttrSpec::opt("block_size", AttrKind::Int, "0"),
    AttrSpec::opt(
        "output_dtype",
        AttrKind::String,
        "the zero point's (or u8 / the scale's)",
    ),
    AttrSpec::opt(
        "saturate",
        AttrKind::Int,
        "1: float8 outputs saturate (0: out of range gives infinity or NaN)",
    ),
    AttrSpec::opt(
        "precision",
        AttrKind::String,
        "x's dtype: the float type x / y_scale is computed in",
    ),
];

/// How an element finds its scale: the same one, one per index along `axis`, or one
/// per block of `block` along `axis`.
fn scale_index(idx: &[usize], scale_rank: usize, axis: usize, block: usize) -> Vec<usize> {
    match (scale_rank, block) {
        (0, _) => vec![],
        (1, 0) => vec![idx[axis]],
        _ => {
            let mut i = idx.to_vec();
            i[axis] /= block.max(1);
            i
        }
    }
}

/// Checks scale (and zero point) against x; returns (axis, block size).
fn check(
    x: &TensorType,
    scale: &TensorType,
    zp: Option<&TensorType>,
    attrs: &Attrs,
) -> Result<(usize, usize), String> {
    // A per-tensor scale ignores `axis`.
    let axis = if scale.rank() == 0 {
        0
    } else {
        norm_axis(attrs.int_or("axis", 1)?, x.rank())?
    };
    let block = attrs.int_or("block_size", 0)?.max(0) as usize;
    let ok = scale.rank() == 0
        || (scale.rank() == 1 && block == 0)
        || (scale.rank() == x.rank() && block > 0);
    if !ok {
        return Err(format!(
            "scale {scale} must be a scalar, 1-D along axis {axis}, or blocked with x's rank"
        ));
    }
    if let Some(z) = zp {
        // A per-tensor zero point may also be a one-element 1-D tensor.
        let single = scale.rank() == 0 && z.shape.dims().iter().all(|d| d.fixed() == Some(1));
        if z.shape.dims() != scale.shape.dims() && !single {
            return Err(format!(
                "the zero point ({z}) must have the scale's shape ({scale})"
            ));
        }
    }
    Ok((axis, block))
}

/// The values integer dtype `d` holds, for saturating casts (floats: unbounded).
pub(crate) fn range(d: DType) -> (f64, f64) {
    match d {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        DType::U16 => (0.0, 65535.0),
        DType::I16 => (-32768.0, 32767.0),
        DType::U32 => (0.0, u32::MAX as f64),
        DType::I32 => (i32::MIN as f64, i32::MAX as f64),
        DType::U64 => (0.0, u64::MAX as f64),
        DType::I64 => (i64::MIN as f64, i64::MAX as f64),
        DType::I4 => (-8.0, 7.0),
        DType::U4 => (0.0, 15.0),
        DType::I2 => (-2.0, 1.0),
        DType::U2 => (0.0, 3.0),
        _ => (f64::NEG_INFINITY, f64::INFINITY),
    }
}

fn elementwise(
    x: &ArrayD<f64>,
    scale: &ArrayD<f64>,
    zp: Option<&ArrayD<f64>>,
    axis: usize,
    block: usize,
    f: impl Fn(f64, f64, f64) -> f64,
) -> Result<ArrayD<f64>, String> {
    let mut out = ArrayD::zeros(x.raw_dim());
    for (idx, v) in out.indexed_iter_mut() {
        let si = IxDyn(&scale_index(idx.slice(), scale.ndim(), axis, block));
        let s = *scale
            .get(&si)
            .ok_or_else(|| format!("no scale for element {:?}", idx.slice()))?;
        let z = match zp {
            None => 0.0,
            Some(z) if scale.ndim() == 0 => *z.first().ok_or("no zero point")?,
            Some(z) => *z.get(&si).ok_or("no zero point")?,
        };
        *v = f(x[&idx], s, z);
    }
    Ok(out)
}

struct Quantize;

const QUANTIZE: OpSchema = OpSchema {
    name: "QuantizeLinear",
    family: "quant",
    inputs: &["x", "y_scale", "y_zero_point?"],
    outputs: &["y"],
    attrs: ATTRS,
    doc: "y = saturate(round_half_even(x / y_scale) + y_zero_point), of the zero point's \
          dtype (u8 without one).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// The `precision` attribute: the type `x / y_scale` is computed in.
fn precision(attrs: &Attrs) -> Result<Option<DType>, String> {
    attrs
        .string("precision")?
        .map(|p| p.parse().map_err(|e| format!("precision: {e}")))
        .transpose()
}

fn quantized_dtype(cx_zp: Option<DType>, attrs: &Attrs) -> Result<DType, String> {
    match attrs.string("output_dtype")? {
        Some(d) => d.parse(),
        None => Ok(cx_zp.unwrap_or(DType::U8)),
    }
}

impl Op for Quantize {
    fn schema(&self) -> &OpSchema {
        &QUANTIZE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, s) = (cx.input(0)?, cx.input(1)?);
        if !x.dtype.is_float() && x.dtype != DType::I32 {
            return Err(format!("x must be float or i32, got {}", x.dtype));
        }
        check(x, s, cx.opt_input(2), cx.attrs)?;
        let d = quantized_dtype(cx.opt_input(2).map(|z| z.dtype), cx.attrs)?;
        if !(d.is_int() || d.is_low_bit()) || d == DType::F8E8M0 {
            return Err(format!("cannot quantize to {d}"));
        }
        if let Some(p) = precision(cx.attrs)? {
            if !p.is_float() {
                return Err(format!("precision must be a float type, got {p}"));
            }
        }
        Ok(vec![TensorType::new(d, x.shape.clone())])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (x, s, zp) = (cx.input(0)?, cx.input(1)?, cx.opt_input(2));
        let (axis, block) = check(cx.input_type(0)?, cx.input_type(1)?, None, cx.attrs)?;
        let d = quantized_dtype(zp.map(|z| z.dtype()), cx.attrs)?;
        let (lo, hi) = range(d);
        let zpa = zp.map(|z| z.to_f64_array());
        // x / y_scale is a value of x's type (or `precision`), as ONNX computes it: round
        // it to that type first, since which way a tie goes depends on it.
        let narrow: fn(f64) -> f64 = match precision(cx.attrs)?.unwrap_or(x.dtype()) {
            DType::F32 => |v| v as f32 as f64,
            DType::F16 => |v| half::f16::from_f64(v).to_f64(),
            DType::BF16 => |v| half::bf16::from_f64(v).to_f64(),
            _ => |v| v,
        };
        let (x, s) = (x.to_f64_array(), s.to_f64_array());
        if d.is_minifloat() {
            let shift_by_zero_point = d == DType::F4E2M1;
            let y = elementwise(&x, &s, zpa.as_ref(), axis, block, |v, s, z| {
                narrow(v / s) + if shift_by_zero_point { z } else { 0.0 }
            })?;
            let saturate = cx.attrs.int_or("saturate", 1)? != 0;
            return Ok(vec![lowbit::cast(
                &Tensor::F64(y),
                d,
                saturate,
                lowbit::E8M0Rounding::Up,
            )?]);
        }
        let q = elementwise(&x, &s, zpa.as_ref(), axis, block, |v, s, z| {
            (narrow(v / s).round_ties_even() + z).clamp(lo, hi)
        })?;
        Ok(vec![Tensor::from_i64_array(d, q.mapv(|v| v as i64))])
    }
}

struct Dequantize;

const DEQUANTIZE: OpSchema = OpSchema {
    name: "DequantizeLinear",
    family: "quant",
    inputs: &["x", "x_scale", "x_zero_point?"],
    outputs: &["y"],
    attrs: ATTRS,
    doc: "y = (x - x_zero_point) * x_scale, of the scale's dtype (or output_dtype).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for Dequantize {
    fn schema(&self) -> &OpSchema {
        &DEQUANTIZE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, s) = (cx.input(0)?, cx.input(1)?);
        if !(x.dtype.is_int() || x.dtype.is_low_bit()) {
            return Err(format!(
                "x must be an integer or low-bit type, got {}",
                x.dtype
            ));
        }
        if !s.dtype.is_float() {
            return Err(format!("x_scale must be a float type, got {}", s.dtype));
        }
        check(x, s, cx.opt_input(2), cx.attrs)?;
        let d = match cx.attrs.string("output_dtype")? {
            Some(d) => d.parse()?,
            None => s.dtype,
        };
        Ok(vec![TensorType::new(d, x.shape.clone())])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (x, s, zp) = (cx.input(0)?, cx.input(1)?, cx.opt_input(2));
        let (axis, block) = check(cx.input_type(0)?, cx.input_type(1)?, None, cx.attrs)?;
        let d = match cx.attrs.string("output_dtype")? {
            Some(d) => d.parse()?,
            None => s.dtype(),
        };
        // Float8 and float4 zero points are zero by definition; ONNX ignores them.
        let zpa = zp
            .filter(|_| !x.dtype().is_minifloat())
            .map(|z| z.to_f64_array());
        let y = elementwise(
            &x.to_f64_array(),
            &s.to_f64_array(),
            zpa.as_ref(),
            axis,
            block,
            |v, s, z| (v - z) * s,
        )?;
        Ok(vec![Tensor::from_f64_array(d, y)])
    }
}

struct DynamicQuantize;

const DYNAMIC_QUANTIZE: OpSchema = OpSchema {
    name: "DynamicQuantizeLinear",
    family: "quant",
    inputs: &["x"],
    outputs: &["y", "y_scale", "y_zero_point"],
    attrs: &[],
    doc: "u8 quantization with the scale and zero point computed from x's range (which \
          always includes 0).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for DynamicQuantize {
    fn schema(&self) -> &OpSchema {
        &DYNAMIC_QUANTIZE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        if x.dtype != DType::F32 {
            return Err(format!("x must be f32, got {}", x.dtype));
        }
        let scalar = crate::ir::Shape::scalar();
        Ok(vec![
            TensorType::new(DType::U8, x.shape.clone()),
            TensorType::new(DType::F32, scalar.clone()),
            TensorType::new(DType::U8, scalar),
        ])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?.expect::<f32>()?;
        let (y, scale, zero_point) = dynamic_quantize_u8(x.iter().copied());
        Ok(vec![
            Tensor::from_vec(x.shape(), y)?,
            Tensor::scalar(scale),
            Tensor::scalar(zero_point),
        ])
    }
}

/// Dynamic u8 quantization of `values` as onnxruntime computes it (for
/// DynamicQuantizeLinear and the quantized RNNs' activations): the range widened to
/// hold 0; scale = range / 255 (1 for an empty range); zero point =
/// round_half_even(-min / scale); each value round_half_even(v / scale) + zero point,
/// saturated (NaN gives 0). Every step is f32, as ONNX's definition is: computing the
/// range, the scale or a quotient in f64 instead moves ties and flips some values by one.
pub(super) fn dynamic_quantize_u8(values: impl Iterator<Item = f32> + Clone) -> (Vec<u8>, f32, u8) {
    let hi = values.clone().fold(0.0f32, f32::max);
    let lo = values.clone().fold(0.0f32, f32::min);
    let (scale, zero_point) = dynamic_quantize_params(lo, hi);
    let quantized = values
        .map(|v| dynamic_quantize_one(v, scale, zero_point))
        .collect();
    (quantized, scale, zero_point as u8)
}

/// The scale and zero point (a whole number in [0, 255]) of [`dynamic_quantize_u8`]
/// for values whose range, widened to hold 0, is `lo..=hi`.
pub fn dynamic_quantize_params(lo: f32, hi: f32) -> (f32, f32) {
    let scale = if hi == lo { 1.0 } else { (hi - lo) / 255.0 };
    (scale, (-lo / scale).clamp(0.0, 255.0).round_ties_even())
}

/// One value of [`dynamic_quantize_u8`]: clamped before rounding, to [-zero point,
/// 255 - zero point] (f32::max and min return the bound for NaN), as onnxruntime's
/// kernel does.
#[inline(always)]
pub fn dynamic_quantize_one(v: f32, scale: f32, zero_point: f32) -> u8 {
    ((v / scale)
        .max(-zero_point)
        .min(255.0 - zero_point)
        .round_ties_even()
        + zero_point) as u8
}

/// `ConvInteger` and `MatMulInteger`: `(a - a_zero_point) op (b - b_zero_point)` in
/// i32, the float op's geometry. A zero point is per tensor, per row of A (per output
/// channel of a convolution's W) or per column of B.
struct IntegerOp {
    schema: OpSchema,
    /// The float op whose geometry (and, on exact f64 operands, arithmetic) this is.
    float_op: &'static str,
}

impl IntegerOp {
    fn float_op(&self) -> Result<&'static dyn Op, String> {
        super::lookup(self.float_op).ok_or_else(|| format!("no {} op", self.float_op))
    }

    /// The axis of operand `operand` (0: A or X, 1: B or W) a 1-D zero point runs along.
    fn zero_point_axis(&self, operand: usize, rank: usize) -> usize {
        match (self.float_op, operand) {
            ("Conv", _) => 0,
            (_, 0) => rank.saturating_sub(2),
            _ => rank.saturating_sub(1),
        }
    }
}

impl Op for IntegerOp {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        for i in 0..4 {
            if let Some(t) = cx.opt_input(i) {
                if !matches!(t.dtype, DType::U8 | DType::I8) {
                    let name = self.schema.inputs[i].trim_end_matches('?');
                    return Err(format!("{name} must be i8 or u8, got {}", t.dtype));
                }
            }
        }
        for (operand, zero_point) in [(0, 2), (1, 3)] {
            let (Some(v), Some(z)) = (cx.opt_input(operand), cx.opt_input(zero_point)) else {
                continue;
            };
            let axis = self.zero_point_axis(operand, v.rank());
            let fits = z.shape.dims().iter().all(|d| d.fixed() == Some(1))
                || (z.rank() == 1 && v.rank() > axis && z.shape.dim(0) == v.shape.dim(axis))
                || z.rank() == v.rank();
            if !fits {
                let name = self.schema.inputs[zero_point].trim_end_matches('?');
                return Err(format!(
                    "{name} ({z}) must be a scalar or run along axis {axis} of {v}"
                ));
            }
        }
        // The geometry is the float op's on the same shapes.
        let as_float = |i: usize| -> Result<Option<TensorType>, String> {
            Ok(Some(TensorType::new(
                DType::F32,
                cx.input(i)?.shape.clone(),
            )))
        };
        let inputs = [as_float(0)?, as_float(1)?];
        let float_cx = InferCtx {
            node_name: cx.node_name,
            inputs: &inputs,
            consts: &[],
            attrs: cx.attrs,
        };
        let mut out = self.float_op()?.infer(&float_cx)?;
        for t in &mut out {
            t.dtype = DType::I32;
        }
        Ok(out)
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        // Each operand minus its zero point, in f64: every product and every sum of up to
        // 2^37 of them is exact there, so the float op computes the integer result.
        let mut operands = vec![];
        for (operand, zero_point) in [(0, 2), (1, 3)] {
            let v = cx.input(operand)?.to_f64_array();
            let v = match cx.opt_input(zero_point) {
                None => v,
                Some(z) => {
                    let mut z = z.to_f64_array();
                    let axis = self.zero_point_axis(operand, v.ndim());
                    if z.len() != 1 && z.ndim() == 1 && v.ndim() > 1 {
                        let mut shape = vec![1; v.ndim()];
                        shape[axis] = z.len();
                        z = z
                            .into_shape_with_order(IxDyn(&shape))
                            .map_err(|e| e.to_string())?;
                    } else if z.len() == 1 {
                        z = z
                            .into_shape_with_order(IxDyn(&[]))
                            .map_err(|e| e.to_string())?;
                    }
                    let z = z.broadcast(v.raw_dim()).ok_or_else(|| {
                        format!(
                            "zero point {:?} does not fit operand {:?}",
                            z.shape(),
                            v.shape()
                        )
                    })?;
                    &v - &z
                }
            };
            operands.push(Tensor::F64(v));
        }
        let types: Vec<TensorType> = operands
            .iter()
            .map(|t| TensorType::new(DType::F64, crate::ir::Shape::fixed(t.shape())))
            .collect();
        let out = super::evaluate(
            self.float_op()?,
            &EvalCtx {
                inputs: &[Some(&operands[0]), Some(&operands[1])],
                input_types: &[Some(&types[0]), Some(&types[1])],
                attrs: cx.attrs,
            },
        )?;
        Ok(out.into_iter().map(|t| t.cast(DType::I32)).collect())
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![
        leak(Quantize),
        leak(Dequantize),
        leak(DynamicQuantize),
        leak(IntegerOp {
            schema: OpSchema {
                name: "ConvInteger",
                family: "quant",
                inputs: &["x", "w", "x_zero_point?", "w_zero_point?"],
                outputs: &["y"],
                attrs: &super::conv::CONV_ATTRS,
                doc: "Conv of (x - x_zero_point) with (w - w_zero_point) in i32 (u8/i8 \
                      operands; w's zero point per tensor or per output channel).",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            float_op: "Conv",
        }),
        leak(IntegerOp {
            schema: OpSchema {
                name: "MatMulInteger",
                family: "quant",
                inputs: &["A", "B", "a_zero_point?", "b_zero_point?"],
                outputs: &["Y"],
                attrs: &[],
                doc: "MatMul of (A - a_zero_point) and (B - b_zero_point) in i32 (u8/i8 \
                      operands; zero points per tensor, per row of A, per column of B).",
                in_place: InPlace::No,
                origin: Origin::Onnx,
            },
            float_op: "MatMul",
        }),
    ]
}
