//! This machine's single-core f32 FMA peak, measured in the calling process: what the
//! benchmarks and `KILN_PROFILE` report kernels' throughput against.
use std::hint::black_box;
use std::time::Instant;

/// The median over 7 timings of `chains(iters)`, which does `flops_per_iter` FLOP
/// per iteration, in GFLOP/s; `iters` is first doubled until one timing takes 20 ms, so
/// that the measurement costs the same few hundred milliseconds in any build (an
/// unoptimised one runs the chains a hundred times slower, and its rate means nothing).
fn median_rate(flops_per_iter: u64, chains: impl Fn(u64) -> f32) -> f64 {
    let time = |iters: u64| {
        let t = Instant::now();
        black_box(chains(black_box(iters)));
        t.elapsed().as_secs_f64()
    };
    let mut iters = 1 << 12;
    while iters < 1 << 40 && time(iters) < 0.02 {
        iters *= 2;
    }
    let mut rates: Vec<f64> = (0..7)
        .map(|_| (iters * flops_per_iter) as f64 / time(iters) / 1e9)
        .collect();
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// GFLOP/s of 12 independent `vfmadd231ps ymm` chains on registers (no loads): the
/// single-core peak with the AVX2 kernels' instructions (None without AVX2+FMA).
#[cfg(target_arch = "x86_64")]
pub fn fma256_gflops() -> Option<f64> {
    use std::arch::x86_64::*;
    #[target_feature(enable = "avx2,fma")]
    fn chains(iters: u64, x: f32) -> f32 {
        let a = _mm256_set1_ps(x);
        let b = _mm256_set1_ps(0.999_999);
        let mut c = [_mm256_set1_ps(1.0); 12];
        for _ in 0..iters {
            for v in c.iter_mut() {
                *v = _mm256_fmadd_ps(*v, b, a);
            }
        }
        let mut s = _mm256_setzero_ps();
        for v in c {
            s = _mm256_add_ps(s, v);
        }
        let mut out = [0f32; 8];
        // SAFETY: `out` holds 8 floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
        out.iter().sum()
    }
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
        return None;
    }
    // SAFETY: AVX2 and FMA were detected above.
    Some(median_rate(12 * 16, |n| unsafe {
        chains(n, black_box(1e-7))
    }))
}

/// The same with 24 independent `vfmadd231ps zmm` chains: the AVX-512 kernels' peak
/// (None without AVX-512F).
#[cfg(target_arch = "x86_64")]
pub fn fma512_gflops() -> Option<f64> {
    use std::arch::x86_64::*;
    #[target_feature(enable = "avx512f")]
    fn chains(iters: u64, x: f32) -> f32 {
        let a = _mm512_set1_ps(x);
        let b = _mm512_set1_ps(0.999_999);
        let mut c = [_mm512_set1_ps(1.0); 24];
        for _ in 0..iters {
            for v in c.iter_mut() {
                *v = _mm512_fmadd_ps(*v, b, a);
            }
        }
        let mut s = _mm512_setzero_ps();
        for v in c {
            s = _mm512_add_ps(s, v);
        }
        _mm512_reduce_add_ps(s)
    }
    if !is_x86_feature_detected!("avx512f") {
        return None;
    }
    // SAFETY: AVX-512F was detected above.
    Some(median_rate(24 * 32, |n| unsafe {
        chains(n, black_box(1e-7))
    }))
}

/// The peak of the widest FMA this CPU has (None on other architectures or
/// without AVX2+FMA).
pub fn fma_gflops() -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        fma512_gflops().or_else(fma256_gflops)
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}
