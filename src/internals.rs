//! Kiln's internals, re-exported for the crate's own benches, tests and fuzz targets:
//! NOT a stable API. Anything here may change or vanish in any release; an embedder uses
//! the rest of the crate or the C ABI.
//!
//! The backends' modules are crate-private, so that nothing outside the crate comes to
//! depend on them; what a bench or test must reach (a kernel to time, the CUDA generator
//! to check on the host) is re-exported here, and nowhere else.

/// The CPU backend's kernels, thread pool and ISA dispatch.
pub mod cpu {
    pub use crate::backend::cpu::isa::{isa, Isa};
    #[cfg(feature = "openblas")]
    pub use crate::backend::cpu::kernels::blas;
    pub use crate::backend::cpu::kernels::{adam, conv, gemm, rnn, Act};
    pub use crate::backend::cpu::pool::Pool;
}

/// The buffer arenas and packed constants are allocated in (huge pages when large), for
/// benches that time a kernel on the memory a compiled model would give it.
pub use crate::aligned::AlignedBuf;

/// The CUDA kernel generator (host-checkable without a GPU) and NVRTC.
pub mod cuda {
    /// The CUDA C the backend generates, and its host emulation.
    pub mod codegen {
        pub use crate::backend::cuda::codegen::{
            emulation, kernel_for_node, kernels_for_graph, samples, template_samples,
            GeneratedKernel, KernelParam,
        };
    }

    /// Compiling CUDA C to PTX.
    #[cfg(feature = "cuda")]
    pub mod nvrtc {
        pub use crate::backend::cuda::nvrtc::{available, compile_ptx, ARCHES};
    }
}

/// This machine's single-core f32 FMA peak, measured in the calling process: what the
/// benchmarks report their kernels' throughput against.
pub mod peak {
    use std::hint::black_box;
    use std::time::Instant;

    /// The median over 7 timings of `chains(iters)`, which does `flops_per_iter` FLOP
    /// per iteration, in GFLOP/s.
    fn median_rate(iters: u64, flops_per_iter: u64, chains: impl Fn(u64) -> f32) -> f64 {
        let mut rates: Vec<f64> = (0..7)
            .map(|_| {
                let t = Instant::now();
                black_box(chains(black_box(iters)));
                (iters * flops_per_iter) as f64 / t.elapsed().as_secs_f64() / 1e9
            })
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
        Some(median_rate(20_000_000, 12 * 16, |n| unsafe {
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
        Some(median_rate(10_000_000, 24 * 32, |n| unsafe {
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
}
