//! One-input elementwise kernels on every dtype, computed as the reference interpreter
//! computes them: float math in f64 rounded once to the element type, the integer forms
//! (Neg, Abs, Sign, Relu, Not, BitwiseNot) in i64 wrapped back like C, the float
//! predicates (IsNaN, IsInf) into bool, and the float8 encodings that `Cast` with
//! `saturate = 0` or to e8m0 asks for. Each loop is monomorphized per dtype and split
//! over the pool in large pieces.
use crate::backend::cpu::kernels::par::{for_ranges, SyncPtr};
use crate::backend::cpu::pool::Pool;
use crate::ir::{Attrs, DType};
use crate::tensor::lowbit::{self, E8M0Rounding, MiniFloat};
use crate::tensor::Elem;

/// Elements per piece handed to a pool task.
const CHUNK: usize = 16 * 1024;

/// `y[i] = f(x[i])`, split over the pool.
pub(crate) fn map<S: Copy + Sync, D: Copy, F: Fn(S) -> D + Sync>(
    pool: Option<&Pool>,
    x: &[S],
    y: &mut [D],
    f: F,
) {
    assert_eq!(x.len(), y.len());
    let n = y.len();
    let o = SyncPtr(y.as_mut_ptr());
    for_ranges(pool, n.div_ceil(CHUNK), CHUNK, &|r| {
        let (lo, hi) = (r.start * CHUNK, (r.end * CHUNK).min(n));
        // SAFETY: for_ranges hands out disjoint ranges of pieces, so `lo..hi` is this
        // task's own part of `y`, which holds `n` elements.
        let dst = unsafe { std::slice::from_raw_parts_mut(o.get().add(lo), hi - lo) };
        for (d, &s) in dst.iter_mut().zip(&x[lo..hi]) {
            *d = f(s);
        }
    });
}

/// `y[i] = f(y[i])`, split over the pool.
pub(crate) fn map_inplace<T: Copy, F: Fn(T) -> T + Sync>(pool: Option<&Pool>, y: &mut [T], f: F) {
    let n = y.len();
    let o = SyncPtr(y.as_mut_ptr());
    for_ranges(pool, n.div_ceil(CHUNK), CHUNK, &|r| {
        let (lo, hi) = (r.start * CHUNK, (r.end * CHUNK).min(n));
        // SAFETY: each task rewrites only its own range `lo..hi` of the `n` elements.
        let dst = unsafe { std::slice::from_raw_parts_mut(o.get().add(lo), hi - lo) };
        for d in dst {
            *d = f(*d);
        }
    });
}

/// Where a one-input kernel reads: another buffer, or the output itself.
pub(crate) enum Src<'a, T> {
    Other(&'a [T]),
    InPlace,
}

fn map_src<T: Copy + Sync, F: Fn(T) -> T + Sync>(
    pool: Option<&Pool>,
    x: Src<'_, T>,
    y: &mut [T],
    f: F,
) {
    match x {
        Src::Other(x) => map(pool, x, y, f),
        Src::InPlace => map_inplace(pool, y, f),
    }
}

/// A one-input op computed in f64 (the reference's float form), with its attributes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FloatOp {
    Neg,
    Abs,
    Sign,
    Relu,
    Exp,
    Log,
    Sqrt,
    Reciprocal,
    Tanh,
    Sigmoid,
    Erf,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    Floor,
    Ceil,
    Round,
    Softplus,
    Softsign,
    Mish,
    HardSwish,
    Silu,
    LeakyRelu(f64),
    Elu(f64),
    Celu(f64),
    ThresholdedRelu(f64),
    /// alpha, gamma.
    Selu(f64, f64),
    /// alpha, beta.
    HardSigmoid(f64, f64),
    /// The tanh approximation when true.
    Gelu(bool),
    Shrink {
        bias: f64,
        lambd: f64,
    },
}

impl FloatOp {
    /// The op `op` with its attributes read, or `None` for an op not computed here.
    pub(crate) fn of(op: &str, attrs: &Attrs) -> Result<Option<FloatOp>, String> {
        use FloatOp::*;
        let alpha = |d: f64| attrs.float_or("alpha", d);
        Ok(Some(match op {
            "Neg" => Neg,
            "Abs" => Abs,
            "Sign" => Sign,
            "Relu" => Relu,
            "Exp" => Exp,
            "Log" => Log,
            "Sqrt" => Sqrt,
            "Reciprocal" => Reciprocal,
            "Tanh" => Tanh,
            "Sigmoid" => Sigmoid,
            "Erf" => Erf,
            "Sin" => Sin,
            "Cos" => Cos,
            "Tan" => Tan,
            "Asin" => Asin,
            "Acos" => Acos,
            "Atan" => Atan,
            "Sinh" => Sinh,
            "Cosh" => Cosh,
            "Asinh" => Asinh,
            "Acosh" => Acosh,
            "Atanh" => Atanh,
            "Floor" => Floor,
            "Ceil" => Ceil,
            "Round" => Round,
            "Softplus" => Softplus,
            "Softsign" => Softsign,
            "Mish" => Mish,
            "HardSwish" => HardSwish,
            "Silu" => Silu,
            "LeakyRelu" => LeakyRelu(alpha(0.01)?),
            "Elu" => Elu(alpha(1.0)?),
            "Celu" => Celu(alpha(1.0)?),
            "ThresholdedRelu" => ThresholdedRelu(alpha(1.0)?),
            "Selu" => Selu(
                alpha(1.673_263_192_176_818_8)?,
                attrs.float_or("gamma", 1.050_701_022_148_132_3)?,
            ),
            "HardSigmoid" => HardSigmoid(alpha(0.2)?, attrs.float_or("beta", 0.5)?),
            "Gelu" => Gelu(attrs.string_or("approximate", "none")? == "tanh"),
            "Shrink" => Shrink {
                bias: attrs.float_or("bias", 0.0)?,
                lambd: attrs.float_or("lambd", 0.5)?,
            },
            _ => return Ok(None),
        }))
    }
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// Sigmoid of an f32 step by step in f32, as the reference computes it on f32.
fn sigmoid_f32(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

fn sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        x
    }
}

fn gelu(x: f64, tanh: bool) -> f64 {
    if tanh {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
    } else {
        0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
    }
}

/// `y = op(x)` through f64, one monomorphized loop per op.
pub(crate) fn float<T: Elem>(op: FloatOp, pool: Option<&Pool>, x: Src<'_, T>, y: &mut [T]) {
    fn go<T: Elem>(pool: Option<&Pool>, x: Src<'_, T>, y: &mut [T], f: impl Fn(f64) -> f64 + Sync) {
        map_src(pool, x, y, |v: T| T::from_f64(f(v.to_f64())));
    }
    use FloatOp::*;
    match op {
        Neg => go(pool, x, y, |v| -v),
        Abs => go(pool, x, y, f64::abs),
        Sign => go(pool, x, y, sign),
        Relu => go(pool, x, y, |v| if v > 0.0 || v.is_nan() { v } else { 0.0 }),
        Exp => go(pool, x, y, f64::exp),
        Log => go(pool, x, y, f64::ln),
        Sqrt => go(pool, x, y, f64::sqrt),
        Reciprocal => go(pool, x, y, |v| 1.0 / v),
        Tanh => go(pool, x, y, f64::tanh),
        // The value is an f32's exactly, so the f32 steps see that f32.
        Sigmoid if T::DTYPE == DType::F32 => go(pool, x, y, |v| sigmoid_f32(v as f32) as f64),
        Sigmoid => go(pool, x, y, sigmoid),
        Erf => go(pool, x, y, libm::erf),
        Sin => go(pool, x, y, f64::sin),
        Cos => go(pool, x, y, f64::cos),
        Tan => go(pool, x, y, f64::tan),
        Asin => go(pool, x, y, f64::asin),
        Acos => go(pool, x, y, f64::acos),
        Atan => go(pool, x, y, f64::atan),
        Sinh => go(pool, x, y, f64::sinh),
        Cosh => go(pool, x, y, f64::cosh),
        Asinh => go(pool, x, y, f64::asinh),
        Acosh => go(pool, x, y, f64::acosh),
        Atanh => go(pool, x, y, f64::atanh),
        Floor => go(pool, x, y, f64::floor),
        Ceil => go(pool, x, y, f64::ceil),
        Round => go(pool, x, y, f64::round_ties_even),
        Softplus => go(pool, x, y, softplus),
        Softsign => go(pool, x, y, |v| v / (1.0 + v.abs())),
        Mish => go(pool, x, y, |v| v * softplus(v).tanh()),
        HardSwish => go(pool, x, y, |v| v * (v / 6.0 + 0.5).clamp(0.0, 1.0)),
        Silu => go(pool, x, y, |v| v * sigmoid(v)),
        LeakyRelu(a) => go(pool, x, y, move |v| if v >= 0.0 { v } else { a * v }),
        Elu(a) => go(
            pool,
            x,
            y,
            move |v| if v >= 0.0 { v } else { a * v.exp_m1() },
        ),
        Celu(a) => go(pool, x, y, move |v| {
            v.max(0.0) + (a * (v / a).exp_m1()).min(0.0)
        }),
        ThresholdedRelu(a) => go(pool, x, y, move |v| if v > a { v } else { 0.0 }),
        Selu(a, g) => go(pool, x, y, move |v| {
            g * if v > 0.0 { v } else { a * v.exp_m1() }
        }),
        HardSigmoid(a, b) => go(pool, x, y, move |v| (a * v + b).clamp(0.0, 1.0)),
        Gelu(tanh) => go(pool, x, y, move |v| gelu(v, tanh)),
        Shrink { bias, lambd } => go(pool, x, y, move |v| {
            if v < -lambd {
                v + bias
            } else if v > lambd {
                v - bias
            } else {
                0.0
            }
        }),
    }
}

/// A one-input op's integer form (the reference's for non-float dtypes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntOp {
    Neg,
    Abs,
    Sign,
    Relu,
    /// Logical not (bool).
    Not,
    BitwiseNot,
}

impl IntOp {
    /// The integer form of `op`, if it has one.
    pub(crate) fn of(op: &str) -> Option<IntOp> {
        Some(match op {
            "Neg" => IntOp::Neg,
            "Abs" => IntOp::Abs,
            "Sign" => IntOp::Sign,
            "Relu" => IntOp::Relu,
            "Not" => IntOp::Not,
            "BitwiseNot" => IntOp::BitwiseNot,
            _ => return None,
        })
    }
}

/// `y = op(x)` through i64, wrapped back into `T`.
pub(crate) fn int<T: Elem>(op: IntOp, pool: Option<&Pool>, x: Src<'_, T>, y: &mut [T]) {
    fn go<T: Elem>(pool: Option<&Pool>, x: Src<'_, T>, y: &mut [T], f: impl Fn(i64) -> i64 + Sync) {
        map_src(pool, x, y, |v: T| T::from_i64(f(v.to_i64())));
    }
    match op {
        IntOp::Neg => go(pool, x, y, i64::wrapping_neg),
        IntOp::Abs => go(pool, x, y, i64::wrapping_abs),
        IntOp::Sign => go(pool, x, y, i64::signum),
        IntOp::Relu => go(pool, x, y, |v| v.max(0)),
        IntOp::Not => go(pool, x, y, |v| (v == 0) as i64),
        IntOp::BitwiseNot => go(pool, x, y, |v| !v),
    }
}

/// A float predicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Predicate {
    IsNaN,
    IsInf { positive: bool, negative: bool },
}

/// `y = p(x)`.
pub(crate) fn predicate<T: Elem>(p: Predicate, pool: Option<&Pool>, x: &[T], y: &mut [bool]) {
    match p {
        Predicate::IsNaN => map(pool, x, y, |v: T| v.to_f64().is_nan()),
        Predicate::IsInf { positive, negative } => map(pool, x, y, move |v: T| {
            let v = v.to_f64();
            (positive && v == f64::INFINITY) || (negative && v == f64::NEG_INFINITY)
        }),
    }
}

/// How `Cast` encodes into float8 where its default conversion does not apply: e8m0
/// (by `round_mode`), or another float8 without saturating.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Encoder {
    E8M0 { saturate: bool, mode: E8M0Rounding },
    Unsaturated(MiniFloat),
}

impl Encoder {
    /// The encoder `Cast` to `to` uses under `saturate` and `mode`, when it is not the
    /// element type's own conversion.
    pub(crate) fn of(to: DType, saturate: bool, mode: E8M0Rounding) -> Option<Encoder> {
        Some(match to {
            DType::F8E8M0 => Encoder::E8M0 { saturate, mode },
            _ if saturate => return None,
            DType::F8E4M3FN => Encoder::Unsaturated(lowbit::E4M3FN),
            DType::F8E4M3FNUZ => Encoder::Unsaturated(lowbit::E4M3FNUZ),
            DType::F8E5M2 => Encoder::Unsaturated(lowbit::E5M2),
            DType::F8E5M2FNUZ => Encoder::Unsaturated(lowbit::E5M2FNUZ),
            _ => return None,
        })
    }

    fn encode(self, v: f64) -> u8 {
        match self {
            Encoder::E8M0 { saturate, mode } => lowbit::e8m0_encode(v, saturate, mode),
            Encoder::Unsaturated(f) => f.encode(v, false),
        }
    }
}

/// `y[i]` = the code of `x[i]` (through f64) under `enc`.
pub(crate) fn encode<S: Elem>(enc: Encoder, pool: Option<&Pool>, x: &[S], y: &mut [u8]) {
    map(pool, x, y, |v: S| enc.encode(v.to_f64()))
}

/// The sub-byte signed integers may sit in memory sign-extended or as their low bits
/// only (how a constant's bytes store them): `dst` gets each element of `src` (of
/// `dtype`) sign-extended, the form the element type holds; other dtypes are copied.
pub(crate) fn normalize(dtype: DType, src: &[u8], dst: &mut [u8]) {
    let bits = match dtype {
        DType::I4 => 4,
        DType::I2 => 2,
        _ => return dst.copy_from_slice(src),
    };
    let shift = 8 - bits;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = (((s << shift) as i8) >> shift) as u8;
    }
}

/// `BitCast` between one-byte dtypes where a byte is not simply kept: the source's byte
/// as its tensor's bytes hold it (the low bits of int4/int2), checked to be an element
/// of `to` (a bool is 0 or 1).
pub(crate) fn bitcast_bytes(from: DType, to: DType, x: &[u8], y: &mut [u8]) -> Result<(), String> {
    let mask = match from {
        DType::I4 => 0x0F,
        DType::I2 => 0x03,
        _ => 0xFF,
    };
    for (d, &s) in y.iter_mut().zip(x) {
        let b = s & mask;
        *d = match to {
            DType::Bool if b > 1 => return Err(format!("byte {b} is not a bool (0 or 1)")),
            DType::Bool => b,
            _ => lowbit::element_byte(to, b)?,
        };
    }
    Ok(())
}

// The low-bit element types are read and written as slices of their one-byte codes.
const _: () = {
    use crate::tensor::lowbit::*;
    use std::mem::{align_of, size_of};
    assert!(size_of::<F8E4M3FN>() == 1 && align_of::<F8E4M3FN>() == 1);
    assert!(size_of::<F8E4M3FNUZ>() == 1 && align_of::<F8E4M3FNUZ>() == 1);
    assert!(size_of::<F8E5M2>() == 1 && align_of::<F8E5M2>() == 1);
    assert!(size_of::<F8E5M2FNUZ>() == 1 && align_of::<F8E5M2FNUZ>() == 1);
    assert!(size_of::<F8E8M0>() == 1 && align_of::<F8E8M0>() == 1);
    assert!(size_of::<F4E2M1>() == 1 && align_of::<F4E2M1>() == 1);
    assert!(size_of::<I4>() == 1 && size_of::<U4>() == 1);
    assert!(size_of::<I2>() == 1 && size_of::<U2>() == 1);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_bit_ints_sign_extend_from_either_form() {
        let src = [0x0F, 0xFF, 0x07, 0x08, 0x03, 0xFE];
        let mut dst = [0u8; 6];
        normalize(DType::I4, &src, &mut dst);
        assert_eq!(dst.map(|b| b as i8), [-1, -1, 7, -8, 3, -2]);
        normalize(DType::I2, &src[4..], &mut dst[..2]);
        assert_eq!([dst[0] as i8, dst[1] as i8], [-1, -2]);
    }

    #[test]
    fn bitcast_into_bool_checks_the_bytes() {
        let mut y = [0u8; 2];
        assert!(bitcast_bytes(DType::U8, DType::Bool, &[1, 0], &mut y).is_ok());
        assert!(bitcast_bytes(DType::U8, DType::Bool, &[2, 0], &mut y)
            .unwrap_err()
            .contains("not a bool"));
    }
}
