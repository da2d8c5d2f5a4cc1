//! Comparisons and `Where` with numpy broadcasting: the masks that backward graphs are
//! made of (Relu's gradient is `Where(x > 0, gy, 0)`, SoftmaxCrossEntropyLoss's one-hot
//! an `Equal`). Booleans are one byte,
//! 0 or 1. Rows whose operands are contiguous or broadcast scalars run loops the
//! compiler vectorizes; other strides run an indexed loop.
use super::broadcast::Runs;
use super::par::SyncPtr;
use crate::backend::cpu::pool::Pool;

/// Operands a [`Walk`] follows at most.
const OPERANDS: usize = 4;

/// How up to four operands broadcast to an output, worked out once.
pub(crate) type Walk = Runs<OPERANDS>;

/// A comparison producing a boolean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    Equal,
    Greater,
    GreaterOrEqual,
    Less,
    LessOrEqual,
}

impl CmpOp {
    pub(crate) fn from_op(op: &str) -> Option<CmpOp> {
        Some(match op {
            "Equal" => CmpOp::Equal,
            "Greater" => CmpOp::Greater,
            "GreaterOrEqual" => CmpOp::GreaterOrEqual,
            "Less" => CmpOp::Less,
            "LessOrEqual" => CmpOp::LessOrEqual,
            _ => return None,
        })
    }
}

/// `out = a op b` (0 or 1 bytes), broadcast as `walk` says (operands 0 and 1).
pub(crate) fn compare<T: PartialOrd + Copy + Send + Sync>(
    op: CmpOp,
    walk: &Walk,
    a: &[T],
    b: &[T],
    out: &mut [u8],
    pool: Option<&Pool>,
) {
    match op {
        CmpOp::Equal => compare_with(|x: T, y: T| x == y, walk, a, b, out, pool),
        CmpOp::Greater => compare_with(|x: T, y: T| x > y, walk, a, b, out, pool),
        CmpOp::GreaterOrEqual => compare_with(|x: T, y: T| x >= y, walk, a, b, out, pool),
        CmpOp::Less => compare_with(|x: T, y: T| x < y, walk, a, b, out, pool),
        CmpOp::LessOrEqual => compare_with(|x: T, y: T| x <= y, walk, a, b, out, pool),
    }
}

fn compare_with<T: Copy + Send + Sync>(
    f: impl Fn(T, T) -> bool + Sync,
    walk: &Walk,
    a: &[T],
    b: &[T],
    out: &mut [u8],
    pool: Option<&Pool>,
) {
    assert!(a.len() == walk.lens()[0] && b.len() == walk.lens()[1] && out.len() == walk.total());
    let o = SyncPtr(out.as_mut_ptr());
    let [sa, sb, ..] = *walk.inner_strides();
    walk.for_each(pool, 1, |offs, at, len| {
        // SAFETY: each run writes its own part of `out`.
        let d = unsafe { std::slice::from_raw_parts_mut(o.get().add(at), len) };
        let (a, b) = (&a[offs[0]..], &b[offs[1]..]);
        match (sa, sb) {
            (1, 1) => d
                .iter_mut()
                .zip(a.iter().zip(b))
                .for_each(|(d, (&x, &y))| *d = f(x, y) as u8),
            (1, 0) => d
                .iter_mut()
                .zip(a)
                .for_each(|(d, &x)| *d = f(x, b[0]) as u8),
            (0, 1) => d
                .iter_mut()
                .zip(b)
                .for_each(|(d, &y)| *d = f(a[0], y) as u8),
            _ => d
                .iter_mut()
                .enumerate()
                .for_each(|(k, d)| *d = f(a[k * sa], b[k * sb]) as u8),
        }
    });
}

/// `out = cond ? x : y` elementwise, broadcast as `walk` says (operands: cond, x, y).
/// `out` may be the buffer of `x` or `y` when that operand has the output's shape
/// (each element is read before it is written).
///
/// # Safety
/// `cond`, `x` and `y` must hold the walk's operand lengths and `out` its total; `out`
/// may overlap only an operand of the output's shape, element for element.
pub(crate) unsafe fn select<T: Copy + Send + Sync>(
    walk: &Walk,
    cond: *const u8,
    x: *const T,
    y: *const T,
    out: *mut T,
    pool: Option<&Pool>,
) {
    let (c, x, y, o) = (
        SyncPtr(cond as *mut u8),
        SyncPtr(x as *mut T),
        SyncPtr(y as *mut T),
        SyncPtr(out),
    );
    let [sc, sx, sy, _] = *walk.inner_strides();
    walk.for_each(pool, 1, |offs, at, len| {
        // SAFETY: the walk keeps each operand's offset `offs[k]` inside it and the run's
        // start `at` inside `out`'s total, which the contract sizes.
        let (c, x, y, d) = unsafe {
            (
                c.get().add(offs[0]),
                x.get().add(offs[1]),
                y.get().add(offs[2]),
                o.get().add(at),
            )
        };
        match (sc, sx, sy) {
            // Relu's gradient: a mask, the incoming gradient and a zero scalar.
            (1, 1, 0) => {
                // SAFETY: stride 0: `y` is one element of the y operand (walk offset).
                let y0 = unsafe { *y };
                for k in 0..len {
                    // SAFETY: `k < len`: cond and x run contiguously for the run's `len`
                    // elements, `d` is this run's own part of `out`; `x[k]` (maybe the
                    // same element) is read before `d[k]` is written.
                    unsafe { *d.add(k) = if *c.add(k) != 0 { *x.add(k) } else { y0 } };
                }
            }
            (1, 0, 1) => {
                // SAFETY: `x` has stride 0 here: one element inside the x operand.
                let x0 = unsafe { *x };
                for k in 0..len {
                    // SAFETY: cond, y and this run's part of `out` all run `len` elements
                    // at stride 1 and `k < len`; `y[k]` is read before `d[k]` is written.
                    unsafe { *d.add(k) = if *c.add(k) != 0 { x0 } else { *y.add(k) } };
                }
            }
            _ => {
                for k in 0..len {
                    // SAFETY: `k < len` at each operand's own stride stays inside it (the
                    // walk); `d + k` is in this run's part of `out`, written after reading.
                    unsafe {
                        *d.add(k) = if *c.add(k * sc) != 0 {
                            *x.add(k * sx)
                        } else {
                            *y.add(k * sy)
                        };
                    }
                }
            }
        }
    });
}

/// `out = (a op b) ? x : y` on f32 operands broadcast as `walk` says (a, b, x, y): a
/// `Fused` body of a comparison and a `Where` on its result (Relu's gradient once the
/// elementwise ops are fused). Works through blocks copied to the stack, so `out` may be
/// the buffer of any operand of the output's shape.
///
/// # Safety
/// The operands must hold the walk's lengths and `out` its total.
pub(crate) unsafe fn compare_select(
    op: CmpOp,
    walk: &Walk,
    operands: [*const f32; OPERANDS],
    out: *mut f32,
    pool: Option<&Pool>,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::backend::cpu::kernels::math::use_avx512(crate::backend::cpu::isa::isa())
        && walk.inner_strides().iter().all(|&s| s <= 1)
    {
        let ptrs = operands.map(|p| SyncPtr(p as *mut f32));
        let o = SyncPtr(out);
        let strides = *walk.inner_strides();
        walk.for_each(pool, 1, |offs, at, len| {
            let p: [*const f32; OPERANDS] = std::array::from_fn(|k| {
                // SAFETY: the walk keeps operand k's run offset `offs[k]` inside it.
                unsafe { ptrs[k].get().add(offs[k]) as *const f32 }
            });
            // SAFETY: `use_avx512` found AVX-512F; each `p[k]` holds the run's `len` floats
            // (stride 1) or one (stride 0), and `out + at` is this run's own `len` floats.
            unsafe { compare_select_avx512(op, p, strides, o.get().add(at), len) }
        });
        return;
    }
    // SAFETY: `compare_select_with` asks exactly this fn's contract, passed on unchanged.
    unsafe {
        match op {
            CmpOp::Equal => compare_select_with(|a, b| a == b, walk, operands, out, pool),
            CmpOp::Greater => compare_select_with(|a, b| a > b, walk, operands, out, pool),
            CmpOp::GreaterOrEqual => compare_select_with(|a, b| a >= b, walk, operands, out, pool),
            CmpOp::Less => compare_select_with(|a, b| a < b, walk, operands, out, pool),
            CmpOp::LessOrEqual => compare_select_with(|a, b| a <= b, walk, operands, out, pool),
        }
    }
}

/// One run of [`compare_select`] on sixteen lanes: operands with stride 0 (one value)
/// or 1; each vector's four operands are loaded before its result is stored, so `out`
/// may be an operand of the output's shape. The ordered comparisons are false on NaN,
/// as Rust's are.
///
/// # Safety
/// AVX-512F; operands readable for `len` floats where their stride is 1, else 1;
/// `out` writable for `len` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn compare_select_avx512(
    op: CmpOp,
    p: [*const f32; OPERANDS],
    strides: [usize; OPERANDS],
    out: *mut f32,
    len: usize,
) {
    use std::arch::x86_64::*;
    /// # Safety
    /// [`compare_select_avx512`]'s contract.
    #[inline(always)]
    unsafe fn run(
        cmp: impl Fn(__m512, __m512) -> __mmask16,
        p: [*const f32; OPERANDS],
        s: [usize; OPERANDS],
        out: *mut f32,
        len: usize,
    ) {
        let load = |k: usize, at: usize, m: __mmask16| {
            // SAFETY: operand k at stride 0 is one readable float; at stride 1 it holds
            // `len`, and mask `m` loads lanes `at..min(at + 16, len)` only; AVX-512F is
            // in the contract.
            unsafe {
                if s[k] == 0 {
                    _mm512_set1_ps(*p[k])
                } else {
                    _mm512_maskz_loadu_ps(m, p[k].add(at))
                }
            }
        };
        let mut at = 0;
        while at < len {
            let m: __mmask16 = if len - at >= 16 {
                u16::MAX
            } else {
                (1u16 << (len - at)) - 1
            };
            let take = cmp(load(0, at, m), load(1, at, m));
            // SAFETY: mask `m` stores only lanes below `len` of `out` (writable for `len`),
            // after all four operands' lanes are loaded; AVX-512F by the contract.
            unsafe {
                let v = _mm512_mask_blend_ps(take, load(3, at, m), load(2, at, m));
                _mm512_mask_storeu_ps(out.add(at), m, v);
            }
            at += 16;
        }
    }
    // `run` on one comparison, its closure checked outside `unsafe`.
    macro_rules! run {
        ($cmp:ident) => {{
            let cmp = |a, b| _mm512_cmp_ps_mask::<$cmp>(a, b);
            // SAFETY: `run`'s contract is this fn's, for the same pointers, strides and
            // length, which its caller upholds.
            unsafe { run(cmp, p, strides, out, len) }
        }};
    }
    match op {
        CmpOp::Equal => run!(_CMP_EQ_OQ),
        CmpOp::Greater => run!(_CMP_GT_OQ),
        CmpOp::GreaterOrEqual => run!(_CMP_GE_OQ),
        CmpOp::Less => run!(_CMP_LT_OQ),
        CmpOp::LessOrEqual => run!(_CMP_LE_OQ),
    }
}

/// [`compare_select`] through blocks copied to the stack, the comparison `f`.
///
/// # Safety
/// As for [`compare_select`].
unsafe fn compare_select_with(
    f: impl Fn(f32, f32) -> bool + Sync,
    walk: &Walk,
    operands: [*const f32; OPERANDS],
    out: *mut f32,
    pool: Option<&Pool>,
) {
    const BLOCK: usize = 256;
    let ptrs = operands.map(|p| SyncPtr(p as *mut f32));
    let o = SyncPtr(out);
    let strides = *walk.inner_strides();
    walk.for_each(pool, 1, |offs, at, len| {
        let mut start = 0;
        while start < len {
            let n = BLOCK.min(len - start);
            let mut buf = [[0.0f32; BLOCK]; OPERANDS];
            for k in 0..OPERANDS {
                let (p, s) = (ptrs[k].get(), strides[k]);
                // SAFETY: `start < len`, so `offs[k] + start·s` is still in operand k's run,
                // which the walk keeps inside the operand.
                let at = unsafe { p.add(offs[k] + start * s) };
                match s {
                    // SAFETY: stride 0: the run's one element, at `at`.
                    0 => buf[k][..n].fill(unsafe { *at }),
                    // SAFETY: stride 1: `n <= len - start` floats from `at` are the run's,
                    // copied into the local block `buf[k]` (BLOCK >= n floats).
                    1 => unsafe { std::ptr::copy_nonoverlapping(at, buf[k].as_mut_ptr(), n) },
                    _ => {
                        for (j, v) in buf[k][..n].iter_mut().enumerate() {
                            // SAFETY: element `j < n` of the run at stride `s`, in operand
                            // k by the walk.
                            *v = unsafe { *at.add(j * s) };
                        }
                    }
                }
            }
            let [a, b, x, y] = &buf;
            let mut res = [0.0f32; BLOCK];
            for j in 0..n {
                res[j] = if f(a[j], b[j]) { x[j] } else { y[j] };
            }
            // SAFETY: this run's part of `out`; every operand of the block was read.
            unsafe { std::ptr::copy_nonoverlapping(res.as_ptr(), o.get().add(at + start), n) };
            start += n;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{lcg_data, pools};
    use super::*;
    use crate::backend::broadcast::broadcast_strides;

    /// Every comparison, operands broadcast several ways, ragged lengths, NaNs, and the
    /// output written over x:
    /// the same as the comparison and choice done one element at a time.
    #[test]
    fn compare_select_matches_elementwise_choice() {
        let ops = [
            (
                CmpOp::Equal,
                (|a: f32, b: f32| a == b) as fn(f32, f32) -> bool,
            ),
            (CmpOp::Greater, |a, b| a > b),
            (CmpOp::GreaterOrEqual, |a, b| a >= b),
            (CmpOp::Less, |a, b| a < b),
            (CmpOp::LessOrEqual, |a, b| a <= b),
        ];
        let full: &[usize] = &[3, 37];
        let cases: &[[&[usize]; 4]] = &[
            [full, &[], full, &[]],
            [full, full, full, full],
            [&[], full, &[], full],
            [&[3, 1], &[37], full, &[1, 37]],
        ];
        for pool in pools() {
            for (op, f) in ops {
                for (c, shapes) in cases.iter().enumerate() {
                    let shapes = shapes.to_vec();
                    let mut data: Vec<Vec<f32>> = shapes
                        .iter()
                        .enumerate()
                        .map(|(k, s)| {
                            // Small integers, so that Equal is sometimes true.
                            let mut d: Vec<f32> = lcg_data(s.iter().product(), 3.0, k as u64)
                                .iter()
                                .map(|v| v.round())
                                .collect();
                            if d.len() > 5 {
                                d[5] = f32::NAN;
                            }
                            d
                        })
                        .collect();
                    let walk = Walk::new(&shapes, full).unwrap();
                    let at = |k: usize, i: usize, j: usize| -> f32 {
                        match shapes[k].len() {
                            0 => data[k][0],
                            _ if shapes[k] == [3, 1] => data[k][i],
                            _ if shapes[k] == [37] || shapes[k] == [1, 37] => data[k][j],
                            _ => data[k][i * 37 + j],
                        }
                    };
                    let want: Vec<f32> = (0..3 * 37)
                        .map(|e| {
                            let (i, j) = (e / 37, e % 37);
                            if f(at(0, i, j), at(1, i, j)) {
                                at(2, i, j)
                            } else {
                                at(3, i, j)
                            }
                        })
                        .collect();
                    let same = |got: &[f32]| {
                        got.iter()
                            .zip(&want)
                            .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()))
                    };
                    let mut got = vec![0.0; want.len()];
                    let ptrs: [*const f32; OPERANDS] = std::array::from_fn(|k| data[k].as_ptr());
                    // SAFETY: the walk was built from the operands' shapes; got holds the output.
                    unsafe { compare_select(op, &walk, ptrs, got.as_mut_ptr(), pool.as_ref()) };
                    assert!(same(&got), "{op:?} case {c}: {got:?} vs {want:?}");
                    if shapes[2] == full {
                        let x = data[2].as_mut_ptr();
                        let ptrs: [*const f32; OPERANDS] = std::array::from_fn(|k| {
                            if k == 2 {
                                x as *const f32
                            } else {
                                data[k].as_ptr()
                            }
                        });
                        // SAFETY: as above, with the output written over operand 2 (same shape).
                        unsafe { compare_select(op, &walk, ptrs, x, pool.as_ref()) };
                        assert!(same(&data[2]), "{op:?} case {c} in place");
                    }
                }
            }
        }
    }

    #[test]
    fn comparisons_and_selects_broadcast() {
        let cases: &[(&[usize], &[usize], &[usize])] = &[
            (&[5, 37], &[], &[5, 37]),
            (&[5, 1], &[7], &[5, 7]),
            (&[3, 1, 9], &[4, 1], &[3, 4, 9]),
            (&[70000], &[70000], &[70000]),
            (&[2, 3, 5], &[2, 1, 5], &[2, 3, 5]),
        ];
        for pool in pools() {
            for &(sa, sb, so) in cases {
                let n = |s: &[usize]| s.iter().product::<usize>();
                // Rounded so that equal values occur.
                let round = |v: Vec<f32>| v.iter().map(|x| (x * 4.0).round()).collect::<Vec<_>>();
                let a = round(lcg_data(n(sa), 1.0, 1));
                let b = round(lcg_data(n(sb), 1.0, 2));
                let walk = Walk::new(&[sa, sb], so).unwrap();
                let idx = |s: &[usize], o: usize| {
                    let st = broadcast_strides(s, so).unwrap();
                    let (mut rest, mut off) = (o, 0);
                    for i in (0..so.len()).rev() {
                        off += (rest % so[i]) * st[i];
                        rest /= so[i];
                    }
                    off
                };
                let mut out = vec![0u8; n(so)];
                compare(
                    CmpOp::GreaterOrEqual,
                    &walk,
                    &a,
                    &b,
                    &mut out,
                    pool.as_ref(),
                );
                for (o, &v) in out.iter().enumerate() {
                    assert_eq!(
                        v,
                        (a[idx(sa, o)] >= b[idx(sb, o)]) as u8,
                        "{sa:?} {sb:?} at {o}"
                    );
                }
                let cond: Vec<u8> = (0..n(sa)).map(|i| (a[i] > 0.0) as u8).collect();
                let walk3 = Walk::new(&[sa, sb, so], so).unwrap();
                let y = lcg_data(n(so), 1.0, 3);
                let mut got = vec![0f32; n(so)];
                // SAFETY: cond, b and y cover their shapes in walk3; got holds the output.
                unsafe {
                    select(
                        &walk3,
                        cond.as_ptr(),
                        b.as_ptr(),
                        y.as_ptr(),
                        got.as_mut_ptr(),
                        pool.as_ref(),
                    )
                };
                for (o, &v) in got.iter().enumerate() {
                    let want = if cond[idx(sa, o)] != 0 {
                        b[idx(sb, o)]
                    } else {
                        y[o]
                    };
                    assert_eq!(v, want, "{sa:?} {sb:?} at {o}");
                }
            }
        }
    }
}
