//! Elementwise binary ops with numpy broadcasting, and unary ops over slices.
//!
//! Binary: the operands' broadcast strides are coalesced (adjacent axes merged where
//! both operands allow), so same-shape operands, a scalar operand, a row vector
//! broadcast over rows, and a column broadcast along the last axis all become a loop of
//! contiguous inner runs in one of three vectorized forms: (vector, vector),
//! (scalar, vector), (vector, scalar). Anything else walks the outer axes by index.
use super::broadcast::Runs;
use super::math;
use super::par::SyncPtr;
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::pool::Pool;
use crate::tensor::Elem;
use std::sync::atomic::{AtomicBool, Ordering};

/// An elementwise binary op. Max and Min propagate NaN (as the interpreter's do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Pow,
}

impl BinOp {
    /// The op on one pair (the portable path).
    #[inline]
    pub(crate) fn scalar(self, a: f32, b: f32) -> f32 {
        match self {
            BinOp::Add => a + b,
            BinOp::Sub => a - b,
            BinOp::Mul => a * b,
            BinOp::Div => a / b,
            BinOp::Max if a.is_nan() || b.is_nan() => f32::NAN,
            BinOp::Min if a.is_nan() || b.is_nan() => f32::NAN,
            BinOp::Max => a.max(b),
            BinOp::Min => a.min(b),
            BinOp::Pow => a.powf(b),
        }
    }
}

/// `out = a op b` with numpy broadcasting of `a` (shape `a_shape`) and `b` to
/// `out_shape`, on the path `isa` asks for (the tests' entry point; a step plans its
/// broadcast once, at compile time).
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn binary_isa(
    isa: Isa,
    op: BinOp,
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
    out: &mut [f32],
    out_shape: &[usize],
    pool: Option<&Pool>,
) {
    let plan = Broadcast::new(&[a_shape, b_shape], out_shape)
        .unwrap_or_else(|| panic!("{a_shape:?} and {b_shape:?} do not broadcast to {out_shape:?}"));
    binary_planned(isa, op, &plan, a, b, out, pool)
}

/// How two operands broadcast to an output, worked out once (a step does it at
/// compile time, so that a run allocates nothing).
pub(crate) type Broadcast = Runs<2>;

/// `out = a op b`, broadcast as `plan` says.
pub(crate) fn binary_planned(
    isa: Isa,
    op: BinOp,
    plan: &Broadcast,
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    pool: Option<&Pool>,
) {
    let total = plan.total();
    assert!(out.len() >= total);
    assert_eq!([a.len(), b.len()], plan.lens());
    let [ia, ib] = *plan.inner_strides();
    let op_avx2 = math::use_avx2(isa) && op != BinOp::Pow;
    let op_avx2 = op_avx2 && [ia, ib].iter().all(|&s| s <= 1);
    let op_avx2 = op_avx2 && (ia == 1 || ib == 1);
    let o = SyncPtr(out.as_mut_ptr());
    plan.for_each(pool, 1, |[oa, ob], at, len| {
        // SAFETY: pieces `at..at + len` are disjoint per call and lie inside the plan's
        // total, at most `out.len()` (asserted above).
        let dst = unsafe { std::slice::from_raw_parts_mut(o.get().add(at), len) };
        #[cfg(target_arch = "x86_64")]
        if op_avx2 {
            // SAFETY: AVX2 checked; the strides are 0 or 1, so each operand's run
            // (len floats, or 1 if broadcast) lies inside it by the shape checks.
            unsafe { run_avx2(op, a.as_ptr().add(oa), ia, b.as_ptr().add(ob), ib, dst) };
            return;
        }
        let _ = op_avx2;
        for (k, d) in dst.iter_mut().enumerate() {
            *d = op.scalar(a[oa + k * ia], b[ob + k * ib]);
        }
    });
}

/// `out = a op b` on a dtype other than f32, broadcast as `plan` says, computed as the
/// interpreter does: integers in i64, wrapping, then cast back like C; floats (f64, f16,
/// bf16) in f64, rounded once. An integer division by zero is an error (Pow on
/// integers is the interpreter's: not here).
pub(crate) fn binary_elem<T: Elem>(
    op: BinOp,
    plan: &Broadcast,
    a: &[T],
    b: &[T],
    out: &mut [T],
    pool: Option<&Pool>,
) -> Result<(), String> {
    assert!(out.len() >= plan.total());
    assert_eq!([a.len(), b.len()], plan.lens());
    let [ia, ib] = *plan.inner_strides();
    let int = T::DTYPE.is_int();
    let by_zero = AtomicBool::new(false);
    let o = SyncPtr(out.as_mut_ptr());
    plan.for_each(pool, 1, |[oa, ob], at, len| {
        // SAFETY: the plan hands each call a disjoint piece `at..at + len` of the output,
        // inside its total, which `out` holds (asserted above).
        let dst = unsafe { std::slice::from_raw_parts_mut(o.get().add(at), len) };
        let pairs = (0..len).map(|k| (a[oa + k * ia], b[ob + k * ib]));
        if int {
            for (d, (x, y)) in dst.iter_mut().zip(pairs) {
                let (x, y) = (x.to_i64(), y.to_i64());
                *d = T::from_i64(match op {
                    BinOp::Add => x.wrapping_add(y),
                    BinOp::Sub => x.wrapping_sub(y),
                    BinOp::Mul => x.wrapping_mul(y),
                    BinOp::Div if y == 0 => {
                        by_zero.store(true, Ordering::Relaxed);
                        0
                    }
                    BinOp::Div => x.wrapping_div(y),
                    BinOp::Max => x.max(y),
                    BinOp::Min => x.min(y),
                    BinOp::Pow => unreachable!("integer Pow is declined at lowering"),
                });
            }
        } else {
            for (d, (x, y)) in dst.iter_mut().zip(pairs) {
                let (x, y) = (x.to_f64(), y.to_f64());
                *d = T::from_f64(match op {
                    BinOp::Add => x + y,
                    BinOp::Sub => x - y,
                    BinOp::Mul => x * y,
                    BinOp::Div => x / y,
                    BinOp::Max if x.is_nan() || y.is_nan() => f64::NAN,
                    BinOp::Min if x.is_nan() || y.is_nan() => f64::NAN,
                    BinOp::Max => x.max(y),
                    BinOp::Min => x.min(y),
                    BinOp::Pow => x.powf(y),
                });
            }
        }
    });
    if by_zero.load(Ordering::Relaxed) {
        return Err("integer division by zero".into());
    }
    Ok(())
}

/// One run: `dst[k] = a[k·sa] op b[k·sb]` with strides 0 or 1 (not both 0).
///
/// # Safety
/// AVX2+FMA; `a`/`b` readable for `dst.len()` floats where their stride is 1, else 1.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn run_avx2(
    op: BinOp,
    a: *const f32,
    sa: usize,
    b: *const f32,
    sb: usize,
    dst: &mut [f32],
) {
    use std::arch::x86_64::*;
    /// The loop for one operation and one pair of strides: the operation and the
    /// strides are fixed before it starts, so each vector is one load pair, one
    /// instruction and one store (the fused loops call this on every tile).
    ///
    /// # Safety
    /// [`run_avx2`]'s contract.
    #[inline(always)]
    unsafe fn run(
        f: impl Fn(__m256, __m256) -> __m256,
        scalar: impl Fn(f32, f32) -> f32,
        a: *const f32,
        sa: usize,
        b: *const f32,
        sb: usize,
        dst: &mut [f32],
    ) {
        let n = dst.len();
        let d = dst.as_mut_ptr();
        let tail = |k0: usize| {
            for k in k0..n {
                // SAFETY: `k < n`, so `d + k` is in `dst`; `k·sa` is `k` (< n, inside `a`'s
                // n floats) or 0 (`a`'s one float), and likewise `k·sb` for `b`.
                unsafe { *d.add(k) = scalar(*a.add(k * sa), *b.add(k * sb)) };
            }
        };
        let mut k = 0;
        match (sa, sb) {
            (0, _) => {
                // SAFETY: a stride-0 `a` is readable for one float (contract), AVX too.
                let x = unsafe { _mm256_set1_ps(*a) };
                while k + 8 <= n {
                    // SAFETY: `k + 8 <= n` by the loop bound; `dst` has n floats, and so
                    // does `b`, of stride 1 as `a`'s is 0 (contract); the CPU has AVX.
                    unsafe { _mm256_storeu_ps(d.add(k), f(x, _mm256_loadu_ps(b.add(k)))) };
                    k += 8;
                }
            }
            (_, 0) => {
                // SAFETY: a stride-0 `b` is readable for one float (contract), AVX too.
                let y = unsafe { _mm256_set1_ps(*b) };
                while k + 8 <= n {
                    // SAFETY: the loop keeps `k + 8 <= n`; `a` (stride 1 here, as `b`'s is
                    // 0) and `dst` both hold n floats; the contract gives AVX.
                    unsafe { _mm256_storeu_ps(d.add(k), f(_mm256_loadu_ps(a.add(k)), y)) };
                    k += 8;
                }
            }
            _ => {
                while k + 8 <= n {
                    // SAFETY: both strides are 1, so `a`, `b` and `dst` each hold n floats,
                    // and lanes `k..k + 8` are below n by the loop bound; AVX (contract).
                    unsafe {
                        let (x, y) = (_mm256_loadu_ps(a.add(k)), _mm256_loadu_ps(b.add(k)));
                        _mm256_storeu_ps(d.add(k), f(x, y));
                    }
                    k += 8;
                }
            }
        }
        tail(k);
    }
    let s = |x, y| op.scalar(x, y);
    // `run` on one operation, its closure checked outside `unsafe`.
    macro_rules! run {
        ($f:expr) => {{
            let f = $f;
            // SAFETY: `run` needs what `run_avx2`'s caller promised for these same `a`,
            // `sa`, `b`, `sb` and `dst`, AVX2+FMA included.
            unsafe { run(f, s, a, sa, b, sb, dst) }
        }};
    }
    match op {
        BinOp::Add => run!(|x, y| _mm256_add_ps(x, y)),
        BinOp::Sub => run!(|x, y| _mm256_sub_ps(x, y)),
        BinOp::Mul => run!(|x, y| _mm256_mul_ps(x, y)),
        BinOp::Div => run!(|x, y| _mm256_div_ps(x, y)),
        BinOp::Max => run!(|x, y| math::avx2::max_min_nan(true, x, y)),
        BinOp::Min => run!(|x, y| math::avx2::max_min_nan(false, x, y)),
        BinOp::Pow => unreachable!("Pow has no vector form"),
    }
}

/// [`run_avx2`] on sixteen lanes: `dst[k] = a[k·sa] op b[k·sb]` with strides 0 or 1
/// (not both 0); the last partial vector is masked. The same IEEE operations, so the
/// same bits as the AVX2 and scalar paths. Pow has no vector form.
///
/// # Safety
/// AVX-512F; `a`/`b` readable for `dst.len()` floats where their stride is 1, else 1.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn run_avx512(
    op: BinOp,
    a: *const f32,
    sa: usize,
    b: *const f32,
    sb: usize,
    dst: &mut [f32],
) {
    use std::arch::x86_64::*;
    /// # Safety
    /// [`run_avx512`]'s contract.
    #[inline(always)]
    unsafe fn run(
        f: impl Fn(__m512, __m512) -> __m512,
        a: *const f32,
        sa: usize,
        b: *const f32,
        sb: usize,
        dst: &mut [f32],
    ) {
        let n = dst.len();
        let d = dst.as_mut_ptr();
        let operand = |p: *const f32, s: usize, k: usize, m: __mmask16| {
            // SAFETY: `p` is `a` or `b` with its stride `s`: at stride 0 it has one float,
            // at stride 1 n floats, of which mask `m` selects only lanes `k..n`; AVX-512F
            // by the contract.
            unsafe {
                if s == 0 {
                    _mm512_set1_ps(*p)
                } else {
                    _mm512_maskz_loadu_ps(m, p.add(k))
                }
            }
        };
        let mut k = 0;
        match (sa, sb) {
            (0, _) => {
                // SAFETY: `a` at stride 0 holds one float (contract); AVX-512F likewise.
                let x = unsafe { _mm512_set1_ps(*a) };
                while k + 16 <= n {
                    // SAFETY: `k + 16 <= n` by the loop bound; `b` (stride 1, since not both
                    // are 0) and `dst` hold n floats; AVX-512F by the contract.
                    unsafe { _mm512_storeu_ps(d.add(k), f(x, _mm512_loadu_ps(b.add(k)))) };
                    k += 16;
                }
            }
            (_, 0) => {
                // SAFETY: `b` at stride 0 holds one float (contract); AVX-512F likewise.
                let y = unsafe { _mm512_set1_ps(*b) };
                while k + 16 <= n {
                    // SAFETY: lanes `k..k + 16` are below n (loop bound) and `a`, of stride
                    // 1 here, holds n floats as `dst` does; AVX-512F by the contract.
                    unsafe { _mm512_storeu_ps(d.add(k), f(_mm512_loadu_ps(a.add(k)), y)) };
                    k += 16;
                }
            }
            _ => {
                while k + 16 <= n {
                    // SAFETY: stride 1 on both: `a`, `b`, `dst` hold n floats each, and the
                    // loop bound keeps `k + 16 <= n`; AVX-512F by the contract.
                    unsafe {
                        let (x, y) = (_mm512_loadu_ps(a.add(k)), _mm512_loadu_ps(b.add(k)));
                        _mm512_storeu_ps(d.add(k), f(x, y));
                    }
                    k += 16;
                }
            }
        }
        if k < n {
            let m: __mmask16 = (1u16 << (n - k)) - 1;
            let v = f(operand(a, sa, k, m), operand(b, sb, k, m));
            // SAFETY: mask `m` stores lanes `k..n` only, inside `dst`'s n floats; AVX-512F
            // by the contract.
            unsafe { _mm512_mask_storeu_ps(d.add(k), m, v) };
        }
    }
    // Max/Min: either operand NaN gives NaN (x + y), as the scalar path.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn max_min(max: bool, x: __m512, y: __m512) -> __m512 {
        let r = if max {
            _mm512_max_ps(x, y)
        } else {
            _mm512_min_ps(x, y)
        };
        let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, y);
        _mm512_mask_blend_ps(nan, r, _mm512_add_ps(x, y))
    }
    // `run` on one operation, its closure checked outside `unsafe`.
    macro_rules! run {
        ($f:expr) => {{
            let f = $f;
            // SAFETY: `run`'s contract is `run_avx512`'s, for the same operands and
            // strides, which its caller upholds (AVX-512F included).
            unsafe { run(f, a, sa, b, sb, dst) }
        }};
    }
    match op {
        BinOp::Add => run!(|x, y| _mm512_add_ps(x, y)),
        BinOp::Sub => run!(|x, y| _mm512_sub_ps(x, y)),
        BinOp::Mul => run!(|x, y| _mm512_mul_ps(x, y)),
        BinOp::Div => run!(|x, y| _mm512_div_ps(x, y)),
        BinOp::Max => run!(|x, y| max_min(true, x, y)),
        BinOp::Min => run!(|x, y| max_min(false, x, y)),
        BinOp::Pow => unreachable!("Pow has no vector form"),
    }
}

/// Whether [`unary_avx512`] has `op` (the exactly rounded ones; the others' AVX2
/// approximations are kept so every ISA computes the same bits).
pub(crate) fn unary_has_avx512(op: UnaryOp) -> bool {
    matches!(
        op,
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Reciprocal | UnaryOp::Relu
    )
}

/// A unary op on sixteen lanes (see [`unary_has_avx512`]), the tail masked.
///
/// # Safety
/// AVX-512F; `src` readable and `dst` writable for `n` floats (maybe the same).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn unary_avx512(op: UnaryOp, src: *const f32, dst: *mut f32, n: usize) {
    use std::arch::x86_64::*;
    /// # Safety
    /// [`unary_avx512`]'s contract.
    #[inline(always)]
    unsafe fn map(f: impl Fn(__m512) -> __m512, src: *const f32, dst: *mut f32, n: usize) {
        let mut k = 0;
        while k + 16 <= n {
            // SAFETY: `k + 16 <= n` (loop bound) and `src`/`dst` hold n floats; AVX-512F,
            // both by the contract.
            unsafe { _mm512_storeu_ps(dst.add(k), f(_mm512_loadu_ps(src.add(k)))) };
            k += 16;
        }
        if k < n {
            let m: __mmask16 = (1u16 << (n - k)) - 1;
            // SAFETY: mask `m` loads and stores lanes `k..n` only, inside the n floats
            // of `src` and `dst`; AVX-512F by the contract.
            unsafe {
                _mm512_mask_storeu_ps(dst.add(k), m, f(_mm512_maskz_loadu_ps(m, src.add(k))))
            };
        }
    }
    let sign = _mm512_set1_ps(-0.0);
    let one = _mm512_set1_ps(1.0);
    let zero = _mm512_setzero_ps();
    let bits = _mm512_castps_si512;
    let float = _mm512_castsi512_ps;
    // `map` on one operation, its closure checked outside `unsafe`.
    macro_rules! map {
        ($f:expr) => {{
            let f = $f;
            // SAFETY: `map` asks what `unary_avx512`'s caller promised: n floats at `src`
            // and `dst`, and AVX-512F.
            unsafe { map(f, src, dst, n) }
        }};
    }
    match op {
        UnaryOp::Neg => map!(|v| float(_mm512_xor_si512(bits(v), bits(sign)))),
        UnaryOp::Abs => map!(|v| float(_mm512_andnot_si512(bits(sign), bits(v)))),
        UnaryOp::Sqrt => map!(|v| _mm512_sqrt_ps(v)),
        UnaryOp::Reciprocal => map!(|v| _mm512_div_ps(one, v)),
        // max(0, v) returns v when v is NaN.
        UnaryOp::Relu => map!(|v| _mm512_max_ps(zero, v)),
        _ => unreachable!("{op:?} has no AVX-512 form here"),
    }
}

/// An elementwise unary op. Relu keeps NaN (as the interpreter's does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    Neg,
    Abs,
    Sqrt,
    Exp,
    Log,
    Reciprocal,
    Relu,
    Sigmoid,
    Tanh,
    Erf,
    Floor,
    Ceil,
    /// Half to even, as ONNX's Round.
    Round,
}

impl UnaryOp {
    /// The op on one value (the portable path).
    #[inline]
    pub(crate) fn scalar(self, x: f32) -> f32 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Exp => math::exp(x),
            UnaryOp::Log => x.ln(),
            UnaryOp::Reciprocal => 1.0 / x,
            UnaryOp::Relu => math::relu(x),
            UnaryOp::Sigmoid => math::sigmoid(x),
            UnaryOp::Tanh => math::tanh(x),
            UnaryOp::Erf => math::erf(x),
            UnaryOp::Floor => x.floor(),
            UnaryOp::Ceil => x.ceil(),
            UnaryOp::Round => x.round_ties_even(),
        }
    }
}

/// `dst[i] = op(src[i])`.
pub(crate) fn unary(op: UnaryOp, src: &[f32], dst: &mut [f32]) {
    unary_isa(isa::isa(), op, src, dst)
}

/// `x[i] = op(x[i])`.
pub(crate) fn unary_inplace(op: UnaryOp, x: &mut [f32]) {
    unary_inplace_isa(isa::isa(), op, x)
}

/// [`unary`] on the path `isa` asks for.
pub(crate) fn unary_isa(isa: Isa, op: UnaryOp, src: &[f32], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len());
    // SAFETY: two slices of `src.len()` floats (asserted equal), disjoint as `&`/`&mut`.
    unsafe { unary_ptr(isa, op, src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// [`unary_inplace`] on the path `isa` asks for.
pub(crate) fn unary_inplace_isa(isa: Isa, op: UnaryOp, x: &mut [f32]) {
    let p = x.as_mut_ptr();
    // SAFETY: `p` is `x`'s own `x.len()` floats, as source and destination at once.
    unsafe { unary_ptr(isa, op, p, p, x.len()) }
}

/// `dst[i] = op(src[i])` for `i < n`, on the path `isa` asks for.
///
/// # Safety
/// `src` readable and `dst` writable for `n` floats, the same buffer or disjoint.
pub(crate) unsafe fn unary_ptr(isa: Isa, op: UnaryOp, src: *const f32, dst: *mut f32, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if math::use_avx2(isa) && op != UnaryOp::Log {
        // SAFETY: `use_avx2` detected AVX2+FMA; both pointers cover n floats (contract).
        unsafe { unary_avx2(op, src, dst, n) };
        return;
    }
    let _ = isa;
    for i in 0..n {
        // SAFETY: i < n, inside both buffers; each element is read before written.
        unsafe { *dst.add(i) = op.scalar(*src.add(i)) };
    }
}

/// # Safety
/// AVX2+FMA; `src` readable and `dst` writable for `n` floats (maybe the same).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn unary_avx2(op: UnaryOp, src: *const f32, dst: *mut f32, n: usize) {
    use math::avx2;
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    let one = _mm256_set1_ps(1.0);
    let zero = _mm256_setzero_ps();
    // `avx2::map` on one operation, its closure checked outside `unsafe`.
    macro_rules! map {
        ($f:expr) => {{
            let f = $f;
            // SAFETY: `unary_avx2`'s caller gives `src` readable and `dst` writable for
            // `n` floats, as `avx2::map` needs; AVX2+FMA are enabled for this fn.
            unsafe { avx2::map(src, dst, n, f) }
        }};
    }
    match op {
        UnaryOp::Neg => map!(|v| _mm256_xor_ps(v, sign)),
        UnaryOp::Abs => map!(|v| _mm256_andnot_ps(sign, v)),
        UnaryOp::Sqrt => map!(|v| _mm256_sqrt_ps(v)),
        UnaryOp::Exp => map!(|v| avx2::exp(v)),
        UnaryOp::Reciprocal => map!(|v| _mm256_div_ps(one, v)),
        // max(0, v) returns v when v is NaN.
        UnaryOp::Relu => map!(|v| _mm256_max_ps(zero, v)),
        UnaryOp::Sigmoid => map!(|v| avx2::sigmoid(v)),
        UnaryOp::Tanh => map!(|v| avx2::tanh(v)),
        UnaryOp::Erf => map!(|v| avx2::erf(v)),
        UnaryOp::Floor => map!(|v| _mm256_floor_ps(v)),
        UnaryOp::Ceil => map!(|v| _mm256_ceil_ps(v)),
        UnaryOp::Round => {
            map!(|v| { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v) })
        }
        UnaryOp::Log => {
            for i in 0..n {
                // SAFETY: `i < n`, and `src`/`dst` hold `n` floats (contract); element i
                // is read before it is written, so `src == dst` is fine.
                unsafe { *dst.add(i) = (*src.add(i)).ln() };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::math::tests::isas;
    use crate::backend::cpu::kernels::testutil::{lcg_data, pools};
    use crate::ir::ops::{self, EvalCtx};
    use crate::ir::Attrs;
    use crate::tensor::Tensor;

    fn interp(name: &str, inputs: &[&Tensor]) -> Tensor {
        let ins: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
        let types = vec![None; ins.len()];
        let attrs = Attrs::new();
        let cx = EvalCtx {
            inputs: &ins,
            input_types: &types,
            attrs: &attrs,
        };
        ops::lookup(name).unwrap().eval(&cx).unwrap().remove(0)
    }

    fn close(got: &[f32], want: &[f64], rel: f64, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            let ok = (g.is_nan() && w.is_nan())
                || (*g as f64 == *w)
                || (*g as f64 - w).abs() <= rel * w.abs() + 1e-30;
            assert!(ok, "{what} at {k}: {g} vs {w}");
        }
    }

    /// Against the interpreter: exact for Add/Sub/Mul/Div/Max/Min (f32 arithmetic
    /// rounded once either way), 1e-6 relative for Pow.
    #[test]
    fn binary_broadcasts_match_interpreter() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[7], &[7]),
            (&[3, 33], &[3, 33]),
            (&[4, 9], &[]),
            (&[], &[5, 100]),
            (&[5, 100], &[100]),
            (&[5, 100], &[5, 1]),
            (&[2, 3, 9], &[3, 1]),
            (&[2, 1, 9], &[1, 7, 1]),
            (&[1], &[3, 1, 1]),
            (&[2, 3, 4, 5], &[3, 1, 5]),
            (&[64, 1000], &[1000]),
            (&[200000], &[1]),
        ];
        let ops = [
            (BinOp::Add, "Add"),
            (BinOp::Sub, "Sub"),
            (BinOp::Mul, "Mul"),
            (BinOp::Div, "Div"),
            (BinOp::Max, "Max"),
            (BinOp::Min, "Min"),
            (BinOp::Pow, "Pow"),
        ];
        for pool in pools() {
            for isa in isas() {
                for &(sa, sb) in cases {
                    let (na, nb) = (sa.iter().product(), sb.iter().product());
                    let mut a = lcg_data(na, 3.0, na as u64);
                    let mut b = lcg_data(nb, 3.0, nb as u64 + 1);
                    if na > 3 {
                        a[3] = f32::NAN;
                    }
                    for (op, name) in ops {
                        if op == BinOp::Pow {
                            a.iter_mut().for_each(|v| *v = v.abs() + 0.1);
                            b.iter_mut().for_each(|v| *v = v.clamp(-2.0, 2.0));
                        }
                        let (ta, tb) = (
                            Tensor::from_vec(sa, a.clone()).unwrap(),
                            Tensor::from_vec(sb, b.clone()).unwrap(),
                        );
                        let want = interp(name, &[&ta, &tb]);
                        let mut out = vec![0.0; want.len()];
                        binary_isa(
                            isa,
                            op,
                            &a,
                            sa,
                            &b,
                            sb,
                            &mut out,
                            want.shape(),
                            pool.as_ref(),
                        );
                        let rel = if op == BinOp::Pow { 1e-6 } else { 0.0 };
                        let what = format!("{name} {sa:?} {sb:?} {}", isa.name());
                        close(&out, &want.to_f64_vec(), rel, &what);
                    }
                }
            }
        }
    }

    /// Against the interpreter: exact for Neg/Abs/Sqrt/Reciprocal/Relu/Floor/Ceil/Round, 2 ulp for Log, 4 ulp-ish
    /// (5e-7 relative, 1e-7 absolute for Erf) for Exp/Sigmoid/Tanh/Erf.
    #[test]
    fn unary_matches_interpreter() {
        let ops = [
            (UnaryOp::Neg, "Neg"),
            (UnaryOp::Abs, "Abs"),
            (UnaryOp::Sqrt, "Sqrt"),
            (UnaryOp::Exp, "Exp"),
            (UnaryOp::Log, "Log"),
            (UnaryOp::Reciprocal, "Reciprocal"),
            (UnaryOp::Relu, "Relu"),
            (UnaryOp::Sigmoid, "Sigmoid"),
            (UnaryOp::Tanh, "Tanh"),
            (UnaryOp::Erf, "Erf"),
            (UnaryOp::Floor, "Floor"),
            (UnaryOp::Ceil, "Ceil"),
            (UnaryOp::Round, "Round"),
        ];
        for isa in isas() {
            for n in [1, 7, 9, 33, 100] {
                let mut x = lcg_data(n, 6.0, n as u64);
                x[0] = f32::NAN;
                let t = Tensor::from_vec(&[n], x.clone()).unwrap();
                for (op, name) in ops {
                    let want = interp(name, &[&t]).to_f64_vec();
                    let mut y = vec![0.0; n];
                    unary_isa(isa, op, &x, &mut y);
                    let mut z = x.clone();
                    unary_inplace_isa(isa, op, &mut z);
                    assert_eq!(
                        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        z.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
                    );
                    for (k, (g, w)) in y.iter().zip(&want).enumerate() {
                        let w32 = *w as f32 as f64;
                        let tol = match op {
                            UnaryOp::Exp | UnaryOp::Sigmoid | UnaryOp::Tanh => 5e-7 * w32.abs(),
                            UnaryOp::Log => 2.5e-7 * w32.abs(),
                            UnaryOp::Erf => 1.5e-7,
                            _ => 0.0,
                        };
                        let ok = (g.is_nan() && w.is_nan()) || (*g as f64 - w32).abs() <= tol;
                        assert!(ok, "{name} {} at {k} (x={}): {g} vs {w}", isa.name(), x[k]);
                    }
                }
            }
        }
    }
}
