//! Normalizations and softmaxes: Softmax, LogSoftmax, Hardmax, BatchNormalization
//! (inference form), LayerNormalization, InstanceNormalization, LpNormalization.
//!
//! Reference semantics: every op here takes floats and computes in f64.
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, Axis, IxDyn};

use super::util::{out, require_dtype, same_dtype};
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::{AttrKind, DType, Dim, Shape, TensorType};
use crate::tensor::Tensor;

fn is_float(d: DType) -> bool {
    d.is_float()
}

/// `a` as an f64 array in standard layout, viewed as `[outer, inner]` around `axis`.
fn split_at(t: &Tensor, axis: usize) -> (ArrayD<f64>, usize, usize) {
    let a = t.to_f64_array().as_standard_layout().into_owned();
    let outer: usize = a.shape()[..axis].iter().product();
    let inner: usize = a.shape()[axis..].iter().product();
    (a, outer, inner)
}

// ---------------------------------------------------------------- softmaxes

#[derive(Clone, Copy)]
enum Kind {
    Softmax,
    LogSoftmax,
    Hardmax,
}

struct Softmax {
    schema: OpSchema,
    kind: Kind,
}

const AXIS_LAST: &[AttrSpec] = &[AttrSpec::opt("axis", AttrKind::Int, "-1")];

impl Op for Softmax {
    fn schema(&self) -> &OpSchema {
        &self.schema
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        require_dtype(x, 0, is_float, "a float type")?;
        x.shape.norm_axis(cx.attrs.int_or("axis", -1)?)?;
        Ok(vec![x.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let axis = crate::ir::shape::norm_axis(cx.attrs.int_or("axis", -1)?, x.rank())?;
        let mut a = x.to_f64_array();
        for mut lane in a.lanes_mut(Axis(axis)) {
            let max = lane.fold(f64::NEG_INFINITY, |m, &v| m.max(v));
            match self.kind {
                Kind::Softmax | Kind::LogSoftmax => {
                    let sum: f64 = lane.iter().map(|&v| (v - max).exp()).sum();
                    lane.mapv_inplace(|v| match self.kind {
                        Kind::Softmax => (v - max).exp() / sum,
                        _ => v - max - sum.ln(),
                    });
                }
                Kind::Hardmax => {
                    // The first maximum wins, as in ONNX.
                    let first = lane.iter().position(|&v| v == max);
                    for (i, v) in lane.iter_mut().enumerate() {
                        *v = if Some(i) == first { 1.0 } else { 0.0 };
                    }
                }
            }
        }
        Ok(vec![Tensor::from_f64_array(x.dtype(), a)])
    }
}

fn softmax(name: &'static str, doc: &'static str, kind: Kind) -> &'static dyn Op {
    leak(Softmax {
        schema: OpSchema {
            name,
            family: "norm",
            inputs: &["input"],
            outputs: &["output"],
            attrs: AXIS_LAST,
            doc,
            in_place: InPlace::No,
            origin: Origin::Onnx,
        },
        kind,
    })
}

// ---------------------------------------------------------------- BatchNormalization

struct BatchNorm;

const BATCH_NORM: OpSchema = OpSchema {
    name: "BatchNormalization",
    family: "norm",
    inputs: &["X", "scale", "B", "input_mean", "input_var"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("epsilon", AttrKind::Float, "1e-5"),
        AttrSpec::opt("momentum", AttrKind::Float, "0.9 (training only)"),
        AttrSpec::opt("training_mode", AttrKind::Int, "0 (only 0 is supported)"),
    ],
    doc: "Inference form: Y = (X - mean) / sqrt(var + epsilon) * scale + B, per channel \
          (axis 1) of X [N, C, ...].",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// Checks that `t` is a 1-D vector whose length can be channel dim `c`.
fn per_channel(t: &TensorType, i: usize, what: &str, c: &Dim) -> Result<(), String> {
    let ok = t.rank() == 1
        && match (t.shape.dim(0), c) {
            (Dim::Fixed(a), Dim::Fixed(b)) => a == b,
            _ => true,
        };
    if ok {
        Ok(())
    } else {
        Err(format!("input {i} ({what}) must be [{c}], got {t}"))
    }
}

impl Op for BatchNorm {
    fn schema(&self) -> &OpSchema {
        &BATCH_NORM
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        require_dtype(x, 0, is_float, "a float type")?;
        if x.rank() < 2 {
            return Err(format!("X must be [N, C, ...], got {x}"));
        }
        if cx.attrs.int_or("training_mode", 0)? != 0 {
            return Err("training_mode = 1 is not supported (inference form only)".into());
        }
        let c = x.shape.dim(1).clone();
        for (i, what) in [(1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")] {
            let t = cx.input(i)?;
            same_dtype("BatchNormalization", &[x, t])?;
            per_channel(t, i, what, &c)?;
        }
        Ok(vec![x.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let eps = cx.attrs.float_or("epsilon", 1e-5)?;
        let p: Vec<Vec<f64>> = (1..5)
            .map(|i| cx.input(i).map(|t| t.to_f64_vec()))
            .collect::<Result<_, _>>()?;
        let c = x.shape()[1];
        if p.iter().any(|v| v.len() != c) {
            return Err(format!("per-channel inputs must have {c} values"));
        }
        let mut a = x.to_f64_array();
        for (ch, mut plane) in a.axis_iter_mut(Axis(1)).enumerate() {
            let k = p[0][ch] / (p[3][ch] + eps).sqrt();
            plane.mapv_inplace(|v| (v - p[2][ch]) * k + p[1][ch]);
        }
        Ok(vec![Tensor::from_f64_array(x.dtype(), a)])
    }
}

// ---------------------------------------------------------------- LayerNormalization

struct LayerNorm;

const LAYER_NORM: OpSchema = OpSchema {
    name: "LayerNormalization",
    family: "norm",
    inputs: &["X", "Scale", "B?"],
    outputs: &["Y", "Mean", "InvStdDev"],
    attrs: &[
        AttrSpec::opt("axis", AttrKind::Int, "-1"),
        AttrSpec::opt("epsilon", AttrKind::Float, "1e-5"),
        AttrSpec::opt("stash_type", AttrKind::Int, "1"),
    ],
    doc: "Normalizes over the axes from `axis` to the last: Y = (X - mean) * InvStdDev * \
          Scale + B, Scale and B broadcasting to those axes. Always has all three outputs; \
          Mean and InvStdDev are f32 (stash_type 1) or X's dtype, with the normalized \
          axes kept as 1.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for LayerNorm {
    fn schema(&self) -> &OpSchema {
        &LAYER_NORM
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        require_dtype(x, 0, is_float, "a float type")?;
        let axis = x.shape.norm_axis(cx.attrs.int_or("axis", -1)?)?;
        let norm = Shape {
            axes: x.shape.axes[axis..].to_vec(),
        };
        for i in [1, 2] {
            if let Some(t) = cx.opt_input(i) {
                same_dtype("LayerNormalization", &[x, t])?;
                let b = crate::ir::shape::broadcast_shapes(&t.shape, &norm)
                    .map_err(|e| format!("input {i}: {e}"))?;
                if b.dims() != norm.dims() {
                    return Err(format!("input {i} ({t}) must broadcast to {norm}"));
                }
            }
        }
        let stash = match cx.attrs.int_or("stash_type", 1)? {
            1 => DType::F32,
            _ => x.dtype,
        };
        let mut stat = x.shape.clone();
        for a in &mut stat.axes[axis..] {
            a.dim = Dim::Fixed(1);
        }
        Ok(vec![
            x.clone(),
            TensorType::new(stash, stat.clone()),
            TensorType::new(stash, stat),
        ])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let axis = crate::ir::shape::norm_axis(cx.attrs.int_or("axis", -1)?, x.rank())?;
        let eps = cx.attrs.float_or("epsilon", 1e-5)?;
        let norm_shape = &x.shape()[axis..];
        let param = |i: usize| -> Result<Option<Vec<f64>>, String> {
            cx.opt_input(i)
                .map(|t| {
                    let a = t.to_f64_array();
                    a.broadcast(IxDyn(norm_shape))
                        .map(|b| b.iter().copied().collect())
                        .ok_or_else(|| format!("input {i} does not broadcast to {norm_shape:?}"))
                })
                .transpose()
        };
        let (scale, bias) = (param(1)?, param(2)?);
        let (mut a, outer, inner) = split_at(x, axis);
        let (mut means, mut inv) = (vec![0.0; outer], vec![0.0; outer]);
        let flat = a.as_slice_mut().expect("standard layout");
        for (o, row) in flat.chunks_mut(inner.max(1)).take(outer).enumerate() {
            let n = row.len() as f64;
            let mean = row.iter().sum::<f64>() / n;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
            let k = 1.0 / (var + eps).sqrt();
            for (j, v) in row.iter_mut().enumerate() {
                *v = (*v - mean) * k * scale.as_ref().map_or(1.0, |s| s[j])
                    + bias.as_ref().map_or(0.0, |b| b[j]);
            }
            (means[o], inv[o]) = (mean, k);
        }
        let mut stat_shape = x.shape().to_vec();
        stat_shape[axis..].iter_mut().for_each(|d| *d = 1);
        let stash = match cx.attrs.int_or("stash_type", 1)? {
            1 => DType::F32,
            _ => x.dtype(),
        };
        let stat = |v: Vec<f64>| Tensor::from_f64s(stash, &stat_shape, &v);
        Ok(vec![
            Tensor::from_f64_array(x.dtype(), a),
            stat(means)?,
            stat(inv)?,
        ])
    }
}

// ---------------------------------------------------------------- RMSNormalization

struct RmsNorm;

const RMS_NORM: OpSchema = OpSchema {
    name: "RMSNormalization",
    family: "norm",
    inputs: &["X", "scale"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("axis", AttrKind::Int, "-1"),
        AttrSpec::opt("epsilon", AttrKind::Float, "1e-5"),
        AttrSpec::opt("stash_type", AttrKind::Int, "1"),
    ],
    doc: "Y = X / sqrt(mean(X^2) + epsilon) * scale over the axes from `axis` to the last; \
          scale broadcasts to those axes.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for RmsNorm {
    fn schema(&self) -> &OpSchema {
        &RMS_NORM
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (x, scale) = (cx.input(0)?, cx.input(1)?);
        require_dtype(x, 0, is_float, "a float type")?;
        same_dtype("RMSNormalization", &[x, scale])?;
        let axis = x.shape.norm_axis(cx.attrs.int_or("axis", -1)?)?;
        let norm = Shape {
            axes: x.shape.axes[axis..].to_vec(),
        };
        let b = crate::ir::shape::broadcast_shapes(&scale.shape, &norm)
            .map_err(|e| format!("scale: {e}"))?;
        if b.dims() != norm.dims() {
            return Err(format!("scale ({scale}) must broadcast to {norm}"));
        }
        Ok(vec![x.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let axis = crate::ir::shape::norm_axis(cx.attrs.int_or("axis", -1)?, x.rank())?;
        let eps = cx.attrs.float_or("epsilon", 1e-5)?;
        let norm_shape = x.shape()[axis..].to_vec();
        let scale: Vec<f64> = cx
            .input(1)?
            .to_f64_array()
            .broadcast(IxDyn(&norm_shape))
            .ok_or("scale does not broadcast")?
            .iter()
            .copied()
            .collect();
        let (mut a, outer, inner) = split_at(x, axis);
        let flat = a.as_slice_mut().expect("standard layout");
        for row in flat.chunks_mut(inner.max(1)).take(outer) {
            let ms = row.iter().map(|v| v * v).sum::<f64>() / row.len() as f64;
            let k = 1.0 / (ms + eps).sqrt();
            row.iter_mut().zip(&scale).for_each(|(v, s)| *v *= k * s);
        }
        Ok(vec![Tensor::from_f64_array(x.dtype(), a)])
    }
}

// ---------------------------------------------------------------- InstanceNormalization

struct InstanceNorm;

const INSTANCE_NORM: OpSchema = OpSchema {
    name: "InstanceNormalization",
    family: "norm",
    inputs: &["input", "scale", "B"],
    outputs: &["output"],
    attrs: &[AttrSpec::opt("epsilon", AttrKind::Float, "1e-5")],
    doc: "Normalizes each (sample, channel) over the spatial axes of [N, C, D1, ...], then \
          scales and shifts per channel.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for InstanceNorm {
    fn schema(&self) -> &OpSchema {
        &INSTANCE_NORM
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        require_dtype(x, 0, is_float, "a float type")?;
        if x.rank() < 3 {
            return Err(format!("input must be [N, C, D1, ...], got {x}"));
        }
        let c = x.shape.dim(1).clone();
        for (i, what) in [(1, "scale"), (2, "B")] {
            let t = cx.input(i)?;
            same_dtype("InstanceNormalization", &[x, t])?;
            per_channel(t, i, what, &c)?;
        }
        Ok(vec![x.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let eps = cx.attrs.float_or("epsilon", 1e-5)?;
        let (scale, bias) = (cx.input(1)?.to_f64_vec(), cx.input(2)?.to_f64_vec());
        let c = x.shape()[1];
        if scale.len() != c || bias.len() != c {
            return Err(format!("scale and B must have {c} values"));
        }
        let (mut a, outer, inner) = split_at(x, 2);
        let flat = a.as_slice_mut().expect("standard layout");
        for (o, plane) in flat.chunks_mut(inner.max(1)).take(outer).enumerate() {
            let ch = o % c;
            let n = plane.len() as f64;
            let mean = plane.iter().sum::<f64>() / n;
            let var = plane.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
            let k = scale[ch] / (var + eps).sqrt();
            plane
                .iter_mut()
                .for_each(|v| *v = (*v - mean) * k + bias[ch]);
        }
        Ok(vec![Tensor::from_f64_array(x.dtype(), a)])
    }
}

// ---------------------------------------------------------------- LRN

struct Lrn;

const LRN: OpSchema = OpSchema {
    name: "LRN",
    family: "norm",
    inputs: &["X"],
    outputs: &["Y"],
    attrs: &[
        AttrSpec::opt("alpha", AttrKind::Float, "1e-4"),
        AttrSpec::opt("beta", AttrKind::Float, "0.75"),
        AttrSpec::opt("bias", AttrKind::Float, "1.0"),
        AttrSpec::req("size", AttrKind::Int),
    ],
    doc: "Local response normalization across channels of [N, C, ...]: x / (bias + alpha / \
          size * sum of squares over the `size` nearest channels)^beta.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for Lrn {
    fn schema(&self) -> &OpSchema {
        &LRN
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        require_dtype(x, 0, is_float, "a float type")?;
        if x.rank() < 3 {
            return Err(format!("X must be [N, C, D1, ...], got {x}"));
        }
        if cx.attrs.req_int("size")? < 1 {
            return Err("size must be >= 1".into());
        }
        Ok(vec![x.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let xt = cx.input(0)?;
        let x = xt.to_f64_array();
        let size = cx.attrs.req_int("size")? as usize;
        let (alpha, beta, bias) = (
            cx.attrs.float_or("alpha", 1e-4)?,
            cx.attrs.float_or("beta", 0.75)?,
            cx.attrs.float_or("bias", 1.0)?,
        );
        let c = x.shape()[1];
        let (lo, hi) = ((size - 1) / 2, (size - 1).div_ceil(2));
        let y = ArrayD::from_shape_fn(x.raw_dim(), |idx| {
            let mut at = idx.clone();
            let ch = idx[1];
            let mut sum = 0.0;
            for k in ch.saturating_sub(lo)..=(ch + hi).min(c - 1) {
                at[1] = k;
                sum += x[&at] * x[&at];
            }
            x[&idx] / (bias + alpha / size as f64 * sum).powf(beta)
        });
        Ok(vec![Tensor::from_f64_array(xt.dtype(), y)])
    }
}

// ---------------------------------------------------------------- LpNormalization

struct LpNorm;

const LP_NORM: OpSchema = OpSchema {
    name: "LpNormalization",
    family: "norm",
    inputs: &["input"],
    outputs: &["output"],
    attrs: &[
        AttrSpec::opt("axis", AttrKind::Int, "-1"),
        AttrSpec::opt("p", AttrKind::Int, "2"),
    ],
    doc: "Divides by the L1 or L2 norm along `axis`.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for LpNorm {
    fn schema(&self) -> &OpSchema {
        &LP_NORM
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        require_dtype(x, 0, is_float, "a float type")?;
        x.shape.norm_axis(cx.attrs.int_or("axis", -1)?)?;
        match cx.attrs.int_or("p", 2)? {
            1 | 2 => Ok(out(x.dtype, x.shape.clone())),
            p => Err(format!("p must be 1 or 2, got {p}")),
        }
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let axis = crate::ir::shape::norm_axis(cx.attrs.int_or("axis", -1)?, x.rank())?;
        let p = cx.attrs.int_or("p", 2)?;
        let mut a = x.to_f64_array();
        for mut lane in a.lanes_mut(Axis(axis)) {
            let norm = if p == 1 {
                lane.iter().map(|v| v.abs()).sum::<f64>()
            } else {
                lane.iter().map(|v| v * v).sum::<f64>().sqrt()
            };
            // A zero lane stays zero (as the ONNX reference has it), not 0/0.
            lane.mapv_inplace(|v| if norm == 0.0 { 0.0 } else { v / norm });
        }
        Ok(vec![Tensor::from_f64_array(x.dtype(), a)])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![
        softmax(
            "Softmax",
            "exp(x) / sum(exp(x)) along `axis` (opset 13: one axis).",
            Kind::Softmax,
        ),
        softmax(
            "LogSoftmax",
            "x - log(sum(exp(x))) along `axis`, computed stably.",
            Kind::LogSoftmax,
        ),
        softmax(
            "Hardmax",
            "1 at the first maximum along `axis`, 0 elsewhere.",
            Kind::Hardmax,
        ),
        leak(BatchNorm),
        leak(LayerNorm),
        leak(RmsNorm),
        leak(Lrn),
        leak(InstanceNorm),
        leak(LpNorm),
    ]
}
