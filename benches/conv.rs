//! Convolution kernels on ResNet-50 shapes (N = 1): blocked direct (NCHW16c) vs plain
//! im2col+GEMM, Winograd F(2,3)/F(4,3) for 3×3 stride 1 and, for pointwise convs, the
//! direct kernel with re-split rows; one and two threads. Throughput is in FLOP (2·MACs
//! of the direct algorithm), so criterion's
//! "Gelem/s" reads as GFLOP/s.
//!
//! `cargo bench --bench conv`
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kiln::internals::cpu::conv::{
    conv_blocked, conv_depthwise, conv_im2col, conv_plain, conv_plain_scratch_len, conv_winograd,
    winograd_supported, ConvShape, PackedConv, PackedWinograd,
};
use kiln::internals::cpu::Act;
use kiln::internals::cpu::Pool;
use std::time::Duration;

fn lcg(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    // (name, ic, oc, input size, kernel, stride, pad)
    let shapes: [(&str, usize, usize, usize, usize, usize, usize); 10] = [
        ("3x3_64-64_56", 64, 64, 56, 3, 1, 1),
        ("1x1_64-256_56", 64, 256, 56, 1, 1, 0),
        ("1x1_256-64_56", 256, 64, 56, 1, 1, 0),
        ("3x3_128-128_28", 128, 128, 28, 3, 1, 1),
        ("3x3s2_128-128_56", 128, 128, 56, 3, 2, 1),
        ("1x1_1024-256_14", 1024, 256, 14, 1, 1, 0),
        ("3x3_256-256_14", 256, 256, 14, 3, 1, 1),
        ("3x3_512-512_7", 512, 512, 7, 3, 1, 1),
        ("1x1_2048-512_7", 2048, 512, 7, 1, 1, 0),
        ("7x7s2_3-64_224", 3, 64, 224, 7, 2, 3),
    ];
    let pool2 = Pool::new(2);
    let mut g = c.benchmark_group("conv");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1200));
    for (name, ic, oc, hw, k, st, p) in shapes {
        let s = ConvShape::new(1, ic, [hw, hw], oc, [k, k], [st, st], [p; 4], [1, 1], 1)
            .expect("a valid shape");
        g.throughput(Throughput::Elements(s.flops() as u64));
        let w = lcg(oc * ic * k * k, 1);
        let b = lcg(oc, 2);
        let packed = PackedConv::new(s, &w, Some(&b)).expect("packable");
        // What the backend runs: a pointwise conv's pixels re-split into fuller rows.
        let rows = (s.pointwise_rows() != s)
            .then(|| PackedConv::new(s.pointwise_rows(), &w, Some(&b)).expect("packable"));
        let xb = lcg(packed.x_len(), 3);
        let mut yb = vec![0.0f32; packed.y_len()];
        let x = lcg(ic * hw * hw, 3);
        let mut y = vec![0.0f32; oc * s.oh * s.ow];
        let mut scratch = vec![0.0f32; conv_plain_scratch_len(&s)];
        // Winograd F(2,3) and F(4,3) for the 3×3 stride-1 shapes (the same FLOP count:
        // Gelem/s is the direct algorithm's effective GFLOP/s).
        let wino: Vec<(usize, PackedWinograd)> = if winograd_supported(&s) {
            [2, 4]
                .into_iter()
                .map(|m| {
                    (
                        m,
                        PackedWinograd::new(s, m, &w, Some(&b)).expect("packable"),
                    )
                })
                .collect()
        } else {
            Vec::new()
        };
        // One 64-byte-aligned scratch large enough for both tile sizes and two threads.
        let wlen = wino
            .iter()
            .map(|(_, p)| p.scratch_len(2))
            .max()
            .unwrap_or(0);
        let mut wscratch = vec![0.0f32; wlen + 16];
        let woff = wscratch.as_ptr().align_offset(64);
        let wsp = wscratch[woff..].as_mut_ptr();
        for (threads, pool) in [(1, None), (2, Some(&pool2))] {
            for (m, pw) in &wino {
                g.bench_function(format!("{name}/winograd{m}/t{threads}"), |bch| {
                    bch.iter(|| {
                        // SAFETY: buffers sized by the packed conv's lengths; the
                        // scratch holds scratch_len(2) aligned floats.
                        unsafe {
                            conv_winograd(
                                pool,
                                pw,
                                xb.as_ptr(),
                                None,
                                yb.as_mut_ptr(),
                                Act::Relu,
                                wsp,
                            )
                        }
                    })
                });
            }
            g.bench_function(format!("{name}/blocked/t{threads}"), |bch| {
                bch.iter(|| {
                    // SAFETY: buffers sized by the packed conv's lengths.
                    unsafe {
                        conv_blocked(pool, &packed, xb.as_ptr(), None, yb.as_mut_ptr(), Act::Relu)
                    }
                })
            });
            if let Some(rows) = &rows {
                g.bench_function(format!("{name}/blocked-rows/t{threads}"), |bch| {
                    bch.iter(|| {
                        // SAFETY: buffers sized by the packed conv's lengths (the same).
                        unsafe {
                            conv_blocked(pool, rows, xb.as_ptr(), None, yb.as_mut_ptr(), Act::Relu)
                        }
                    })
                });
            }
            g.bench_function(format!("{name}/plain/t{threads}"), |bch| {
                bch.iter(|| {
                    // SAFETY: buffers sized per conv_plain's contract.
                    unsafe {
                        conv_plain(
                            pool,
                            &s,
                            w.as_ptr(),
                            Some(b.as_ptr()),
                            x.as_ptr(),
                            None,
                            y.as_mut_ptr(),
                            Act::Relu,
                            scratch.as_mut_ptr(),
                        )
                    }
                })
            });
        }
    }
    // Depthwise 3×3 (MobileNet-style, pad 1): the direct kernel vs im2col + GEMM.
    for (name, c, hw, st) in [("dw3x3_256_28", 256, 28, 1), ("dw3x3s2_128_56", 128, 56, 2)] {
        let s = ConvShape::new(1, c, [hw, hw], c, [3, 3], [st, st], [1; 4], [1, 1], c)
            .expect("a valid shape");
        g.throughput(Throughput::Elements(s.flops() as u64));
        let w = lcg(c * 9, 1);
        let b = lcg(c, 2);
        let x = lcg(c * hw * hw, 3);
        let mut y = vec![0.0f32; c * s.oh * s.ow];
        let mut scratch = vec![0.0f32; conv_plain_scratch_len(&s)];
        for (threads, pool) in [(1, None), (2, Some(&pool2))] {
            g.bench_function(format!("{name}/direct/t{threads}"), |bch| {
                bch.iter(|| {
                    // SAFETY: buffers sized per conv_depthwise's contract.
                    unsafe {
                        conv_depthwise(
                            pool,
                            &s,
                            w.as_ptr(),
                            Some(b.as_ptr()),
                            x.as_ptr(),
                            None,
                            y.as_mut_ptr(),
                            Act::Relu,
                        )
                    }
                })
            });
            g.bench_function(format!("{name}/im2col/t{threads}"), |bch| {
                bch.iter(|| {
                    // SAFETY: buffers sized per conv_plain's contract.
                    unsafe {
                        conv_im2col(
                            pool,
                            &s,
                            w.as_ptr(),
                            Some(b.as_ptr()),
                            x.as_ptr(),
                            None,
                            y.as_mut_ptr(),
                            Act::Relu,
                            scratch.as_mut_ptr(),
                        )
                    }
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
