//! The CPU backend's loss, sampling, dropout and quantization kernels against the
//! reference interpreter, compiled without the fallback: NegativeLogLikelihoodLoss and
//! SoftmaxCrossEntropyLoss (ranks 2–5, every reduction, weights, ignore_index, the
//! log_prob output, i32 and i64 targets), GridSample (every mode, padding and
//! align_corners, 1–3 spatial axes), Dropout (inference and training, ratio, training
//! mode and counter as run-time inputs, the mask), QuantizeLinear and DequantizeLinear
//! of every dtype (per tensor, per axis, blocked; with and without a zero point;
//! saturating and not) and ConvInteger with run-time weights, on several float dtypes,
//! each asserting the kernel it lowered to.
use crate::common;

use common::{constant, typed_param, Rng};
use kiln::backend::cpu::CpuBackend;
use kiln::backend::{backend_with, Device};
use kiln::ir::{text, Attr, Attrs, DType, Graph, Value};
use kiln::passes::CompileOptions;
use kiln::Tensor;

fn options() -> CompileOptions {
    CompileOptions {
        allow_fallback: false,
        threads: 1,
        ..Default::default()
    }
}

/// `g` compiles without the fallback to a step of one of `kinds`, and gives the
/// interpreter's outputs (within `tol`; 0: exactly).
fn check(g: &Graph, inputs: &[Tensor], kinds: &[&str], tol: f64) {
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let cpu = CpuBackend::new(options());
    let exe = cpu
        .compile_cpu(g)
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)));
    let got_kinds: Vec<&str> = exe
        .step_report(&shapes)
        .unwrap()
        .iter()
        .map(|s| s.kind)
        .collect();
    assert!(
        got_kinds.iter().any(|k| kinds.contains(k)),
        "want a step of {kinds:?}, got {got_kinds:?}\n{}",
        text::print(g)
    );
    let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
    let want = interp.compile(g).unwrap().run(inputs).unwrap();
    let cpu = backend_with(Device::Cpu, options()).unwrap();
    let got = cpu
        .compile(g)
        .unwrap()
        .run(inputs)
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)));
    assert_eq!(want.len(), got.len());
    for (i, (w, o)) in want.iter().zip(&got).enumerate() {
        o.check_close(w, tol, tol)
            .unwrap_or_else(|e| panic!("output {i}: {e}\n{}", text::print(g)));
    }
}

fn node(g: &mut Graph, op: &str, inputs: &[Value], attrs: Attrs) -> kiln::ir::NodeId {
    g.op(op, inputs, attrs, "")
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)))
}

fn tolerance(d: DType) -> f64 {
    match d {
        DType::F64 => 1e-12,
        DType::F32 => 1e-6,
        _ => 1e-3,
    }
}

/// Both losses over ranks 2–5, reductions, weights, ignore_index and target types.
#[test]
fn losses() {
    let mut rng = Rng(7);
    let shapes: [&[usize]; 5] = [
        &[3, 5],
        &[2, 4, 3],
        &[2, 3, 2, 2],
        &[1, 2, 2, 1, 3],
        &[0, 3],
    ];
    for (case, shape) in shapes.iter().enumerate() {
        for softmax in [false, true] {
            for reduction in ["none", "sum", "mean"] {
                for weighted in [false, true] {
                    for ignore in [None, Some(1i64), Some(-1)] {
                        let dtype = [DType::F32, DType::F64, DType::F16][case % 3];
                        let label = if (case + weighted as usize).is_multiple_of(2) {
                            DType::I64
                        } else {
                            DType::I32
                        };
                        let c = shape[1];
                        let mut tshape = vec![shape[0]];
                        tshape.extend_from_slice(&shape[2..]);
                        let mut g = Graph::new("loss");
                        let x = typed_param(&mut g, "x", dtype, shape);
                        let t = typed_param(&mut g, "t", label, &tshape);
                        let mut ins = vec![x, t];
                        let mut feeds = vec![rng.tensor_of(dtype, shape)];
                        let n: usize = tshape.iter().product();
                        let targets: Vec<i64> = (0..n)
                            .map(|_| match ignore {
                                Some(i) if rng.below(4) == 0 => i,
                                _ => rng.below(c) as i64,
                            })
                            .collect();
                        feeds.push(Tensor::from_i64s(label, &tshape, &targets).unwrap());
                        if weighted {
                            ins.push(typed_param(&mut g, "w", dtype, &[c]));
                            let w: Vec<f64> = (0..c).map(|_| rng.uniform(0.1, 2.0)).collect();
                            feeds.push(Tensor::from_f64s(dtype, &[c], &w).unwrap());
                        }
                        let mut attrs =
                            Attrs::new().with("reduction", Attr::String(reduction.into()));
                        if let Some(i) = ignore {
                            attrs = attrs.with("ignore_index", Attr::Int(i));
                        }
                        let op = if softmax {
                            "SoftmaxCrossEntropyLoss"
                        } else {
                            "NegativeLogLikelihoodLoss"
                        };
                        let id = node(&mut g, op, &ins, attrs);
                        g.add_output("loss", id.out(0)).unwrap();
                        if softmax && case.is_multiple_of(2) {
                            g.add_output("log_prob", id.out(1)).unwrap();
                        }
                        // The [N, C] unweighted f32 loss has its own vectorized step.
                        let kinds: &[&str] = match softmax {
                            false => &["nll-loss"],
                            true => &["softmax-xent-nd", "softmax-xent"],
                        };
                        check(&g, &feeds, kinds, tolerance(dtype));
                    }
                }
            }
        }
    }
}

/// MseLoss on every float dtype, each reduction, rank 0 and empty inputs.
#[test]
fn mse_loss() {
    let mut rng = Rng(17);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for shape in [&[3usize, 4][..], &[], &[2, 0, 3], &[2, 1, 3, 2]] {
            for reduction in ["none", "sum", "mean"] {
                let mut g = Graph::new("mse");
                let p = typed_param(&mut g, "p", dtype, shape);
                let t = typed_param(&mut g, "t", dtype, shape);
                let attrs = Attrs::new().with("reduction", Attr::String(reduction.into()));
                let id = node(&mut g, "MseLoss", &[p, t], attrs);
                g.add_output("loss", id.out(0)).unwrap();
                let feeds = [rng.tensor_of(dtype, shape), rng.tensor_of(dtype, shape)];
                check(&g, &feeds, &["mse-loss"], tolerance(dtype));
            }
        }
    }
}

/// AffineGrid, 2-D and 3-D, both align_corners, size-1 axes, on every float dtype.
#[test]
fn affine_grid() {
    let mut rng = Rng(19);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for size in [&[2i64, 3, 4, 5][..], &[1, 1, 1, 3], &[2, 2, 3, 1, 2]] {
            for align in [0, 1] {
                let r = size.len() - 2;
                let mut g = Graph::new("affine");
                let theta_shape = [size[0] as usize, r, r + 1];
                let theta = typed_param(&mut g, "theta", dtype, &theta_shape);
                let sz = constant(
                    &mut g,
                    Tensor::from_i64s(DType::I64, &[size.len()], size).unwrap(),
                );
                let attrs = Attrs::new().with("align_corners", Attr::Int(align));
                let id = node(&mut g, "AffineGrid", &[theta, sz], attrs);
                g.add_output("grid", id.out(0)).unwrap();
                let feeds = [rng.tensor_of(dtype, &theta_shape)];
                check(&g, &feeds, &["affine-grid"], tolerance(dtype));
            }
        }
    }
}

/// A target out of range (and not ignore_index) is a run-time error, not a panic.
#[test]
fn loss_target_out_of_range_is_an_error() {
    let mut g = Graph::new("nll");
    let x = typed_param(&mut g, "x", DType::F32, &[2, 3, 2]);
    let t = typed_param(&mut g, "t", DType::I64, &[2, 2]);
    let id = node(&mut g, "NegativeLogLikelihoodLoss", &[x, t], Attrs::new());
    g.add_output("loss", id.out(0)).unwrap();
    let cpu = backend_with(Device::Cpu, options()).unwrap();
    let exe = cpu.compile(&g).unwrap();
    let x = Tensor::from_vec(&[2, 3, 2], vec![0.5f32; 12]).unwrap();
    let t = Tensor::from_vec(&[2, 2], vec![0i64, 1, 3, 2]).unwrap();
    let e = exe.run(&[x, t]).unwrap_err().to_string();
    assert!(e.contains("out of range"), "{e}");
}

/// GridSample: every mode × padding × align_corners over 1, 2 and 3 spatial axes.
#[test]
fn grid_sample() {
    let mut rng = Rng(11);
    let forms: [(&[usize], &[usize]); 3] = [
        (&[1, 2, 5], &[1, 4, 1]),
        (&[2, 2, 3, 4], &[2, 3, 2, 2]),
        (&[1, 1, 3, 2, 4], &[1, 2, 2, 3, 3]),
    ];
    let mut k = 0;
    for (xs, gs) in forms {
        for mode in ["nearest", "linear", "cubic"] {
            for padding in ["zeros", "border", "reflection"] {
                for align in [0, 1] {
                    k += 1;
                    let dtype = [DType::F32, DType::F64, DType::F16][k % 3];
                    let mut g = Graph::new("grid");
                    let x = typed_param(&mut g, "x", dtype, xs);
                    let grid = typed_param(&mut g, "grid", dtype, gs);
                    let attrs = Attrs::new()
                        .with("mode", Attr::String(mode.into()))
                        .with("padding_mode", Attr::String(padding.into()))
                        .with("align_corners", Attr::Int(align));
                    let y = node(&mut g, "GridSample", &[x, grid], attrs);
                    g.add_output("y", y.into()).unwrap();
                    let n: usize = gs.iter().product();
                    let coords: Vec<f64> = (0..n).map(|_| rng.uniform(-1.4, 1.4)).collect();
                    let feeds = [
                        rng.tensor_of(dtype, xs),
                        Tensor::from_f64s(dtype, gs, &coords).unwrap(),
                    ];
                    check(&g, &feeds, &["grid-sample"], tolerance(dtype));
                }
            }
        }
    }
}

/// Dropout: inference (no inputs but data, a constant ratio, training false) and
/// training (ratio, training mode and counter fed at run time), with and without the
/// mask output, on three float dtypes and a rank-0 input.
#[test]
fn dropout() {
    let mut rng = Rng(5);
    for (k, dtype) in [DType::F32, DType::F16, DType::F64].into_iter().enumerate() {
        for shape in [&[3usize, 4, 5][..], &[], &[0, 2]] {
            for form in 0..4 {
                let mut g = Graph::new("dropout");
                let x = typed_param(&mut g, "x", dtype, shape);
                let mut ins = vec![x];
                let mut feeds = vec![rng.tensor_of(dtype, shape)];
                match form {
                    0 => {}
                    1 => ins.push(constant(&mut g, Tensor::scalar(0.25f32))),
                    _ => {
                        ins.push(typed_param(&mut g, "ratio", dtype, &[]));
                        feeds.push(Tensor::from_f64s(dtype, &[], &[0.375]).unwrap());
                        ins.push(typed_param(&mut g, "training", DType::Bool, &[]));
                        feeds.push(Tensor::scalar(form == 3));
                        ins.push(typed_param(&mut g, "counter", DType::I64, &[]));
                        feeds.push(Tensor::scalar(k as i64 + 3));
                    }
                }
                let attrs = Attrs::new().with("seed", Attr::Int(42));
                let id = node(&mut g, "Dropout", &ins, attrs);
                g.add_output("y", id.out(0)).unwrap();
                if form != 1 {
                    g.add_output("mask", id.out(1)).unwrap();
                }
                check(&g, &feeds, &["dropout"], 0.0);
            }
        }
    }
}

/// A ratio fed out of [0, 1) is a run-time error.
#[test]
fn dropout_ratio_out_of_range_is_an_error() {
    let mut g = Graph::new("dropout");
    let x = typed_param(&mut g, "x", DType::F32, &[4]);
    let r = typed_param(&mut g, "r", DType::F32, &[]);
    let id = node(&mut g, "Dropout", &[x, r], Attrs::new());
    g.add_output("y", id.out(0)).unwrap();
    let exe = backend_with(Device::Cpu, options())
        .unwrap()
        .compile(&g)
        .unwrap();
    let x = Tensor::from_vec(&[4], vec![1f32; 4]).unwrap();
    let e = exe
        .run(&[x, Tensor::scalar(1.5f32)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("ratio"), "{e}");
}

/// The scale (and zero point) layouts: per tensor, per axis (a negative axis), blocked;
/// x [2, 6, 3].
const LAYOUTS: [(&[usize], i64, i64); 4] =
    [(&[], 1, 0), (&[6], -2, 0), (&[3], 2, 0), (&[2, 3, 3], 1, 2)];

/// A zero point of `dtype` and `shape`: values inside its range.
fn zero_point(rng: &mut Rng, dtype: DType, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    if dtype.is_int() || matches!(dtype, DType::I4 | DType::U4 | DType::I2 | DType::U2) {
        let lo: i64 = match dtype {
            DType::I8 | DType::I16 | DType::I32 | DType::I4 | DType::I2 => -1,
            _ => 0,
        };
        let v: Vec<i64> = (0..n).map(|_| lo + rng.below(3) as i64).collect();
        Tensor::from_i64s(dtype, shape, &v).unwrap()
    } else {
        Tensor::from_f64s(dtype, shape, &vec![0.0; n]).unwrap()
    }
}

/// QuantizeLinear to every integer and low-bit dtype, from three float types and i32,
/// in every layout, with the zero point as a run-time input or absent (output_dtype
/// naming the type), float8 saturating and not.
#[test]
fn quantize_linear() {
    let mut rng = Rng(3);
    let targets = [
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::I32,
        DType::I4,
        DType::U4,
        DType::I2,
        DType::U2,
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F4E2M1,
    ];
    let xshape = [2usize, 6, 3];
    let mut k = 0;
    for d in targets {
        for (sshape, axis, block) in LAYOUTS {
            for with_zero_point in [true, false] {
                k += 1;
                let xt = [DType::F32, DType::F16, DType::F64, DType::I32][k % 4];
                let st = if xt == DType::I32 {
                    DType::F32
                } else {
                    [DType::F32, xt][k % 2]
                };
                let saturate = if k.is_multiple_of(3) { 0 } else { 1 };
                let mut g = Graph::new("q");
                let x = typed_param(&mut g, "x", xt, &xshape);
                let s = typed_param(&mut g, "s", st, sshape);
                let n: usize = xshape.iter().product();
                let xv: Vec<f64> = (0..n).map(|_| rng.uniform(-300.0, 300.0)).collect();
                let mut feeds = vec![Tensor::from_f64s(xt, &xshape, &xv).unwrap()];
                let ns: usize = sshape.iter().product();
                let sv: Vec<f64> = (0..ns).map(|_| rng.uniform(0.5, 40.0)).collect();
                feeds.push(Tensor::from_f64s(st, sshape, &sv).unwrap());
                let mut ins = vec![x, s];
                let mut attrs = Attrs::new()
                    .with("axis", Attr::Int(axis))
                    .with("block_size", Attr::Int(block))
                    .with("saturate", Attr::Int(saturate));
                if with_zero_point {
                    ins.push(typed_param(&mut g, "z", d, sshape));
                    feeds.push(zero_point(&mut rng, d, sshape));
                } else {
                    attrs = attrs.with("output_dtype", Attr::String(d.to_string()));
                }
                let y = node(&mut g, "QuantizeLinear", &ins, attrs);
                g.add_output("y", y.into()).unwrap();
                check(&g, &feeds, &["quantize"], 0.0);
            }
        }
    }
}

/// DequantizeLinear from every integer and low-bit dtype to three float types, in
/// every layout, with and without a zero point.
#[test]
fn dequantize_linear() {
    let mut rng = Rng(9);
    let sources = [
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::I32,
        DType::I4,
        DType::U4,
        DType::I2,
        DType::U2,
        DType::F8E4M3FN,
        DType::F8E5M2,
        DType::F4E2M1,
    ];
    let xshape = [2usize, 6, 3];
    let mut k = 0;
    for d in sources {
        for (sshape, axis, block) in LAYOUTS {
            for with_zero_point in [true, false] {
                k += 1;
                let st = [DType::F32, DType::F16, DType::F64][k % 3];
                let mut g = Graph::new("dq");
                let x = typed_param(&mut g, "x", d, &xshape);
                let s = typed_param(&mut g, "s", st, sshape);
                let mut feeds = vec![rng.tensor_of(d, &xshape)];
                let ns: usize = sshape.iter().product();
                let sv: Vec<f64> = (0..ns).map(|_| rng.uniform(0.01, 2.0)).collect();
                feeds.push(Tensor::from_f64s(st, sshape, &sv).unwrap());
                let mut ins = vec![x, s];
                if with_zero_point {
                    ins.push(typed_param(&mut g, "z", d, sshape));
                    feeds.push(zero_point(&mut rng, d, sshape));
                }
                let attrs = Attrs::new()
                    .with("axis", Attr::Int(axis))
                    .with("block_size", Attr::Int(block));
                let y = node(&mut g, "DequantizeLinear", &ins, attrs);
                g.add_output("y", y.into()).unwrap();
                check(
                    &g,
                    &feeds,
                    &["dequantize", "dequantize-low-bit"],
                    tolerance(st),
                );
            }
        }
    }
}

/// x's shape, w's, the attributes and the group.
type ConvForm = (
    &'static [usize],
    &'static [usize],
    &'static [(&'static str, &'static [i64])],
    i64,
);

/// ConvInteger with weights (and their zero points) fed at run time: u8 and i8, 1–3
/// spatial axes, padding, strides, dilations, groups, per-channel zero points.
#[test]
fn conv_integer_runtime_weights() {
    let mut rng = Rng(13);
    let forms: [ConvForm; 4] = [
        (
            &[1, 2, 7],
            &[3, 2, 3],
            &[("pads", &[1, 2]), ("strides", &[2])],
            1,
        ),
        (&[2, 4, 5, 4], &[4, 2, 2, 3], &[("pads", &[1, 0, 1, 1])], 2),
        (&[1, 1, 6, 6], &[2, 1, 3, 3], &[("dilations", &[2, 1])], 1),
        (
            &[1, 2, 3, 3, 4],
            &[2, 2, 2, 2, 2],
            &[("pads", &[0, 1, 0, 1, 0, 1])],
            1,
        ),
    ];
    for (i, (xs, ws, extra, group)) in forms.into_iter().enumerate() {
        for (xt, wt) in [
            (DType::U8, DType::U8),
            (DType::I8, DType::U8),
            (DType::U8, DType::I8),
        ] {
            let mut g = Graph::new("convint");
            let x = typed_param(&mut g, "x", xt, xs);
            let w = typed_param(&mut g, "w", wt, ws);
            let mut ins = vec![x, w];
            let mut feeds = vec![rng.tensor_of(xt, xs), rng.tensor_of(wt, ws)];
            if i.is_multiple_of(2) {
                ins.push(typed_param(&mut g, "xz", xt, &[]));
                feeds.push(zero_point(&mut rng, xt, &[]));
                let wz: &[usize] = if i == 0 { &[] } else { &ws[..1] };
                ins.push(typed_param(&mut g, "wz", wt, wz));
                feeds.push(zero_point(&mut rng, wt, wz));
            }
            let mut attrs = Attrs::new().with("group", Attr::Int(group));
            for (k, v) in extra {
                attrs = attrs.with(k, Attr::Ints(v.to_vec()));
            }
            let y = node(&mut g, "ConvInteger", &ins, attrs);
            g.add_output("y", y.into()).unwrap();
            check(&g, &feeds, &["conv-integer-direct"], 0.0);
        }
    }
}
