//! Softmax and LogSoftmax over the last axis of a `[rows, n]` buffer, or over the middle
//! axis of an `[outer, n, inner]` one.
use super::math;
use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::pool::Pool;

/// Softmax of each length-`n` row of `src` into `dst`.
pub(crate) fn softmax(src: &[f32], dst: &mut [f32], rows: usize, n: usize, pool: Option<&Pool>) {
    softmax_isa(isa::isa(), src, dst, rows, n, pool)
}

/// LogSoftmax of each length-`n` row of `src` into `dst`.
pub(crate) fn log_softmax(
    src: &[f32],
    dst: &mut [f32],
    rows: usize,
    n: usize,
    pool: Option<&Pool>,
) {
    log_softmax_isa(isa::isa(), src, dst, rows, n, pool)
}

/// [`softmax`] on the path `isa` asks for.
pub(crate) fn softmax_isa(
    isa: Isa,
    src: &[f32],
    dst: &mut [f32],
    rows: usize,
    n: usize,
    pool: Option<&Pool>,
) {
    assert!(src.len() >= rows * n && dst.len() >= rows * n);
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    // SAFETY: a `&` and a `&mut` slice, disjoint, of `rows · n` floats at least (asserted).
    unsafe { run(isa, s, d, rows, n, false, pool) }
}

/// Softmax of each length-`n` row of `x`, in place, on the path `isa` asks for.
pub(crate) fn softmax_inplace_isa(
    isa: Isa,
    x: &mut [f32],
    rows: usize,
    n: usize,
    pool: Option<&Pool>,
) {
    assert!(x.len() >= rows * n);
    let p = x.as_mut_ptr();
    // SAFETY: `p` is `x`'s `rows · n` floats (asserted), softmaxed in place.
    unsafe { run(isa, p, p, rows, n, false, pool) }
}

/// [`log_softmax`] on the path `isa` asks for.
pub(crate) fn log_softmax_isa(
    isa: Isa,
    src: &[f32],
    dst: &mut [f32],
    rows: usize,
    n: usize,
    pool: Option<&Pool>,
) {
    assert!(src.len() >= rows * n && dst.len() >= rows * n);
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    // SAFETY: the assert gives both slices `rows · n` floats; `&` and `&mut` are disjoint.
    unsafe { run(isa, s, d, rows, n, true, pool) }
}

/// LogSoftmax of each length-`n` row of `x`, in place, on the path `isa` asks for.
#[cfg(test)]
pub(crate) fn log_softmax_inplace_isa(
    isa: Isa,
    x: &mut [f32],
    rows: usize,
    n: usize,
    pool: Option<&Pool>,
) {
    assert!(x.len() >= rows * n);
    let p = x.as_mut_ptr();
    // SAFETY: in place over `x`, whose length is at least `rows · n` (asserted).
    unsafe { run(isa, p, p, rows, n, true, pool) }
}

/// Softmax (LogSoftmax if `log`) of each length-`n` row of `src` into `dst`.
///
/// # Safety
/// `src` and `dst` hold `rows · n` floats and are either the same buffer or disjoint.
unsafe fn run(
    isa: Isa,
    src: *const f32,
    dst: *mut f32,
    rows: usize,
    n: usize,
    log: bool,
    pool: Option<&Pool>,
) {
    if n == 0 {
        return;
    }
    let (src, dst) = (SyncPtr(src as *mut f32), SyncPtr(dst));
    let avx2 = math::use_avx2(isa);
    for_ranges(pool, rows, n * 4, &|r| {
        for i in r {
            // SAFETY: row i < rows starts `i · n` floats into both `rows · n` buffers.
            let (s, d) = unsafe { (src.get().add(i * n) as *const f32, dst.get().add(i * n)) };
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: `avx2` came from `use_avx2`, which checked AVX2+FMA; row i's n
                // floats at `s`/`d` belong to this task alone.
                unsafe { avx2_row(s, d, n, log) };
                continue;
            }
            let _ = avx2;
            // SAFETY: `s` and `d` point at row i, n floats inside both buffers (contract),
            // and no other task touches row i.
            unsafe { scalar_row(s, d, n, log) };
        }
    });
}

/// Lanes of the strided form reduced together (on the stack).
const LANES: usize = 64;

/// Softmax (or LogSoftmax if `log`) along the middle axis of `[outer, n, inner]`:
/// each of the `outer·inner` lanes (stride `inner`) on its own, `LANES` neighbouring
/// lanes at once so the loops run over contiguous memory. Panics unless `src` and `dst`
/// hold at least `outer·n·inner` floats.
pub(crate) fn softmax_strided(
    src: &[f32],
    dst: &mut [f32],
    [outer, n, inner]: [usize; 3],
    log: bool,
    pool: Option<&Pool>,
) {
    let len = outer * n * inner;
    assert!(
        src.len() >= len && dst.len() >= len,
        "softmax_strided: {} and {} floats for [{outer}, {n}, {inner}]",
        src.len(),
        dst.len()
    );
    if len == 0 {
        return;
    }
    // The tasks write disjoint rows of `dst`, so they share it as a pointer.
    let (src, dst) = (SyncPtr(src.as_ptr() as *mut f32), SyncPtr(dst.as_mut_ptr()));
    for_ranges(pool, outer, n * inner * 4, &|r| {
        let (mut max, mut sum) = ([0f32; LANES], [0f32; LANES]);
        for o in r {
            for c0 in (0..inner).step_by(LANES) {
                let w = LANES.min(inner - c0);
                let at = |i: usize| (o * n + i) * inner + c0;
                let (s, d) = (src.get() as *const f32, dst.get());
                max[..w].fill(f32::NEG_INFINITY);
                sum[..w].fill(0.0);
                for i in 0..n {
                    // SAFETY: `at(i) + w <= (o·n + i + 1)·inner`, inside `src`, whose length
                    // was asserted; only reads, and only for this loop.
                    let x = unsafe { std::slice::from_raw_parts(s.add(at(i)), w) };
                    for (m, &v) in max[..w].iter_mut().zip(x) {
                        *m = m.max(v);
                    }
                }
                for i in 0..n {
                    // SAFETY: row i's lane block starts at `at(i)`, inside both buffers
                    // (their lengths asserted at least `outer·n·inner`).
                    let (x, y) = unsafe { (s.add(at(i)), d.add(at(i))) };
                    for k in 0..w {
                        // SAFETY: `k < w`, so `x + k` is in the lane block just offset.
                        let e = math::exp(unsafe { *x.add(k) } - max[k]);
                        sum[k] += e;
                        if !log {
                            // SAFETY: `y + k`, `k < w`, in `dst`'s row o, which this task
                            // owns; `x[k]` was read just before.
                            unsafe { *y.add(k) = e };
                        }
                    }
                }
                for k in 0..w {
                    sum[k] = if log {
                        max[k] + sum[k].ln()
                    } else {
                        1.0 / sum[k]
                    };
                }
                for i in 0..n {
                    // SAFETY: `at(i)` is the same in-bounds lane block offset as above.
                    let (x, y) = unsafe { (s.add(at(i)), d.add(at(i))) };
                    for (k, &t) in sum[..w].iter().enumerate() {
                        // SAFETY: `k < w` (`sum[..w]`): element k of row i's block, in
                        // both buffers; this task owns row o of `dst`.
                        unsafe { *y.add(k) = if log { *x.add(k) - t } else { *y.add(k) * t } };
                    }
                }
            }
        }
    });
}

/// # Safety
/// `s` readable and `d` writable for `n` floats (possibly the same).
unsafe fn scalar_row(s: *const f32, d: *mut f32, n: usize, log: bool) {
    let mut max = f32::NEG_INFINITY;
    for j in 0..n {
        // SAFETY: `j < n`, and `s` is readable for `n` floats.
        max = max.max(unsafe { *s.add(j) });
    }
    let mut sum = 0.0f32;
    if log {
        for j in 0..n {
            // SAFETY: `s[j]`, `j < n`: the sum pass of LogSoftmax.
            sum += math::exp(unsafe { *s.add(j) } - max);
        }
        let k = max + sum.ln();
        for j in 0..n {
            // SAFETY: `j < n`: read `s[j]`, then write `d[j]` (maybe the same float).
            unsafe { *d.add(j) = *s.add(j) - k };
        }
    } else {
        for j in 0..n {
            // SAFETY: `s[j]` with `j < n`, read before `d[j]` is written below.
            let e = math::exp(unsafe { *s.add(j) } - max);
            // SAFETY: `d` is writable for `n` floats and `j < n`.
            unsafe { *d.add(j) = e };
            sum += e;
        }
        let k = 1.0 / sum;
        for j in 0..n {
            // SAFETY: `d[j]`, `j < n`, written by the loop above: scaled in place.
            unsafe { *d.add(j) *= k };
        }
    }
}

/// # Safety
/// AVX2+FMA; `s` readable and `d` writable for `n` floats (possibly the same).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_row(s: *const f32, d: *mut f32, n: usize, log: bool) {
    use std::arch::x86_64::*;
    let body = n / 8 * 8;
    // Max: vector lanes, then the tail.
    let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut j = 0;
    while j < body {
        // SAFETY: `j + 8 <= body <= n` (`body` a multiple of 8) and `s` holds `n` floats.
        vmax = _mm256_max_ps(vmax, unsafe { _mm256_loadu_ps(s.add(j)) });
        j += 8;
    }
    let mut max = hmax(vmax);
    for j in body..n {
        // SAFETY: the tail `body <= j < n` of `s`.
        max = max.max(unsafe { *s.add(j) });
    }
    let vm = _mm256_set1_ps(max);
    let mut vsum = _mm256_setzero_ps();
    j = 0;
    while j < body {
        // SAFETY: the exp pass reads `s[j..j + 8]`, below `body <= n`.
        let e = math::avx2::exp(_mm256_sub_ps(unsafe { _mm256_loadu_ps(s.add(j)) }, vm));
        if !log {
            // SAFETY: `d[j..j + 8]`, below `body <= n`, after `s[j..j + 8]` was read.
            unsafe { _mm256_storeu_ps(d.add(j), e) };
        }
        vsum = _mm256_add_ps(vsum, e);
        j += 8;
    }
    let mut sum = hsum(vsum);
    if body < n {
        // The tail through one padded vector, so that it gets the same exp.
        let mut buf = [f32::NEG_INFINITY; 8];
        // SAFETY: the `n - body < 8` tail floats of `s` into the local `buf` of 8.
        unsafe { std::ptr::copy_nonoverlapping(s.add(body), buf.as_mut_ptr(), n - body) };
        // SAFETY: `buf` is a local array of 8 floats, exactly one vector to load and store.
        unsafe {
            let e = math::avx2::exp(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), vm));
            _mm256_storeu_ps(buf.as_mut_ptr(), e);
        }
        for (k, &v) in buf[..n - body].iter().enumerate() {
            sum += v;
            if !log {
                // SAFETY: `body + k < n` as `k < n - body`; `d` holds `n` floats.
                unsafe { *d.add(body + k) = v };
            }
        }
    }
    if log {
        let k = _mm256_set1_ps(max + sum.ln());
        j = 0;
        while j < body {
            // SAFETY: `j + 8 <= body <= n`: load `s[j..j + 8]`, store `d[j..j + 8]`.
            unsafe { _mm256_storeu_ps(d.add(j), _mm256_sub_ps(_mm256_loadu_ps(s.add(j)), k)) };
            j += 8;
        }
        let k = max + sum.ln();
        for j in body..n {
            // SAFETY: the LogSoftmax tail, `body <= j < n`, in both rows.
            unsafe { *d.add(j) = *s.add(j) - k };
        }
    } else {
        let k = 1.0 / sum;
        let vk = _mm256_set1_ps(k);
        j = 0;
        while j < body {
            // SAFETY: `d[j..j + 8]`, `j + 8 <= body <= n`, rescaled in place.
            unsafe { _mm256_storeu_ps(d.add(j), _mm256_mul_ps(_mm256_loadu_ps(d.add(j)), vk)) };
            j += 8;
        }
        for j in body..n {
            // SAFETY: `d[j]` for `body <= j < n`, the tail written above.
            unsafe { *d.add(j) *= k };
        }
    }
}

/// The largest lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hmax(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
    _mm_cvtss_f32(m)
}

/// The sum of the lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hsum(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_add_ss(m, _mm_shuffle_ps::<1>(m, m));
    _mm_cvtss_f32(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::math::tests::isas;
    use crate::backend::cpu::kernels::testutil::{lcg_data, pools};

    fn reference(x: &[f32], n: usize, log: bool) -> Vec<f64> {
        let mut out = vec![];
        for row in x.chunks(n) {
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
            out.extend(row.iter().map(|&v| {
                if log {
                    v as f64 - max - sum.ln()
                } else {
                    (v as f64 - max).exp() / sum
                }
            }));
        }
        out
    }

    /// Softmax: 4e-6 relative + 1e-9 absolute; LogSoftmax: 2e-6 relative + 2e-6 absolute.
    #[test]
    fn matches_f64_reference() {
        for pool in pools() {
            for isa in isas() {
                for &(rows, n) in &[(1, 1), (3, 7), (5, 9), (2, 33), (7, 100), (300, 257)] {
                    let x = lcg_data(rows * n, 8.0, rows as u64 * 31 + n as u64);
                    for log in [false, true] {
                        let want = reference(&x, n, log);
                        let mut y = vec![0.0; rows * n];
                        let mut z = x.clone();
                        if log {
                            log_softmax_isa(isa, &x, &mut y, rows, n, pool.as_ref());
                            log_softmax_inplace_isa(isa, &mut z, rows, n, pool.as_ref());
                        } else {
                            softmax_isa(isa, &x, &mut y, rows, n, pool.as_ref());
                            softmax_inplace_isa(isa, &mut z, rows, n, pool.as_ref());
                        }
                        assert_eq!(y, z, "in place differs");
                        for (g, w) in y.iter().zip(&want) {
                            let tol = if log {
                                2e-6 + 2e-6 * w.abs()
                            } else {
                                1e-9 + 4e-6 * w
                            };
                            assert!(
                                (*g as f64 - w).abs() <= tol,
                                "{} rows={rows} n={n} log={log}: {g} vs {w}",
                                isa.name()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn matches_interpreter_op() {
        use crate::ir::ops::{self, EvalCtx};
        use crate::ir::Attrs;
        use crate::tensor::Tensor;
        let (rows, n) = (6, 21);
        let x = lcg_data(rows * n, 5.0, 7);
        let t = Tensor::from_vec(&[2, 3, n], x.clone()).unwrap();
        for (name, log) in [("Softmax", false), ("LogSoftmax", true)] {
            let attrs = Attrs::new();
            let cx = EvalCtx {
                inputs: &[Some(&t)],
                input_types: &[None],
                attrs: &attrs,
            };
            let want = ops::lookup(name).unwrap().eval(&cx).unwrap()[0].to_f64_vec();
            let mut y = vec![0.0; rows * n];
            if log {
                log_softmax(&x, &mut y, rows, n, None);
            } else {
                softmax(&x, &mut y, rows, n, None);
            }
            for (g, w) in y.iter().zip(&want) {
                assert!((*g as f64 - w).abs() <= 2e-6 + 2e-6 * w.abs(), "{name}");
            }
        }
    }
}
