//! The CPU backend's quantized kernels against the reference interpreter, bit for bit:
//! DynamicQuantizeLinear, MatMulInteger and ConvInteger over u8 and i8 operands, zero
//! points per tensor, per row, per column and per output channel, depths that split
//! the exact f32 GEMM into chunks, at 1 and 2 threads.
use crate::common;

use kiln::backend::cpu::CpuBackend;
use kiln::backend::{backend_with, Device, Executable};
use kiln::ir::{text, Attrs, DType, Graph, Value};
use kiln::passes::CompileOptions;
use kiln::Tensor;

use common::{constant, ints, op, typed_param, Rng};

fn cpu(threads: usize) -> CpuBackend {
    CpuBackend::new(CompileOptions {
        threads,
        ..Default::default()
    })
}

/// Random bytes of `dtype` (u8 or i8) over their whole range.
fn bytes(rng: &mut Rng, dtype: DType, dims: &[usize]) -> Tensor {
    let n = dims.iter().product();
    let v: Vec<u8> = (0..n).map(|_| rng.below(256) as u8).collect();
    match dtype {
        DType::U8 => Tensor::from_vec(dims, v).unwrap(),
        _ => Tensor::from_vec(dims, v.into_iter().map(|b| b as i8).collect()).unwrap(),
    }
}

/// `g` (its inputs `inputs`) on cpu at 1 and 2 threads gives exactly the interpreter's
/// outputs, with a step of kind `kind`.
fn check_exact(g: &Graph, inputs: &[Tensor], kind: &str) {
    let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
    let want = interp.compile(g).unwrap().run(inputs).unwrap();
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    for threads in [1, 2] {
        let exe = cpu(threads)
            .compile_cpu(g)
            .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)));
        let kinds = exe
            .step_kinds(&shapes)
            .unwrap()
            .expect("lowered to kernels");
        assert!(
            kinds.contains(&kind) && !kinds.contains(&"fallback"),
            "{kind} expected, got {kinds:?}\n{}",
            text::print(g)
        );
        let got = exe.run(inputs).unwrap();
        for (i, (w, o)) in want.iter().zip(&got).enumerate() {
            assert_eq!((w.dtype(), w.shape()), (o.dtype(), o.shape()), "output {i}");
            let (w, o) = (w.to_f64_vec(), o.to_f64_vec());
            let bad = w.iter().zip(&o).position(|(a, b)| a != b);
            assert!(
                bad.is_none(),
                "output {i}, {threads} thread(s), element {bad:?}: want {:?}, got {:?}\n{}",
                bad.map(|e| w[e]),
                bad.map(|e| o[e]),
                text::print(g)
            );
        }
    }
}

#[test]
fn dynamic_quantization_is_the_interpreters() {
    let mut rng = Rng(7);
    for (i, dims) in [&[1usize][..], &[5, 7], &[3, 37, 41], &[2, 24, 32, 80]]
        .iter()
        .enumerate()
    {
        let mut g = Graph::new("dql");
        let x = typed_param(&mut g, "x", DType::F32, dims);
        let q = g
            .op("DynamicQuantizeLinear", &[x], Attrs::new(), "q")
            .unwrap();
        for k in 0..3 {
            g.add_output(&format!("y{k}"), q.out(k)).unwrap();
        }
        // Skewed ranges (all positive, all negative, mixed) move the zero point.
        let shift = [0.0, 3.0, -3.0, 0.5][i];
        let x = rng.f32_tensor(dims, 2.0).to_f64_vec();
        let x: Vec<f32> = x.iter().map(|v| (v + shift) as f32).collect();
        check_exact(
            &g,
            &[Tensor::from_vec(dims, x).unwrap()],
            "dynamic-quantize",
        );
    }
}

/// The zero point operand `kind` asks for: none, one, or one per `len` index.
fn zero_point(
    g: &mut Graph,
    rng: &mut Rng,
    dtype: DType,
    kind: usize,
    len: usize,
) -> Option<Value> {
    match kind {
        0 => None,
        1 => Some(constant(g, bytes(rng, dtype, &[]))),
        _ => Some(constant(g, bytes(rng, dtype, &[len]))),
    }
}

#[test]
fn integer_matmuls_are_exact() {
    // (A dims, B dims, A's dtype, B's dtype, A's zero point, B's zero point, B constant)
    type Case = (
        &'static [usize],
        &'static [usize],
        DType,
        DType,
        usize,
        usize,
        bool,
    );
    let cases: &[Case] = &[
        (&[1, 1], &[1, 1], DType::U8, DType::I8, 0, 0, true),
        (&[5, 7], &[7, 9], DType::U8, DType::U8, 1, 1, true),
        (&[17, 700], &[700, 33], DType::U8, DType::U8, 1, 2, true),
        (&[2, 3, 300], &[300, 20], DType::I8, DType::I8, 2, 1, true),
        (&[6, 520], &[520, 19], DType::U8, DType::I8, 1, 2, false),
        (&[2, 5, 8], &[2, 8, 3], DType::U8, DType::U8, 1, 1, true),
        (&[3, 1, 4, 9], &[2, 9, 5], DType::U8, DType::U8, 0, 1, false),
    ];
    for (i, &(a_dims, b_dims, a_type, b_type, a_zp, b_zp, b_const)) in cases.iter().enumerate() {
        let mut rng = Rng(i as u64);
        let mut g = Graph::new("matmul_integer");
        let a = typed_param(&mut g, "a", a_type, a_dims);
        let mut inputs = vec![bytes(&mut rng, a_type, a_dims)];
        let b = if b_const {
            constant(&mut g, bytes(&mut rng, b_type, b_dims))
        } else {
            inputs.push(bytes(&mut rng, b_type, b_dims));
            typed_param(&mut g, "b", b_type, b_dims)
        };
        let m = a_dims[a_dims.len() - 2];
        let n = b_dims[b_dims.len() - 1];
        let za = zero_point(&mut g, &mut rng, a_type, a_zp, m);
        let zb = zero_point(&mut g, &mut rng, b_type, b_zp, n);
        let y = g
            .add_op(
                "MatMulInteger",
                &[Some(a), Some(b), za, zb],
                Attrs::new(),
                "y",
            )
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        g.add_output("y", y.out(0)).unwrap();
        check_exact(&g, &inputs, "gemm-integer");
    }
}

#[test]
fn integer_convolutions_are_exact() {
    struct Case {
        x: &'static [usize],
        w: &'static [usize],
        w_type: DType,
        group: i64,
        attrs: &'static [(&'static str, &'static [i64])],
        per_channel: bool,
    }
    let cases = [
        // ddddocr's first layer: one channel, stride 2, padding.
        Case {
            x: &[1, 1, 16, 20],
            w: &[8, 1, 3, 3],
            w_type: DType::I8,
            group: 1,
            attrs: &[("strides", &[2, 2]), ("pads", &[1, 1, 1, 1])],
            per_channel: false,
        },
        // A depth of 64·9 with u8 weights: three exact chunks.
        Case {
            x: &[2, 64, 7, 6],
            w: &[5, 64, 3, 3],
            w_type: DType::U8,
            group: 1,
            attrs: &[("pads", &[1, 0, 2, 1])],
            per_channel: true,
        },
        Case {
            x: &[1, 6, 9, 9],
            w: &[4, 3, 3, 2],
            w_type: DType::I8,
            group: 2,
            attrs: &[("dilations", &[2, 1]), ("strides", &[1, 2])],
            per_channel: true,
        },
        // 1-D (a voice detector's) and 3-D.
        Case {
            x: &[1, 4, 50],
            w: &[6, 4, 5],
            w_type: DType::I8,
            group: 1,
            attrs: &[("strides", &[3]), ("pads", &[2, 2])],
            per_channel: false,
        },
        Case {
            x: &[1, 3, 4, 5, 6],
            w: &[2, 3, 2, 3, 2],
            w_type: DType::U8,
            group: 1,
            attrs: &[("pads", &[1, 0, 1, 0, 1, 0])],
            per_channel: true,
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let mut rng = Rng(100 + i as u64);
        let mut g = Graph::new("conv_integer");
        let x = typed_param(&mut g, "x", DType::U8, c.x);
        let x_zp = typed_param(&mut g, "x_zero_point", DType::U8, &[]);
        let w = constant(&mut g, bytes(&mut rng, c.w_type, c.w));
        let w_zp = zero_point(
            &mut g,
            &mut rng,
            c.w_type,
            if c.per_channel { 2 } else { 1 },
            c.w[0],
        );
        let attrs = ints(c.attrs).with("group", kiln::ir::Attr::Int(c.group));
        let y = g
            .add_op(
                "ConvInteger",
                &[Some(x), Some(w), Some(x_zp), w_zp],
                attrs,
                "y",
            )
            .unwrap_or_else(|e| panic!("case {i}: {e}"));
        g.add_output("y", y.out(0)).unwrap();
        let inputs = [
            bytes(&mut rng, DType::U8, c.x),
            bytes(&mut rng, DType::U8, &[]),
        ];
        check_exact(&g, &inputs, "conv-integer");
    }
}

/// The pattern quantizing exporters write: x quantized dynamically, the integer
/// convolution, its i32 result back to f32 and scaled.
#[test]
fn dynamically_quantized_convolution_runs_on_kernels() {
    let mut rng = Rng(3);
    let mut g = Graph::new("dynamic_conv");
    let x = typed_param(&mut g, "x", DType::F32, &[1, 8, 12, 10]);
    let q = g
        .op("DynamicQuantizeLinear", &[x], Attrs::new(), "q")
        .unwrap();
    let w = constant(&mut g, bytes(&mut rng, DType::I8, &[16, 8, 3, 3]));
    let y = op(
        &mut g,
        "ConvInteger",
        &[q.out(0), w, q.out(2)],
        ints(&[("pads", &[1, 1, 1, 1])]),
    );
    let y = op(
        &mut g,
        "Cast",
        &[y],
        Attrs::new().with("to", kiln::ir::Attr::String("f32".into())),
    );
    let y = op(&mut g, "Mul", &[y, q.out(1)], Attrs::new());
    g.add_output("y", y).unwrap();
    check_exact(&g, &[rng.f32_tensor(&[1, 8, 12, 10], 3.0)], "conv-integer");
}

/// A dynamically quantized layer with its whole dequantizing epilogue, as exporters
/// write it: ConvInteger, an i32 bias (a run-time input, per channel or one), Cast to
/// f32, the scale (x's, times a constant), then `tail` ("relu", "silu", "residual" or
/// nothing). The fuse-quant pass makes it one `FusedConvInteger` step.
fn dequantized_conv(dims: &[usize], m: usize, group: i64, per_channel: bool, tail: &str) -> Graph {
    let mut rng = Rng(5);
    let mut g = Graph::new("dequantized_conv");
    let x = typed_param(&mut g, "x", DType::F32, dims);
    let bias_dims: &[usize] = if per_channel { &[1, m, 1, 1] } else { &[] };
    let bias = typed_param(&mut g, "bias", DType::I32, bias_dims);
    let q = g
        .op("DynamicQuantizeLinear", &[x], Attrs::new(), "q")
        .unwrap();
    let depth = dims[1] / group as usize;
    let w = constant(&mut g, bytes(&mut rng, DType::U8, &[m, depth, 3, 3]));
    let wz = constant(&mut g, bytes(&mut rng, DType::U8, &[]));
    let attrs = ints(&[("pads", &[1, 1, 1, 1])]).with("group", kiln::ir::Attr::Int(group));
    let y = op(&mut g, "ConvInteger", &[q.out(0), w, q.out(2), wz], attrs);
    let y = op(&mut g, "Add", &[bias, y], Attrs::new());
    let y = op(
        &mut g,
        "Cast",
        &[y],
        Attrs::new().with("to", kiln::ir::Attr::String("f32".into())),
    );
    let w_scale = constant(&mut g, Tensor::from_vec(&[], vec![0.0371f32]).unwrap());
    let scale = op(&mut g, "Mul", &[q.out(1), w_scale], Attrs::new());
    let y = op(&mut g, "Mul", &[scale, y], Attrs::new());
    let y = match tail {
        "relu" => op(&mut g, "Relu", &[y], Attrs::new()),
        "silu" => {
            let s = op(&mut g, "Sigmoid", &[y], Attrs::new());
            op(&mut g, "Mul", &[y, s], Attrs::new())
        }
        "residual" => {
            let z = typed_param(&mut g, "z", DType::F32, &[dims[0], m, dims[2], dims[3]]);
            op(&mut g, "Add", &[y, z], Attrs::new())
        }
        _ => y,
    };
    g.add_output("y", y).unwrap();
    g
}

#[test]
fn dequantizing_epilogues_are_the_interpreters() {
    // (x dims, output channels, group, bias per channel, tail)
    let cases: &[(&[usize], usize, i64, bool, &str)] = &[
        (&[1, 8, 12, 10], 16, 1, true, ""),
        (&[1, 8, 12, 10], 16, 1, true, "relu"),
        (&[2, 6, 7, 9], 4, 2, true, "residual"),
        (&[1, 24, 16, 40], 40, 1, false, ""),
        (&[1, 24, 16, 40], 40, 1, true, "silu"),
    ];
    for (i, &(dims, m, group, per_channel, tail)) in cases.iter().enumerate() {
        let g = dequantized_conv(dims, m, group, per_channel, tail);
        let mut rng = Rng(50 + i as u64);
        let mut inputs = vec![rng.f32_tensor(dims, 3.0)];
        let bias_dims: &[usize] = if per_channel { &[1, m, 1, 1] } else { &[] };
        let n: usize = bias_dims.iter().product();
        let bias: Vec<i32> = (0..n).map(|_| rng.below(4001) as i32 - 2000).collect();
        inputs.push(Tensor::from_vec(bias_dims, bias).unwrap());
        if tail == "residual" {
            inputs.push(rng.f32_tensor(&[dims[0], m, dims[2], dims[3]], 1.0));
        }
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
        let kinds = cpu(1)
            .compile_cpu(&g)
            .unwrap()
            .step_kinds(&shapes)
            .unwrap()
            .expect("lowered to kernels");
        // One step from the convolution to the activation: no Add, Cast or Mul over the
        // output left (the scale's own scalar Mul stays).
        assert!(
            !kinds
                .iter()
                .any(|k| ["cast", "binary-elem", "fused-eltwise"].contains(k)),
            "case {i}: {kinds:?}"
        );
        if tail == "silu" {
            // The CPU's SiLU is within a few ulps of the interpreter's, not bit-exact.
            let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
            let want = interp.compile(&g).unwrap().run(&inputs).unwrap();
            for threads in [1, 2] {
                let got = cpu(threads).compile_cpu(&g).unwrap().run(&inputs).unwrap();
                got[0]
                    .check_close(&want[0], 1e-6, 1e-6)
                    .unwrap_or_else(|e| panic!("case {i}, {threads} thread(s): {e}"));
            }
        } else {
            check_exact(&g, &inputs, "conv-integer");
        }
    }
}
