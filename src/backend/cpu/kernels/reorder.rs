//! Reorders between plain `[N, C, S]` (S = the product of the spatial dims) and blocked
//! `[N, ceil(C/b), S, b]` layouts, for any block size b. Blocking writes zeros in the
//! pad lanes of the last channel block; unblocking ignores them.
use super::math;
use super::par::{for_ranges, SyncPtr};
use crate::backend::cpu::isa::{self, Isa};
use crate::backend::cpu::pool::Pool;

/// Spatial positions per tile: keeps a tile of b source rows in L1.
const TILE: usize = 64;

/// Plain `src` [n, c, spatial] to blocked `dst` [n, ceil(c/block), spatial, block].
pub(crate) fn to_blocked(
    src: &[f32],
    dst: &mut [f32],
    n: usize,
    c: usize,
    spatial: usize,
    block: usize,
    pool: Option<&Pool>,
) {
    to_blocked_isa(isa::isa(), src, dst, n, c, spatial, block, pool)
}

/// [`to_blocked`] on the path `isa` asks for.
#[allow(clippy::too_many_arguments)]
pub(crate) fn to_blocked_isa(
    isa: Isa,
    src: &[f32],
    dst: &mut [f32],
    n: usize,
    c: usize,
    spatial: usize,
    block: usize,
    pool: Option<&Pool>,
) {
    assert!(block > 0);
    let cb = c.div_ceil(block);
    assert!(src.len() >= n * c * spatial && dst.len() >= n * cb * spatial * block);
    let dp = SyncPtr(dst.as_mut_ptr());
    let avx2 = math::use_avx2(isa) && block.is_multiple_of(8);
    for_ranges(pool, n * cb, spatial * block, &|r| {
        for nb in r {
            let (ni, bi) = (nb / cb, nb % cb);
            let c0 = bi * block;
            let lanes = block.min(c - c0);
            // SAFETY: each task writes only its own blocks of dst.
            let out = unsafe {
                std::slice::from_raw_parts_mut(dp.get().add(nb * spatial * block), spatial * block)
            };
            let rows = &src[(ni * c + c0) * spatial..(ni * c + c0 + lanes) * spatial];
            for s0 in (0..spatial).step_by(TILE) {
                let s1 = (s0 + TILE).min(spatial);
                #[cfg(target_arch = "x86_64")]
                if avx2 && lanes == block {
                    let mut s = s0;
                    while s + 8 <= s1 {
                        for l0 in (0..block).step_by(8) {
                            // SAFETY: AVX2 checked; rows l0..l0+8 hold spatial floats
                            // from s, and out has block floats per position.
                            unsafe {
                                transpose8(
                                    rows.as_ptr().add(l0 * spatial + s),
                                    spatial,
                                    out.as_mut_ptr().add(s * block + l0),
                                    block,
                                )
                            };
                        }
                        s += 8;
                    }
                    for s in s..s1 {
                        for l in 0..block {
                            out[s * block + l] = rows[l * spatial + s];
                        }
                    }
                    continue;
                }
                let _ = avx2;
                for s in s0..s1 {
                    let px = &mut out[s * block..(s + 1) * block];
                    for (l, v) in px[..lanes].iter_mut().enumerate() {
                        *v = rows[l * spatial + s];
                    }
                    px[lanes..].fill(0.0);
                }
            }
        }
    });
}

/// Blocked `src` [n, ceil(c/block), spatial, block] to plain `dst` [n, c, spatial].
pub(crate) fn to_plain(
    src: &[f32],
    dst: &mut [f32],
    n: usize,
    c: usize,
    spatial: usize,
    block: usize,
    pool: Option<&Pool>,
) {
    to_plain_isa(isa::isa(), src, dst, n, c, spatial, block, pool)
}

/// [`to_plain`] on the path `isa` asks for.
#[allow(clippy::too_many_arguments)]
pub(crate) fn to_plain_isa(
    isa: Isa,
    src: &[f32],
    dst: &mut [f32],
    n: usize,
    c: usize,
    spatial: usize,
    block: usize,
    pool: Option<&Pool>,
) {
    assert!(block > 0);
    let cb = c.div_ceil(block);
    assert!(src.len() >= n * cb * spatial * block && dst.len() >= n * c * spatial);
    let dp = SyncPtr(dst.as_mut_ptr());
    let avx2 = math::use_avx2(isa) && block.is_multiple_of(8);
    for_ranges(pool, n * cb, spatial * block, &|r| {
        for nb in r {
            let (ni, bi) = (nb / cb, nb % cb);
            let c0 = bi * block;
            let lanes = block.min(c - c0);
            let inp = &src[nb * spatial * block..(nb + 1) * spatial * block];
            // SAFETY: each task writes only the channels of its own blocks.
            let rows = unsafe {
                std::slice::from_raw_parts_mut(
                    dp.get().add((ni * c + c0) * spatial),
                    lanes * spatial,
                )
            };
            for s0 in (0..spatial).step_by(TILE) {
                let s1 = (s0 + TILE).min(spatial);
                #[cfg(target_arch = "x86_64")]
                if avx2 && lanes == block {
                    let mut s = s0;
                    while s + 8 <= s1 {
                        for l0 in (0..block).step_by(8) {
                            // SAFETY: AVX2 checked; 8 positions × 8 lanes inside inp,
                            // 8 channel rows × 8 positions inside rows.
                            unsafe {
                                transpose8(
                                    inp.as_ptr().add(s * block + l0),
                                    block,
                                    rows.as_mut_ptr().add(l0 * spatial + s),
                                    spatial,
                                )
                            };
                        }
                        s += 8;
                    }
                    for s in s..s1 {
                        for l in 0..block {
                            rows[l * spatial + s] = inp[s * block + l];
                        }
                    }
                    continue;
                }
                let _ = avx2;
                for l in 0..lanes {
                    for s in s0..s1 {
                        rows[l * spatial + s] = inp[s * block + l];
                    }
                }
            }
        }
    });
}

/// Transposes an 8×8 tile: row r of `src` (stride `ss`) becomes column r of `dst`
/// (stride `ds`).
///
/// # Safety
/// AVX2; 8 rows of 8 floats readable at `src` and writable at `dst` with those strides.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose8(src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
    use std::arch::x86_64::*;
    // SAFETY: rows i < 8 of the tile, 8 floats each at src + i·ss (the contract).
    let r: [__m256; 8] = unsafe { std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * ss))) };
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    let o = [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ];
    for (i, v) in o.iter().enumerate() {
        // SAFETY: column i < 8 of the tile is row i of dst: 8 writable floats at
        // dst + i·ds (the contract).
        unsafe { _mm256_storeu_ps(dst.add(i * ds), *v) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::math::tests::isas;
    use crate::backend::cpu::kernels::testutil::{lcg_data, pools};
    use crate::ir::ops::{self, EvalCtx};
    use crate::ir::{Attr, Attrs};
    use crate::tensor::Tensor;

    #[test]
    fn round_trip_and_matches_interpreter() {
        for pool in pools() {
            for isa in isas() {
                for &(n, c, ref sp) in &[
                    (1usize, 3usize, vec![5usize]),
                    (2, 20, vec![7, 9]),
                    (1, 16, vec![8, 8]),
                    (2, 33, vec![3, 4, 5]),
                    (1, 64, vec![67, 70]),
                ] {
                    let s: usize = sp.iter().product();
                    let x = lcg_data(n * c * s, 1.0, c as u64);
                    for block in [4, 8, 16] {
                        let cb = c.div_ceil(block);
                        let mut b = vec![f32::NAN; n * cb * s * block];
                        to_blocked_isa(isa, &x, &mut b, n, c, s, block, pool.as_ref());
                        let mut shape = vec![n, c];
                        shape.extend(sp);
                        let xt = Tensor::from_vec(&shape, x.clone()).unwrap();
                        let mut a = Attrs::new();
                        a.set("to", Attr::String("blocked".into()));
                        a.set("block", Attr::Int(block as i64));
                        let cx = EvalCtx {
                            inputs: &[Some(&xt)],
                            input_types: &[None],
                            attrs: &a,
                        };
                        let want =
                            ops::lookup("Reorder").unwrap().eval(&cx).unwrap()[0].to_f64_vec();
                        assert_eq!(want.len(), b.len());
                        for (k, (g, w)) in b.iter().zip(&want).enumerate() {
                            let lane = k % block;
                            let ch = (k / (s * block)) % cb * block + lane;
                            if ch < c {
                                assert_eq!(*g as f64, *w, "block {block} at {k}");
                            } else {
                                assert_eq!(*g, 0.0, "pad lane at {k}");
                            }
                        }
                        // Garbage in the pad lanes must not leak back.
                        for (k, v) in b.iter_mut().enumerate() {
                            if (k / (s * block)) % cb * block + k % block >= c {
                                *v = f32::NAN;
                            }
                        }
                        let mut y = vec![0.0; n * c * s];
                        to_plain_isa(isa, &b, &mut y, n, c, s, block, pool.as_ref());
                        assert_eq!(x, y, "round trip block {block} {}", isa.name());
                    }
                }
            }
        }
    }
}
