//! `QuantizeLinear` and `DequantizeLinear` of every dtype pair the interpreter takes,
//! per tensor, per axis or blocked, as it computes them: the operands converted to f64
//! by a loop typed for their dtype ([`load_f64`]), the arithmetic in f64 ([`quantize`],
//! [`dequantize`]), the result converted back by one typed for the output's
//! ([`store_f64`], [`store_i64`], or a float8 encoder that does not saturate); and
//! `ConvInteger` directly, for weights known only at run time ([`conv_integer`]).
use super::quant::Bytes;
use crate::tensor::lowbit::MiniFloat;
use crate::tensor::Elem;

/// How a Q/DQ scale runs over x.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleLayout {
    /// One scale.
    Tensor,
    /// One per index along the axis.
    Axis,
    /// One per block of `block` along the axis (the scale of x's rank).
    Blocked,
}

/// Where element `i` of x finds its scale (and zero point).
#[derive(Debug, Clone, Copy)]
pub struct ScaleMap {
    pub layout: ScaleLayout,
    /// x viewed as [outer, axis_len, inner] around the scale's axis.
    pub axis_len: usize,
    pub inner: usize,
    /// Elements along the axis that share a scale when blocked.
    pub block: usize,
}

impl ScaleMap {
    /// The index of element `i`'s scale: the scale laid out as [outer,
    /// ceil(axis_len / block), inner] when blocked, [axis_len] per axis, [] per tensor.
    #[inline]
    pub fn index(&self, i: usize) -> usize {
        match self.layout {
            ScaleLayout::Tensor => 0,
            ScaleLayout::Axis => (i / self.inner) % self.axis_len,
            ScaleLayout::Blocked => {
                let along = (i / self.inner) % self.axis_len;
                let outer = i / (self.inner * self.axis_len);
                let blocks = self.axis_len.div_ceil(self.block);
                (outer * blocks + along / self.block) * self.inner + i % self.inner
            }
        }
    }
}

/// The float type `x / scale` is rounded to before the rest of quantizing (ONNX's
/// `precision`, by default x's type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Narrow {
    F32,
    F16,
    BF16,
    None,
}

impl Narrow {
    #[inline]
    fn apply(self, v: f64) -> f64 {
        match self {
            Narrow::F32 => v as f32 as f64,
            Narrow::F16 => half::f16::from_f64(v).to_f64(),
            Narrow::BF16 => half::bf16::from_f64(v).to_f64(),
            Narrow::None => v,
        }
    }
}

/// What quantizing rounds to.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// An integer type of this range: round half to even, add the zero point, saturate.
    Int(f64, f64),
    /// A float8/float4 type: `x / scale` (plus the zero point for float4), encoded
    /// when stored.
    Float { shift_by_zero_point: bool },
}

/// `x`'s values quantized in place (still as f64; [`store_i64`] or the float encoders
/// write them in the output's type).
pub fn quantize(
    x: &mut [f64],
    scale: &[f64],
    zero_point: Option<&[f64]>,
    map: &ScaleMap,
    narrow: Narrow,
    target: Target,
) {
    for (i, v) in x.iter_mut().enumerate() {
        let k = map.index(i);
        let z = zero_point.map_or(0.0, |z| z[k]);
        let q = narrow.apply(*v / scale[k]);
        *v = match target {
            Target::Int(lo, hi) => (q.round_ties_even() + z).clamp(lo, hi),
            Target::Float {
                shift_by_zero_point,
            } => q + if shift_by_zero_point { z } else { 0.0 },
        };
    }
}

/// `(x - zero point) * scale`, in place.
pub fn dequantize(x: &mut [f64], scale: &[f64], zero_point: Option<&[f64]>, map: &ScaleMap) {
    for (i, v) in x.iter_mut().enumerate() {
        let k = map.index(i);
        let z = zero_point.map_or(0.0, |z| z[k]);
        *v = (*v - z) * scale[k];
    }
}

/// `src`'s elements as f64.
pub fn load_f64<T: Elem>(src: &[T], dst: &mut [f64]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = s.to_f64();
    }
}

/// f64s to `T` as a float converts (saturating float8, truncating ints).
pub fn store_f64<T: Elem>(src: &[f64], dst: &mut [T]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = T::from_f64(s);
    }
}

/// Whole f64s (in `T`'s range) to `T` as an integer converts.
pub fn store_i64<T: Elem>(src: &[f64], dst: &mut [T]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = T::from_i64(s as i64);
    }
}

/// f64s to a float8 format's codes without saturating (out of range gives infinity or
/// NaN), as Cast with saturate = 0 does.
pub fn store_unsaturated(codec: MiniFloat, src: &[f64], dst: &mut [u8]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = codec.encode(s, false);
    }
}

/// A `ConvInteger`'s geometry, its spatial axes padded to three (leading ones).
#[derive(Debug, Clone)]
pub struct ConvIntegerGeometry {
    pub images: usize,
    pub groups: usize,
    /// Input channels per group.
    pub channels: usize,
    /// Output channels per group.
    pub m: usize,
    pub input: [usize; 3],
    pub output: [usize; 3],
    pub kernel: [usize; 3],
    pub stride: [usize; 3],
    pub dilation: [usize; 3],
    pub pad_begin: [usize; 3],
}

/// `ConvInteger` of 8-bit x [N, groups·channels, input] with w [groups·m, channels,
/// kernel] into i32 y [N, groups·m, output]: each output the sum of (x − x_zero) ·
/// (w − w_zero(output channel)) over the taps inside x (padding counts for nothing), in
/// i64 and then saturated to i32 as the interpreter's f64 result converts.
pub fn conv_integer(
    g: &ConvIntegerGeometry,
    (x, x_kind, x_zero): (&[u8], Bytes, i32),
    (w, w_kind): (&[u8], Bytes),
    w_zero: &dyn Fn(usize) -> i32,
    y: &mut [i32],
) {
    let [id, ih, iw] = g.input;
    let [od, oh, ow] = g.output;
    let [kd, kh, kw] = g.kernel;
    let in_plane = id * ih * iw;
    let out_plane = od * oh * ow;
    let taps = kd * kh * kw;
    // The input index of output index o and tap k along an axis, if inside.
    let at = |o: usize, k: usize, a: usize, len: usize| -> Option<usize> {
        let p = (o * g.stride[a] + k * g.dilation[a]).checked_sub(g.pad_begin[a])?;
        (p < len).then_some(p)
    };
    for n in 0..g.images {
        for group in 0..g.groups {
            for j in 0..g.m {
                let oc = group * g.m + j;
                let wz = w_zero(oc) as i64;
                let out = &mut y[(n * g.groups * g.m + oc) * out_plane..][..out_plane];
                for (o, v) in out.iter_mut().enumerate() {
                    let (zo, yo, xo) = (o / (oh * ow), (o / ow) % oh, o % ow);
                    let mut acc = 0i64;
                    for c in 0..g.channels {
                        let plane = (n * g.groups * g.channels + group * g.channels + c) * in_plane;
                        let wbase = (oc * g.channels + c) * taps;
                        for a in 0..kd {
                            let Some(zi) = at(zo, a, 0, id) else { continue };
                            for b in 0..kh {
                                let Some(yi) = at(yo, b, 1, ih) else { continue };
                                for d in 0..kw {
                                    let Some(xi) = at(xo, d, 2, iw) else { continue };
                                    let xv = x_kind.value(x[plane + (zi * ih + yi) * iw + xi]);
                                    let wv = w_kind.value(w[wbase + (a * kh + b) * kw + d]);
                                    acc += (xv - x_zero) as i64 * (wv as i64 - wz);
                                }
                            }
                        }
                    }
                    *v = acc.clamp(i32::MIN as i64, i32::MAX as i64) as i32;
                }
            }
        }
    }
}
