//! Normalizations. LayerNormalization over the last axis of a `[rows, n]` buffer (ONNX
//! semantics: each row's mean and biased variance, `y = (x - mean) / sqrt(var + eps) *
//! gamma + beta`); InstanceNormalization, the same per plane with one scale and bias per
//! channel (GroupNormalization imports as it); LpNormalization along any axis.
use super::math;
use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::pool::Pool;

/// The per-row statistics LayerNormalization may also output.
pub struct NormStats<'a> {
    /// `rows` means.
    pub mean: &'a mut [f32],
    /// `rows` values of 1/sqrt(var + eps).
    pub inv_std: &'a mut [f32],
}

/// LayerNormalization of each length-`n` row of `src` into `dst`; `gamma` (and `beta`
/// if given) hold `n` values. `stats`, if given, receives each row's mean and 1/σ.
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_norm(
    src: &[f32],
    dst: &mut [f32],
    rows: usize,
    n: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    stats: Option<NormStats<'_>>,
    pool: Option<&Pool>,
) {
    assert!(src.len() >= rows * n && dst.len() >= rows * n);
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    // SAFETY: `src` and `dst` are a shared and a mutable slice (so disjoint), each of
    // at least `rows · n` floats by the assert.
    unsafe { run(isa::isa(), s, d, rows, n, gamma, beta, eps, stats, pool) }
}

/// [`layer_norm`] on the path `isa` asks for.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_norm_isa(
    isa: Isa,
    src: &[f32],
    dst: &mut [f32],
    rows: usize,
    n: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    stats: Option<NormStats<'_>>,
    pool: Option<&Pool>,
) {
    assert!(src.len() >= rows * n && dst.len() >= rows * n);
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    // SAFETY: both slices hold `rows · n` floats or more (asserted), and `&`/`&mut`
    // slices never overlap.
    unsafe { run(isa, s, d, rows, n, gamma, beta, eps, stats, pool) }
}

/// [`layer_norm`] in place, on the path `isa` asks for.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn layer_norm_inplace_isa(
    isa: Isa,
    x: &mut [f32],
    rows: usize,
    n: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    stats: Option<NormStats<'_>>,
    pool: Option<&Pool>,
) {
    assert!(x.len() >= rows * n);
    let p = x.as_mut_ptr();
    // SAFETY: `p` is `x`'s, `rows · n` floats or more (asserted), read and written in place.
    unsafe { run(isa, p, p, rows, n, gamma, beta, eps, stats, pool) }
}

/// LayerNormalization of `rows` rows of `n` floats from `src` into `dst`.
///
/// # Safety
/// `src` readable and `dst` writable for `rows · n` floats, the same buffer or disjoint.
#[allow(clippy::too_many_arguments)]
unsafe fn run(
    isa: Isa,
    src: *const f32,
    dst: *mut f32,
    rows: usize,
    n: usize,
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    stats: Option<NormStats<'_>>,
    pool: Option<&Pool>,
) {
    assert!(gamma.len() >= n && beta.is_none_or(|b| b.len() >= n));
    let stats = stats.map(|s| {
        assert!(s.mean.len() >= rows && s.inv_std.len() >= rows);
        (
            SyncPtr(s.mean.as_mut_ptr()),
            SyncPtr(s.inv_std.as_mut_ptr()),
        )
    });
    if n == 0 {
        return;
    }
    let (src, dst) = (SyncPtr(src as *mut f32), SyncPtr(dst));
    let avx2 = math::use_avx2(isa);
    for_ranges(pool, rows, n * 3, &|r| {
        for i in r {
            // SAFETY: `i < rows`, so row i's offset `i · n` lies inside both buffers of
            // `rows · n` floats (the contract).
            let (s, d) = unsafe { (src.get().add(i * n) as *const f32, dst.get().add(i * n)) };
            let (g, b) = (gamma.as_ptr(), beta.map(|b| b.as_ptr()));
            let (mean, inv) = {
                #[cfg(target_arch = "x86_64")]
                if avx2 {
                    // SAFETY: `avx2` is `use_avx2(isa)`, true only with AVX2+FMA detected;
                    // `s`/`d` hold row i's n floats (tasks own disjoint rows), `g`/`b` n
                    // floats each (asserted).
                    unsafe { avx2_row(s, d, n, g, b, eps) }
                } else {
                    // SAFETY: row i's n floats at `s` and `d`, this task's alone, and
                    // gamma/beta's n floats (asserted at the top) are what it reads.
                    unsafe { scalar_row(s, d, n, g, b, eps) }
                }
                #[cfg(not(target_arch = "x86_64"))]
                {
                    let _ = avx2;
                    // SAFETY: portable build: the row pointers cover row i's n floats,
                    // `g`/`b` n floats (asserted), as `scalar_row` needs.
                    unsafe { scalar_row(s, d, n, g, b, eps) }
                }
            };
            if let Some((m, v)) = stats {
                // SAFETY: i < rows, and both stats slices hold rows floats (asserted).
                unsafe {
                    *m.get().add(i) = mean;
                    *v.get().add(i) = inv;
                }
            }
        }
    });
}

/// # Safety
/// `s` readable, `d` writable (maybe the same), `g` and `b` readable, for `n` floats.
unsafe fn scalar_row(
    s: *const f32,
    d: *mut f32,
    n: usize,
    g: *const f32,
    b: Option<*const f32>,
    eps: f32,
) -> (f32, f32) {
    let mut sum = 0.0f32;
    for j in 0..n {
        // SAFETY: `j < n`, and `s` is readable for `n` floats (contract).
        sum += unsafe { *s.add(j) };
    }
    let mean = sum / n as f32;
    let mut ss = 0.0f32;
    for j in 0..n {
        // SAFETY: `s[j]` with `j < n` again, the second pass over the row.
        let c = unsafe { *s.add(j) } - mean;
        ss += c * c;
    }
    let inv = 1.0 / (ss / n as f32 + eps).sqrt();
    for j in 0..n {
        // SAFETY: `j < n`: `s`, `g` (and `b`) are readable and `d` writable for `n`
        // floats; element j of `s` is read before `d` (maybe `s`) is written there.
        unsafe {
            let y = (*s.add(j) - mean) * inv * *g.add(j);
            *d.add(j) = match b {
                Some(b) => y + *b.add(j),
                None => y,
            };
        }
    }
    (mean, inv)
}

/// # Safety
/// AVX2+FMA; as [`scalar_row`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_row(
    s: *const f32,
    d: *mut f32,
    n: usize,
    g: *const f32,
    b: Option<*const f32>,
    eps: f32,
) -> (f32, f32) {
    use super::softmax::hsum;
    use std::arch::x86_64::*;
    let body = n / 8 * 8;
    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut j = 0;
    while j + 16 <= body {
        // SAFETY: `j + 16 <= body <= n` by the loop bound; `s` holds `n` floats.
        unsafe {
            a0 = _mm256_add_ps(a0, _mm256_loadu_ps(s.add(j)));
            a1 = _mm256_add_ps(a1, _mm256_loadu_ps(s.add(j + 8)));
        }
        j += 16;
    }
    if j < body {
        // SAFETY: `body` is a multiple of 8 and `j < body`, so `s[j..j + 8]` is in the row.
        a0 = _mm256_add_ps(a0, unsafe { _mm256_loadu_ps(s.add(j)) });
    }
    let mut sum = hsum(_mm256_add_ps(a0, a1));
    for j in body..n {
        // SAFETY: the tail `body <= j < n` of `s`'s `n` floats.
        sum += unsafe { *s.add(j) };
    }
    let mean = sum / n as f32;
    let vm = _mm256_set1_ps(mean);
    let (mut q0, mut q1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    j = 0;
    while j + 16 <= body {
        // SAFETY: the second pass: 16 floats `j..j + 16` of `s`, below `body <= n`.
        let (x0, x1) = unsafe { (_mm256_loadu_ps(s.add(j)), _mm256_loadu_ps(s.add(j + 8))) };
        let c0 = _mm256_sub_ps(x0, vm);
        let c1 = _mm256_sub_ps(x1, vm);
        q0 = _mm256_fmadd_ps(c0, c0, q0);
        q1 = _mm256_fmadd_ps(c1, c1, q1);
        j += 16;
    }
    if j < body {
        // SAFETY: one last full vector: `j < body`, both multiples of 8, `body <= n`.
        let c0 = _mm256_sub_ps(unsafe { _mm256_loadu_ps(s.add(j)) }, vm);
        q0 = _mm256_fmadd_ps(c0, c0, q0);
    }
    let mut ss = hsum(_mm256_add_ps(q0, q1));
    for j in body..n {
        // SAFETY: `j` in the scalar tail `body..n` of the row at `s`.
        let c = unsafe { *s.add(j) } - mean;
        ss += c * c;
    }
    let inv = 1.0 / (ss / n as f32 + eps).sqrt();
    let vi = _mm256_set1_ps(inv);
    j = 0;
    while j < body {
        // SAFETY: `j + 8 <= body <= n` (`body` a multiple of 8): `s`, `g` (and `b`) are
        // readable and `d` writable there (contract); `s[j..]` is loaded before `d[j..]`,
        // maybe the same floats, is stored.
        unsafe {
            let c = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(s.add(j)), vm), vi);
            let y = match b {
                Some(b) => _mm256_fmadd_ps(c, _mm256_loadu_ps(g.add(j)), _mm256_loadu_ps(b.add(j))),
                None => _mm256_mul_ps(c, _mm256_loadu_ps(g.add(j))),
            };
            _mm256_storeu_ps(d.add(j), y);
        }
        j += 8;
    }
    for j in body..n {
        // SAFETY: scalar tail `body <= j < n` of the row: read `s`, `g`, `b`, then write
        // `d`, all `n` floats long (contract).
        unsafe {
            let y = (*s.add(j) - mean) * inv * *g.add(j);
            *d.add(j) = match b {
                Some(b) => y + *b.add(j),
                None => y,
            };
        }
    }
    (mean, inv)
}

/// Sum of `f(v)` over `x` in 16 f32 lanes per block of 1,024 values, the blocks summed
/// in f64: vectorizable, and a plane of 10⁵ values keeps its digits.
fn blocked_sum(x: &[f32], f: impl Fn(f32) -> f32) -> f64 {
    let mut total = 0.0f64;
    for block in x.chunks(1024) {
        let mut lanes = [0.0f32; 16];
        let mut chunks = block.chunks_exact(16);
        for c in &mut chunks {
            for (l, &v) in lanes.iter_mut().zip(c) {
                *l += f(v);
            }
        }
        for (l, &v) in lanes.iter_mut().zip(chunks.remainder()) {
            *l += f(v);
        }
        total += lanes.iter().map(|&l| l as f64).sum::<f64>();
    }
    total
}

/// InstanceNormalization of `rows` planes of `n` floats, plane r with channel
/// `r % channels`'s scale and bias: `y = (x - mean) · scale / sqrt(var + eps) + bias`
/// (biased variance, two passes).
#[allow(clippy::too_many_arguments)]
pub(crate) fn instance_norm(
    src: &[f32],
    dst: &mut [f32],
    rows: usize,
    n: usize,
    scale: &[f32],
    bias: &[f32],
    eps: f64,
    pool: Option<&Pool>,
) {
    let channels = scale.len();
    assert!(src.len() >= rows * n && dst.len() >= rows * n);
    assert!(channels > 0 && bias.len() == channels);
    if n == 0 {
        return;
    }
    let out = SyncPtr(dst.as_mut_ptr());
    for_ranges(pool, rows, n * 4, &|r| {
        for row in r {
            let x = &src[row * n..(row + 1) * n];
            // SAFETY: row < rows; tasks write disjoint rows of dst (asserted long enough).
            let y = unsafe { std::slice::from_raw_parts_mut(out.get().add(row * n), n) };
            let mean = blocked_sum(x, |v| v) / n as f64;
            let m = mean as f32;
            let var = blocked_sum(x, |v| (v - m) * (v - m)) / n as f64;
            let c = row % channels;
            let k = (scale[c] as f64 / (var + eps).sqrt()) as f32;
            let b = bias[c];
            for (y, &x) in y.iter_mut().zip(x) {
                *y = (x - m) * k + b;
            }
        }
    });
}

/// LpNormalization (p = 1 or 2) along the middle axis of `[outer, len, inner]`: each
/// lane divided by its norm, a zero lane left zero. `norms` is scratch for `inner`
/// values per task (`outer` tasks at most: give `outer · inner`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn lp_norm(
    src: &[f32],
    dst: &mut [f32],
    [outer, len, inner]: [usize; 3],
    p: u32,
    norms: &mut [f32],
    pool: Option<&Pool>,
) {
    let plane = len * inner;
    if outer * plane == 0 {
        return;
    }
    assert!(src.len() >= outer * plane && dst.len() >= outer * plane);
    assert!(norms.len() >= outer * inner);
    let (out, scratch) = (SyncPtr(dst.as_mut_ptr()), SyncPtr(norms.as_mut_ptr()));
    for_ranges(pool, outer, plane * 3, &|r| {
        for o in r {
            let x = &src[o * plane..(o + 1) * plane];
            // SAFETY: o < outer; tasks write disjoint planes of dst and their own inner
            // floats of the scratch (both asserted long enough).
            let (y, norm) = unsafe {
                (
                    std::slice::from_raw_parts_mut(out.get().add(o * plane), plane),
                    std::slice::from_raw_parts_mut(scratch.get().add(o * inner), inner),
                )
            };
            // Lanes run along `len`, `inner` apart: accumulate whole rows of `inner`.
            norm.fill(0.0);
            for row in x.chunks_exact(inner) {
                for (s, &v) in norm.iter_mut().zip(row) {
                    *s += if p == 1 { v.abs() } else { v * v };
                }
            }
            if p != 1 {
                norm.iter_mut().for_each(|s| *s = s.sqrt());
            }
            for (yr, xr) in y.chunks_exact_mut(inner).zip(x.chunks_exact(inner)) {
                for ((y, &x), &s) in yr.iter_mut().zip(xr).zip(&*norm) {
                    *y = if s == 0.0 { 0.0 } else { x / s };
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::math::tests::isas;
    use crate::backend::cpu::kernels::testutil::{lcg_data, pools};
    use crate::ir::ops::{self, EvalCtx};
    use crate::ir::{Attr, Attrs};
    use crate::tensor::Tensor;

    /// Against the interpreter's LayerNormalization: |err| ≤ 2e-5 · (1 + |want|).
    #[test]
    fn matches_interpreter_op() {
        for pool in pools() {
            for isa in isas() {
                for &(rows, n) in &[(1, 1), (3, 7), (4, 9), (2, 33), (5, 100), (200, 300)] {
                    let x = lcg_data(rows * n, 3.0, n as u64);
                    // An offset mean checks the two-pass variance.
                    let x: Vec<f32> = x.iter().map(|v| v + 10.0).collect();
                    let g = lcg_data(n, 2.0, 99);
                    let b = lcg_data(n, 1.0, 98);
                    for with_beta in [false, true] {
                        let xt = Tensor::from_vec(&[rows, n], x.clone()).unwrap();
                        let gt = Tensor::from_vec(&[n], g.clone()).unwrap();
                        let bt = Tensor::from_vec(&[n], b.clone()).unwrap();
                        let mut attrs = Attrs::new();
                        attrs.set("epsilon", Attr::Float(1e-3));
                        let cx = EvalCtx {
                            inputs: &[Some(&xt), Some(&gt), with_beta.then_some(&bt)],
                            input_types: &[None, None, None],
                            attrs: &attrs,
                        };
                        let outs = ops::lookup("LayerNormalization")
                            .unwrap()
                            .eval(&cx)
                            .unwrap();
                        let mut y = vec![0.0; rows * n];
                        let (mut m, mut s) = (vec![0.0; rows], vec![0.0; rows]);
                        let bopt = with_beta.then_some(&b[..]);
                        let stats = NormStats {
                            mean: &mut m,
                            inv_std: &mut s,
                        };
                        layer_norm_isa(
                            isa,
                            &x,
                            &mut y,
                            rows,
                            n,
                            &g,
                            bopt,
                            1e-3,
                            Some(stats),
                            pool.as_ref(),
                        );
                        let mut z = x.clone();
                        layer_norm_inplace_isa(
                            isa,
                            &mut z,
                            rows,
                            n,
                            &g,
                            bopt,
                            1e-3,
                            None,
                            pool.as_ref(),
                        );
                        assert_eq!(y, z);
                        for (got, want) in [(&y, &outs[0]), (&m, &outs[1]), (&s, &outs[2])] {
                            for (a, w) in got.iter().zip(want.to_f64_vec()) {
                                assert!(
                                    (*a as f64 - w).abs() <= 2e-5 * (1.0 + w.abs()),
                                    "{} rows={rows} n={n}: {a} vs {w}",
                                    isa.name()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
