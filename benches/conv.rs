//! Convolution kernels on ResNet-50 shapes (N = 1): blocked direct (NCHW16c) vs plain
//! im2col+GEMM, Winograd F(2,3)/F(4,3) for 3×3 stride 1 and, for pointwise convs, the
//! direct kernel with re-split rows; one and two threads. Throughput is in FLOP (2·MACs
//! of the direct algorithm), so criterion's
//! "Gelem/s" reads as GFLOP/s.
//!
//! Then a grid of awkward shapes (long 1-D signals with few channels, real models'
//! 1-D convs, large kernels, strides and dilations, depthwise, 3-D), each a one-`Conv`
//! graph compiled by the CPU backend as a model would be (its layout reorders included),
//! printed with the kernels it ran on, its GFLOP/s and onnxruntime's time for the same
//! single-op model (`bench/conv_ort.py`, through `target/py/bin/python` when present).
//!
//! `cargo bench --bench conv` (`KILN_CONV_GRID=<text>`: only the grid rows whose name
//! contains the text)
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kiln::backend::cpu::CpuBackend;
use kiln::backend::Executable;
use kiln::internals::cpu::conv::{
    conv_blocked, conv_blocked_isa, conv_depthwise, conv_im2col, conv_plain,
    conv_plain_scratch_len, conv_winograd, micro_tile, winograd_supported, ConvShape, PackedConv,
    PackedWinograd,
};
use kiln::internals::cpu::Pool;
use kiln::internals::cpu::{Act, Isa};
use kiln::ir::{Attr, Attrs, DType, Graph, Shape, TensorType, Value};
use kiln::passes::{CompileOptions, Profiling};
use kiln::Tensor;
use std::time::{Duration, Instant};

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
        let rows = (s.pointwise_rows(micro_tile(s.oc)) != s).then(|| {
            PackedConv::new(s.pointwise_rows(micro_tile(s.oc)), &w, Some(&b)).expect("packable")
        });
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

/// The grid, in `bench/conv_ort.py`'s notation: `name:x=dims:w=dims:s=strides:p=pads
/// (begins, then ends):d=dilations:g=group:e=epilogue` (`prelu` with a per-channel
/// slope, `clip` to [0, 6], `hardsigmoid`).
const GRID: &[&str] = &[
    "1d_c1_16000_k11:x=1,1,16000:w=16,1,11:p=5,5",
    "1d_c4_16000_k9:x=1,4,16000:w=32,4,9:p=4,4",
    "1d_c8_4096_k3_d4:x=1,8,4096:w=16,8,3:p=4,4:d=4",
    "magika_256-512_k5:x=1,256,512,1:w=512,256,5,1",
    "silero_stft_k256s128:x=1,1,4160:w=258,1,256:s=128",
    "silero_129-128_k3:x=1,129,33:w=128,129,3:p=1,1",
    "silero_128-64_k3s2:x=1,128,33:w=64,128,3:s=2:p=1,1",
    "silero_64-1_k1:x=1,64,9:w=1,64,1",
    "7x7_32-32_56:x=1,32,56,56:w=32,32,7,7:p=3,3,3,3",
    "11x11s4_3-64_224:x=1,3,224,224:w=64,3,11,11:s=4,4:p=2,2,2,2",
    "3x3d2_64-64_28:x=1,64,28,28:w=64,64,3,3:p=2,2,2,2:d=2,2",
    "3x3d4_64-64_28:x=1,64,28,28:w=64,64,3,3:p=4,4,4,4:d=4,4",
    "dw3x3_96_56:x=1,96,56,56:w=96,1,3,3:p=1,1,1,1:g=96",
    "dw5x5_192_20:x=1,192,20,20:w=192,1,5,5:p=2,2,2,2:g=192",
    "3d_3x3x3_16-32_16x28:x=1,16,16,28,28:w=32,16,3,3,3:p=1,1,1,1,1,1",
    // Issue 42's geometries: long kernels with strides past them, dilations in the
    // thousands, groups other than 1 and C, asymmetric pads, an input smaller than the
    // window until padded, 3-D strided, and the epilogues models put after a conv.
    "stft_k320s160_1-257:x=1,1,16000:w=257,1,320:s=160",
    "stft2d_1x320s160_1-257:x=1,1,1,16000:w=257,1,1,320:s=1,160",
    "1d_k400s10_16-32:x=1,16,8000:w=32,16,400:s=10",
    "3x3s5_32-64_112:x=1,32,112,112:w=64,32,3,3:s=5,5",
    "1d_k2d1024_32-32:x=1,32,8192:w=32,32,2:d=1024:p=1024,0",
    "1d_k3d2048_16-16:x=1,16,8192:w=16,16,3:d=2048:p=2048,2048",
    "g4_3x3_64-64_56:x=1,64,56,56:w=64,16,3,3:p=1,1,1,1:g=4",
    "g32_3x3_128-128_56:x=1,128,56,56:w=128,4,3,3:p=1,1,1,1:g=32",
    "g2_1d_k5_64-64:x=1,64,4000:w=64,32,5:p=2,2:g=2",
    "3x3s2_asym_64-64_56:x=1,64,56,56:w=64,64,3,3:s=2,2:p=0,0,1,1",
    "5x5_on_3x3_32-32:x=1,32,3,3:w=32,32,5,5:p=1,1,1,1",
    "3d_3x3x3s2_16-32_16x28:x=1,16,16,28,28:w=32,16,3,3,3:s=2,2,2:p=1,1,1,1,1,1",
    "3x3_32-32_56+prelu:x=1,32,56,56:w=32,32,3,3:p=1,1,1,1:e=prelu",
    "3x3_32-32_56+clip:x=1,32,56,56:w=32,32,3,3:p=1,1,1,1:e=clip",
    "3x3_32-32_56+hardsigmoid:x=1,32,56,56:w=32,32,3,3:p=1,1,1,1:e=hardsigmoid",
    // basic_pitch_nmp's one-output-channel convs (its shapes as far as the model shows
    // them: 2 s of audio, 172 frames × 264 or 88 bins; the CQT's 256-tap low-pass
    // filter at stride 2, per octave).
    "bp_32-1_7x3_264:x=1,32,172,264:w=1,32,7,3:p=3,1,3,1",
    "bp_33-1_7x3_88:x=1,33,172,88:w=1,33,7,3:p=3,1,3,1",
    "bp_1-1_k256s2_44100:x=1,1,44100:w=1,1,256:s=2:p=127,128",
    "bp_1-1_k256s2_11025:x=1,1,11025:w=1,1,256:s=2:p=127,128",
];

struct GridShape {
    name: String,
    x: Vec<usize>,
    w: Vec<usize>,
    attrs: Attrs,
    group: usize,
    epilogue: Option<String>,
}

fn parse_grid(spec: &str) -> GridShape {
    let mut fields = spec.split(':');
    let name = fields.next().expect("a name").to_string();
    let (mut x, mut w, mut attrs, mut group, mut epilogue) =
        (vec![], vec![], Attrs::new(), 1, None);
    for f in fields {
        let (k, v) = f.split_once('=').expect("key=values");
        if k == "e" {
            epilogue = Some(v.to_string());
            continue;
        }
        let v: Vec<i64> = v.split(',').map(|d| d.parse().expect("an int")).collect();
        let dims = || v.iter().map(|&d| d as usize).collect::<Vec<_>>();
        match k {
            "x" => x = dims(),
            "w" => w = dims(),
            "s" => attrs.set("strides", Attr::Ints(v)),
            "p" => attrs.set("pads", Attr::Ints(v)),
            "d" => attrs.set("dilations", Attr::Ints(v)),
            "g" => group = v[0] as usize,
            other => panic!("unknown field {other} in {spec}"),
        }
    }
    attrs.set("group", Attr::Int(group as i64));
    GridShape {
        name,
        x,
        w,
        attrs,
        group,
        epilogue,
    }
}

/// The grid's epilogue after the conv's output `y` (rank `rank`): what models write.
fn epilogue(g: &mut Graph, y: Value, which: Option<&str>, ydims: &[usize]) -> Value {
    let Some(which) = which else { return y };
    let (channels, rank) = (ydims[1], ydims.len());
    let scalar = |g: &mut Graph, name: &str, v: f32| -> Value {
        g.add_constant_value(name, Tensor::from_vec(&[], vec![v]).expect("scalar"))
            .expect("constant")
            .into()
    };
    let node = match which {
        "prelu" => {
            // Per-channel slope, shaped [C, 1, ...] to broadcast over the spatial axes.
            let mut dims = vec![channels];
            dims.resize(rank - 1, 1);
            let slope = g
                .add_constant_value(
                    "slope",
                    Tensor::from_vec(&dims, lcg(channels, 4)).expect("slope"),
                )
                .expect("slope");
            g.op("PRelu", &[y, slope.into()], Attrs::new(), "prelu")
        }
        "clip" => {
            let (lo, hi) = (scalar(g, "lo", 0.0), scalar(g, "hi", 6.0));
            g.op("Clip", &[y, lo, hi], Attrs::new(), "clip")
        }
        "hardsigmoid" => g.op("HardSigmoid", &[y], Attrs::new(), "hardsigmoid"),
        other => panic!("unknown epilogue {other}"),
    };
    node.expect("a valid epilogue").into()
}

/// The grid's shapes through the CPU backend at one and two threads, then onnxruntime.
/// Whether this is `cargo bench`: `cargo test --all-targets` runs benches without
/// `--bench`, where the hand-timed sections below would run for minutes unoptimized.
fn benchmarking() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn grid(_: &mut Criterion) {
    if !benchmarking() {
        return;
    }
    let peak = kiln::internals::peak::fma_gflops();
    println!("\nconv grid: one-Conv models on the CPU backend (a run: median of runs in ~0.5 s; the conv step: its mean)");
    match peak {
        Some(p) => println!("FMA peak, one thread: {p:.1} GFLOP/s"),
        None => println!("FMA peak: not measurable on this CPU"),
    }
    // KILN_CONV_GRID=<text> keeps the rows whose name contains the text.
    let only = std::env::var("KILN_CONV_GRID").unwrap_or_default();
    let specs: Vec<&str> = GRID
        .iter()
        .copied()
        .filter(|spec| {
            spec.split(':')
                .next()
                .is_some_and(|n| n.contains(only.as_str()))
        })
        .collect();
    for spec in &specs {
        let s = parse_grid(spec);
        let mut g = Graph::new("conv");
        let x = g
            .add_parameter("x", TensorType::new(DType::F32, Shape::fixed(&s.x)))
            .expect("x");
        let wlen = s.w.iter().product();
        let w = g
            .add_constant_value("w", Tensor::from_vec(&s.w, lcg(wlen, 1)).expect("w"))
            .expect("w");
        let b = g
            .add_constant_value("b", Tensor::from_vec(&[s.w[0]], lcg(s.w[0], 2)).expect("b"))
            .expect("b");
        let y = g
            .op(
                "Conv",
                &[x.into(), w.into(), b.into()],
                s.attrs.clone(),
                "conv",
            )
            .expect("a valid conv");
        let ydims = g.node(y).outputs[0].shape.to_fixed().expect("static");
        let y = epilogue(&mut g, y.into(), s.epilogue.as_deref(), &ydims);
        g.add_output("y", y).expect("output");
        let flops = 2.0
            * ydims.iter().product::<usize>() as f64
            * (s.x[1] / s.group) as f64
            * s.w[2..].iter().product::<usize>() as f64;
        let input = Tensor::from_vec(&s.x, lcg(s.x.iter().product(), 3)).expect("x");
        for threads in [1, 2] {
            // Step times collected: the conv step's own time, without the reorders a
            // one-conv model pays at its ends (a network's chain of blocked ops does not).
            let backend = CpuBackend::new(CompileOptions {
                threads,
                profile: Profiling::Collect,
                ..CompileOptions::from_env().expect("the KILN_* options")
            });
            let exe = backend.compile_cpu(&g).expect("compiles");
            let kinds = exe
                .step_kinds(std::slice::from_ref(&s.x))
                .expect("specializes")
                .map_or("interpreter".to_string(), |k| k.join(","));
            let inputs = [input.clone()];
            for _ in 0..2 {
                exe.run(&inputs).expect("runs");
            }
            exe.restart_profile();
            let mut times = vec![];
            let start = Instant::now();
            while times.len() < 5 || (start.elapsed().as_secs_f64() < 0.5 && times.len() < 1000) {
                let t = Instant::now();
                exe.run(&inputs).expect("runs");
                times.push(t.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            let ms = times[times.len() / 2] * 1e3;
            let conv_ms = 1e3
                * exe
                    .step_times()
                    .iter()
                    .filter(|t| t.kind.starts_with("conv"))
                    .map(|t| t.seconds_per_call)
                    .sum::<f64>();
            let gflops = flops / conv_ms / 1e6;
            let of_peak = peak.map_or(f64::NAN, |p| 100.0 * gflops / (p * threads as f64));
            println!(
                "{:32} t{threads}  kiln {ms:9.3} ms  conv step {conv_ms:8.3} ms {gflops:7.1} GFLOP/s {of_peak:5.1}% peak  [{kinds}]",
                s.name,
            );
        }
    }
    let python = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/py/bin/python");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/conv_ort.py");
    let mut cmd = std::process::Command::new(&python);
    cmd.arg(&script).args(&specs).args(["--threads", "1", "2"]);
    println!(
        "\nonnxruntime: {} {} <the grid> --threads 1 2",
        python.display(),
        script.display()
    );
    if python.exists() {
        match cmd.status() {
            Ok(st) if st.success() => {}
            other => println!("(onnxruntime's timing failed: {other:?})"),
        }
    }
}

/// The zoo's slowest direct-conv layers (ddddocr_det's, magika's 1-D conv as the row
/// the CPU step makes of it), run by the blocked kernel's AVX2 and AVX-512 paths in
/// alternation in this process, against the host's FMA peak.
fn zoo_layers(_: &mut Criterion) {
    if !benchmarking() {
        return;
    }
    /// (name, ic, oc, [ih, iw], [kh, kw], stride, pad)
    type Layer = (
        &'static str,
        usize,
        usize,
        [usize; 2],
        [usize; 2],
        usize,
        usize,
    );
    let layers: [Layer; 7] = [
        ("magika_conv0_256-512_k5", 256, 512, [1, 512], [1, 5], 1, 0),
        ("ddddocr_conv41_12-24_208", 12, 24, [208, 208], [3, 3], 1, 1),
        (
            "ddddocr_conv44_24-48s2_208",
            24,
            48,
            [208, 208],
            [3, 3],
            2,
            1,
        ),
        (
            "ddddocr_conv64_48-96s2_104",
            48,
            96,
            [104, 104],
            [3, 3],
            2,
            1,
        ),
        (
            "ddddocr_conv98_96-192s2_52",
            96,
            192,
            [52, 52],
            [3, 3],
            2,
            1,
        ),
        (
            "ddddocr_conv132_192-384s2_26",
            192,
            384,
            [26, 26],
            [3, 3],
            2,
            1,
        ),
        (
            "ddddocr_conv180_192-192_1x1_26",
            192,
            192,
            [26, 26],
            [1, 1],
            1,
            0,
        ),
    ];
    let peak = kiln::internals::peak::fma_gflops();
    println!(
        "\nzoo conv layers, blocked direct kernel: AVX2 vs AVX-512 (alternating, fastest run)"
    );
    match peak {
        Some(p) => println!("FMA peak, one thread: {p:.1} GFLOP/s"),
        None => println!("FMA peak: not measurable on this CPU"),
    }
    if kiln::internals::cpu::isa() < Isa::Avx512 {
        println!("(no AVX-512 here: skipped)");
        return;
    }
    let pool2 = Pool::new(2);
    for (name, ic, oc, hw, k, st, p) in layers {
        let s = ConvShape::new(1, ic, hw, oc, k, [st, st], [p; 4], [1, 1], 1).expect("valid");
        let w = lcg(oc * ic * k[0] * k[1], 1);
        let b = lcg(oc, 2);
        let packed =
            PackedConv::new(s.pointwise_rows(micro_tile(s.oc)), &w, Some(&b)).expect("packable");
        let xb = lcg(packed.x_len(), 3);
        let mut yb = vec![0.0f32; packed.y_len()];
        for (threads, pool) in [(1, None), (2, Some(&pool2))] {
            let mut times = [vec![], vec![]];
            let isas = [Isa::Avx2, Isa::Avx512];
            let start = Instant::now();
            while times[1].len() < 5
                || (start.elapsed().as_secs_f64() < 1.0 && times[1].len() < 500)
            {
                for (i, isa) in isas.into_iter().enumerate() {
                    let t = Instant::now();
                    // SAFETY: buffers sized by the packed conv's lengths.
                    unsafe {
                        conv_blocked_isa(
                            isa,
                            pool,
                            &packed,
                            xb.as_ptr(),
                            None,
                            yb.as_mut_ptr(),
                            Act::Relu,
                        )
                    };
                    times[i].push(t.elapsed().as_secs_f64());
                }
            }
            // The fastest run: on a shared machine the others are preempted ones.
            let gf =
                |t: &mut Vec<f64>| s.flops() / t.iter().copied().fold(f64::MAX, f64::min) / 1e9;
            let (g2, g5) = (gf(&mut times[0]), gf(&mut times[1]));
            let pct = |g: f64| peak.map_or(f64::NAN, |p| 100.0 * g / (p * threads as f64));
            println!(
                "{name:32} t{threads}  avx2 {g2:6.1} GFLOP/s ({:4.1}% peak)  avx512 {g5:6.1} GFLOP/s ({:4.1}% peak)  ×{:.2}",
                pct(g2),
                pct(g5),
                g5 / g2
            );
        }
    }
}

criterion_group!(benches, bench, grid, zoo_layers);
criterion_main!(benches);
