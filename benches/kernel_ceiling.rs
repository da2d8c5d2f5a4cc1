//! The ceiling of the blocked convolution's micro-kernel on this host, as a share of
//! the FMA peak probed in the same process: what the convolutions could reach if every
//! byte they read were already in L1.
//!
//! Per input channel the AVX-512 micro-kernel loads two weight rows and broadcasts twelve
//! input values into 24 FMAs (12 pixels × 32 output channels). Measured here, alternating
//! over seven rounds, medians:
//! - that loop written in assembly, walking 16 channels of L1-resident weights and
//!   inputs the way the kernel does (the best the instruction mix can do);
//! - the same loop shaped 6 pixels × 64 output channels (fewer loads per FMA);
//! - the same loop without its broadcasts (only the weight-row loads left), to show
//!   which loads cost;
//! - the same loop with the broadcasts folded into the FMAs as `{1to16}` operands (the
//!   form the kernel avoids, to show why);
//! - `conv_blocked` itself on 1×1 shapes whose weights and input fit in L1 (the compiled
//!   kernel with its bias, stores and call overhead).
//!
//! `cargo bench --bench kernel_ceiling`
use kiln::internals::cpu::conv::{conv_blocked, ConvShape, PackedConv};
use kiln::internals::cpu::Act;
use kiln::internals::peak::fma512_gflops;
#[cfg(target_arch = "x86_64")]
use std::arch::asm;
use std::time::Instant;

/// A 64-byte aligned run of floats, so no weight row splits a cache line.
#[repr(align(64))]
#[derive(Clone, Copy)]
struct Line(#[allow(dead_code)] [f32; 16]);

/// The micro-kernel's channel loop over `blocks` input blocks: broadcasts into
/// registers, then FMAs.
#[cfg(target_arch = "x86_64")]
fn channels_broadcast(x: *const f32, w: *const f32, blocks: u64) {
    // SAFETY: the loop reads `blocks` blocks of 16 channels × 12 pixels of x and of
    // 16 × 32 floats of w, which the caller's buffers hold; every register it writes
    // is declared.
    unsafe {
        asm!(
            "2:",
            "vmovaps zmm28, [{w}]",
            "vmovaps zmm29, [{w} + 64]",
            "vbroadcastss zmm0, [{x} + 0]",
            "vfmadd231ps zmm4, zmm28, zmm0",
            "vfmadd231ps zmm5, zmm29, zmm0",
            "vbroadcastss zmm1, [{x} + 64]",
            "vfmadd231ps zmm6, zmm28, zmm1",
            "vfmadd231ps zmm7, zmm29, zmm1",
            "vbroadcastss zmm2, [{x} + 128]",
            "vfmadd231ps zmm8, zmm28, zmm2",
            "vfmadd231ps zmm9, zmm29, zmm2",
            "vbroadcastss zmm3, [{x} + 192]",
            "vfmadd231ps zmm10, zmm28, zmm3",
            "vfmadd231ps zmm11, zmm29, zmm3",
            "vbroadcastss zmm0, [{x} + 256]",
            "vfmadd231ps zmm12, zmm28, zmm0",
            "vfmadd231ps zmm13, zmm29, zmm0",
            "vbroadcastss zmm1, [{x} + 320]",
            "vfmadd231ps zmm14, zmm28, zmm1",
            "vfmadd231ps zmm15, zmm29, zmm1",
            "vbroadcastss zmm2, [{x} + 384]",
            "vfmadd231ps zmm16, zmm28, zmm2",
            "vfmadd231ps zmm17, zmm29, zmm2",
            "vbroadcastss zmm3, [{x} + 448]",
            "vfmadd231ps zmm18, zmm28, zmm3",
            "vfmadd231ps zmm19, zmm29, zmm3",
            "vbroadcastss zmm0, [{x} + 512]",
            "vfmadd231ps zmm20, zmm28, zmm0",
            "vfmadd231ps zmm21, zmm29, zmm0",
            "vbroadcastss zmm1, [{x} + 576]",
            "vfmadd231ps zmm22, zmm28, zmm1",
            "vfmadd231ps zmm23, zmm29, zmm1",
            "vbroadcastss zmm2, [{x} + 640]",
            "vfmadd231ps zmm24, zmm28, zmm2",
            "vfmadd231ps zmm25, zmm29, zmm2",
            "vbroadcastss zmm3, [{x} + 704]",
            "vfmadd231ps zmm26, zmm28, zmm3",
            "vfmadd231ps zmm27, zmm29, zmm3",
            "add {x}, 4",
            "add {w}, 128",
            "dec {c}",
            "jnz 2b",
            // The next input block starts 12 pixels of 16 channels on.
            "add {x}, 704",
            "mov {c}, 16",
            "dec {b}",
            "jnz 2b",
            x = inout(reg) x => _,
            w = inout(reg) w => _,
            c = inout(reg) 16u64 => _,
            b = inout(reg) blocks => _,
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _, out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _, out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _, out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _, out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _, out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _, out("zmm28") _, out("zmm29") _,
            options(nostack, readonly),
        )
    }
}

/// The same loop without its broadcasts: the FMAs take four input registers loaded
/// once, so only the two weight-row loads per channel remain.
#[cfg(target_arch = "x86_64")]
fn channels_no_broadcast(x: *const f32, w: *const f32, blocks: u64) {
    // SAFETY: the loop reads `blocks` blocks of 16 channels × 12 pixels of x and of
    // 16 × 32 floats of w, which the caller's buffers hold; every register it writes
    // is declared.
    unsafe {
        asm!(
            "vbroadcastss zmm0, [{x}]",
            "vbroadcastss zmm1, [{x} + 64]",
            "vbroadcastss zmm2, [{x} + 128]",
            "vbroadcastss zmm3, [{x} + 192]",
            "2:",
            "vmovaps zmm28, [{w}]",
            "vmovaps zmm29, [{w} + 64]",
            "vfmadd231ps zmm4, zmm28, zmm0",
            "vfmadd231ps zmm5, zmm29, zmm0",
            "vfmadd231ps zmm6, zmm28, zmm1",
            "vfmadd231ps zmm7, zmm29, zmm1",
            "vfmadd231ps zmm8, zmm28, zmm2",
            "vfmadd231ps zmm9, zmm29, zmm2",
            "vfmadd231ps zmm10, zmm28, zmm3",
            "vfmadd231ps zmm11, zmm29, zmm3",
            "vfmadd231ps zmm12, zmm28, zmm0",
            "vfmadd231ps zmm13, zmm29, zmm0",
            "vfmadd231ps zmm14, zmm28, zmm1",
            "vfmadd231ps zmm15, zmm29, zmm1",
            "vfmadd231ps zmm16, zmm28, zmm2",
            "vfmadd231ps zmm17, zmm29, zmm2",
            "vfmadd231ps zmm18, zmm28, zmm3",
            "vfmadd231ps zmm19, zmm29, zmm3",
            "vfmadd231ps zmm20, zmm28, zmm0",
            "vfmadd231ps zmm21, zmm29, zmm0",
            "vfmadd231ps zmm22, zmm28, zmm1",
            "vfmadd231ps zmm23, zmm29, zmm1",
            "vfmadd231ps zmm24, zmm28, zmm2",
            "vfmadd231ps zmm25, zmm29, zmm2",
            "vfmadd231ps zmm26, zmm28, zmm3",
            "vfmadd231ps zmm27, zmm29, zmm3",
            "add {x}, 4",
            "add {w}, 128",
            "dec {c}",
            "jnz 2b",
            // The next input block starts 12 pixels of 16 channels on.
            "add {x}, 704",
            "mov {c}, 16",
            "dec {b}",
            "jnz 2b",
            x = inout(reg) x => _,
            w = inout(reg) w => _,
            c = inout(reg) 16u64 => _,
            b = inout(reg) blocks => _,
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _, out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _, out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _, out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _, out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _, out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _, out("zmm28") _, out("zmm29") _,
            options(nostack, readonly),
        )
    }
}

/// The same loop with each broadcast folded into its two FMAs.
#[cfg(target_arch = "x86_64")]
fn channels_embedded(x: *const f32, w: *const f32, blocks: u64) {
    // SAFETY: the loop reads `blocks` blocks of 16 channels × 12 pixels of x and of
    // 16 × 32 floats of w, which the caller's buffers hold; every register it writes
    // is declared.
    unsafe {
        asm!(
            "2:",
            "vmovaps zmm28, [{w}]",
            "vmovaps zmm29, [{w} + 64]",
            "vfmadd231ps zmm4, zmm28, dword ptr [{x} + 0]{{1to16}}",
            "vfmadd231ps zmm5, zmm29, dword ptr [{x} + 0]{{1to16}}",
            "vfmadd231ps zmm6, zmm28, dword ptr [{x} + 64]{{1to16}}",
            "vfmadd231ps zmm7, zmm29, dword ptr [{x} + 64]{{1to16}}",
            "vfmadd231ps zmm8, zmm28, dword ptr [{x} + 128]{{1to16}}",
            "vfmadd231ps zmm9, zmm29, dword ptr [{x} + 128]{{1to16}}",
            "vfmadd231ps zmm10, zmm28, dword ptr [{x} + 192]{{1to16}}",
            "vfmadd231ps zmm11, zmm29, dword ptr [{x} + 192]{{1to16}}",
            "vfmadd231ps zmm12, zmm28, dword ptr [{x} + 256]{{1to16}}",
            "vfmadd231ps zmm13, zmm29, dword ptr [{x} + 256]{{1to16}}",
            "vfmadd231ps zmm14, zmm28, dword ptr [{x} + 320]{{1to16}}",
            "vfmadd231ps zmm15, zmm29, dword ptr [{x} + 320]{{1to16}}",
            "vfmadd231ps zmm16, zmm28, dword ptr [{x} + 384]{{1to16}}",
            "vfmadd231ps zmm17, zmm29, dword ptr [{x} + 384]{{1to16}}",
            "vfmadd231ps zmm18, zmm28, dword ptr [{x} + 448]{{1to16}}",
            "vfmadd231ps zmm19, zmm29, dword ptr [{x} + 448]{{1to16}}",
            "vfmadd231ps zmm20, zmm28, dword ptr [{x} + 512]{{1to16}}",
            "vfmadd231ps zmm21, zmm29, dword ptr [{x} + 512]{{1to16}}",
            "vfmadd231ps zmm22, zmm28, dword ptr [{x} + 576]{{1to16}}",
            "vfmadd231ps zmm23, zmm29, dword ptr [{x} + 576]{{1to16}}",
            "vfmadd231ps zmm24, zmm28, dword ptr [{x} + 640]{{1to16}}",
            "vfmadd231ps zmm25, zmm29, dword ptr [{x} + 640]{{1to16}}",
            "vfmadd231ps zmm26, zmm28, dword ptr [{x} + 704]{{1to16}}",
            "vfmadd231ps zmm27, zmm29, dword ptr [{x} + 704]{{1to16}}",
            "add {x}, 4",
            "add {w}, 128",
            "dec {c}",
            "jnz 2b",
            // The next input block starts 12 pixels of 16 channels on.
            "add {x}, 704",
            "mov {c}, 16",
            "dec {b}",
            "jnz 2b",
            x = inout(reg) x => _,
            w = inout(reg) w => _,
            c = inout(reg) 16u64 => _,
            b = inout(reg) blocks => _,
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _, out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _, out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _, out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _, out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _, out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _, out("zmm28") _, out("zmm29") _,
            options(nostack, readonly),
        )
    }
}

/// The loop shaped 6 pixels × 64 output channels instead: four weight rows and six
/// broadcasts per channel (10 loads) rather than two and twelve (14).
#[cfg(target_arch = "x86_64")]
fn channels_four_blocks(x: *const f32, w: *const f32, blocks: u64) {
    // SAFETY: as in `channels_broadcast`, with 16 × 64 floats of w and 6 pixels of x
    // per block.
    unsafe {
        asm!(
            "2:",
            "vmovaps zmm28, [{w}]",
            "vmovaps zmm29, [{w} + 64]",
            "vmovaps zmm30, [{w} + 128]",
            "vmovaps zmm31, [{w} + 192]",
            "vbroadcastss zmm0, [{x} + 0]",
            "vfmadd231ps zmm4, zmm28, zmm0",
            "vfmadd231ps zmm5, zmm29, zmm0",
            "vfmadd231ps zmm6, zmm30, zmm0",
            "vfmadd231ps zmm7, zmm31, zmm0",
            "vbroadcastss zmm1, [{x} + 64]",
            "vfmadd231ps zmm8, zmm28, zmm1",
            "vfmadd231ps zmm9, zmm29, zmm1",
            "vfmadd231ps zmm10, zmm30, zmm1",
            "vfmadd231ps zmm11, zmm31, zmm1",
            "vbroadcastss zmm2, [{x} + 128]",
            "vfmadd231ps zmm12, zmm28, zmm2",
            "vfmadd231ps zmm13, zmm29, zmm2",
            "vfmadd231ps zmm14, zmm30, zmm2",
            "vfmadd231ps zmm15, zmm31, zmm2",
            "vbroadcastss zmm3, [{x} + 192]",
            "vfmadd231ps zmm16, zmm28, zmm3",
            "vfmadd231ps zmm17, zmm29, zmm3",
            "vfmadd231ps zmm18, zmm30, zmm3",
            "vfmadd231ps zmm19, zmm31, zmm3",
            "vbroadcastss zmm0, [{x} + 256]",
            "vfmadd231ps zmm20, zmm28, zmm0",
            "vfmadd231ps zmm21, zmm29, zmm0",
            "vfmadd231ps zmm22, zmm30, zmm0",
            "vfmadd231ps zmm23, zmm31, zmm0",
            "vbroadcastss zmm1, [{x} + 320]",
            "vfmadd231ps zmm24, zmm28, zmm1",
            "vfmadd231ps zmm25, zmm29, zmm1",
            "vfmadd231ps zmm26, zmm30, zmm1",
            "vfmadd231ps zmm27, zmm31, zmm1",
            "add {x}, 4",
            "add {w}, 256",
            "dec {c}",
            "jnz 2b",
            "add {x}, 320",
            "mov {c}, 16",
            "dec {b}",
            "jnz 2b",
            x = inout(reg) x => _,
            w = inout(reg) w => _,
            c = inout(reg) 16u64 => _,
            b = inout(reg) blocks => _,
            out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _, out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _, out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _, out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _, out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _, out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _, out("zmm28") _, out("zmm29") _, out("zmm30") _, out("zmm31") _,
            options(nostack, readonly),
        )
    }
}

/// GFLOP/s of `calls` runs of a channel loop over `blocks` input blocks.
#[cfg(target_arch = "x86_64")]
fn loop_rate(f: fn(*const f32, *const f32, u64), blocks: usize, calls: usize) -> f64 {
    // Room for either loop's weights (up to 64 output channels per channel).
    let w = vec![Line([0.5; 16]); blocks * 64];
    let x = vec![Line([0.5; 16]); blocks * 12];
    let t = Instant::now();
    for _ in 0..calls {
        f(x.as_ptr().cast(), w.as_ptr().cast(), blocks as u64);
    }
    (calls * blocks * 16 * 24 * 32) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// GFLOP/s of `conv_blocked` on a 1×1 shape, median of repeated runs.
fn conv_rate(ic: usize, h: usize, w: usize, oc: usize) -> f64 {
    let s = ConvShape::new(1, ic, [h, w], oc, [1, 1], [1, 1], [0; 4], [1, 1], 1).unwrap();
    let weights: Vec<f32> = (0..oc * ic).map(|i| (i % 7) as f32 * 0.1).collect();
    let p = PackedConv::new(s, &weights, None).unwrap();
    let x = vec![0.5f32; p.x_len()];
    let mut y = vec![0f32; p.y_len()];
    let runs = (2e9 / s.flops()) as usize + 1;
    let t = Instant::now();
    for _ in 0..runs {
        // SAFETY: x and y are the packed shape's lengths; one thread.
        unsafe { conv_blocked(None, &p, x.as_ptr(), None, y.as_mut_ptr(), Act::Relu) };
    }
    runs as f64 * s.flops() / t.elapsed().as_secs_f64() / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        type Case = (&'static str, Box<dyn Fn() -> f64>);
        let cases: Vec<Case> = vec![
            (
                "loop, 4 blocks (8 KiB of weights)",
                Box::new(|| loop_rate(channels_broadcast, 4, 500_000)),
            ),
            (
                "loop, 16 blocks (32 KiB of weights)",
                Box::new(|| loop_rate(channels_broadcast, 16, 125_000)),
            ),
            (
                "loop, 6 px x 64 channels, 4 blocks",
                Box::new(|| loop_rate(channels_four_blocks, 4, 500_000)),
            ),
            (
                "loop without its broadcasts",
                Box::new(|| loop_rate(channels_no_broadcast, 4, 500_000)),
            ),
            (
                "loop, embedded broadcasts",
                Box::new(|| loop_rate(channels_embedded, 4, 500_000)),
            ),
            (
                "conv_blocked 1x1 128->32, 2x24 px",
                Box::new(|| conv_rate(128, 2, 24, 32)),
            ),
            (
                "conv_blocked 1x1 64->32, 2x48 px",
                Box::new(|| conv_rate(64, 2, 48, 32)),
            ),
        ];
        let mut peaks = vec![];
        let mut rates = vec![vec![]; cases.len()];
        for _ in 0..7 {
            peaks.push(fma512_gflops().unwrap_or(f64::NAN));
            for (r, (_, f)) in rates.iter_mut().zip(&cases) {
                r.push(f());
            }
        }
        let peak = median(peaks);
        println!("FMA peak (zmm, probed): {peak:.1} GFLOP/s");
        for (r, (name, _)) in rates.into_iter().zip(&cases) {
            let g = median(r);
            println!(
                "{name:<40} {g:7.1} GFLOP/s  {:5.1} % of peak",
                100.0 * g / peak
            );
        }
        return;
    }
    println!("skipped: the micro-kernel ceiling is measured on AVX-512 hosts only");
}
