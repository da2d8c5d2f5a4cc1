//! The CPU backend against the reference interpreter: every kernel family on random
//! shapes with ragged edges (sizes that are not multiples of the vector width, padding,
//! strides, dilation, groups), at 1 and 2 threads, plus per-shape specialization,
//! concurrent runs and bad inputs. `KILN_CPU_ISA=portable` reruns it all on the plain
//! Rust paths (`make test` does).
use crate::common;

use kiln::backend::cpu::CpuBackend;
use kiln::backend::{backend_with, Backend, Device, Executable};
use kiln::ir::{text, Attr, Attrs, DType, Graph, Shape, TensorType, Value};
use kiln::passes::CompileOptions;
use kiln::passes::Tuning;
use kiln::{Dim, Tensor};

use common::{ints, op, param, random_inputs, weight, Rng};

fn cpu(threads: usize) -> Box<dyn kiln::backend::Backend> {
    backend_with(
        Device::Cpu,
        CompileOptions {
            threads,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The CPU backend on `threads` threads, choosing algorithms as `tuning` says (not as
/// the environment does: the tests decide which algorithms they check).
fn cpu_with(threads: usize, tuning: &Tuning) -> CpuBackend {
    CpuBackend::new(CompileOptions {
        threads,
        tuning: tuning.clone(),
        ..Default::default()
    })
}

/// Tuning that makes `algorithm` win wherever it is a candidate.
fn forcing(algorithm: &str) -> Tuning {
    Tuning {
        force: Some(algorithm.into()),
        ..Tuning::default()
    }
}

/// The kernel kinds `g` lowers to (inputs with symbolic dims of 3).
fn kinds(g: &Graph) -> Vec<&'static str> {
    kinds_with(g, &Tuning::default())
}

fn kinds_with(g: &Graph, tuning: &Tuning) -> Vec<&'static str> {
    let exe = cpu_with(1, tuning).compile_cpu(g).unwrap();
    let shapes: Vec<Vec<usize>> = random_inputs(g, &mut Rng(0), 3, 1.0)
        .iter()
        .map(|t| t.shape().to_vec())
        .collect();
    exe.step_kinds(&shapes)
        .unwrap()
        .expect("lowered to kernels")
}

/// `g` lowers to a kernel of kind `kind` (not only the fallback).
fn uses(g: &Graph, kind: &str) {
    let k = kinds(g);
    assert!(
        k.contains(&kind),
        "no {kind} step in {k:?}\n{}",
        text::print(g)
    );
}

/// `g` on cpu at 1 and 2 threads gives the interpreter's outputs.
fn check(g: &Graph, seed: u64) {
    check_with(g, seed, &Tuning::default())
}

fn check_with(g: &Graph, seed: u64, tuning: &Tuning) {
    let mut rng = Rng(seed);
    let inputs = random_inputs(g, &mut rng, 3, 1.0);
    let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
    let want = interp.compile(g).unwrap().run(&inputs).unwrap();
    for threads in [1, 2] {
        let got = cpu_with(threads, tuning)
            .compile(g)
            .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)))
            .run(&inputs)
            .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)));
        for (i, (w, o)) in want.iter().zip(&got).enumerate() {
            o.check_close(w, 1e-4, 1e-4).unwrap_or_else(|e| {
                panic!("output {i}, {threads} thread(s): {e}\n{}", text::print(g))
            });
        }
    }
}

#[test]
fn matmuls_of_every_shape() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[1, 1], &[1, 1]),
        (&[5, 7], &[7, 9]),
        (&[17, 33], &[33, 6]),
        (&[64, 100], &[100, 40]),
        (&[7], &[7, 5]),
        (&[4, 7], &[7]),
        (&[2, 3, 5, 7], &[7, 4]),
        (&[3, 1, 5, 7], &[1, 4, 7, 6]),
        (&[2, 5, 8], &[2, 8, 3]),
    ];
    for (i, (a, b)) in cases.iter().enumerate() {
        let mut g = Graph::new("matmul");
        let mut rng = Rng(i as u64);
        let x = param(&mut g, "a", a);
        let w = weight(&mut g, &mut rng, "b", b);
        let y = op(&mut g, "MatMul", &[x, w], Attrs::new());
        g.add_output("y", y).unwrap();
        uses(&g, "gemm");
        check(&g, i as u64);
        // Both operands computed: nothing constant to pack.
        let mut g = Graph::new("matmul2");
        let x = param(&mut g, "a", a);
        let w = param(&mut g, "b", b);
        let y = op(&mut g, "MatMul", &[x, w], Attrs::new());
        g.add_output("y", y).unwrap();
        check(&g, 100 + i as u64);
    }
}

#[test]
fn gemms_with_transposes_and_every_bias() {
    let (m, k, n) = (13, 19, 11);
    let biases: &[&[usize]] = &[&[n], &[1, n], &[m, n], &[m, 1], &[1]];
    for (ta, tb) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        for (j, bias) in biases.iter().enumerate() {
            let mut g = Graph::new("gemm");
            let mut rng = Rng(j as u64);
            let a_dims = if ta == 1 { [k, m] } else { [m, k] };
            let b_dims = if tb == 1 { [n, k] } else { [k, n] };
            let a = param(&mut g, "a", &a_dims);
            let b = weight(&mut g, &mut rng, "b", &b_dims);
            let c = weight(&mut g, &mut rng, "c", bias);
            let attrs = Attrs::new()
                .with("transA", Attr::Int(ta))
                .with("transB", Attr::Int(tb));
            let y = op(&mut g, "Gemm", &[a, b, c], attrs);
            g.add_output("y", y).unwrap();
            if bias.len() == 1 && bias != &[1] || bias.len() == 2 {
                uses(&g, "gemm");
            }
            check(&g, j as u64);
        }
    }
}

#[test]
fn dense_layers_fuse_bias_activation_and_residual() {
    for act in ["Relu", "Sigmoid", "Tanh", "Gelu", "LeakyRelu"] {
        let mut g = Graph::new("dense");
        let mut rng = Rng(3);
        let x = param(&mut g, "x", &[2, 9, 24]);
        let w = weight(&mut g, &mut rng, "w", &[24, 24]);
        let bias = weight(&mut g, &mut rng, "bias", &[24]);
        let h = op(&mut g, "MatMul", &[x, w], Attrs::new());
        let h = op(&mut g, "Add", &[h, bias], Attrs::new());
        let h = op(&mut g, "Add", &[h, x], Attrs::new());
        let y = op(&mut g, act, &[h], Attrs::new());
        g.add_output("y", y).unwrap();
        assert_eq!(kinds(&g), ["gemm"], "one fused GEMM");
        check(&g, 5);
    }
}

/// Conv → (+bias) → (+residual) → Relu, as the pipeline fuses it: blocked (channels a
/// multiple of 16) or plain.
fn conv_graph(
    rng: &mut Rng,
    n: usize,
    (cin, cout): (usize, usize),
    (h, w): (usize, usize),
    attrs: &[(&str, &[i64])],
    residual: bool,
) -> Graph {
    let k = attrs
        .iter()
        .find(|(name, _)| *name == "kernel_shape")
        .map(|(_, v)| v.to_vec())
        .unwrap_or(vec![3, 3]);
    let group = attrs
        .iter()
        .find(|(name, _)| *name == "group_")
        .map_or(1, |(_, v)| v[0]);
    let attrs: Vec<(&str, &[i64])> = attrs
        .iter()
        .filter(|(a, _)| *a != "group_")
        .copied()
        .collect();
    let mut g = Graph::new("conv");
    let x = param(&mut g, "x", &[n, cin, h, w]);
    let wt = weight(
        &mut g,
        rng,
        "w",
        &[cout, cin / group as usize, k[0] as usize, k[1] as usize],
    );
    let b = weight(&mut g, rng, "b", &[cout]);
    let mut a = ints(&attrs).with("kernel_shape", Attr::Ints(k));
    if group != 1 {
        a = a.with("group", Attr::Int(group));
    }
    let y = op(&mut g, "Conv", &[x, wt, b], a);
    let y = if residual {
        let shape = g.node(y.node).outputs[0].shape.to_fixed().unwrap();
        let z = param(&mut g, "z", &shape);
        op(&mut g, "Add", &[y, z], Attrs::new())
    } else {
        y
    };
    let y = op(&mut g, "Relu", &[y], Attrs::new());
    g.add_output("y", y).unwrap();
    g
}

/// Batch, (in, out) channels, (height, width), attributes, whether a residual is added.
type ConvCase = (
    usize,
    (usize, usize),
    (usize, usize),
    Vec<(&'static str, &'static [i64])>,
    bool,
);

#[test]
fn convolutions_blocked_and_plain() {
    let mut rng = Rng(11);
    let cases: Vec<ConvCase> = vec![
        (1, (16, 16), (7, 7), vec![("pads", &[1, 1, 1, 1])], true),
        (2, (32, 16), (13, 5), vec![("pads", &[1, 0, 2, 1])], false),
        (
            1,
            (16, 32),
            (14, 14),
            vec![("strides", &[2, 2]), ("pads", &[1, 1, 1, 1])],
            false,
        ),
        (1, (32, 32), (9, 11), vec![("kernel_shape", &[1, 1])], true),
        (
            1,
            (16, 48),
            (8, 8),
            vec![("kernel_shape", &[1, 1]), ("strides", &[2, 2])],
            false,
        ),
        (
            1,
            (16, 16),
            (12, 12),
            vec![("dilations", &[2, 2]), ("pads", &[2, 2, 2, 2])],
            false,
        ),
        (
            1,
            (16, 16),
            (15, 15),
            vec![("kernel_shape", &[5, 5]), ("pads", &[2, 2, 2, 2])],
            true,
        ),
        (
            1,
            (3, 16),
            (23, 23),
            vec![
                ("kernel_shape", &[7, 7]),
                ("strides", &[2, 2]),
                ("pads", &[3, 3, 3, 3]),
            ],
            false,
        ),
        (2, (5, 7), (9, 6), vec![("pads", &[1, 1, 1, 1])], true),
        (2, (20, 24), (9, 6), vec![("pads", &[1, 1, 1, 1])], true),
        (
            1,
            (3, 20),
            (11, 10),
            vec![("strides", &[2, 1]), ("pads", &[1, 0, 1, 2])],
            true,
        ),
        (
            1,
            (8, 8),
            (10, 10),
            vec![("pads", &[1, 1, 1, 1]), ("group_", &[8])],
            false,
        ),
        (1, (6, 4), (7, 9), vec![("group_", &[2])], false),
    ];
    for (i, (n, c, hw, attrs, residual)) in cases.into_iter().enumerate() {
        let g = conv_graph(&mut rng, n, c, hw, &attrs, residual);
        // Group-1 convs with at least one full block of outputs run blocked, ragged
        // channel counts too; fewer than 16 input channels are read plain (the stem).
        let grouped = attrs.iter().any(|(k, _)| *k == "group_");
        let blocked = !grouped && c.1 >= 16;
        if !blocked {
            let depthwise = attrs
                .iter()
                .any(|(k, v)| *k == "group_" && v[0] == c.0 as i64);
            let group = attrs
                .iter()
                .find(|(k, _)| *k == "group_")
                .map_or(1, |(_, v)| v[0] as usize);
            // Up to 8 output channels per group run the direct kernel.
            let kind = if depthwise {
                "conv-depthwise"
            } else if c.1 / group <= 8 {
                "conv-direct"
            } else {
                "conv-im2col"
            };
            uses(&g, kind);
            check(&g, i as u64);
            continue;
        }
        // Every blocked algorithm the shape has, each forced in turn (Winograd reads a
        // blocked X only).
        let attr = |k: &str| attrs.iter().find(|(name, _)| *name == k).map(|a| a.1);
        let winograd = c.0 >= 16
            && attr("kernel_shape").is_none_or(|k| k == [3, 3])
            && attr("strides").is_none_or(|s| s == [1, 1])
            && attr("dilations").is_none_or(|d| d == [1, 1]);
        for (algorithm, kind) in [
            ("direct", "conv-blocked"),
            ("winograd2", "conv-winograd2"),
            ("winograd4", "conv-winograd4"),
        ] {
            let kind = if winograd { kind } else { "conv-blocked" };
            let tuning = forcing(algorithm);
            let k = kinds_with(&g, &tuning);
            assert!(k.contains(&kind), "{algorithm}: no {kind} in {k:?}");
            check_with(&g, i as u64, &tuning);
        }
    }
}

/// Conv → (+bias) → (+residual) → Relu over `x` dims [N, C, spatial...] with `oc`
/// outputs and a `kernel` of the same spatial rank.
fn conv_nd_graph(
    rng: &mut Rng,
    x: &[usize],
    oc: usize,
    kernel: &[usize],
    attrs: &[(&str, &[i64])],
    group: usize,
    residual: bool,
) -> Graph {
    let mut g = Graph::new("conv_nd");
    let xv = param(&mut g, "x", x);
    let mut wd = vec![oc, x[1] / group];
    wd.extend_from_slice(kernel);
    let wt = weight(&mut g, rng, "w", &wd);
    let b = weight(&mut g, rng, "b", &[oc]);
    let a = ints(attrs).with("group", Attr::Int(group as i64));
    let y = op(&mut g, "Conv", &[xv, wt, b], a);
    let y = if residual {
        let shape = g.node(y.node).outputs[0].shape.to_fixed().unwrap();
        let z = param(&mut g, "z", &shape);
        op(&mut g, "Add", &[y, z], Attrs::new())
    } else {
        y
    };
    let y = op(&mut g, "Relu", &[y], Attrs::new());
    g.add_output("y", y).unwrap();
    g
}

/// 1-D convolutions (blocked, a plain stem, plain, grouped, depthwise, grouped in whole
/// channel blocks), 2-D ones grouped in whole blocks, a 2-D one over
/// a single column (run as a row) and 3-D ones, with their epilogues fused: each runs
/// on a conv kernel, never the fallback, and agrees with the interpreter.
#[test]
fn convolutions_of_one_and_three_spatial_axes() {
    // (x dims, oc, kernel, attributes, group, residual, kind)
    type Case = (
        &'static [usize],
        usize,
        &'static [usize],
        Vec<(&'static str, &'static [i64])>,
        usize,
        bool,
        &'static str,
    );
    let cases: Vec<Case> = vec![
        (
            &[2, 32, 37],
            24,
            &[3],
            vec![("pads", &[1, 2]), ("dilations", &[2])],
            1,
            true,
            "conv-blocked",
        ),
        (
            &[1, 1, 700],
            20,
            &[64],
            vec![("strides", &[32])],
            1,
            false,
            "conv-blocked",
        ),
        (
            &[2, 24, 31],
            16,
            &[5],
            vec![("strides", &[2]), ("pads", &[2, 2])],
            1,
            true,
            "conv-blocked",
        ),
        // One input channel × 256 taps into 258 (an STFT): its packed weights would not
        // fit the plain-input blocked kernel's 64 KiB, so im2col.
        (
            &[2, 1, 832],
            258,
            &[256],
            vec![("strides", &[128])],
            1,
            true,
            "conv-im2col",
        ),
        (&[1, 20, 40], 1, &[1], vec![], 1, false, "conv-direct"),
        // One output channel: several rows per tile (2-D, grouped), chains of taps (a
        // long strided 1-D filter).
        (
            &[2, 5, 9, 30],
            1,
            &[5, 3],
            vec![("pads", &[2, 1, 2, 1])],
            1,
            true,
            "conv-direct",
        ),
        (
            &[1, 6, 7, 20],
            3,
            &[3, 3],
            vec![("pads", &[1, 1, 1, 1])],
            3,
            false,
            "conv-direct",
        ),
        (
            &[1, 1, 900],
            1,
            &[80],
            vec![("strides", &[2]), ("pads", &[40, 39])],
            1,
            true,
            "conv-direct",
        ),
        (
            &[2, 6, 19],
            4,
            &[3],
            vec![("pads", &[1, 1]), ("dilations", &[4])],
            2,
            true,
            "conv-direct",
        ),
        (
            &[1, 12, 25],
            12,
            &[5],
            vec![("pads", &[2, 2])],
            12,
            false,
            "conv-depthwise",
        ),
        // Groups of whole channel blocks: each group a group-1 blocked conv (two
        // images, so the group slices stride by image).
        (
            &[2, 64, 29],
            32,
            &[5],
            vec![("pads", &[2, 1]), ("strides", &[2])],
            2,
            true,
            "conv-grouped-blocked",
        ),
        (
            &[2, 64, 9, 11],
            64,
            &[3, 3],
            vec![("pads", &[1, 0, 1, 1])],
            4,
            true,
            "conv-grouped-blocked",
        ),
        (
            &[1, 64, 12, 12],
            32,
            &[3, 3],
            vec![("pads", &[1, 1, 1, 1])],
            2,
            false,
            "conv-grouped-blocked",
        ),
        (
            &[2, 32, 30, 1],
            32,
            &[5, 1],
            vec![("pads", &[2, 0, 1, 0])],
            1,
            true,
            "conv-blocked",
        ),
        (
            &[1, 3, 5, 6, 7],
            4,
            &[3, 3, 3],
            vec![("pads", &[1, 1, 1, 1, 1, 1])],
            1,
            true,
            "conv-im2col",
        ),
        (
            &[2, 4, 6, 5, 4],
            6,
            &[2, 3, 1],
            vec![
                ("strides", &[2, 1, 2]),
                ("pads", &[0, 1, 0, 1, 2, 0]),
                ("dilations", &[2, 1, 1]),
            ],
            2,
            false,
            "conv-im2col",
        ),
        (
            &[1, 18, 4, 4, 4],
            20,
            &[1, 1, 1],
            vec![],
            1,
            true,
            "conv-im2col",
        ),
        // Volumes gathered a few output planes at a time: 3 planes of 10×10 per chunk
        // (the last one ragged), and one 20×20 plane per chunk, grouped and strided.
        (
            &[2, 16, 7, 10, 10],
            8,
            &[3, 3, 3],
            vec![("pads", &[1, 1, 1, 1, 1, 1])],
            1,
            true,
            "conv-im2col",
        ),
        (
            &[1, 32, 9, 20, 20],
            8,
            &[3, 3, 3],
            vec![("pads", &[1, 1, 1, 1, 1, 1]), ("strides", &[2, 1, 1])],
            2,
            false,
            "conv-im2col",
        ),
    ];
    let mut rng = Rng(12);
    for (i, (x, oc, k, attrs, group, residual, kind)) in cases.into_iter().enumerate() {
        let g = conv_nd_graph(&mut rng, x, oc, k, &attrs, group, residual);
        let kinds = kinds(&g);
        assert!(kinds.contains(&kind), "case {i}: no {kind} in {kinds:?}");
        assert!(!kinds.contains(&"fallback"), "case {i}: {kinds:?}");
        check(&g, 40 + i as u64);
    }
}

/// ResNet-style blocks: the planner gives each fused conv its residual's buffer (the
/// residual dies there), also when the kernel accumulates over input-channel chunks.
#[test]
fn residual_blocks_write_over_their_residual() {
    for (c, k) in [(16, 3), (64, 3), (256, 3)] {
        let mut rng = Rng(c as u64);
        let mut g = Graph::new("residual");
        let x = param(&mut g, "x", &[1, c, 6, 5]);
        let w0 = weight(&mut g, &mut rng, "w0", &[c, c, 1, 1]);
        let mut h = op(&mut g, "Conv", &[x, w0], Attrs::new());
        for i in 0..2 {
            // Scaled like a trained net's (1/sqrt(fan-in)), so values stay O(1) and the
            // comparison measures the kernels, not f32 cancellation.
            let t = rng.f32_tensor(&[c, c, k, k], 1.0).to_f64_array() / ((c * k * k) as f64).sqrt();
            let t = Tensor::from_f64_array(DType::F32, t);
            let w: Value = g
                .add_constant_value(&format!("w{}", i + 1), t)
                .unwrap()
                .into();
            let pads: &[i64] = &[1, 1, 1, 1];
            let y = op(&mut g, "Conv", &[h, w], ints(&[("pads", pads)]));
            let y = op(&mut g, "Add", &[y, h], Attrs::new());
            h = op(&mut g, "Relu", &[y], Attrs::new());
        }
        g.add_output("y", h).unwrap();
        check(&g, 9);
    }
}

#[test]
fn pools_softmax_and_layernorm() {
    let mut rng = Rng(21);
    // Pools after a blocked conv (the pipeline decides the layout) and on plain inputs.
    for (kernel, strides, pads, ceil) in [
        ([2, 2], [2, 2], [0, 0, 0, 0], 0),
        ([3, 3], [2, 2], [1, 1, 1, 1], 0),
        ([3, 3], [2, 2], [0, 0, 1, 1], 1),
    ] {
        for pool in ["MaxPool", "AveragePool"] {
            for cin in [16, 5] {
                let mut g = Graph::new("pool");
                let x = param(&mut g, "x", &[2, cin, 11, 9]);
                let w = weight(&mut g, &mut rng, "w", &[16, cin, 3, 3]);
                let h = op(&mut g, "Conv", &[x, w], ints(&[("pads", &[1, 1, 1, 1])]));
                let attrs = ints(&[
                    ("kernel_shape", &kernel),
                    ("strides", &strides),
                    ("pads", &pads),
                ])
                .with("ceil_mode", Attr::Int(ceil));
                let y = op(&mut g, pool, &[h], attrs.clone());
                let y = op(&mut g, "GlobalAveragePool", &[y], Attrs::new());
                g.add_output("y", y).unwrap();
                uses(&g, "pool-blocked");
                uses(&g, "global-pool-blocked");
                check(&g, 2);
                // The same pools on a plain input.
                let mut g = Graph::new("pool");
                let x = param(&mut g, "x", &[2, cin, 11, 9]);
                let y = op(&mut g, pool, &[x], attrs);
                let y = op(&mut g, "GlobalMaxPool", &[y], Attrs::new());
                g.add_output("y", y).unwrap();
                uses(&g, "pool");
                uses(&g, "global-pool");
                check(&g, 3);
            }
        }
    }
    for width in [1, 7, 9, 33, 100, 768] {
        let mut g = Graph::new("rows");
        let x = param(&mut g, "x", &[3, 5, width]);
        let gamma = weight(&mut g, &mut rng, "gamma", &[width]);
        let beta = weight(&mut g, &mut rng, "beta", &[width]);
        let s = op(
            &mut g,
            "Softmax",
            &[x],
            Attrs::new().with("axis", Attr::Int(-1)),
        );
        let ln = op(
            &mut g,
            "LayerNormalization",
            &[x, gamma, beta],
            Attrs::new().with("axis", Attr::Int(-1)),
        );
        g.add_output("softmax", s).unwrap();
        g.add_output("layernorm", ln).unwrap();
        uses(&g, "softmax");
        uses(&g, "layernorm");
        check(&g, width as u64);
    }
    // Along an inner axis (YOLOv8's distribution head: axis 1 of [1, 16, 4, N]); lane
    // counts below, at and above the kernel's 64-lane blocks.
    for (shape, axis) in [
        (vec![1, 16, 4, 37], 1),
        (vec![2, 3, 70], 1),
        (vec![5, 2, 3], 0),
        (vec![2, 7, 64], -2),
    ] {
        for softmax in ["Softmax", "LogSoftmax"] {
            let mut g = Graph::new("inner");
            let x = param(&mut g, "x", &shape);
            let s = op(
                &mut g,
                softmax,
                &[x],
                Attrs::new().with("axis", Attr::Int(axis)),
            );
            g.add_output("y", s).unwrap();
            uses(&g, "softmax");
            check(&g, shape.len() as u64);
        }
    }
}

/// The small CNN's chain: a 1-channel conv reads the plain image (the direct kernel,
/// not im2col), and conv → pool → conv → pool stays blocked with no reorder until the
/// Flatten; ragged channel counts (20, 40) leave pad lanes the pools pool.
#[test]
fn conv_pool_chains_stay_blocked() {
    for (cin, c1, c2) in [(1, 32, 64), (3, 20, 40)] {
        let mut rng = Rng(41 + cin as u64);
        let mut g = Graph::new("cnn");
        let x = param(&mut g, "x", &[2, cin, 13, 12]);
        let pads: &[i64] = &[1, 1, 1, 1];
        let w1 = weight(&mut g, &mut rng, "w1", &[c1, cin, 3, 3]);
        let h = op(&mut g, "Conv", &[x, w1], ints(&[("pads", pads)]));
        let h = op(&mut g, "Relu", &[h], Attrs::new());
        let pool = ints(&[("kernel_shape", &[2, 2]), ("strides", &[2, 2])]);
        let h = op(&mut g, "MaxPool", &[h], pool.clone());
        let w2 = weight(&mut g, &mut rng, "w2", &[c2, c1, 3, 3]);
        let h = op(&mut g, "Conv", &[h, w2], ints(&[("pads", pads)]));
        let h = op(&mut g, "Relu", &[h], Attrs::new());
        let h = op(&mut g, "AveragePool", &[h], pool);
        let h = op(&mut g, "GlobalAveragePool", &[h], Attrs::new());
        let y = op(
            &mut g,
            "Flatten",
            &[h],
            Attrs::new().with("axis", Attr::Int(1)),
        );
        g.add_output("y", y).unwrap();
        let k = kinds_with(&g, &forcing("direct"));
        let want = [
            "conv-blocked",
            "pool-blocked",
            "conv-blocked",
            "pool-blocked",
            "global-pool-blocked",
            "reorder",
        ];
        assert_eq!(k[..want.len()], want, "{k:?}\n{}", text::print(&g));
        assert!(!k.contains(&"conv-im2col"), "{k:?}");
        check(&g, 43);
    }
}

#[test]
fn elementwise_chains_transposes_and_concats() {
    let mut rng = Rng(31);
    let mut g = Graph::new("misc");
    let x = param(&mut g, "x", &[2, 3, 17]);
    let b = weight(&mut g, &mut rng, "b", &[17]);
    let h = op(&mut g, "Add", &[x, b], Attrs::new());
    let h = op(&mut g, "Tanh", &[h], Attrs::new());
    let h = op(&mut g, "Mul", &[h, x], Attrs::new());
    let t = op(&mut g, "Transpose", &[h], ints(&[("perm", &[2, 0, 1])]));
    let c = op(
        &mut g,
        "Concat",
        &[h, x],
        Attrs::new().with("axis", Attr::Int(1)),
    );
    g.add_output("t", t).unwrap();
    g.add_output("c", c).unwrap();
    uses(&g, "transpose");
    uses(&g, "fused-eltwise");
    check(&g, 3);
}

fn scalar(g: &mut Graph, name: &str, v: f32) -> Value {
    g.add_constant_value(name, Tensor::from_vec(&[], vec![v]).unwrap())
        .unwrap()
        .into()
}

fn axes(g: &mut Graph, name: &str, axes: &[i64]) -> Value {
    let t = Tensor::from_vec(&[axes.len()], axes.to_vec()).unwrap();
    g.add_constant_value(name, t).unwrap().into()
}

/// Fused elementwise chains with broadcasts and parametrized activations, and every
/// reduction over inner, outer, split and all axes, as kernels (none falls back).
#[test]
fn fused_chains_and_reductions() {
    let mut rng = Rng(41);
    let mut g = Graph::new("fused-reduce");
    let x = param(&mut g, "x", &[3, 5, 19]);
    let s = weight(&mut g, &mut rng, "s", &[19]);
    let r = weight(&mut g, &mut rng, "r", &[5, 1]);
    let (lo, hi, two) = (
        scalar(&mut g, "lo", -0.3),
        scalar(&mut g, "hi", 0.4),
        scalar(&mut g, "two", 2.0),
    );
    let alpha = |a: f32| Attrs::new().with("alpha", Attr::Float(a as f64));
    let h = op(&mut g, "Mul", &[x, s], Attrs::new());
    let h = op(&mut g, "LeakyRelu", &[h], alpha(0.2));
    let h = op(&mut g, "Add", &[h, r], Attrs::new());
    let h = op(&mut g, "Clip", &[h, lo, hi], Attrs::new());
    let h = op(&mut g, "Gelu", &[h], Attrs::new());
    let p = op(&mut g, "Pow", &[x, two], Attrs::new());
    let p = op(&mut g, "Sqrt", &[p], Attrs::new());
    let h = op(&mut g, "Sub", &[h, p], Attrs::new());
    let h = op(&mut g, "HardSigmoid", &[h], alpha(0.3));
    let h = op(&mut g, "Elu", &[h], alpha(0.7));
    g.add_output("h", h).unwrap();
    let keep0 = Attrs::new().with("keepdims", Attr::Int(0));
    for (k, (name, ax)) in [
        ("ReduceMean", &[2i64][..]),
        ("ReduceSum", &[0, 2]),
        ("ReduceMax", &[1]),
        ("ReduceMin", &[-1]),
        ("ReduceLogSumExp", &[2]),
        ("ReduceLogSumExp", &[0]),
        ("ReduceL1", &[1, 2]),
        ("ReduceSumSquare", &[0]),
        ("ReduceProd", &[2]),
    ]
    .into_iter()
    .enumerate()
    {
        let a = axes(&mut g, &format!("axes{k}"), ax);
        let attrs = if k % 2 == 0 {
            Attrs::new()
        } else {
            keep0.clone()
        };
        let y = op(&mut g, name, &[x, a], attrs);
        g.add_output(&format!("{name}{k}"), y).unwrap();
    }
    // No axes: every axis.
    let l2 = op(&mut g, "ReduceL2", &[x], Attrs::new());
    g.add_output("l2", l2).unwrap();
    let k = kinds(&g);
    assert!(k.contains(&"fused-eltwise"), "{k:?}");
    assert_eq!(k.iter().filter(|&&s| s == "reduce").count(), 10, "{k:?}");
    assert!(!k.contains(&"fallback"), "{k:?}");
    check(&g, 9);
}

#[test]
fn embedding_lookups_and_their_bad_indices() {
    let mut rng = Rng(61);
    let mut g = Graph::new("embed");
    let ids = g
        .add_parameter("ids", TensorType::new(DType::I64, Shape::fixed(&[2, 5])))
        .unwrap()
        .into();
    let table = weight(&mut g, &mut rng, "table", &[11, 7]);
    let y = op(
        &mut g,
        "Gather",
        &[table, ids],
        Attrs::new().with("axis", Attr::Int(0)),
    );
    g.add_output("y", y).unwrap();
    let ids = Tensor::from_vec(&[2, 5], vec![0i64, 3, 10, -1, -11, 5, 5, 2, 9, 1]).unwrap();
    let want = backend_with(Device::Interp, CompileOptions::default())
        .unwrap()
        .compile(&g)
        .unwrap()
        .run(std::slice::from_ref(&ids))
        .unwrap();
    let exe = cpu(2).compile(&g).unwrap();
    exe.run(&[ids]).unwrap()[0]
        .check_close(&want[0], 0.0, 0.0)
        .unwrap();
    let bad = Tensor::from_vec(&[2, 5], vec![0i64, 3, 11, 0, 0, 0, 0, 0, 0, 0]).unwrap();
    let e = exe.run(&[bad]).unwrap_err().to_string();
    assert!(e.contains("Gather") && e.contains("out of range"), "{e}");
}

/// One executable, symbolic batch: each new batch size gets its own program, and
/// several threads may run it at once.
#[test]
fn symbolic_batches_and_concurrent_runs() {
    let mut rng = Rng(41);
    let mut g = Graph::new("batch");
    let ty = TensorType::new(
        DType::F32,
        Shape::new([
            Dim::Sym("N".into()),
            Dim::Fixed(16),
            Dim::Fixed(6),
            Dim::Fixed(6),
        ]),
    );
    let x: Value = g.add_parameter("x", ty).unwrap().into();
    let w = weight(&mut g, &mut rng, "w", &[16, 16, 3, 3]);
    let h = op(&mut g, "Conv", &[x, w], ints(&[("pads", &[1, 1, 1, 1])]));
    let h = op(&mut g, "Relu", &[h], Attrs::new());
    let h = op(&mut g, "Flatten", &[h], Attrs::new());
    let w2 = weight(&mut g, &mut rng, "w2", &[576, 10]);
    let y = op(&mut g, "MatMul", &[h, w2], Attrs::new());
    g.add_output("y", y).unwrap();
    let exe = cpu(2).compile(&g).unwrap();
    let oracle = backend_with(Device::Interp, CompileOptions::default())
        .unwrap()
        .compile(&g)
        .unwrap();
    let cases: Vec<(Vec<Tensor>, Vec<Tensor>)> = [1, 3, 1, 4]
        .iter()
        .map(|&n| {
            let inputs = vec![rng.f32_tensor(&[n, 16, 6, 6], 1.0)];
            let want = oracle.run(&inputs).unwrap();
            (inputs, want)
        })
        .collect();
    let exe: &dyn Executable = exe.as_ref();
    std::thread::scope(|s| {
        for t in 0..4 {
            let cases = &cases;
            s.spawn(move || {
                for round in 0..10 {
                    let (inputs, want) = &cases[(t + round) % cases.len()];
                    let got = exe.run(inputs).unwrap();
                    got[0].check_close(&want[0], 1e-4, 1e-4).unwrap();
                }
            });
        }
    });
}

#[test]
fn bad_inputs_are_errors_naming_the_input() {
    let mut rng = Rng(51);
    let mut g = Graph::new("bad");
    let x = param(&mut g, "x", &[2, 8]);
    let w = weight(&mut g, &mut rng, "w", &[8, 4]);
    let y = op(&mut g, "MatMul", &[x, w], Attrs::new());
    g.add_output("y", y).unwrap();
    let exe = cpu(2).compile(&g).unwrap();
    let e = exe
        .run(&[rng.f32_tensor(&[3, 8], 1.0)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("input 'x'"), "{e}");
    let e = exe
        .run(&[Tensor::from_vec(&[2, 8], vec![0i64; 16]).unwrap()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("input 'x'") && e.contains("i64"), "{e}");
    let e = exe.run(&[]).unwrap_err().to_string();
    assert!(e.contains("takes 1 inputs"), "{e}");
}

#[test]
fn low_bit_dequantize_per_tensor_per_axis_and_blocked() {
    let low_bit = DType::ALL.into_iter().filter(|d| d.is_low_bit());
    for (i, dtype) in low_bit.enumerate() {
        let mut rng = Rng(i as u64);
        // (scale dims, axis, block_size) over x of [4, 6].
        let layouts: &[(&[usize], i64, i64)] = &[
            (&[], 1, 0),
            (&[6], 1, 0),
            (&[4], 0, 0),
            (&[4, 2], 1, 4),
            (&[2, 6], 0, 3),
        ];
        for &(scale_dims, axis, block) in layouts {
            let mut g = Graph::new("dq");
            let x = param(&mut g, "x", &[4, 6]);
            // Spread [-1, 1) over the dtype's range before converting.
            let eight = common::constant(&mut g, Tensor::scalar(8.0f32));
            let wide = op(&mut g, "Mul", &[x, eight], Attrs::new());
            let to = Attrs::new().with("to", Attr::String(dtype.to_string()));
            let q = op(&mut g, "Cast", &[wide], to);
            let scale = weight(&mut g, &mut rng, "scale", scale_dims);
            let n: usize = scale_dims.iter().product();
            let zp_values: Vec<f64> = (0..n).map(|k| (k % 3) as f64).collect();
            let zp = Tensor::from_f64s(dtype, scale_dims, &zp_values).unwrap();
            let zp = common::constant(&mut g, zp);
            let attrs = Attrs::new()
                .with("axis", Attr::Int(axis))
                .with("block_size", Attr::Int(block));
            let y = op(&mut g, "DequantizeLinear", &[q, scale, zp], attrs);
            g.add_output("y", y).unwrap();
            uses(&g, "dequantize-low-bit");
            check(&g, i as u64);
        }
    }
}

/// Every activation exporters write runs as one vectorized kernel, and after a
/// convolution or a product it is the kernel's epilogue: no step of its own.
#[test]
fn activations_as_kernels_and_epilogues() {
    let mut rng = Rng(71);
    let f = |k: &str, v: f64| Attrs::new().with(k, Attr::Float(v));
    let acts: Vec<(&str, Attrs)> = vec![
        ("HardSwish", Attrs::new()),
        ("Mish", Attrs::new()),
        ("Softplus", Attrs::new()),
        ("Softsign", Attrs::new()),
        ("Selu", Attrs::new()),
        ("Selu", f("alpha", 1.5).with("gamma", Attr::Float(0.9))),
        ("Celu", f("alpha", 0.7)),
        ("ThresholdedRelu", f("alpha", 0.3)),
        ("LeakyRelu", f("alpha", 0.2)),
        ("Elu", f("alpha", 0.6)),
        ("HardSigmoid", f("alpha", 0.3)),
        ("Gelu", Attrs::new()),
        (
            "Gelu",
            Attrs::new().with("approximate", Attr::String("tanh".into())),
        ),
    ];
    for (name, attrs) in &acts {
        let mut g = Graph::new("act");
        let x = param(&mut g, "x", &[3, 37]);
        let y = op(&mut g, name, &[x], attrs.clone());
        g.add_output("y", y).unwrap();
        uses(&g, "activation");
        check(&g, 5);
        // After a convolution: its epilogue.
        let mut g = Graph::new("conv-act");
        let x = param(&mut g, "x", &[1, 16, 9, 7]);
        let w = weight(&mut g, &mut rng, "w", &[24, 16, 3, 3]);
        let h = op(&mut g, "Conv", &[x, w], ints(&[("pads", &[1, 1, 1, 1])]));
        let y = op(&mut g, name, &[h], attrs.clone());
        g.add_output("y", y).unwrap();
        let k = kinds(&g);
        assert!(
            !k.iter()
                .any(|s| ["activation", "fused-eltwise", "fallback"].contains(s)),
            "{name}: {k:?}"
        );
        check(&g, 6);
    }
}

/// The decomposed forms exporters write: HardSwish as `x * clip(x + 3, 0, 6) / 6` (and
/// as `x * HardSigmoid(x)`) after a convolution, SiLU as `x * sigmoid(x)` after a
/// product, each folded into the producer's epilogue.
#[test]
fn decomposed_hardswish_and_silu_fuse_into_epilogues() {
    let mut rng = Rng(73);
    let c = |g: &mut Graph, v: f32| scalar(g, &format!("c{v}"), v);
    for form in 0..3 {
        let mut g = Graph::new("hardswish");
        let x = param(&mut g, "x", &[1, 16, 8, 5]);
        let w = weight(&mut g, &mut rng, "w", &[32, 16, 1, 1]);
        let h = op(&mut g, "Conv", &[x, w], Attrs::new());
        let (three, zero, six) = (c(&mut g, 3.0), c(&mut g, 0.0), c(&mut g, 6.0));
        let y = if form == 2 {
            let hs = Attrs::new()
                .with("alpha", Attr::Float(1.0 / 6.0))
                .with("beta", Attr::Float(0.5));
            let s = op(&mut g, "HardSigmoid", &[h], hs);
            op(&mut g, "Mul", &[h, s], Attrs::new())
        } else {
            let t = op(&mut g, "Add", &[h, three], Attrs::new());
            let t = op(&mut g, "Clip", &[t, zero, six], Attrs::new());
            if form == 0 {
                let m = op(&mut g, "Mul", &[h, t], Attrs::new());
                op(&mut g, "Div", &[m, six], Attrs::new())
            } else {
                let d = op(&mut g, "Div", &[t, six], Attrs::new());
                op(&mut g, "Mul", &[h, d], Attrs::new())
            }
        };
        g.add_output("y", y).unwrap();
        let k = kinds(&g);
        assert!(
            !k.iter()
                .any(|s| ["activation", "fused-eltwise", "binary", "fallback"].contains(s)),
            "form {form}: {k:?}"
        );
        check(&g, 7);
    }
    let mut g = Graph::new("silu");
    let x = param(&mut g, "x", &[5, 33]);
    let w = weight(&mut g, &mut rng, "w", &[33, 20]);
    let h = op(&mut g, "MatMul", &[x, w], Attrs::new());
    let s = op(&mut g, "Sigmoid", &[h], Attrs::new());
    let y = op(&mut g, "Mul", &[s, h], Attrs::new());
    g.add_output("y", y).unwrap();
    let k = kinds(&g);
    assert_eq!(k.len(), 1, "{k:?}");
    check(&g, 8);
}

/// Binary ops on every numeric dtype, broadcast, exactly as the interpreter computes
/// them (integers wrap); an integer division by zero is an error naming the node.
#[test]
fn binary_ops_on_every_numeric_dtype() {
    let dtypes = [
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::F64,
        DType::F16,
        DType::BF16,
    ];
    let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
    let mut rng = Rng(79);
    for dtype in dtypes {
        for name in ["Add", "Sub", "Mul", "Div", "Max", "Min"] {
            let mut g = Graph::new("typed");
            let a = common::typed_param(&mut g, "a", dtype, &[3, 1, 5]);
            let b = common::typed_param(&mut g, "b", dtype, &[4, 1]);
            let y = op(&mut g, name, &[a, b], Attrs::new());
            g.add_output("y", y).unwrap();
            uses(&g, "binary-elem");
            let values = |rng: &mut Rng, n: usize| -> Vec<f64> {
                // Small magnitudes (unsigned types too), never 0 (a divisor).
                (0..n)
                    .map(|_| {
                        let v = (rng.f32_tensor(&[1], 1.0).to_f64_vec()[0] * 100.0).round();
                        let unsigned =
                            matches!(dtype, DType::U8 | DType::U16 | DType::U32 | DType::U64);
                        let v = if unsigned { v.abs() } else { v };
                        if v == 0.0 {
                            7.0
                        } else {
                            v
                        }
                    })
                    .collect()
            };
            let inputs = vec![
                Tensor::from_f64s(dtype, &[3, 1, 5], &values(&mut rng, 15)).unwrap(),
                Tensor::from_f64s(dtype, &[4, 1], &values(&mut rng, 4)).unwrap(),
            ];
            let want = interp.compile(&g).unwrap().run(&inputs).unwrap();
            for threads in [1, 2] {
                let got = cpu(threads).compile(&g).unwrap().run(&inputs).unwrap();
                assert_eq!(got, want, "{name} on {dtype}");
            }
        }
    }
    let mut g = Graph::new("div0");
    let a = common::typed_param(&mut g, "a", DType::I32, &[4]);
    let b = common::typed_param(&mut g, "b", DType::I32, &[4]);
    let y = common::named_op(&mut g, "Div", &[a, b], Attrs::new(), "the_div");
    g.add_output("y", y).unwrap();
    let a = Tensor::from_f64s(DType::I32, &[4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let b = Tensor::from_f64s(DType::I32, &[4], &[1.0, 0.0, 3.0, 4.0]).unwrap();
    let err = cpu(1).compile(&g).unwrap().run(&[a, b]).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("the_div") && msg.contains("division by zero"),
        "{msg}"
    );
}

/// Multi-head attention as one kernel: 3-D and 4-D operands, grouped key/value heads,
/// no mask, a key mask and a full mask, an explicit scale.
#[test]
fn attention_heads_on_the_gemm() {
    let mask_shapes: [Option<&[usize]>; 4] = [
        None,
        Some(&[2, 1, 1, 11]),
        Some(&[11]),
        Some(&[2, 4, 7, 11]),
    ];
    for mask_shape in mask_shapes {
        for three_d in [true, false] {
            let (hq, hkv, d, dv) = (4, 2, 8, 5);
            let (b, sq, t) = (2, 7, 11);
            let mut g = Graph::new("attention");
            let (q, k, v) = if three_d {
                (
                    param(&mut g, "q", &[b, sq, hq * d]),
                    param(&mut g, "k", &[b, t, hkv * d]),
                    param(&mut g, "v", &[b, t, hkv * dv]),
                )
            } else {
                (
                    param(&mut g, "q", &[b, hq, sq, d]),
                    param(&mut g, "k", &[b, hkv, t, d]),
                    param(&mut g, "v", &[b, hkv, t, dv]),
                )
            };
            let mut ins = vec![q, k, v];
            if let Some(ms) = mask_shape {
                ins.push(param(&mut g, "mask", ms));
            }
            let mut attrs = Attrs::new();
            if three_d {
                attrs = attrs
                    .with("q_num_heads", Attr::Int(hq as i64))
                    .with("kv_num_heads", Attr::Int(hkv as i64));
            }
            if mask_shape.is_some_and(|m| m.len() == 1) {
                attrs = attrs.with("scale", Attr::Float(0.3));
            }
            let node = g.op("Attention", &ins, attrs, "att").unwrap();
            g.add_output("y", Value::from(node)).unwrap();
            uses(&g, "attention");
            check(&g, 11);
        }
    }
}

/// Reductions on integer and f64/f16 tensors over constant axes, kept or dropped, as
/// the interpreter computes them (integers exactly).
#[test]
fn reductions_on_every_numeric_dtype() {
    let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
    let mut rng = Rng(83);
    for dtype in [DType::I32, DType::I64, DType::U8, DType::F64, DType::F16] {
        let kinds_of: &[&str] = if dtype.is_float() {
            &[
                "ReduceSum",
                "ReduceMean",
                "ReduceMax",
                "ReduceMin",
                "ReduceProd",
                "ReduceL1",
                "ReduceL2",
                "ReduceLogSumExp",
                "ReduceSumSquare",
            ]
        } else {
            &[
                "ReduceSum",
                "ReduceMax",
                "ReduceMin",
                "ReduceProd",
                "ReduceL1",
                "ReduceSumSquare",
            ]
        };
        for (k, name) in kinds_of.iter().enumerate() {
            for ax in [&[1i64][..], &[0, 2], &[-1], &[0, 1, 2]] {
                let mut g = Graph::new("reduce");
                let x = common::typed_param(&mut g, "x", dtype, &[3, 4, 5]);
                let a = axes(&mut g, "axes", ax);
                let attrs = Attrs::new().with("keepdims", Attr::Int((k % 2) as i64));
                let y = op(&mut g, name, &[x, a], attrs);
                g.add_output("y", y).unwrap();
                uses(&g, "reduce");
                let vals: Vec<f64> = rng
                    .f32_tensor(&[60], 3.0)
                    .to_f64_vec()
                    .iter()
                    .map(|v| {
                        if dtype.is_float() {
                            *v
                        } else {
                            v.round().abs()
                        }
                    })
                    .collect();
                let inputs = vec![Tensor::from_f64s(dtype, &[3, 4, 5], &vals).unwrap()];
                let want = interp.compile(&g).unwrap().run(&inputs).unwrap();
                for threads in [1, 2] {
                    let got = cpu(threads).compile(&g).unwrap().run(&inputs).unwrap();
                    got[0]
                        .check_close(&want[0], 1e-12, 1e-12)
                        .unwrap_or_else(|e| panic!("{name} {ax:?} on {dtype}: {e}"));
                }
            }
        }
    }
}

/// LayerNormalization over the trailing axes from any `axis` is one kernel.
#[test]
fn layernorm_over_trailing_axes() {
    let mut rng = Rng(89);
    for axis in [0i64, 1, -2, 2] {
        let mut g = Graph::new("ln");
        let x = param(&mut g, "x", &[3, 5, 7]);
        let from = if axis < 0 { axis + 3 } else { axis } as usize;
        let dims = &[3, 5, 7][from..];
        let gamma = weight(&mut g, &mut rng, "gamma", dims);
        let beta = weight(&mut g, &mut rng, "beta", dims);
        let attrs = Attrs::new().with("axis", Attr::Int(axis));
        let y = op(&mut g, "LayerNormalization", &[x, gamma, beta], attrs);
        g.add_output("y", y).unwrap();
        uses(&g, "layernorm");
        check(&g, 13);
    }
}

/// InstanceNormalization (and so GroupNormalization, which imports as it) and
/// LpNormalization along any axis run as kernels.
#[test]
fn instance_and_lp_normalization() {
    let mut rng = Rng(90);
    for dims in [&[2, 3, 5, 7][..], &[1, 4, 33], &[2, 2, 3, 4, 5]] {
        let mut g = Graph::new("in");
        let x = param(&mut g, "x", dims);
        let scale = weight(&mut g, &mut rng, "scale", &[dims[1]]);
        let bias = weight(&mut g, &mut rng, "bias", &[dims[1]]);
        let attrs = Attrs::new().with("epsilon", Attr::Float(1e-3));
        let y = op(&mut g, "InstanceNormalization", &[x, scale, bias], attrs);
        g.add_output("y", y).unwrap();
        uses(&g, "instancenorm");
        check(&g, 14);
    }
    for (axis, p) in [(-1i64, 2i64), (0, 1), (1, 2), (2, 1)] {
        let mut g = Graph::new("lp");
        let x = param(&mut g, "x", &[3, 5, 7]);
        let attrs = Attrs::new()
            .with("axis", Attr::Int(axis))
            .with("p", Attr::Int(p));
        let y = op(&mut g, "LpNormalization", &[x], attrs);
        g.add_output("y", y).unwrap();
        uses(&g, "lpnorm");
        check(&g, 15);
    }
}

/// TopK along any axis, largest or smallest, runs as a kernel.
#[test]
fn topk_along_any_axis() {
    for (axis, k, largest) in [(-1i64, 3i64, 1i64), (0, 2, 0), (1, 5, 1), (2, 1, 0)] {
        let mut g = Graph::new("topk");
        let x = param(&mut g, "x", &[4, 5, 6]);
        let k = g.ints("k", &[k]).unwrap();
        let attrs = Attrs::new()
            .with("axis", Attr::Int(axis))
            .with("largest", Attr::Int(largest));
        let node = g.add_op("TopK", &[Some(x), Some(k)], attrs, "").unwrap();
        g.add_output("values", node.out(0)).unwrap();
        g.add_output("indices", node.out(1)).unwrap();
        uses(&g, "topk");
        check(&g, 16);
    }
}

/// Two-operand Einsums run on the GEMM (the pipeline lowers them to MatMul).
#[test]
fn einsums_run_on_the_gemm() {
    for (eq, a, b) in [
        ("bhqd,bhkd->bhqk", &[2, 3, 4, 5][..], &[2, 3, 6, 5][..]),
        ("bid,jd->bij", &[2, 3, 4], &[5, 4]),
    ] {
        let mut g = Graph::new("einsum");
        let x = param(&mut g, "a", a);
        let y = param(&mut g, "b", b);
        let attrs = Attrs::new().with("equation", Attr::String(eq.into()));
        let e = op(&mut g, "Einsum", &[x, y], attrs);
        g.add_output("y", e).unwrap();
        uses(&g, "gemm");
        assert!(!kinds(&g).contains(&"fallback"), "{eq}");
        check(&g, 17);
    }
}

/// Conv and MatMul with a bias Add and an activation off f32: the epilogue fuses only
/// where a fused kernel of that dtype exists, so every one compiles to kernels (the
/// fallback is off) and agrees with the interpreter.
#[test]
fn epilogues_off_f32_compile_to_kernels() {
    for (dtype, tol) in [(DType::F64, 1e-9), (DType::F16, 1e-2), (DType::BF16, 5e-2)] {
        let mut rng = Rng(7);
        let mut constant = |g: &mut Graph, name: &str, dims: &[usize]| -> Value {
            let n: usize = dims.iter().product();
            let v: Vec<f64> = (0..n).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let t = Tensor::from_f64s(dtype, dims, &v).unwrap();
            g.add_constant_value(name, t).unwrap().into()
        };
        let mut g = Graph::new("epilogues");
        let x = common::typed_param(&mut g, "x", dtype, &[1, 3, 6, 6]);
        let w = constant(&mut g, "w", &[4, 3, 3, 3]);
        let b = constant(&mut g, "b", &[1, 4, 1, 1]);
        let conv = op(&mut g, "Conv", &[x, w], Attrs::new());
        let biased = op(&mut g, "Add", &[conv, b], Attrs::new());
        let y = op(&mut g, "Relu", &[biased], Attrs::new());
        let flat = op(&mut g, "Flatten", &[y], Attrs::new());
        let m = constant(&mut g, "m", &[64, 5]);
        let c = constant(&mut g, "c", &[5]);
        let mm = op(&mut g, "MatMul", &[flat, m], Attrs::new());
        let mb = op(&mut g, "Add", &[mm, c], Attrs::new());
        let z = op(&mut g, "Tanh", &[mb], Attrs::new());
        g.add_output("z", z).unwrap();
        let xs: Vec<f64> = (0..108)
            .map(|i| ((i * 37) % 17) as f64 / 17.0 - 0.5)
            .collect();
        let inputs = [Tensor::from_f64s(dtype, &[1, 3, 6, 6], &xs).unwrap()];
        let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
        let want = interp.compile(&g).unwrap().run(&inputs).unwrap();
        let got = cpu(1)
            .compile(&g)
            .unwrap_or_else(|e| panic!("{dtype}: {e}"))
            .run(&inputs)
            .unwrap();
        got[0]
            .check_close(&want[0], tol, tol)
            .unwrap_or_else(|e| panic!("{dtype}: {e}"));
    }
}
