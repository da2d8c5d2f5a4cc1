//! Normalizations as typed loops on any float dtype, computing in f64 like the
//! reference: `RMSNormalization` (any axis, a scale broadcast to the normalized axes),
//! `BatchNormalization` (inference form, its statistics read at run time, so not only
//! constants the fold pass took), `LRN`, and `Softmax` / `LogSoftmax` on the dtypes the
//! f32 kernels of [`super::nn`] do not take.
use crate::backend::cpu::program::{Cx, Kernel, Slot};
use crate::ir::shape::norm_axis;
use crate::ir::DType;
use crate::tensor::Elem;
use crate::with_dtype;

use super::matmul_elem::{elems, elems_mut};
use super::Build;

enum Norm {
    /// Rows of `inner` (the axes from `axis` on); `scale_at[e]`: element e's scale.
    Rms {
        inner: usize,
        eps: f64,
        scale: Slot,
        scale_at: Vec<usize>,
    },
    /// X as [N, C, inner]; scale, B, mean, var per channel.
    Batch {
        c: usize,
        inner: usize,
        eps: f64,
        params: [Slot; 4],
    },
    /// X as [N, C, inner].
    Lrn {
        c: usize,
        inner: usize,
        size: usize,
        alpha: f64,
        beta: f64,
        bias: f64,
    },
    /// Along the middle axis of [outer, len, inner].
    Softmax { len: usize, inner: usize, log: bool },
    /// LpNormalization (p 1 or 2) along the middle axis of [outer, len, inner].
    Lp { len: usize, inner: usize, p: i64 },
    /// InstanceNormalization: X as [N, C, inner]; scale and B per channel.
    Instance {
        c: usize,
        inner: usize,
        eps: f64,
        params: [Slot; 2],
    },
    /// LayerNormalization over rows of `inner`; `at[e]`: element e's scale / B offset;
    /// Mean and InvStdDev written where used, as f32 (`stash_f32`) or X's dtype.
    Layer {
        inner: usize,
        eps: f64,
        scale: Slot,
        bias: Option<Slot>,
        scale_at: Vec<usize>,
        bias_at: Vec<usize>,
        stats: [Option<Slot>; 2],
        stash_f32: bool,
    },
}

struct NormElem {
    what: Norm,
    dtype: DType,
    x: Slot,
    y: Slot,
}

/// The float dtypes these loops take.
const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Per element of rows shaped `norm`, the offset of its value in a tensor of shape `s`
/// broadcast (right-aligned) to `norm`.
fn broadcast_at(s: &[usize], norm: &[usize]) -> Result<Option<Vec<usize>>, String> {
    if s.len() > norm.len() {
        return Ok(None);
    }
    // Right-aligned strides (0 where it broadcasts).
    let off = norm.len() - s.len();
    let mut strides = vec![0usize; norm.len()];
    let mut step = 1;
    for i in (0..s.len()).rev() {
        if s[i] != 1 {
            if s[i] != norm[off + i] {
                return Err(format!("{s:?} does not broadcast to {norm:?}"));
            }
            strides[off + i] = step;
        }
        step *= s[i];
    }
    let inner: usize = norm.iter().product();
    Ok(Some(
        (0..inner)
            .map(|mut e| {
                let mut at = 0;
                for (d, st) in norm.iter().zip(&strides).rev() {
                    at += (e % d) * st;
                    e /= d;
                }
                at
            })
            .collect(),
    ))
}

pub(super) fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let (Some(x), Some(y)) = (b.input(0), b.outs.first()) else {
        return Ok(None);
    };
    let dtype = x.dtype;
    if !FLOATS.contains(&dtype) || y.dtype != dtype || y.shape != x.shape {
        return Ok(None);
    }
    if b.outs.len() > 1 && b.node.op != "LayerNormalization" {
        return Ok(None);
    }
    if b.ins.iter().flatten().any(|s| s.dtype != dtype) {
        return Ok(None);
    }
    let attrs = &b.node.attrs;
    let rank = x.shape.len();
    let channels = || -> Option<(usize, usize)> {
        let c = *x.shape.get(1)?;
        Some((c, x.shape[2..].iter().product()))
    };
    let what = match b.node.op.as_str() {
        "RMSNormalization" => {
            let axis = norm_axis(attrs.int_or("axis", -1)?, rank)?;
            let Some(scale) = b.input(1) else {
                return Ok(None);
            };
            let norm = &x.shape[axis..];
            let Some(scale_at) = broadcast_at(&scale.shape, norm)? else {
                return Ok(None);
            };
            let inner: usize = norm.iter().product();
            Norm::Rms {
                inner,
                eps: attrs.float_or("epsilon", 1e-5)?,
                scale: scale.clone(),
                scale_at,
            }
        }
        "BatchNormalization" => {
            if attrs.int_or("training_mode", 0)? != 0 || rank < 2 {
                return Ok(None);
            }
            let Some((c, inner)) = channels() else {
                return Ok(None);
            };
            let p: Option<Vec<Slot>> = (1..5).map(|k| b.input(k).cloned()).collect();
            let Some(p) = p else { return Ok(None) };
            if p.iter().any(|s| s.elements() != c) {
                return Err(format!("per-channel inputs must have {c} values"));
            }
            let Ok(params) = <[Slot; 4]>::try_from(p) else {
                return Ok(None);
            };
            Norm::Batch {
                c,
                inner,
                eps: attrs.float_or("epsilon", 1e-5)?,
                params,
            }
        }
        "LRN" => {
            let Some((c, inner)) = channels().filter(|_| rank >= 3) else {
                return Ok(None);
            };
            let size = attrs.req_int("size")?;
            if size < 1 {
                return Err("size must be >= 1".into());
            }
            Norm::Lrn {
                c,
                inner,
                size: size as usize,
                alpha: attrs.float_or("alpha", 1e-4)?,
                beta: attrs.float_or("beta", 0.75)?,
                bias: attrs.float_or("bias", 1.0)?,
            }
        }
        op @ ("Softmax" | "LogSoftmax") if dtype != DType::F32 => {
            let axis = norm_axis(attrs.int_or("axis", -1)?, rank)?;
            Norm::Softmax {
                len: x.shape[axis],
                inner: x.shape[axis + 1..].iter().product(),
                log: op == "LogSoftmax",
            }
        }
        "LpNormalization" => {
            let axis = norm_axis(attrs.int_or("axis", -1)?, rank)?;
            let p = attrs.int_or("p", 2)?;
            if !matches!(p, 1 | 2) {
                return Err(format!("p must be 1 or 2, got {p}"));
            }
            Norm::Lp {
                len: x.shape[axis],
                inner: x.shape[axis + 1..].iter().product(),
                p,
            }
        }
        "InstanceNormalization" => {
            let Some((c, inner)) = channels().filter(|_| rank >= 3) else {
                return Ok(None);
            };
            let (Some(s), Some(bias)) = (b.input(1), b.input(2)) else {
                return Ok(None);
            };
            if s.elements() != c || bias.elements() != c {
                return Err(format!("scale and B must have {c} values"));
            }
            Norm::Instance {
                c,
                inner,
                eps: attrs.float_or("epsilon", 1e-5)?,
                params: [s.clone(), bias.clone()],
            }
        }
        "LayerNormalization" => {
            let axis = norm_axis(attrs.int_or("axis", -1)?, rank)?;
            let Some(scale) = b.input(1) else {
                return Ok(None);
            };
            let norm = &x.shape[axis..];
            let Some(scale_at) = broadcast_at(&scale.shape, norm)? else {
                return Ok(None);
            };
            let (bias, bias_at) = match b.input(2) {
                Some(s) => {
                    let Some(at) = broadcast_at(&s.shape, norm)? else {
                        return Ok(None);
                    };
                    (Some(s.clone()), at)
                }
                None => (None, Vec::new()),
            };
            let stash_f32 = attrs.int_or("stash_type", 1)? == 1;
            let want = if stash_f32 { DType::F32 } else { dtype };
            let outer: usize = x.shape[..axis].iter().product();
            let mut stats = [None, None];
            for (k, st) in stats.iter_mut().enumerate() {
                let Some(s) = b.outs.get(k + 1) else { continue };
                if s.dtype != want || s.elements() != outer {
                    return Ok(None);
                }
                if super::nn::used(b, k as u32 + 1) {
                    *st = Some(s.clone());
                }
            }
            Norm::Layer {
                inner: norm.iter().product(),
                eps: attrs.float_or("epsilon", 1e-5)?,
                scale: scale.clone(),
                bias,
                scale_at,
                bias_at,
                stats,
                stash_f32,
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(Box::new(NormElem {
        what,
        dtype,
        x: x.clone(),
        y: y.clone(),
    })))
}

impl NormElem {
    /// # Safety
    /// The slots hold `T`s of their shapes in `cx`, Y a buffer of its own.
    unsafe fn run_as<T: Elem>(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: X, this step's `T` input, only read.
        let x = unsafe { elems::<T>(cx, &self.x) };
        // SAFETY: Y, the output; none of these ops runs in place, so it is not X's.
        let y = unsafe { elems_mut::<T>(cx, &self.y) };
        match &self.what {
            Norm::Rms {
                inner,
                eps,
                scale,
                scale_at,
            } => {
                // SAFETY: the scale input, `T`s of its shape, only read.
                let scale = unsafe { elems::<T>(cx, scale) };
                let inner = (*inner).max(1);
                for (xr, yr) in x.chunks(inner).zip(y.chunks_mut(inner)) {
                    let ms =
                        xr.iter().map(|v| v.to_f64() * v.to_f64()).sum::<f64>() / xr.len() as f64;
                    let k = 1.0 / (ms + eps).sqrt();
                    for ((o, v), &at) in yr.iter_mut().zip(xr).zip(scale_at) {
                        *o = T::from_f64(v.to_f64() * (k * scale[at].to_f64()));
                    }
                }
            }
            Norm::Batch {
                c,
                inner,
                eps,
                params,
            } => {
                // SAFETY: scale, B, mean and var, `T` inputs of C values, only read.
                let p: [&[T]; 4] = std::array::from_fn(|k| unsafe { elems::<T>(cx, &params[k]) });
                let inner = (*inner).max(1);
                for (plane, (xp, yp)) in x.chunks(inner).zip(y.chunks_mut(inner)).enumerate() {
                    let ch = plane % c;
                    let k = p[0][ch].to_f64() / (p[3][ch].to_f64() + eps).sqrt();
                    let (mean, bias) = (p[2][ch].to_f64(), p[1][ch].to_f64());
                    for (o, v) in yp.iter_mut().zip(xp) {
                        *o = T::from_f64((v.to_f64() - mean) * k + bias);
                    }
                }
            }
            Norm::Lrn {
                c,
                inner,
                size,
                alpha,
                beta,
                bias,
            } => {
                let (c, inner) = (*c, *inner);
                let (lo, hi) = ((size - 1) / 2, (size - 1).div_ceil(2));
                let per = alpha / *size as f64;
                for (at, o) in y.iter_mut().enumerate() {
                    let (n, ch, s) = (at / (c * inner), (at / inner) % c, at % inner);
                    let mut sum = 0.0;
                    for k in ch.saturating_sub(lo)..=(ch + hi).min(c - 1) {
                        let v = x[(n * c + k) * inner + s].to_f64();
                        sum += v * v;
                    }
                    *o = T::from_f64(x[at].to_f64() / (bias + per * sum).powf(*beta));
                }
            }
            Norm::Softmax { len, inner, log } => {
                let (len, inner) = (*len, *inner);
                let block = (len * inner).max(1);
                for (xb, yb) in x.chunks(block).zip(y.chunks_mut(block)) {
                    for i in 0..inner {
                        let lane = (0..len).map(|l| xb[l * inner + i].to_f64());
                        let max = lane.clone().fold(f64::NEG_INFINITY, f64::max);
                        let sum: f64 = lane.clone().map(|v| (v - max).exp()).sum();
                        for (l, v) in lane.enumerate() {
                            yb[l * inner + i] = T::from_f64(if *log {
                                v - max - sum.ln()
                            } else {
                                (v - max).exp() / sum
                            });
                        }
                    }
                }
            }
            Norm::Lp { len, inner, p } => {
                let (len, inner) = (*len, *inner);
                let block = (len * inner).max(1);
                for (xb, yb) in x.chunks(block).zip(y.chunks_mut(block)) {
                    for i in 0..inner {
                        let lane = (0..len).map(|l| xb[l * inner + i].to_f64());
                        let norm = if *p == 1 {
                            lane.clone().map(f64::abs).sum::<f64>()
                        } else {
                            lane.clone().map(|v| v * v).sum::<f64>().sqrt()
                        };
                        for (l, v) in lane.enumerate() {
                            let o = if norm == 0.0 { 0.0 } else { v / norm };
                            yb[l * inner + i] = T::from_f64(o);
                        }
                    }
                }
            }
            Norm::Instance {
                c,
                inner,
                eps,
                params,
            } => {
                // SAFETY: scale and B, `T` inputs of C values, only read.
                let p: [&[T]; 2] = std::array::from_fn(|k| unsafe { elems::<T>(cx, &params[k]) });
                let inner = (*inner).max(1);
                for (plane, (xp, yp)) in x.chunks(inner).zip(y.chunks_mut(inner)).enumerate() {
                    let ch = plane % c;
                    let (mean, var) = mean_var(xp);
                    let k = p[0][ch].to_f64() / (var + eps).sqrt();
                    let bias = p[1][ch].to_f64();
                    for (o, v) in yp.iter_mut().zip(xp) {
                        *o = T::from_f64((v.to_f64() - mean) * k + bias);
                    }
                }
            }
            Norm::Layer {
                inner,
                eps,
                scale,
                bias,
                scale_at,
                bias_at,
                stats,
                stash_f32,
            } => {
                // SAFETY: LayerNormalization's Scale, `T`s of its shape, only read.
                let scale = unsafe { elems::<T>(cx, scale) };
                // SAFETY: LayerNormalization's B, `T`s of its shape, only read.
                let bias = bias.as_ref().map(|b| unsafe { elems::<T>(cx, b) });
                let mut outs: [Option<Stat<T>>; 2] = std::array::from_fn(|k| {
                    let st = stats[k].as_ref()?;
                    Some(if *stash_f32 {
                        // SAFETY: Mean / InvStdDev, f32 outputs of one value per row, each
                        // its own buffer.
                        Stat::F32(unsafe { elems_mut::<f32>(cx, st) })
                    } else {
                        // SAFETY: Mean / InvStdDev in X's dtype, one value per row, each
                        // its own buffer.
                        Stat::Same(unsafe { elems_mut::<T>(cx, st) })
                    })
                });
                let inner = (*inner).max(1);
                for (row, (xr, yr)) in x.chunks(inner).zip(y.chunks_mut(inner)).enumerate() {
                    let (mean, var) = mean_var(xr);
                    let k = 1.0 / (var + eps).sqrt();
                    for (j, (o, v)) in yr.iter_mut().zip(xr).enumerate() {
                        let b = bias.map_or(0.0, |b| b[bias_at[j]].to_f64());
                        *o = T::from_f64((v.to_f64() - mean) * k * scale[scale_at[j]].to_f64() + b);
                    }
                    for (st, v) in outs.iter_mut().zip([mean, k]) {
                        match st {
                            Some(Stat::F32(o)) => o[row] = v as f32,
                            Some(Stat::Same(o)) => o[row] = T::from_f64(v),
                            None => {}
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// A LayerNormalization statistic output: f32 (stash_type 1) or X's dtype.
enum Stat<'a, T> {
    F32(&'a mut [f32]),
    Same(&'a mut [T]),
}

/// The mean and (population) variance of `v`, in f64.
fn mean_var<T: Elem>(v: &[T]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().map(|v| v.to_f64()).sum::<f64>() / n;
    let var = v
        .iter()
        .map(|v| (v.to_f64() - mean) * (v.to_f64() - mean))
        .sum::<f64>()
        / n;
    (mean, var)
}

/// [`NormElem::run_as`] as a free fn, for `with_dtype!`.
///
/// # Safety
/// As for [`NormElem::run_as`].
unsafe fn run_norm<T: Elem>(s: &NormElem, cx: &Cx) -> Result<(), String> {
    // SAFETY: the normalization step's contract, passed on.
    unsafe { s.run_as::<T>(cx) }
}

impl Kernel for NormElem {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: X, Y and the other inputs hold `dtype` (checked at build).
        unsafe { with_dtype!(self.dtype, run_norm(self, cx)) }
    }
    fn can_fail(&self) -> bool {
        false
    }
    fn kind(&self) -> &'static str {
        match self.what {
            Norm::Rms { .. } => "rmsnorm",
            Norm::Batch { .. } => "batchnorm",
            Norm::Lrn { .. } => "lrn",
            Norm::Softmax { .. } => "softmax-elem",
            Norm::Lp { .. } => "lp-norm",
            Norm::Instance { .. } => "instance-norm",
            Norm::Layer { .. } => "layer-norm-elem",
        }
    }
}
