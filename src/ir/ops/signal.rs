//! Signal processing: DFT, STFT and MelWeightMatrix (ONNX 17-20). Complex tensors are
//! real ones whose last axis holds (real, imaginary); a real signal's last axis has
//! size one. The reference transforms are the plain O(n^2) sums in f64, with twiddle
//! factors reduced modulo n so that large indices lose no precision.
use crate::ir::ops::{InPlace, Origin};
use std::f64::consts::PI;

use ndarray::{ArrayD, Dimension, IxDyn};

use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::{AttrKind, DType, Dim, Shape, TensorType};
use crate::tensor::Tensor;

/// An integer scalar (or one-element) operand's value, when it is a constant.
fn const_scalar(cx: &InferCtx<'_>, i: usize, what: &str) -> Result<Option<i64>, String> {
    let Some(t) = cx.opt_input(i) else {
        return Ok(None);
    };
    if !matches!(t.dtype, DType::I32 | DType::I64) || t.rank() > 1 {
        return Err(format!("{what} must be an integer scalar, got {t}"));
    }
    Ok(cx
        .const_input(i)
        .and_then(|c| c.to_i64_vec().first().copied()))
}

fn scalar(cx: &EvalCtx<'_>, i: usize, what: &str) -> Result<Option<i64>, String> {
    match cx.opt_input(i) {
        None => Ok(None),
        Some(t) => t
            .to_i64_vec()
            .first()
            .copied()
            .map(Some)
            .ok_or_else(|| format!("{what} is empty")),
    }
}

fn check_signal(x: &TensorType) -> Result<(), String> {
    if !x.dtype.is_float() {
        return Err(format!("the signal must be float, got {}", x.dtype));
    }
    if x.rank() < 2 || !matches!(x.shape.dim(x.rank() - 1).fixed(), Some(1 | 2) | None) {
        return Err(format!(
            "the signal must end in an axis of 1 (real) or 2 (complex), got {x}"
        ));
    }
    Ok(())
}

/// `cos` and `sin` of `2 pi k n / len`.
fn twiddle(k: usize, n: usize, len: usize) -> (f64, f64) {
    let angle = 2.0 * PI * ((k * n) % len) as f64 / len as f64;
    (angle.cos(), angle.sin())
}

/// The DFT of one complex sequence (zero-padded or truncated to `len`), bins `0..bins`;
/// `inverse` uses `e^{+i}` and divides by `len`.
fn transform(x: &[(f64, f64)], len: usize, bins: usize, inverse: bool) -> Vec<(f64, f64)> {
    let sign = if inverse { 1.0 } else { -1.0 };
    let norm = if inverse { len as f64 } else { 1.0 };
    (0..bins)
        .map(|k| {
            let (mut re, mut im) = (0.0, 0.0);
            for (n, &(xr, xi)) in x.iter().enumerate().take(len) {
                let (c, s) = twiddle(k, n, len);
                let s = sign * s;
                re += xr * c - xi * s;
                im += xr * s + xi * c;
            }
            (re / norm, im / norm)
        })
        .collect()
}

/// The real inverse of a one-sided spectrum (numpy's `irfft`): the imaginary parts of
/// the DC and Nyquist bins do not contribute.
fn inverse_real(x: &[(f64, f64)], len: usize) -> Vec<f64> {
    let half = len / 2 + 1;
    let bin = |k: usize| x.get(k).copied().unwrap_or((0.0, 0.0));
    (0..len)
        .map(|n| {
            let mut sum = bin(0).0;
            for k in 1..half {
                let (re, im) = bin(k);
                let (c, s) = twiddle(k, n, len);
                let term = re * c - im * s;
                sum += if len.is_multiple_of(2) && k == len / 2 {
                    term
                } else {
                    2.0 * term
                };
            }
            sum / len as f64
        })
        .collect()
}

/// The complex lanes of `x` along `axis` (x's last axis holds 1 or 2 parts).
fn lanes(x: &ArrayD<f64>, axis: usize) -> (Vec<usize>, Vec<Vec<(f64, f64)>>) {
    let shape = x.shape();
    let parts = shape[shape.len() - 1];
    let mut outer = shape[..shape.len() - 1].to_vec();
    let n = outer[axis];
    outer[axis] = 1;
    let mut out = vec![];
    for idx in ndarray::indices(IxDyn(&outer)) {
        let mut p = idx.slice().to_vec();
        p.push(0);
        let lane = (0..n)
            .map(|i| {
                p[axis] = i;
                let last = p.len() - 1;
                p[last] = 0;
                let re = x[IxDyn(&p)];
                let im = if parts == 2 {
                    p[last] = 1;
                    x[IxDyn(&p)]
                } else {
                    0.0
                };
                (re, im)
            })
            .collect();
        out.push(lane);
    }
    (outer, out)
}

// ---------------------------------------------------------------- DFT

struct Dft;

const DFT: OpSchema = OpSchema {
    name: "DFT",
    family: "signal",
    inputs: &["input", "dft_length?", "axis?"],
    outputs: &["output"],
    attrs: &[
        AttrSpec::opt("inverse", AttrKind::Int, "0"),
        AttrSpec::opt("onesided", AttrKind::Int, "0"),
    ],
    doc: "The discrete Fourier transform along `axis` (default -2; not the last axis, \
          which holds the real or complex parts) of length dft_length (default: the \
          axis's size; the signal is zero-padded or truncated). onesided keeps bins \
          0..n/2; inverse divides by n, and inverse with onesided gives the real signal \
          of a one-sided spectrum.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

fn dft_axis(axis: Option<i64>, rank: usize) -> Result<usize, String> {
    let a = axis.unwrap_or(-2);
    let ax = crate::ir::shape::norm_axis(a, rank)?;
    if ax == rank - 1 {
        return Err("axis cannot be the last axis (real and imaginary parts)".into());
    }
    Ok(ax)
}

impl Op for Dft {
    fn schema(&self) -> &OpSchema {
        &DFT
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        check_signal(x)?;
        let len = const_scalar(cx, 1, "dft_length")?;
        let axis_value = const_scalar(cx, 2, "axis")?;
        let axis = if cx.opt_input(2).is_some() && axis_value.is_none() {
            None // known at run time only
        } else {
            Some(dft_axis(axis_value, x.rank())?)
        };
        let inverse = cx.attrs.int_or("inverse", 0)? != 0;
        let onesided = cx.attrs.int_or("onesided", 0)? != 0;
        let mut shape: Shape = x.shape.clone();
        let keeps_length = len.is_none() && cx.opt_input(1).is_none() && !onesided;
        let Some(axis) = axis else {
            // An axis known only at run time: its size stays put only without a length
            // or a one-sided spectrum; otherwise any axis but the last may change.
            if !keeps_length {
                for a in 0..shape.rank() - 1 {
                    shape.axes[a].dim = cx.fresh_dim(0, a);
                    shape.axes[a].name = None;
                }
            }
            let last = shape.rank() - 1;
            shape.axes[last].dim = Dim::Fixed(if inverse && onesided { 1 } else { 2 });
            return Ok(vec![TensorType::new(x.dtype, shape)]);
        };
        let n = match (len, x.shape.dim(axis).fixed()) {
            (Some(l), _) if l < 1 => return Err(format!("dft_length must be positive, got {l}")),
            (Some(l), _) => Some(l as usize),
            (None, Some(d)) if inverse && onesided => Some(2 * d.saturating_sub(1)),
            (None, d) if cx.opt_input(1).is_none() => d,
            _ => None,
        };
        shape.axes[axis].dim = match n {
            Some(n) if onesided && !inverse => Dim::Fixed(n / 2 + 1),
            Some(n) => Dim::Fixed(n),
            None => cx.fresh_dim(0, axis),
        };
        shape.axes[axis].name = None;
        let last = shape.rank() - 1;
        shape.axes[last].dim = Dim::Fixed(if inverse && onesided { 1 } else { 2 });
        Ok(vec![TensorType::new(x.dtype, shape)])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let xt = cx.input(0)?;
        let x = xt.to_f64_array();
        let axis = dft_axis(scalar(cx, 2, "axis")?, x.ndim())?;
        let inverse = cx.attrs.int_or("inverse", 0)? != 0;
        let onesided = cx.attrs.int_or("onesided", 0)? != 0;
        let size = x.shape()[axis];
        let n = match scalar(cx, 1, "dft_length")? {
            Some(l) if l < 1 => return Err(format!("dft_length must be positive, got {l}")),
            Some(l) => l as usize,
            None if inverse && onesided => 2 * size.saturating_sub(1),
            None => size,
        };
        if n == 0 {
            return Err("the transform length is 0".into());
        }
        let (outer, lanes) = lanes(&x, axis);
        let (bins, parts) = match (inverse, onesided) {
            (true, true) => (n, 1),
            (false, true) => (n / 2 + 1, 2),
            _ => (n, 2),
        };
        let mut shape = x.shape().to_vec();
        shape[axis] = bins;
        *shape.last_mut().expect("rank >= 2") = parts;
        super::util::check_size(&shape)?;
        let mut y = ArrayD::<f64>::zeros(IxDyn(&shape));
        for (idx, lane) in ndarray::indices(IxDyn(&outer)).into_iter().zip(&lanes) {
            let mut p = idx.slice().to_vec();
            p.push(0);
            let last = p.len() - 1;
            if inverse && onesided {
                for (i, v) in inverse_real(lane, n).into_iter().enumerate() {
                    p[axis] = i;
                    y[IxDyn(&p)] = v;
                }
            } else {
                for (i, (re, im)) in transform(lane, n, bins, inverse).into_iter().enumerate() {
                    p[axis] = i;
                    p[last] = 0;
                    y[IxDyn(&p)] = re;
                    p[last] = 1;
                    y[IxDyn(&p)] = im;
                }
            }
        }
        Ok(vec![Tensor::from_f64_array(xt.dtype(), y)])
    }
}

// ---------------------------------------------------------------- STFT

struct Stft;

const STFT: OpSchema = OpSchema {
    name: "STFT",
    family: "signal",
    inputs: &["signal", "frame_step", "window?", "frame_length?"],
    outputs: &["output"],
    attrs: &[AttrSpec::opt("onesided", AttrKind::Int, "1")],
    doc: "Short-time Fourier transform of signal [batch, length, 1|2]: frames of \
          frame_length (default: the window's length) every frame_step, each times the \
          window (default: ones), transformed. Output [batch, frames, bins, 2] with \
          frames = 1 + (length - frame_length) / frame_step.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// (frames, frame length) from the signal length, step and frame length.
fn framing(length: usize, step: i64, frame: i64) -> Result<(usize, usize), String> {
    if step < 1 || frame < 1 || frame as usize > length {
        return Err(format!(
            "frame_step {step} and frame_length {frame} do not fit a signal of {length}"
        ));
    }
    Ok((
        1 + (length - frame as usize) / step as usize,
        frame as usize,
    ))
}

impl Op for Stft {
    fn schema(&self) -> &OpSchema {
        &STFT
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        check_signal(x)?;
        if x.rank() != 3 {
            return Err(format!("signal must be [batch, length, 1|2], got {x}"));
        }
        if let Some(w) = cx.opt_input(2) {
            if w.rank() != 1 || w.dtype != x.dtype {
                return Err(format!("window must be a {} vector, got {w}", x.dtype));
            }
        }
        let step = const_scalar(cx, 1, "frame_step")?;
        let frame = const_scalar(cx, 3, "frame_length")?.or_else(|| {
            cx.opt_input(2)
                .and_then(|w| w.shape.dim(0).fixed())
                .map(|n| n as i64)
        });
        let onesided = cx.attrs.int_or("onesided", 1)? != 0;
        let (frames, bins) = match (x.shape.dim(1).fixed(), step, frame) {
            (Some(len), Some(step), Some(frame)) => {
                let (frames, f) = framing(len, step, frame)?;
                let bins = if onesided { f / 2 + 1 } else { f };
                (Dim::Fixed(frames), Dim::Fixed(bins))
            }
            _ => (cx.fresh_dim(0, 1), cx.fresh_dim(0, 2)),
        };
        let shape = Shape::new([x.shape.dim(0).clone(), frames, bins, Dim::Fixed(2)]);
        Ok(vec![TensorType::new(x.dtype, shape)])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let xt = cx.input(0)?;
        let x = xt.to_f64_array();
        let (batch, length) = (x.shape()[0], x.shape()[1]);
        let step = scalar(cx, 1, "frame_step")?.ok_or("frame_step is required")?;
        let window = cx.opt_input(2).map(|w| w.to_f64_vec());
        let frame = match (scalar(cx, 3, "frame_length")?, &window) {
            (Some(f), _) => f,
            (None, Some(w)) => w.len() as i64,
            (None, None) => length as i64,
        };
        let (frames, f) = framing(length, step, frame)?;
        let window = window.unwrap_or_else(|| vec![1.0; f]);
        if window.len() != f {
            return Err(format!(
                "the window has {} values for frames of {f}",
                window.len()
            ));
        }
        let onesided = cx.attrs.int_or("onesided", 1)? != 0;
        let bins = if onesided { f / 2 + 1 } else { f };
        let (_, signals) = lanes(&x, 1);
        let mut y = ArrayD::<f64>::zeros(IxDyn(&[batch, frames, bins, 2]));
        for (b, signal) in signals.iter().enumerate() {
            for fr in 0..frames {
                let start = fr * step as usize;
                let chunk: Vec<(f64, f64)> = (0..f)
                    .map(|n| {
                        let (re, im) = signal[start + n];
                        (re * window[n], im * window[n])
                    })
                    .collect();
                for (k, (re, im)) in transform(&chunk, f, bins, false).into_iter().enumerate() {
                    y[[b, fr, k, 0]] = re;
                    y[[b, fr, k, 1]] = im;
                }
            }
        }
        Ok(vec![Tensor::from_f64_array(xt.dtype(), y)])
    }
}

// ---------------------------------------------------------------- MelWeightMatrix

struct MelWeightMatrix;

const MEL_WEIGHT_MATRIX: OpSchema = OpSchema {
    name: "MelWeightMatrix",
    family: "signal",
    inputs: &[
        "num_mel_bins",
        "dft_length",
        "sample_rate",
        "lower_edge_hertz",
        "upper_edge_hertz",
    ],
    outputs: &["output"],
    attrs: &[AttrSpec::opt("output_datatype", AttrKind::String, "f32")],
    doc: "Triangular mel filters [dft_length / 2 + 1, num_mel_bins] between the edge \
          frequencies, with the ONNX reference's integer bin edges.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

impl Op for MelWeightMatrix {
    fn schema(&self) -> &OpSchema {
        &MEL_WEIGHT_MATRIX
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let dtype: DType = cx.attrs.string_or("output_datatype", "f32")?.parse()?;
        let mels = const_scalar(cx, 0, "num_mel_bins")?;
        let len = const_scalar(cx, 1, "dft_length")?;
        const_scalar(cx, 2, "sample_rate")?;
        for i in [3, 4] {
            let t = cx.input(i)?;
            if !t.dtype.is_float() || t.rank() > 1 {
                return Err(format!("input {i} must be a float scalar, got {t}"));
            }
        }
        let rows = len.map_or(cx.fresh_dim(0, 0), |l| {
            Dim::Fixed((l.max(0) / 2 + 1) as usize)
        });
        let cols = mels.map_or(cx.fresh_dim(0, 1), |m| Dim::Fixed(m.max(0) as usize));
        Ok(vec![TensorType::new(dtype, Shape::new([rows, cols]))])
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let dtype: DType = cx.attrs.string_or("output_datatype", "f32")?.parse()?;
        let int = |i, what| scalar(cx, i, what)?.ok_or(format!("{what} is required"));
        let (mels, len, rate) = (
            int(0, "num_mel_bins")?,
            int(1, "dft_length")?,
            int(2, "sample_rate")?,
        );
        let float = |i: usize| -> Result<f64, String> {
            cx.input(i)?
                .to_f64_vec()
                .first()
                .copied()
                .ok_or_else(|| format!("input {i} is empty"))
        };
        let (lower, upper) = (float(3)?, float(4)?);
        let (rows, mels) = mel_check(mels, len, rate, lower, upper)?;
        super::util::check_size(&[rows, mels])?;
        let mut y = ArrayD::<f64>::zeros(IxDyn(&[rows, mels]));
        mel_filters(mels, len, rate, lower, upper, |row, i, v| y[[row, i]] = v)?;
        Ok(vec![Tensor::from_f64_array(dtype, y)])
    }
}

/// The matrix's [rows, filters] when the arguments are valid.
pub(crate) fn mel_check(
    mels: i64,
    len: i64,
    rate: i64,
    lower: f64,
    upper: f64,
) -> Result<(usize, usize), String> {
    if mels < 1 || len < 1 || rate < 1 || !(0.0..=upper).contains(&lower) {
        return Err(format!(
            "num_mel_bins {mels}, dft_length {len}, sample_rate {rate} must be positive and 0 <= lower_edge_hertz {lower} <= upper_edge_hertz {upper}"
        ));
    }
    Ok(((len / 2 + 1) as usize, mels as usize))
}

/// The triangular filters' non-zero weights, `set(bin, filter, weight)`, of the
/// [`len / 2 + 1`, `mels`] matrix (arguments [`mel_check`]ed).
pub(crate) fn mel_filters(
    mels: usize,
    len: i64,
    rate: i64,
    lower: f64,
    upper: f64,
    mut set: impl FnMut(usize, usize, f64),
) -> Result<(), String> {
    let rows = (len / 2 + 1) as usize;
    let mel = |hz: f64| 2595.0 * (hz / 700.0).ln_1p() / 10f64.ln();
    let (low, high) = (mel(lower), mel(upper));
    let step = (high - low) / (mels + 2) as f64;
    // Each filter's left, centre and right edge as a spectrogram bin.
    let edge = |i: usize| {
        let hz = 700.0 * (((i as f64) * step + low) / 2595.0 * 10f64.ln()).exp_m1();
        (((len + 1) as f64 * hz) / rate as f64).floor() as i64
    };
    let mut put = |j: i64, i: usize, v: f64| -> Result<(), String> {
        let row = usize::try_from(j)
            .ok()
            .filter(|&r| r < rows)
            .ok_or_else(|| format!("the mel filters reach bin {j}, past {rows} bins: upper_edge_hertz is above the Nyquist frequency"))?;
        set(row, i, v);
        Ok(())
    };
    for i in 0..mels {
        let (left, centre, right) = (edge(i), edge(i + 1), edge(i + 2));
        if centre == left {
            put(centre, i, 1.0)?;
        } else {
            for j in left..=centre {
                put(j, i, (j - left) as f64 / (centre - left) as f64)?;
            }
        }
        for j in centre..right {
            put(j, i, (right - j) as f64 / (right - centre) as f64)?;
        }
    }
    Ok(())
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(Dft), leak(Stft), leak(MelWeightMatrix)]
}
