//! Activations applied in kernels' epilogues and fused elementwise loops.
use super::math;
use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::pool::Pool;
use crate::ir::Attrs;

/// Floats per piece of [`Act::apply_from`]: a piece stays in L1 between copy and apply.
const PIECE: usize = 4096;

/// √(2/π), GELU's tanh-approximation constant.
const GELU_TANH_K: f32 = 0.797_884_6;

/// An activation from a fused op's `activation` / `activation_attrs` (see
/// `ir::ops::fused::ACTIVATIONS`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Act {
    None,
    Relu,
    LeakyRelu(f32),
    Sigmoid,
    Tanh,
    /// max(0, min(1, alpha·x + beta))
    HardSigmoid(f32, f32),
    Elu(f32),
    /// x·Φ(x) with the exact (erf) Φ.
    Gelu,
    /// GELU with the tanh approximation.
    GeluTanh,
    Clip(f32, f32),
    /// x·max(0, min(1, x/6 + 1/2))
    HardSwish,
    /// x·sigmoid(x) (SiLU).
    Silu,
    /// x·tanh(ln(1 + e^x))
    Mish,
    /// ln(1 + e^x)
    Softplus,
    /// x / (1 + |x|)
    Softsign,
    /// gamma·(x if x > 0 else alpha·(e^x − 1)): (alpha, gamma).
    Selu(f32, f32),
    /// max(0, x) + min(0, alpha·(e^(x/alpha) − 1))
    Celu(f32),
    /// x if x > alpha else 0
    ThresholdedRelu(f32),
}

/// SELU's default alpha and gamma (ONNX's).
const SELU_ALPHA: f32 = 1.673_263_2;
const SELU_GAMMA: f32 = 1.050_701;

/// Above this, Mish's factor tanh(softplus(x)) is 1 in f32 (and e^x stays finite).
const MISH_CAP: f32 = 20.0;

/// tanh(ln(1 + e^x)) as e(e + 2) / (e(e + 2) + 2), e = e^x (no log, no overflow).
#[inline]
fn mish_factor(v: f32) -> f32 {
    let e = math::exp(v.min(MISH_CAP));
    let m = e * (e + 2.0);
    if v.is_nan() {
        v
    } else {
        m / (m + 2.0)
    }
}

impl Act {
    /// The activation a fused op's attributes name.
    pub(crate) fn from_attrs(attrs: &Attrs) -> Result<Act, String> {
        let name = attrs.string_or("activation", "none")?;
        let mut kv = std::collections::HashMap::new();
        for s in attrs.strings("activation_attrs")?.unwrap_or(&[]) {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| format!("activation_attrs: '{s}' is not NAME=VALUE"))?;
            kv.insert(k.to_string(), v.trim_matches('"').to_string());
        }
        let num = |k: &str, default: f32| -> Result<f32, String> {
            kv.get(k).map_or(Ok(default), |v| {
                v.parse()
                    .map_err(|_| format!("activation_attrs: bad {k} '{v}'"))
            })
        };
        Ok(match name {
            "none" => Act::None,
            "Gelu" if kv.get("approximate").map(String::as_str) == Some("tanh") => Act::GeluTanh,
            "Gelu" => Act::Gelu,
            "Clip" => Act::Clip(num("min", f32::NEG_INFINITY)?, num("max", f32::INFINITY)?),
            other => match Act::of_op(other, |k, d| Ok(f64::from(num(k, d as f32)?)))? {
                Some(act) => act,
                None => return Err(format!("the CPU backend has no activation '{other}'")),
            },
        })
    }

    /// The activation a one-input elementwise op computes, its float attributes read
    /// through `attr(name, default)`; `None` when the op is no activation here (Clip,
    /// whose bounds are operands, is the caller's).
    pub(crate) fn of_op(
        op: &str,
        attr: impl Fn(&str, f64) -> Result<f64, String>,
    ) -> Result<Option<Act>, String> {
        let f = |k: &str, d: f64| attr(k, d).map(|v| v as f32);
        Ok(Some(match op {
            "Relu" => Act::Relu,
            "LeakyRelu" => Act::LeakyRelu(f("alpha", 0.01)?),
            "Sigmoid" => Act::Sigmoid,
            "Tanh" => Act::Tanh,
            "HardSigmoid" => Act::HardSigmoid(f("alpha", 0.2)?, f("beta", 0.5)?),
            "Elu" => Act::Elu(f("alpha", 1.0)?),
            "HardSwish" => Act::HardSwish,
            "Silu" => Act::Silu,
            "Mish" => Act::Mish,
            "Softplus" => Act::Softplus,
            "Softsign" => Act::Softsign,
            "Selu" => Act::Selu(
                f("alpha", f64::from(SELU_ALPHA))?,
                f("gamma", f64::from(SELU_GAMMA))?,
            ),
            "Celu" => Act::Celu(f("alpha", 1.0)?),
            "ThresholdedRelu" => Act::ThresholdedRelu(f("alpha", 1.0)?),
            _ => return Ok(None),
        }))
    }

    /// Applies the activation to every element of `x` in place (vectorized when the CPU
    /// has AVX2).
    pub(crate) fn apply(self, x: &mut [f32]) {
        self.apply_isa(isa::isa(), x)
    }

    /// `y = act(x)` split over the pool in cache-sized pieces (each piece copied, then
    /// activated in place); `x` may be `y` itself.
    ///
    /// # Safety
    /// `x` must be readable for `y.len()` floats, and be `y` or not overlap it.
    pub(crate) unsafe fn apply_from(self, x: *const f32, y: &mut [f32], pool: Option<&Pool>) {
        let isa = isa::isa();
        let (src, dst) = (SyncPtr(x as *mut f32), SyncPtr(y.as_mut_ptr()));
        for_ranges(pool, y.len().div_ceil(PIECE), PIECE, &|r| {
            let at = r.start * PIECE;
            let len = (r.end * PIECE).min(y.len()) - at;
            // SAFETY: pieces are disjoint and inside y; x covers them too, and is y or
            // disjoint from it.
            unsafe {
                let d = dst.get().add(at);
                let s = src.get().add(at);
                if s != d {
                    std::ptr::copy_nonoverlapping(s, d, len);
                }
                self.apply_isa(isa, std::slice::from_raw_parts_mut(d, len));
            }
        });
    }

    /// [`Act::apply`] on the path `isa` asks for.
    pub(crate) fn apply_isa(self, isa: Isa, x: &mut [f32]) {
        if self == Act::None {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if math::use_avx512(isa) && self.has_avx512() {
            // SAFETY: `use_avx512` is true only when `isa::detected()` found AVX-512F on
            // this CPU, the one feature `apply_avx512` is compiled for.
            unsafe { self.apply_avx512(x) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if math::use_avx2(isa) {
            // SAFETY: `use_avx2` is true only when `is_x86_feature_detected!` saw both AVX2
            // and FMA, which `apply_avx2` is compiled for.
            unsafe { self.apply_avx2(x) };
            return;
        }
        let _ = isa;
        x.iter_mut().for_each(|v| *v = self.scalar(*v));
    }

    /// The activation of one value (the portable path).
    #[inline]
    pub(crate) fn scalar(self, v: f32) -> f32 {
        match self {
            Act::None => v,
            // NaN stays NaN in every activation, as the ops have it.
            Act::Relu => math::relu(v),
            Act::LeakyRelu(a) => {
                if v < 0.0 {
                    v * a
                } else {
                    v
                }
            }
            // NaN stays NaN, as the Clip op has it.
            Act::Clip(_, _) if v.is_nan() => v,
            Act::Clip(lo, hi) => v.max(lo).min(hi),
            Act::Sigmoid => math::sigmoid(v),
            Act::Tanh => math::tanh(v),
            Act::HardSigmoid(a, b) => (a * v + b).clamp(0.0, 1.0),
            Act::Elu(a) => {
                if v < 0.0 {
                    a * (math::exp(v) - 1.0)
                } else {
                    v
                }
            }
            Act::Gelu => 0.5 * v * (1.0 + math::erf(v * std::f32::consts::FRAC_1_SQRT_2)),
            Act::GeluTanh => {
                let u = GELU_TANH_K * (v + 0.044715 * v * v * v);
                0.5 * v * (1.0 + math::tanh(u))
            }
            Act::HardSwish => v * (v * (1.0 / 6.0) + 0.5).clamp(0.0, 1.0),
            Act::Silu => v * math::sigmoid(v),
            Act::Mish => v * mish_factor(v),
            Act::Softplus => v.max(0.0) + math::exp(-v.abs()).ln_1p(),
            Act::Softsign => v / (1.0 + v.abs()),
            Act::Selu(a, g) => {
                if v > 0.0 {
                    g * v
                } else {
                    g * (a * (math::exp(v) - 1.0))
                }
            }
            Act::Celu(a) => math::relu(v) + (a * (math::exp(v / a) - 1.0)).min(0.0),
            // NaN is not above alpha: 0, as the op has it.
            Act::ThresholdedRelu(a) => {
                if v > a {
                    v
                } else {
                    0.0
                }
            }
        }
    }

    /// Whether [`Act::apply_avx512`] has this activation (the rest run on AVX2).
    fn has_avx512(self) -> bool {
        matches!(
            self,
            Act::Relu
                | Act::Clip(..)
                | Act::Sigmoid
                | Act::Tanh
                | Act::HardSwish
                | Act::Silu
                | Act::Gelu
                | Act::GeluTanh
        )
    }

    /// The activations of [`Act::has_avx512`] on sixteen lanes.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    fn apply_avx512(self, x: &mut [f32]) {
        use math::avx512;
        use std::arch::x86_64::*;
        use std::f32::consts::FRAC_1_SQRT_2;
        let (p, n) = (x.as_mut_ptr(), x.len());
        let zero = _mm512_setzero_ps();
        let one = _mm512_set1_ps(1.0);
        // `avx512::map` in place over `x`, the closure `$f` type-checked outside `unsafe`.
        macro_rules! map {
            ($f:expr) => {{
                let f = $f;
                // SAFETY: `p`, `n` are `x`'s pointer and length, so map reads and writes
                // `x[..n]` only, borrowed mutably here; AVX-512F is enabled for this fn.
                unsafe { avx512::map(p, p, n, f) }
            }};
        }
        match self {
            // Constants first: max/min return the second operand when either is NaN,
            // so NaN stays NaN as the ops have it.
            Act::Relu => map!(|v| _mm512_max_ps(zero, v)),
            Act::Clip(lo, hi) => {
                let (lo, hi) = (_mm512_set1_ps(lo), _mm512_set1_ps(hi));
                map!(|v| _mm512_min_ps(hi, _mm512_max_ps(lo, v)))
            }
            Act::Sigmoid => map!(|v| avx512::sigmoid(v)),
            Act::HardSwish => {
                let (sixth, half) = (_mm512_set1_ps(1.0 / 6.0), _mm512_set1_ps(0.5));
                map!(|v| {
                    let h = _mm512_fmadd_ps(v, sixth, half);
                    _mm512_mul_ps(v, _mm512_min_ps(one, _mm512_max_ps(zero, h)))
                })
            }
            Act::Silu => map!(|v| _mm512_mul_ps(v, avx512::sigmoid(v))),
            Act::Tanh => map!(|v| avx512::tanh(v)),
            Act::Gelu => {
                let (k, half) = (_mm512_set1_ps(FRAC_1_SQRT_2), _mm512_set1_ps(0.5));
                map!(|v| {
                    let e = avx512::erf(_mm512_mul_ps(v, k));
                    _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, e))
                })
            }
            Act::GeluTanh => {
                let (k, c) = (_mm512_set1_ps(GELU_TANH_K), _mm512_set1_ps(0.044715));
                let half = _mm512_set1_ps(0.5);
                map!(|v| {
                    let v3 = _mm512_mul_ps(_mm512_mul_ps(v, v), v);
                    let u = _mm512_mul_ps(k, _mm512_fmadd_ps(c, v3, v));
                    let t = avx512::tanh(u);
                    _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, t))
                })
            }
            _ => unreachable!("{self:?} has no AVX-512 form"),
        }
    }

    /// All activations on eight lanes (Softplus per element).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn apply_avx2(self, x: &mut [f32]) {
        use math::avx2;
        use std::arch::x86_64::*;
        let p = x.as_mut_ptr();
        let n = x.len();
        let zero = _mm256_setzero_ps();
        let half = _mm256_set1_ps(0.5);
        let one = _mm256_set1_ps(1.0);
        // `avx2::map` in place over `x`, the closure `$f` type-checked outside `unsafe`.
        macro_rules! map {
            ($f:expr) => {{
                let f = $f;
                // SAFETY: map touches `p[..n]`, which is all of `x` (its pointer and
                // length), borrowed mutably here; this fn is compiled for AVX2+FMA.
                unsafe { avx2::map(p, p, n, f) }
            }};
        }
        match self {
            Act::None => {}
            Act::Relu => map!(|v| _mm256_max_ps(zero, v)),
            Act::LeakyRelu(a) => {
                let a = _mm256_set1_ps(a);
                map!(|v| {
                    let neg = _mm256_cmp_ps::<_CMP_LT_OQ>(v, zero);
                    _mm256_blendv_ps(v, _mm256_mul_ps(v, a), neg)
                })
            }
            Act::Clip(lo, hi) => {
                let (lo, hi) = (_mm256_set1_ps(lo), _mm256_set1_ps(hi));
                // max/min return the second operand when either is NaN: NaN stays NaN,
                // as the Clip op has it.
                map!(|v| _mm256_min_ps(hi, _mm256_max_ps(lo, v)))
            }
            Act::Sigmoid => map!(|v| avx2::sigmoid(v)),
            Act::Tanh => map!(|v| avx2::tanh(v)),
            Act::HardSigmoid(a, b) => {
                let (a, b) = (_mm256_set1_ps(a), _mm256_set1_ps(b));
                map!(|v| {
                    // Constants first: NaN stays NaN, as in f32::clamp.
                    _mm256_min_ps(one, _mm256_max_ps(zero, _mm256_fmadd_ps(a, v, b)))
                })
            }
            Act::Elu(a) => {
                let a = _mm256_set1_ps(a);
                map!(|v| {
                    let e = _mm256_mul_ps(a, _mm256_sub_ps(avx2::exp(v), one));
                    _mm256_blendv_ps(v, e, _mm256_cmp_ps::<_CMP_LT_OQ>(v, zero))
                })
            }
            Act::Gelu => {
                let k = _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2);
                map!(|v| {
                    let e = avx2::erf(_mm256_mul_ps(v, k));
                    _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, e))
                })
            }
            Act::HardSwish => {
                let sixth = _mm256_set1_ps(1.0 / 6.0);
                map!(|v| {
                    let h = _mm256_fmadd_ps(v, sixth, half);
                    // Constants first: NaN stays NaN.
                    _mm256_mul_ps(v, _mm256_min_ps(one, _mm256_max_ps(zero, h)))
                })
            }
            Act::Silu => map!(|v| _mm256_mul_ps(v, avx2::sigmoid(v))),
            Act::Mish => {
                let cap = _mm256_set1_ps(MISH_CAP);
                let two = _mm256_set1_ps(2.0);
                map!(|v| {
                    // tanh(ln(1 + e)) = e(e + 2) / (e(e + 2) + 2), e = e^x; above the cap
                    // the factor is 1 to f32 precision (min keeps NaN: second operand).
                    let e = avx2::exp(_mm256_min_ps(cap, v));
                    let m = _mm256_mul_ps(e, _mm256_add_ps(e, two));
                    _mm256_mul_ps(v, _mm256_div_ps(m, _mm256_add_ps(m, two)))
                })
            }
            Act::Softplus => x.iter_mut().for_each(|v| *v = self.scalar(*v)),
            Act::Softsign => {
                let sign = _mm256_set1_ps(-0.0);
                map!(|v| {
                    let d = _mm256_add_ps(one, _mm256_andnot_ps(sign, v));
                    _mm256_div_ps(v, d)
                })
            }
            Act::Selu(a, g) => {
                let (a, g) = (_mm256_set1_ps(a), _mm256_set1_ps(g));
                map!(|v| {
                    let e = _mm256_mul_ps(a, _mm256_sub_ps(avx2::exp(v), one));
                    let pos = _mm256_cmp_ps::<_CMP_GT_OQ>(v, zero);
                    _mm256_mul_ps(g, _mm256_blendv_ps(e, v, pos))
                })
            }
            Act::Celu(a) => {
                let inv = _mm256_set1_ps(1.0 / a);
                let a = _mm256_set1_ps(a);
                map!(|v| {
                    let e = avx2::exp(_mm256_mul_ps(v, inv));
                    let neg = _mm256_min_ps(zero, _mm256_mul_ps(a, _mm256_sub_ps(e, one)));
                    // max(v, 0) with v second keeps NaN.
                    _mm256_add_ps(_mm256_max_ps(zero, v), neg)
                })
            }
            Act::ThresholdedRelu(a) => {
                let a = _mm256_set1_ps(a);
                map!(|v| {
                    let keep = _mm256_cmp_ps::<_CMP_GT_OQ>(v, a);
                    _mm256_and_ps(v, keep)
                })
            }
            Act::GeluTanh => {
                let k = _mm256_set1_ps(GELU_TANH_K);
                let c = _mm256_set1_ps(0.044715);
                map!(|v| {
                    let v3 = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
                    let u = _mm256_mul_ps(k, _mm256_fmadd_ps(c, v3, v));
                    let t = avx2::tanh(u);
                    _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, t))
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::math::tests::isas;

    fn reference(act: Act, x: f64) -> f64 {
        match act {
            Act::None => x,
            Act::Relu => x.max(0.0),
            Act::LeakyRelu(a) => {
                if x < 0.0 {
                    x * a as f64
                } else {
                    x
                }
            }
            Act::Clip(_, _) if x.is_nan() => x,
            Act::Clip(lo, hi) => x.max(lo as f64).min(hi as f64),
            Act::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Act::Tanh => x.tanh(),
            Act::HardSigmoid(a, b) => (a as f64 * x + b as f64).clamp(0.0, 1.0),
            Act::Elu(a) => {
                if x < 0.0 {
                    a as f64 * x.exp_m1()
                } else {
                    x
                }
            }
            Act::Gelu => 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)),
            Act::GeluTanh => {
                let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
                0.5 * x * (1.0 + u.tanh())
            }
            Act::HardSwish => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
            Act::Silu => x / (1.0 + (-x).exp()),
            Act::Mish => x * softplus(x).tanh(),
            Act::Softplus => softplus(x),
            Act::Softsign => x / (1.0 + x.abs()),
            Act::Selu(a, g) => g as f64 * if x > 0.0 { x } else { a as f64 * x.exp_m1() },
            Act::Celu(a) => {
                let a = a as f64;
                x.max(0.0) + (a * (x / a).exp_m1()).min(0.0)
            }
            Act::ThresholdedRelu(a) => {
                if x > a as f64 {
                    x
                } else {
                    0.0
                }
            }
        }
    }

    fn softplus(x: f64) -> f64 {
        x.max(0.0) + (-x.abs()).exp().ln_1p()
    }

    #[test]
    fn activations_match_f64() {
        let acts = [
            Act::None,
            Act::Relu,
            Act::LeakyRelu(0.1),
            Act::Clip(-1.5, 2.0),
            Act::Sigmoid,
            Act::Tanh,
            Act::HardSigmoid(0.2, 0.5),
            Act::Elu(1.3),
            Act::Gelu,
            Act::GeluTanh,
            Act::HardSwish,
            Act::Silu,
            Act::Mish,
            Act::Softplus,
            Act::Softsign,
            Act::Selu(1.673_263_2, 1.050_701),
            Act::Celu(0.7),
            Act::ThresholdedRelu(0.4),
        ];
        for isa in isas() {
            for act in acts {
                for n in [1, 7, 9, 33, 1000] {
                    let mut xs: Vec<f32> =
                        (0..n).map(|i| (i as f32 * 0.7391).sin() * 9.0).collect();
                    xs[n / 2] = f32::NAN;
                    let mut y = xs.clone();
                    act.apply_isa(isa, &mut y);
                    for (&x, &g) in xs.iter().zip(&y) {
                        if x.is_nan() {
                            // NaN is not above the threshold; every other keeps it.
                            let want_nan = !matches!(act, Act::ThresholdedRelu(_));
                            assert_eq!(g.is_nan(), want_nan, "{act:?} {} of NaN: {g}", isa.name());
                            continue;
                        }
                        let want = reference(act, x as f64);
                        // Absolute 2e-6 (Elu's e^x - 1 loses digits near 0), else 1e-5 relative.
                        let tol = 2e-6 + 1e-5 * want.abs();
                        assert!(
                            (g as f64 - want).abs() <= tol,
                            "{act:?} {} at {x}: {g} vs {want}",
                            isa.name()
                        );
                    }
                }
            }
        }
    }
}
