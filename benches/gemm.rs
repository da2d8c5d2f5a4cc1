//! Kiln's packed GEMM against OpenBLAS `cblas_sgemm` (both single-threaded), plus Kiln
//! on two threads for the BERT and MLP shapes, and this machine's FMA peak. With
//! `--features gemm-crate`, the `gemm` crate beside them (1 and 2 threads).
//!
//! `cargo bench --bench gemm --features openblas`; throughput is printed in Gelem/s = GFLOP/s (2·m·n·k).
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kiln::internals::cpu::blas::{self, gemm_openblas};
use kiln::internals::cpu::gemm::{gemm, gemm_packed, gemm_with_isa, Epilogue, Mat, PackedB};
use kiln::internals::cpu::{Isa, Pool};
#[cfg(target_arch = "x86_64")]
use kiln::internals::peak::{fma256_gflops, fma512_gflops};
use std::hint::black_box;
use std::time::Duration;

const SHAPES: &[(&str, usize, usize, usize)] = &[
    ("square_1024", 1024, 1024, 1024),
    ("resnet_64x3136x256", 64, 3136, 256),
    ("resnet_256x3136x64", 256, 3136, 64),
    ("resnet_128x784x512", 128, 784, 512),
    ("resnet_256x196x1024", 256, 196, 1024),
    ("resnet_2048x49x512", 2048, 49, 512),
    ("bert_128x768x768", 128, 768, 768),
    ("bert_128x3072x768", 128, 3072, 768),
    ("bert_128x768x3072", 128, 768, 3072),
    ("mlp_64x512x784", 64, 512, 784),
];

/// The GEMMs of one MLP 784-512-512-10 training step at batch 64, as the matmul step
/// issues them: (name, m, n, k, A transposed, B transposed). Weights are [out, in], so
/// the forward pass multiplies by Wᵀ and the filter gradients by a transposed dY.
const MLP_TRAIN: &[(&str, usize, usize, usize, bool, bool)] = &[
    ("fwd_64x512x784_Bt", 64, 512, 784, false, true),
    ("fwd_64x512x512_Bt", 64, 512, 512, false, true),
    ("fwd_64x10x512_Bt", 64, 10, 512, false, true),
    ("bwd_data_64x512x512", 64, 512, 512, false, false),
    ("bwd_data_64x512x10", 64, 512, 10, false, false),
    ("bwd_filter_512x784x64_At", 512, 784, 64, true, false),
    ("bwd_filter_512x512x64_At", 512, 512, 64, true, false),
    ("bwd_filter_10x512x64_At", 10, 512, 64, true, false),
];

/// A row-major `rows`×`cols` view of `buf`, or (transposed) the transpose of a
/// row-major `cols`×`rows` matrix.
fn view(buf: &[f32], rows: usize, cols: usize, transposed: bool) -> Mat {
    if transposed {
        Mat::rows(buf.as_ptr(), rows).t()
    } else {
        Mat::rows(buf.as_ptr(), cols)
    }
}

fn data(len: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

/// `c = a·b` (row-major m×k, k×n, m×n) by the `gemm` crate.
#[cfg(feature = "gemm-crate")]
///
/// # Safety
/// `c` is writable for m×n floats.
unsafe fn gemm_crate(
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    b: &[f32],
    c: *mut f32,
    threads: gemm::Parallelism,
) {
    let (n_, k_) = (n as isize, k as isize);
    gemm::gemm(
        m,
        n,
        k,
        c,
        1,
        n_,
        false,
        a.as_ptr(),
        1,
        k_,
        b.as_ptr(),
        1,
        n_,
        0.0,
        1.0,
        false,
        false,
        false,
        threads,
    )
}

#[cfg(feature = "gemm-crate")]
#[allow(clippy::too_many_arguments)]
fn check_gemm_crate(
    name: &str,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    b: &[f32],
    am: Mat,
    bm: Mat,
    ep: &Epilogue,
) {
    let (mut want, mut got) = (vec![0f32; m * n], vec![0f32; m * n]);
    // SAFETY: a, b, want and got cover m×k, k×n, m×n, m×n.
    unsafe {
        gemm(None, m, n, k, am, bm, want.as_mut_ptr(), n, ep);
        gemm_crate(m, n, k, a, b, got.as_mut_ptr(), gemm::Parallelism::None);
    }
    let diff = got
        .iter()
        .zip(&want)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    assert!(
        diff < 1e-3,
        "{name}: the gemm crate differs from Kiln by {diff}"
    );
}

fn bench(cr: &mut Criterion) {
    blas::single_threaded();
    #[cfg(target_arch = "x86_64")]
    if let Some(p) = fma256_gflops() {
        println!("FMA peak, one thread (median of 7): {p:.1} GFLOP/s");
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(p) = fma512_gflops() {
        println!("AVX-512 FMA peak, one thread (median of 7): {p:.1} GFLOP/s");
    }
    let pool = Pool::new(2);
    let ep = Epilogue::NONE;
    for &(name, m, n, k) in SHAPES {
        let a = data(m * k, 1);
        let b = data(k * n, 2);
        let mut c = vec![0f32; m * n];
        let (am, bm) = (Mat::rows(a.as_ptr(), k), Mat::rows(b.as_ptr(), n));
        // SAFETY: b is k×n.
        let packed = unsafe { PackedB::new(m, k, n, bm) };
        // The `gemm` crate's arguments are strides: check it computes what Kiln does.
        #[cfg(feature = "gemm-crate")]
        check_gemm_crate(name, m, n, k, &a, &b, am, bm, &ep);
        let mut g = cr.benchmark_group("gemm");
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_millis(1200))
            .throughput(Throughput::Elements((2 * m * n * k) as u64));
        let cp = c.as_mut_ptr();
        g.bench_function(BenchmarkId::new("kiln_1t", name), |bn| {
            // SAFETY: a, b, c cover m×k, k×n, m×n.
            bn.iter(|| unsafe { gemm(None, m, n, k, am, bm, cp, n, &ep) })
        });
        g.bench_function(BenchmarkId::new("kiln_avx2_1t", name), |bn| {
            // SAFETY: a, b, c cover m×k, k×n, m×n.
            bn.iter(|| unsafe { gemm_with_isa(Isa::Avx2, None, m, n, k, am, bm, cp, n, &ep) })
        });
        g.bench_function(BenchmarkId::new("openblas_1t", name), |bn| {
            // SAFETY: a, b, c cover m×k, k×n, m×n.
            bn.iter(|| unsafe { gemm_openblas(m, n, k, am, bm, cp, n, &ep) })
        });
        #[cfg(feature = "gemm-crate")]
        g.bench_function(BenchmarkId::new("gemm_crate_1t", name), |bn| {
            // SAFETY: a, b, c cover m×k, k×n, m×n.
            bn.iter(|| unsafe { gemm_crate(m, n, k, &a, &b, cp, gemm::Parallelism::None) })
        });
        if name.starts_with("bert") || name.starts_with("mlp") {
            g.bench_function(BenchmarkId::new("kiln_packed_1t", name), |bn| {
                // SAFETY: a, b, c cover m×k, k×n, m×n.
                bn.iter(|| unsafe { gemm_packed(None, m, n, k, am, &packed, cp, n, &ep) })
            });
            g.bench_function(BenchmarkId::new("kiln_2t", name), |bn| {
                // SAFETY: a, b, c cover m×k, k×n, m×n.
                bn.iter(|| unsafe { gemm(Some(&pool), m, n, k, am, bm, cp, n, &ep) })
            });
            g.bench_function(BenchmarkId::new("kiln_packed_2t", name), |bn| {
                // SAFETY: a, b, c cover m×k, k×n, m×n.
                bn.iter(|| unsafe { gemm_packed(Some(&pool), m, n, k, am, &packed, cp, n, &ep) })
            });
            #[cfg(feature = "gemm-crate")]
            g.bench_function(BenchmarkId::new("gemm_crate_2t", name), |bn| {
                // SAFETY: a, b, c cover m×k, k×n, m×n.
                bn.iter(|| unsafe { gemm_crate(m, n, k, &a, &b, cp, gemm::Parallelism::Rayon(2)) })
            });
        }
        g.finish();
        black_box(&mut c);
    }
    for &(name, m, n, k, at, bt) in MLP_TRAIN {
        let a = data(m * k, 1);
        let b = data(k * n, 2);
        let mut c = vec![0f32; m * n];
        let (am, bm) = (view(&a, m, k, at), view(&b, k, n, bt));
        let mut g = cr.benchmark_group("gemm_mlp_train");
        g.sample_size(20)
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_millis(1000))
            .throughput(Throughput::Elements((2 * m * n * k) as u64));
        let cp = c.as_mut_ptr();
        for (id, isa) in [("kiln_avx512_1t", Isa::Avx512), ("kiln_avx2_1t", Isa::Avx2)] {
            g.bench_function(BenchmarkId::new(id, name), |bn| {
                // SAFETY: a, b, c cover m×k, k×n, m×n.
                bn.iter(|| unsafe { gemm_with_isa(isa, None, m, n, k, am, bm, cp, n, &ep) })
            });
        }
        g.bench_function(BenchmarkId::new("openblas_1t", name), |bn| {
            // SAFETY: a, b, c cover m×k, k×n, m×n.
            bn.iter(|| unsafe { gemm_openblas(m, n, k, am, bm, cp, n, &ep) })
        });
        g.bench_function(BenchmarkId::new("kiln_2t", name), |bn| {
            // SAFETY: a, b, c cover m×k, k×n, m×n.
            bn.iter(|| unsafe { gemm(Some(&pool), m, n, k, am, bm, cp, n, &ep) })
        });
        g.finish();
        black_box(&mut c);
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
