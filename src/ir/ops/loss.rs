//! Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss (opset 13 forms), and
//! the Kiln-only MseLoss.
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, Axis, Dimension, IxDyn};

use super::util::require_dtype;
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::{AttrKind, Attrs, DType, Shape, TensorType};
use crate::tensor::Tensor;

const LOSS_ATTRS: &[AttrSpec] = &[
    AttrSpec::opt("ignore_index", AttrKind::Int, "none"),
    AttrSpec::opt("reduction", AttrKind::String, "mean"),
];

fn is_float(d: DType) -> bool {
    d.is_float()
}

fn reduction(attrs: &Attrs) -> Result<&str, String> {
    match attrs.string_or("reduction", "mean")? {
        r @ ("none" | "sum" | "mean") => Ok(r),
        r => Err(format!("reduction '{r}' is not one of none, sum, mean")),
    }
}

/// Checks input [N, C, d...], target [N, d...] (integer) and weight [C]; returns the
/// loss type for the reduction.
fn check(cx: &InferCtx<'_>) -> Result<TensorType, String> {
    let (x, t) = (cx.input(0)?, cx.input(1)?);
    require_dtype(x, 0, is_float, "a float type")?;
    if !matches!(t.dtype, DType::I32 | DType::I64) {
        return Err(format!(
            "input 1 (target) must be i32 or i64, got {}",
            t.dtype
        ));
    }
    if x.rank() < 2 || t.rank() != x.rank() - 1 {
        return Err(format!(
            "input must be [N, C, d...] and target [N, d...], got {x} and {t}"
        ));
    }
    if let Some(w) = cx.opt_input(2) {
        if w.dtype != x.dtype || w.rank() != 1 {
            return Err(format!(
                "weight must be a 1-D {} tensor [C], got {w}",
                x.dtype
            ));
        }
    }
    Ok(match reduction(cx.attrs)? {
        "none" => TensorType::new(x.dtype, t.shape.clone()),
        _ => TensorType::new(x.dtype, Shape::scalar()),
    })
}

/// The NLL of log-probabilities `logp` [N, C, d...] against `target` [N, d...].
fn nll(
    logp: &ArrayD<f64>,
    target: &Tensor,
    weight: Option<&Tensor>,
    attrs: &Attrs,
) -> Result<ArrayD<f64>, String> {
    let c = logp.shape()[1];
    let target = target.to_i64_array();
    let weight = weight.map(|w| w.to_f64_vec());
    if weight.as_ref().is_some_and(|w| w.len() != c) {
        return Err(format!("weight must have {c} values"));
    }
    let ignore = attrs.int("ignore_index")?;
    let mut loss = ArrayD::<f64>::zeros(target.raw_dim());
    let mut weights = ArrayD::<f64>::zeros(target.raw_dim());
    for (idx, &t) in target.indexed_iter() {
        if Some(t) == ignore {
            continue;
        }
        if t < 0 || t as usize >= c {
            return Err(format!("target {t} is out of range for {c} classes"));
        }
        let mut at: Vec<usize> = idx.slice().to_vec();
        at.insert(1, t as usize);
        let w = weight.as_ref().map_or(1.0, |w| w[t as usize]);
        loss[&idx] = -logp[IxDyn(&at)] * w;
        weights[&idx] = w;
    }
    Ok(match reduction(attrs)? {
        "none" => loss,
        "sum" => ArrayD::from_elem(IxDyn(&[]), loss.sum()),
        _ => ArrayD::from_elem(IxDyn(&[]), loss.sum() / weights.sum()),
    })
}

struct NllLoss;

const NLL: OpSchema = OpSchema {
    name: "NegativeLogLikelihoodLoss",
    family: "loss",
    inputs: &["input", "target", "weight?"],
    outputs: &["loss"],
    attrs: LOSS_ATTRS,
    doc: "-input[n, target[n, d...], d...] * weight[target], reduced by none, sum or the \
          weighted mean; targets equal to ignore_index count for nothing.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for NllLoss {
    fn schema(&self) -> &OpSchema {
        &NLL
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        Ok(vec![check(cx)?])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let loss = nll(&x.to_f64_array(), cx.input(1)?, cx.opt_input(2), cx.attrs)?;
        Ok(vec![Tensor::from_f64_array(x.dtype(), loss)])
    }
}

struct SoftmaxCrossEntropy;

const SCE: OpSchema = OpSchema {
    name: "SoftmaxCrossEntropyLoss",
    family: "loss",
    inputs: &["scores", "labels", "weights?"],
    outputs: &["output", "log_prob"],
    attrs: LOSS_ATTRS,
    doc: "NegativeLogLikelihoodLoss of LogSoftmax(scores) over axis 1; always has the \
          log_prob output.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for SoftmaxCrossEntropy {
    fn schema(&self) -> &OpSchema {
        &SCE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        Ok(vec![check(cx)?, cx.input(0)?.clone()])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let mut logp = x.to_f64_array();
        for mut lane in logp.lanes_mut(Axis(1)) {
            let max = lane.fold(f64::NEG_INFINITY, |m, &v| m.max(v));
            let lse = lane.iter().map(|v| (v - max).exp()).sum::<f64>().ln() + max;
            lane.mapv_inplace(|v| v - lse);
        }
        let loss = nll(&logp, cx.input(1)?, cx.opt_input(2), cx.attrs)?;
        Ok(vec![
            Tensor::from_f64_array(x.dtype(), loss),
            Tensor::from_f64_array(x.dtype(), logp),
        ])
    }
}

struct MseLoss;

const MSE: OpSchema = OpSchema {
    name: "MseLoss",
    family: "loss",
    inputs: &["prediction", "target"],
    outputs: &["loss"],
    attrs: &[AttrSpec::opt("reduction", AttrKind::String, "mean")],
    doc: "Kiln-only. (prediction − target)², of two float tensors of the same type and \
          shape (no broadcasting, so that a shape slip is an error, not a silently wrong \
          loss), reduced by none, sum or mean over all elements.",
    in_place: InPlace::No,
    origin: Origin::Kiln,
};

impl Op for MseLoss {
    fn schema(&self) -> &OpSchema {
        &MSE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (p, t) = (cx.input(0)?, cx.input(1)?);
        require_dtype(p, 0, is_float, "a float type")?;
        // Symbolic dims may differ in name and agree at run time (eval checks them).
        let agree = |a: &crate::ir::Dim, b: &crate::ir::Dim| {
            a == b || a.fixed().is_none() || b.fixed().is_none()
        };
        let same_shape =
            t.rank() == p.rank() && (0..p.rank()).all(|i| agree(p.shape.dim(i), t.shape.dim(i)));
        if t.dtype != p.dtype || !same_shape {
            return Err(format!(
                "input 1 (target) must have the type of input 0 (prediction), {p}; got {t}"
            ));
        }
        Ok(vec![match reduction(cx.attrs)? {
            "none" => p.clone(),
            _ => TensorType::new(p.dtype, Shape::scalar()),
        }])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (p, t) = (cx.input(0)?, cx.input(1)?);
        if p.shape() != t.shape() {
            return Err(format!(
                "prediction has shape {:?}, target {:?}",
                p.shape(),
                t.shape()
            ));
        }
        let d = p.to_f64_array() - t.to_f64_array();
        let sq = d.mapv(|v| v * v);
        let loss = match reduction(cx.attrs)? {
            "none" => sq,
            "sum" => ArrayD::from_elem(IxDyn(&[]), sq.sum()),
            // The mean of no elements is NaN, as in numpy and PyTorch.
            _ => ArrayD::from_elem(IxDyn(&[]), sq.sum() / sq.len() as f64),
        };
        Ok(vec![Tensor::from_f64_array(p.dtype(), loss)])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(NllLoss), leak(SoftmaxCrossEntropy), leak(MseLoss)]
}
