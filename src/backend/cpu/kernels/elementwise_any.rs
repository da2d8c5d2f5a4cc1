//! Elementwise ops on every numeric dtype (and bool), computed as the interpreter
//! computes them: floats (f32, f64, f16, bf16) in f64 and rounded once to their dtype,
//! integers in i64 and wrapped back like a C cast. Binary ops broadcast as a
//! [`Broadcast`] plan says: comparisons into bool, logic on bool, bitwise ops and
//! shifts, Mod, Pow of any base and exponent dtypes, PRelu, and arithmetic on the
//! dtypes [`super::binary::binary_elem`] does not take (integer Pow). Clip with
//! constant or run-time bounds; variadic Sum, Mean, Max and Min through an accumulator
//! of the output's size. Booleans are bytes, 0 or 1.
use super::binary::{BinOp, Broadcast};
use super::broadcast::Runs;
use super::par::{for_ranges, SyncPtr};
use super::select::CmpOp;
use crate::backend::cpu::pool::Pool;
use crate::tensor::Elem;
use std::sync::atomic::{AtomicBool, Ordering};

/// A binary op of [`binary_same`] (one dtype in and out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SameOp {
    Arith(BinOp),
    BitAnd,
    BitOr,
    BitXor,
    Shift { left: bool },
    Mod { fmod: bool },
    PRelu,
}

/// Logic on booleans.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogicOp {
    And,
    Or,
    Xor,
}

/// A variadic reduction over inputs broadcast together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarOp {
    Sum,
    Mean,
    Max,
    Min,
}

/// `out[i] = f(a[·], b[·])` over the output, each operand broadcast as `plan` says,
/// split over the pool.
fn zip<A: Copy + Sync, B: Copy + Sync, O: Copy>(
    plan: &Broadcast,
    a: &[A],
    b: &[B],
    out: &mut [O],
    pool: Option<&Pool>,
    f: impl Fn(A, B) -> O + Sync,
) {
    assert!(out.len() >= plan.total());
    assert_eq!([a.len(), b.len()], plan.lens());
    let [ia, ib] = *plan.inner_strides();
    let o = SyncPtr(out.as_mut_ptr());
    plan.for_each(pool, 1, |[oa, ob], at, len| {
        // SAFETY: each call of the plan gets its own piece `at..at + len` of the output,
        // inside the plan's total, which `out` holds (asserted on entry).
        let dst = unsafe { std::slice::from_raw_parts_mut(o.get().add(at), len) };
        match (ia, ib) {
            (1, 1) => {
                let (a, b) = (&a[oa..oa + len], &b[ob..ob + len]);
                for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
                    *d = f(x, y);
                }
            }
            (1, 0) => {
                let y = b[ob];
                for (d, &x) in dst.iter_mut().zip(&a[oa..oa + len]) {
                    *d = f(x, y);
                }
            }
            (0, 1) => {
                let x = a[oa];
                for (d, &y) in dst.iter_mut().zip(&b[ob..ob + len]) {
                    *d = f(x, y);
                }
            }
            _ => {
                for (k, d) in dst.iter_mut().enumerate() {
                    *d = f(a[oa + k * ia], b[ob + k * ib]);
                }
            }
        }
    });
}

/// The interpreter's integer power: a negative exponent truncates (only 1 and -1 have
/// integer reciprocals), 0 to a negative power is an error (`None`).
fn int_pow(x: i64, y: i64) -> Option<i64> {
    if y < 0 {
        return match x {
            1 => Some(1),
            -1 => Some(if y % 2 == 0 { 1 } else { -1 }),
            0 => None,
            _ => Some(0),
        };
    }
    Some(x.wrapping_pow(y.min(u32::MAX as i64) as u32))
}

fn nan_max_min(max: bool, x: f64, y: f64) -> f64 {
    if x.is_nan() || y.is_nan() {
        f64::NAN
    } else if max {
        x.max(y)
    } else {
        x.min(y)
    }
}

fn float_arith(op: BinOp, x: f64, y: f64) -> f64 {
    match op {
        BinOp::Add => x + y,
        BinOp::Sub => x - y,
        BinOp::Mul => x * y,
        BinOp::Div => x / y,
        BinOp::Max => nan_max_min(true, x, y),
        BinOp::Min => nan_max_min(false, x, y),
        BinOp::Pow => x.powf(y),
    }
}

/// `None`: the op has no value here (an integer division by zero, 0 to a negative power).
fn int_arith(op: BinOp, x: i64, y: i64) -> Option<i64> {
    Some(match op {
        BinOp::Add => x.wrapping_add(y),
        BinOp::Sub => x.wrapping_sub(y),
        BinOp::Mul => x.wrapping_mul(y),
        BinOp::Div if y == 0 => return None,
        BinOp::Div => x.wrapping_div(y),
        BinOp::Max => x.max(y),
        BinOp::Min => x.min(y),
        BinOp::Pow => return int_pow(x, y),
    })
}

/// Python's `%` (the divisor's sign) unless `fmod`, then C's `fmod` (the dividend's).
fn float_mod(fmod: bool, x: f64, y: f64) -> f64 {
    let r = x % y;
    if !fmod && r != 0.0 && (r < 0.0) != (y < 0.0) {
        r + y
    } else {
        r
    }
}

fn int_mod(fmod: bool, x: i64, y: i64) -> Option<i64> {
    if y == 0 {
        return None;
    }
    let r = x.wrapping_rem(y);
    Some(if !fmod && r != 0 && (r < 0) != (y < 0) {
        r + y
    } else {
        r
    })
}

/// A shift of `bits`-wide values as the interpreter shifts: signed values wrap left and
/// shift arithmetically right; shifts out of `0..bits` give 0 (-1 for a negative value
/// shifted right).
fn shift(left: bool, signed: bool, bits: u32, x: i64, y: i64) -> i64 {
    let mask = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    if signed {
        return match u32::try_from(y) {
            Ok(s) if s < bits && left => (((x as u64) << s) & mask) as i64,
            Ok(s) if s < bits => x >> s,
            _ if !left && x < 0 => -1,
            _ => 0,
        };
    }
    let (x, s) = ((x as u64) & mask, y as u64);
    (if s >= bits as u64 {
        0
    } else if left {
        (x << s) & mask
    } else {
        x >> s
    }) as i64
}

/// What an op that failed on some element says.
fn failure(op: SameOp) -> &'static str {
    match op {
        SameOp::Mod { .. } => "integer modulo by zero",
        SameOp::Arith(BinOp::Pow) => "0 raised to a negative power",
        _ => "integer division by zero",
    }
}

/// Whether [`binary_same`] may fail on `op` for integers.
pub(crate) fn same_can_fail(op: SameOp) -> bool {
    matches!(
        op,
        SameOp::Mod { .. } | SameOp::Arith(BinOp::Div) | SameOp::Arith(BinOp::Pow)
    )
}

/// `out = a op b` with `a`, `b` and `out` all `T`s.
pub(crate) fn binary_same<T: Elem>(
    op: SameOp,
    plan: &Broadcast,
    a: &[T],
    b: &[T],
    out: &mut [T],
    pool: Option<&Pool>,
) -> Result<(), String> {
    let bad = AtomicBool::new(false);
    let or_fail = |v: Option<i64>| {
        v.unwrap_or_else(|| {
            bad.store(true, Ordering::Relaxed);
            0
        })
    };
    let (signed, bits) = (T::DTYPE.is_signed(), 8 * T::DTYPE.size_in_bytes() as u32);
    let f64s = |x: T, y: T| (x.to_f64(), y.to_f64());
    let i64s = |x: T, y: T| (x.to_i64(), y.to_i64());
    if T::DTYPE.is_float() {
        match op {
            SameOp::Arith(op) => zip(plan, a, b, out, pool, |x, y| {
                let (x, y) = f64s(x, y);
                T::from_f64(float_arith(op, x, y))
            }),
            SameOp::Mod { fmod } => zip(plan, a, b, out, pool, |x, y| {
                let (x, y) = f64s(x, y);
                T::from_f64(float_mod(fmod, x, y))
            }),
            SameOp::PRelu => zip(plan, a, b, out, pool, |x, s| {
                let (x, s) = f64s(x, s);
                T::from_f64(if x >= 0.0 { x } else { s * x })
            }),
            _ => return Err(format!("{op:?} is not defined for {}", T::DTYPE)),
        }
    } else {
        match op {
            SameOp::Arith(op) => zip(plan, a, b, out, pool, |x, y| {
                let (x, y) = i64s(x, y);
                T::from_i64(or_fail(int_arith(op, x, y)))
            }),
            SameOp::Mod { fmod } => zip(plan, a, b, out, pool, |x, y| {
                let (x, y) = i64s(x, y);
                T::from_i64(or_fail(int_mod(fmod, x, y)))
            }),
            SameOp::BitAnd => zip(plan, a, b, out, pool, |x, y| {
                T::from_i64(x.to_i64() & y.to_i64())
            }),
            SameOp::BitOr => zip(plan, a, b, out, pool, |x, y| {
                T::from_i64(x.to_i64() | y.to_i64())
            }),
            SameOp::BitXor => zip(plan, a, b, out, pool, |x, y| {
                T::from_i64(x.to_i64() ^ y.to_i64())
            }),
            SameOp::Shift { left } => zip(plan, a, b, out, pool, |x, y| {
                let (x, y) = i64s(x, y);
                T::from_i64(shift(left, signed, bits, x, y))
            }),
            SameOp::PRelu => return Err(format!("PRelu is not defined for {}", T::DTYPE)),
        }
    }
    if bad.load(Ordering::Relaxed) {
        return Err(failure(op).into());
    }
    Ok(())
}

/// `out = a op b` as bytes 0 or 1, compared as the interpreter compares: floats as
/// f64, integers as i64 (so u64 above `i64::MAX` compares as its wrapped value).
pub(crate) fn compare_any<T: Elem>(
    op: CmpOp,
    plan: &Broadcast,
    a: &[T],
    b: &[T],
    out: &mut [u8],
    pool: Option<&Pool>,
) {
    fn run<K: PartialOrd + Copy, T: Elem>(
        key: impl Fn(T) -> K + Sync,
        op: CmpOp,
        plan: &Broadcast,
        a: &[T],
        b: &[T],
        out: &mut [u8],
        pool: Option<&Pool>,
    ) {
        let k = &key;
        match op {
            CmpOp::Equal => zip(plan, a, b, out, pool, |x, y| (k(x) == k(y)) as u8),
            CmpOp::Less => zip(plan, a, b, out, pool, |x, y| (k(x) < k(y)) as u8),
            CmpOp::LessOrEqual => zip(plan, a, b, out, pool, |x, y| (k(x) <= k(y)) as u8),
            CmpOp::Greater => zip(plan, a, b, out, pool, |x, y| (k(x) > k(y)) as u8),
            CmpOp::GreaterOrEqual => zip(plan, a, b, out, pool, |x, y| (k(x) >= k(y)) as u8),
        }
    }
    if T::DTYPE.is_float() {
        run(|x: T| x.to_f64(), op, plan, a, b, out, pool)
    } else {
        run(|x: T| x.to_i64(), op, plan, a, b, out, pool)
    }
}

/// `out = a op b` on booleans (bytes: nonzero is true), as bytes 0 or 1.
pub(crate) fn logic(
    op: LogicOp,
    plan: &Broadcast,
    a: &[u8],
    b: &[u8],
    out: &mut [u8],
    pool: Option<&Pool>,
) {
    match op {
        LogicOp::And => zip(plan, a, b, out, pool, |x, y| (x != 0 && y != 0) as u8),
        LogicOp::Or => zip(plan, a, b, out, pool, |x, y| (x != 0 || y != 0) as u8),
        LogicOp::Xor => zip(plan, a, b, out, pool, |x, y| ((x != 0) != (y != 0)) as u8),
    }
}

/// `out = x ^ y` with the result of `x`'s dtype: floats as f64 (an integer exponent
/// too), an integer base with a float exponent as f64 then truncated into the base's
/// dtype, integers by [`int_pow`] (0 to a negative power is an error).
pub(crate) fn pow_any<X: Elem, Y: Elem>(
    plan: &Broadcast,
    a: &[X],
    b: &[Y],
    out: &mut [X],
    pool: Option<&Pool>,
) -> Result<(), String> {
    if X::DTYPE.is_float() || Y::DTYPE.is_float() {
        zip(plan, a, b, out, pool, |x, y| {
            X::from_f64(x.to_f64().powf(y.to_f64()))
        });
        return Ok(());
    }
    let bad = AtomicBool::new(false);
    zip(plan, a, b, out, pool, |x, y| {
        X::from_i64(int_pow(x.to_i64(), y.to_i64()).unwrap_or_else(|| {
            bad.store(true, Ordering::Relaxed);
            0
        }))
    });
    if bad.load(Ordering::Relaxed) {
        return Err("0 raised to a negative power".into());
    }
    Ok(())
}

/// Elements per task of the one-operand loops.
const PIECE: usize = 16 * 1024;

/// `out = x` limited to `[lo, hi]` (omitted bounds do not limit): floats in f64 with
/// NaN kept, integers in i64 with the bounds truncated to integers.
pub(crate) fn clip<T: Elem>(
    x: &[T],
    out: &mut [T],
    lo: Option<f64>,
    hi: Option<f64>,
    pool: Option<&Pool>,
) {
    assert_eq!(x.len(), out.len());
    let o = SyncPtr(out.as_mut_ptr());
    let float = T::DTYPE.is_float();
    let (flo, fhi) = (lo.unwrap_or(f64::NEG_INFINITY), hi.unwrap_or(f64::INFINITY));
    let (ilo, ihi) = (
        lo.map_or(i64::MIN, |v| v as i64),
        hi.map_or(i64::MAX, |v| v as i64),
    );
    for_ranges(pool, x.len().div_ceil(PIECE), PIECE, &|r| {
        for t in r {
            let range = t * PIECE..((t + 1) * PIECE).min(x.len());
            // SAFETY: tasks own disjoint ranges `range` of `out`, inside its `x.len()`.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(o.get().add(range.start), range.len()) };
            for (d, &v) in dst.iter_mut().zip(&x[range]) {
                *d = if float {
                    let v = v.to_f64();
                    T::from_f64(if v.is_nan() { v } else { v.max(flo).min(fhi) })
                } else {
                    T::from_i64(v.to_i64().max(ilo).min(ihi))
                };
            }
        }
    });
}

/// How each input of a variadic op broadcasts to its output.
pub(crate) type Spread = Runs<1>;

/// Folds input `x` (spread to the output as `plan` says) into `acc`: `first` sets it.
fn fold<T: Copy + Sync, A: Copy>(
    plan: &Spread,
    x: &[T],
    acc: &mut [A],
    pool: Option<&Pool>,
    first: bool,
    init: impl Fn(T) -> A + Sync,
    f: impl Fn(A, T) -> A + Sync,
) {
    assert!(acc.len() >= plan.total());
    assert_eq!([x.len()], plan.lens());
    let [s] = *plan.inner_strides();
    let o = SyncPtr(acc.as_mut_ptr());
    plan.for_each(pool, 1, |[ox], at, len| {
        // SAFETY: the plan gives each call a piece `at..at + len` of its own, inside its
        // total, which the accumulator holds (asserted above).
        let dst = unsafe { std::slice::from_raw_parts_mut(o.get().add(at), len) };
        for (k, d) in dst.iter_mut().enumerate() {
            let v = x[ox + k * s];
            *d = if first { init(v) } else { f(*d, v) };
        }
    });
}

/// Input `k` of `n` of a variadic op folded into the accumulator (f64 for floats, i64
/// for integers, as `acc`'s 8-byte words), then on the last the result into `out`.
/// The interpreter's folds: floats summed in f64 in input order, Max/Min with NaN
/// winning, integer sums wrapping.
#[allow(clippy::too_many_arguments)]
pub(crate) fn variadic_step<T: Elem>(
    op: VarOp,
    plan: &Spread,
    k: usize,
    n: usize,
    x: &[T],
    acc: &mut [u64],
    out: &mut [T],
    pool: Option<&Pool>,
) {
    let first = k == 0;
    let fl = |a: u64| f64::from_bits(a);
    let fb = |v: f64| v.to_bits();
    if T::DTYPE.is_float() {
        let init = |v: T| fb(v.to_f64());
        match op {
            VarOp::Sum | VarOp::Mean => fold(plan, x, acc, pool, first, init, |a, v| {
                fb(fl(a) + v.to_f64())
            }),
            VarOp::Max => fold(plan, x, acc, pool, first, init, |a, v| {
                fb(nan_max_min(true, fl(a), v.to_f64()))
            }),
            VarOp::Min => fold(plan, x, acc, pool, first, init, |a, v| {
                fb(nan_max_min(false, fl(a), v.to_f64()))
            }),
        }
    } else {
        let init = |v: T| v.to_i64() as u64;
        let i = |a: u64| a as i64;
        match op {
            VarOp::Sum | VarOp::Mean => fold(plan, x, acc, pool, first, init, |a, v| {
                i(a).wrapping_add(v.to_i64()) as u64
            }),
            VarOp::Max => fold(plan, x, acc, pool, first, init, |a, v| {
                i(a).max(v.to_i64()) as u64
            }),
            VarOp::Min => fold(plan, x, acc, pool, first, init, |a, v| {
                i(a).min(v.to_i64()) as u64
            }),
        }
    }
    if k + 1 < n {
        return;
    }
    let div = if op == VarOp::Mean { n as f64 } else { 1.0 };
    let float = T::DTYPE.is_float();
    let o = SyncPtr(out.as_mut_ptr());
    let acc = &acc[..out.len()];
    for_ranges(pool, out.len().div_ceil(PIECE), PIECE, &|r| {
        for t in r {
            let range = t * PIECE..((t + 1) * PIECE).min(acc.len());
            // SAFETY: each task writes its own range of `out` (as long as `acc`, sliced so).
            let dst =
                unsafe { std::slice::from_raw_parts_mut(o.get().add(range.start), range.len()) };
            for (d, &a) in dst.iter_mut().zip(&acc[range]) {
                *d = if float {
                    T::from_f64(f64::from_bits(a) / div)
                } else {
                    T::from_i64(a as i64)
                };
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shifts_and_mods_follow_the_interpreter() {
        assert_eq!(shift(true, true, 8, -1, 9), 0);
        assert_eq!(shift(false, true, 8, -128, 9), -1);
        assert_eq!(shift(false, true, 32, -8, 1), -4);
        assert_eq!(shift(true, false, 8, 255, 1), 254);
        assert_eq!(int_mod(false, -7, 3), Some(2));
        assert_eq!(int_mod(true, -7, 3), Some(-1));
        assert_eq!(int_mod(false, 1, 0), None);
        assert_eq!(float_mod(false, -7.0, 3.0), 2.0);
        assert_eq!(int_pow(2, -1), Some(0));
        assert_eq!(int_pow(0, -1), None);
    }
}
