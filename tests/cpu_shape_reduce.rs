//! The CPU backend's index, scan and structured kernels (`steps/index_ops.rs`,
//! `steps/pool_nd.rs`) against the reference interpreter, compiled with fallback off:
//! ArgMax/ArgMin, Trilu, CumSum/CumProd, Hardmax, ReverseSequence, GatherND, Det,
//! Einsum, DFT, TfIdfVectorizer and the N-D pools, over dtypes and attribute forms
//! (negative axes, run-time scalar operands, size-1 and empty dims), each asserting the
//! kernel it lowered to.
use crate::common;

use common::{constant, op, typed_param, Rng};
use kiln::backend::cpu::CpuBackend;
use kiln::backend::{backend_with, Device};
use kiln::ir::{text, Attr, Attrs, DType, Graph};
use kiln::passes::CompileOptions;
use kiln::Tensor;

fn cpu(threads: usize) -> CpuBackend {
    CpuBackend::new(CompileOptions {
        threads,
        allow_fallback: false,
        ..Default::default()
    })
}

/// `g` lowers to a `kind` step (no fallback) and gives the interpreter's outputs.
fn check(g: &Graph, inputs: &[Tensor], kind: &str, tol: f64) {
    check_any(g, inputs, &[kind], tol)
}

/// As [`check`], with a step of one of `kinds`.
fn check_any(g: &Graph, inputs: &[Tensor], want: &[&str], tol: f64) {
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let exe = cpu(1)
        .compile_cpu(g)
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)));
    let kinds: Vec<&str> = exe
        .step_report(&shapes)
        .unwrap()
        .iter()
        .map(|s| s.kind)
        .collect();
    assert!(
        kinds.iter().any(|k| want.contains(k)),
        "want a {want:?} step, got {kinds:?}\n{}",
        text::print(g)
    );
    let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
    let want = interp.compile(g).unwrap().run(inputs).unwrap();
    let got = kiln::backend::Backend::compile(&cpu(1), g)
        .unwrap()
        .run(inputs)
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)));
    for (i, (w, o)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.dtype(), o.dtype(), "output {i}");
        o.check_close(w, tol, tol)
            .unwrap_or_else(|e| panic!("output {i}: {e}\n{}", text::print(g)));
    }
}

fn i64s(v: &[i64]) -> Tensor {
    Tensor::from_vec(&[v.len()], v.to_vec()).unwrap()
}

fn scalar(v: i64) -> Tensor {
    Tensor::from_vec(&[], vec![v]).unwrap()
}

fn attrs(pairs: &[(&str, i64)]) -> Attrs {
    pairs
        .iter()
        .fold(Attrs::new(), |a, (k, v)| a.with(k, Attr::Int(*v)))
}

fn tol(d: DType) -> f64 {
    match d {
        DType::F16 | DType::BF16 => 1e-2,
        DType::F32 => 1e-5,
        _ => 1e-9,
    }
}

#[test]
fn arg_max_and_min() {
    let mut rng = Rng(11);
    for dtype in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::I32,
        DType::U8,
        DType::I64,
    ] {
        for (shape, axis) in [
            (&[3usize, 4, 5][..], -1i64),
            (&[3, 4, 5], 0),
            (&[2, 1, 3], 1),
        ] {
            for (keep, last) in [(1, 0), (0, 1), (1, 1)] {
                for name in ["ArgMax", "ArgMin"] {
                    let mut g = Graph::new("arg");
                    let x = typed_param(&mut g, "x", dtype, shape);
                    let a = [
                        ("axis", axis),
                        ("keepdims", keep),
                        ("select_last_index", last),
                    ];
                    let y = op(&mut g, name, &[x], attrs(&a));
                    g.add_output("y", y).unwrap();
                    check(&g, &[rng.tensor_of(dtype, shape)], "arg-reduce", 0.0);
                }
            }
        }
    }
}

#[test]
fn trilu_constant_and_runtime_k() {
    let mut rng = Rng(12);
    for dtype in [DType::I64, DType::F32, DType::Bool, DType::F16] {
        for shape in [&[4usize, 5][..], &[2, 3, 3], &[3, 0, 5], &[3, 1, 5]] {
            for upper in [0, 1] {
                for k in [-7i64, -1, 0, 2] {
                    let mut g = Graph::new("trilu");
                    let x = typed_param(&mut g, "x", dtype, shape);
                    let kc = constant(&mut g, scalar(k));
                    let y = op(&mut g, "Trilu", &[x, kc], attrs(&[("upper", upper)]));
                    g.add_output("y", y).unwrap();
                    check(&g, &[rng.tensor_of(dtype, shape)], "trilu", 0.0);
                }
                let mut g = Graph::new("trilu_rt");
                let x = typed_param(&mut g, "x", dtype, shape);
                let kp = typed_param(&mut g, "k", DType::I64, &[]);
                let y = op(&mut g, "Trilu", &[x, kp], attrs(&[("upper", upper)]));
                g.add_output("y", y).unwrap();
                check(&g, &[rng.tensor_of(dtype, shape), scalar(-1)], "trilu", 0.0);
                let mut g = Graph::new("trilu_default");
                let x = typed_param(&mut g, "x", dtype, shape);
                let y = op(&mut g, "Trilu", &[x], attrs(&[("upper", upper)]));
                g.add_output("y", y).unwrap();
                check(&g, &[rng.tensor_of(dtype, shape)], "trilu", 0.0);
            }
        }
    }
}

#[test]
fn cumulative_sums_and_products() {
    let mut rng = Rng(13);
    for dtype in [DType::F64, DType::F32, DType::I32, DType::I64, DType::F16] {
        for name in ["CumSum", "CumProd"] {
            for (exclusive, reverse) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                let a = attrs(&[("exclusive", exclusive), ("reverse", reverse)]);
                for axis in [-1i64, 0, 1] {
                    let mut g = Graph::new("cum");
                    let x = typed_param(&mut g, "x", dtype, &[3, 4, 2]);
                    let ax = constant(&mut g, Tensor::from_vec(&[], vec![axis as i32]).unwrap());
                    let y = op(&mut g, name, &[x, ax], a.clone());
                    g.add_output("y", y).unwrap();
                    let t = tol(dtype).max(if name == "CumProd" { 1e-3 } else { 0.0 });
                    check(&g, &[rng.tensor_of(dtype, &[3, 4, 2])], "cumulative", t);
                }
                let mut g = Graph::new("cum_rt");
                let x = typed_param(&mut g, "x", dtype, &[5]);
                let ax = typed_param(&mut g, "axis", DType::I64, &[]);
                let y = op(&mut g, name, &[x, ax], a.clone());
                g.add_output("y", y).unwrap();
                let inputs = [rng.tensor_of(dtype, &[5]), scalar(0)];
                check(&g, &inputs, "cumulative", tol(dtype).max(1e-3));
            }
        }
    }
}

#[test]
fn hardmax_reverse_sequence_det() {
    let mut rng = Rng(14);
    for dtype in [DType::F32, DType::F64, DType::F16] {
        for axis in [-1i64, 0, 1] {
            let mut g = Graph::new("hardmax");
            let x = typed_param(&mut g, "x", dtype, &[3, 4, 5]);
            let y = op(&mut g, "Hardmax", &[x], attrs(&[("axis", axis)]));
            g.add_output("y", y).unwrap();
            check(&g, &[rng.tensor_of(dtype, &[3, 4, 5])], "hardmax", 0.0);
        }
        for shape in [&[3usize, 3][..], &[2, 4, 4], &[1, 1]] {
            let mut g = Graph::new("det");
            let x = typed_param(&mut g, "x", dtype, shape);
            let y = op(&mut g, "Det", &[x], Attrs::new());
            g.add_output("y", y).unwrap();
            check(&g, &[rng.tensor_of(dtype, shape)], "det", tol(dtype) * 10.0);
        }
    }
    for dtype in [DType::F32, DType::I64, DType::Bool, DType::BF16] {
        for (batch, time) in [(1i64, 0i64), (0, 1)] {
            let shape = [4usize, 3, 2];
            let mut g = Graph::new("revseq");
            let x = typed_param(&mut g, "x", dtype, &shape);
            let lens = typed_param(&mut g, "lens", DType::I64, &[shape[batch as usize]]);
            let a = attrs(&[("batch_axis", batch), ("time_axis", time)]);
            let y = op(&mut g, "ReverseSequence", &[x, lens], a);
            g.add_output("y", y).unwrap();
            let steps = shape[time as usize] as i64;
            let l: Vec<i64> = (0..shape[batch as usize] as i64)
                .map(|i| i % (steps + 1))
                .collect();
            check(
                &g,
                &[rng.tensor_of(dtype, &shape), i64s(&l)],
                "reverse-sequence",
                0.0,
            );
        }
    }
}

/// (data shape, indices shape, index values, batch_dims).
type NdCase<'a> = (&'a [usize], &'a [usize], &'a [i64], i64);

#[test]
fn gather_nd_batch_dims() {
    let mut rng = Rng(15);
    // (data, indices shape, values, batch_dims)
    let cases: &[NdCase] = &[
        (&[2, 3, 4], &[2, 2], &[0, 1, -1, -2], 0),
        (&[2, 3, 4], &[3, 1], &[1, 0, -1], 0),
        (&[2, 3, 4], &[2, 3], &[0, 1, 2, 1, 2, 3], 0),
        (&[2, 3, 4], &[2, 1], &[2, -3], 1),
        (&[2, 3, 4], &[2, 2, 2], &[0, 1, 2, 3, 1, 0, -1, -1], 1),
    ];
    for dtype in [DType::F32, DType::I32, DType::U8, DType::Bool] {
        for &(data, ishape, values, bd) in cases {
            for wide in [true, false] {
                let mut g = Graph::new("gathernd");
                let x = typed_param(&mut g, "x", dtype, data);
                let idx = if wide {
                    Tensor::from_vec(ishape, values.to_vec()).unwrap()
                } else {
                    let v: Vec<i32> = values.iter().map(|&v| v as i32).collect();
                    Tensor::from_vec(ishape, v).unwrap()
                };
                let ic = constant(&mut g, idx);
                let y = op(&mut g, "GatherND", &[x, ic], attrs(&[("batch_dims", bd)]));
                g.add_output("y", y).unwrap();
                check(&g, &[rng.tensor_of(dtype, data)], "gather-nd", 0.0);
            }
        }
    }
}

#[test]
fn einsum_forms() {
    let mut rng = Rng(16);
    let cases: &[(&str, &[&[usize]])] = &[
        ("bii->bi", &[&[3, 4, 4]]),
        ("ij->i", &[&[3, 4]]),
        ("ij->ji", &[&[3, 4]]),
        ("->", &[&[]]),
        ("ii", &[&[3, 3]]),
    ];
    for dtype in [DType::F64, DType::BF16, DType::I32] {
        for &(eq, shapes) in cases {
            let mut g = Graph::new("einsum");
            let xs: Vec<_> = shapes
                .iter()
                .enumerate()
                .map(|(i, s)| typed_param(&mut g, &format!("x{i}"), dtype, s))
                .collect();
            let a = Attrs::new().with("equation", Attr::String(eq.into()));
            let y = op(&mut g, "Einsum", &xs, a);
            g.add_output("y", y).unwrap();
            let inputs: Vec<Tensor> = shapes.iter().map(|s| rng.tensor_of(dtype, s)).collect();
            check(&g, &inputs, "einsum", tol(dtype));
        }
    }
}

#[test]
fn stft_forms() {
    let mut rng = Rng(29);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for (parts, onesided, window, frame) in [
            (1usize, 1, true, None),
            (2, 0, true, Some(6i64)),
            (1, 0, false, Some(5)),
            (2, 1, true, None),
        ] {
            let shape = [2usize, 20, parts];
            let mut g = Graph::new("stft");
            let x = typed_param(&mut g, "x", dtype, &shape);
            let step = constant(&mut g, scalar(3));
            let wlen = frame.map_or(6, |f| f as usize);
            let w = window.then(|| typed_param(&mut g, "w", dtype, &[wlen]));
            let fl = frame.map(|f| constant(&mut g, scalar(f)));
            let n = g
                .add_op(
                    "STFT",
                    &[Some(x), Some(step), w, fl],
                    attrs(&[("onesided", onesided)]),
                    "",
                )
                .unwrap_or_else(|e| panic!("{e}"));
            g.add_output("y", n.out(0)).unwrap();
            let mut inputs = vec![rng.tensor_of(dtype, &shape)];
            if window {
                inputs.push(rng.tensor_of(dtype, &[wlen]));
            }
            check(&g, &inputs, "stft", tol(dtype) * 100.0);
        }
    }
}

#[test]
fn dft_forms() {
    let mut rng = Rng(17);
    for dtype in [DType::F32, DType::F64] {
        for parts in [1usize, 2] {
            for (inverse, onesided) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                if onesided == 1 && inverse == 0 && parts == 2 {
                    continue;
                }
                if inverse == 1 && onesided == 1 && parts == 1 {
                    continue;
                }
                for len in [None, Some(5i64), Some(10)] {
                    let shape = [2usize, 8, 3, parts];
                    let mut g = Graph::new("dft");
                    let x = typed_param(&mut g, "x", dtype, &shape);
                    let l = len.map(|v| constant(&mut g, scalar(v)));
                    let ax = constant(&mut g, scalar(-3));
                    let a = attrs(&[("inverse", inverse), ("onesided", onesided)]);
                    let n = g
                        .add_op("DFT", &[Some(x), l, Some(ax)], a, "")
                        .unwrap_or_else(|e| panic!("{e}"));
                    g.add_output("y", n.out(0)).unwrap();
                    check(
                        &g,
                        &[rng.tensor_of(dtype, &shape)],
                        "dft",
                        tol(dtype) * 100.0,
                    );
                }
                // The axis as a run-time input (shapes stay static without a length).
                if onesided == 1 {
                    continue;
                }
                let shape = [2usize, 6, parts];
                let mut g = Graph::new("dft_rt");
                let x = typed_param(&mut g, "x", dtype, &shape);
                let ax = typed_param(&mut g, "axis", DType::I64, &[]);
                let a = attrs(&[("inverse", inverse), ("onesided", onesided)]);
                let Ok(n) = g.add_op("DFT", &[Some(x), None, Some(ax)], a, "") else {
                    continue;
                };
                g.add_output("y", n.out(0)).unwrap();
                let inputs = [rng.tensor_of(dtype, &shape), scalar(1)];
                check(&g, &inputs, "dft", tol(dtype) * 100.0);
            }
        }
    }
}

#[test]
fn tf_idf_modes() {
    let mut rng = Rng(18);
    for dtype in [DType::I32, DType::I64] {
        for mode in ["TF", "IDF", "TFIDF"] {
            for (min, max, skip) in [(1i64, 2i64, 0i64), (2, 2, 3), (1, 1, 5)] {
                let a = Attrs::new()
                    .with("mode", Attr::String(mode.into()))
                    .with("min_gram_length", Attr::Int(min))
                    .with("max_gram_length", Attr::Int(max))
                    .with("max_skip_count", Attr::Int(skip))
                    .with("ngram_counts", Attr::Ints(vec![0, 4]))
                    .with("ngram_indexes", Attr::Ints(vec![0, 1, 2, 3, 4, 5, 6]))
                    .with(
                        "pool_int64s",
                        Attr::Ints(vec![2, 3, 5, 4, 5, 6, 7, 8, 6, 7]),
                    )
                    .with(
                        "weights",
                        Attr::Floats(vec![0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]),
                    );
                let mut g = Graph::new("tfidf");
                let x = typed_param(&mut g, "x", dtype, &[2, 12]);
                let y = op(&mut g, "TfIdfVectorizer", &[x], a);
                g.add_output("y", y).unwrap();
                let v: Vec<i64> = (0..24).map(|_| 2 + rng.below(7) as i64).collect();
                let t = Tensor::from_i64s(dtype, &[2, 12], &v).unwrap();
                check(&g, &[t], "tf-idf", 0.0);
            }
        }
    }
}

/// The N-D pool's step, or the f32 2-D one where that covers the form.
const POOLS: &[&str] = &["pool-nd", "pool"];

/// (X shape, int attributes, auto_pad).
type PoolForm<'a> = (&'a [usize], &'a [(&'a str, &'a [i64])], &'a str);

#[test]
fn pools_nd() {
    let mut rng = Rng(19);
    let forms: &[PoolForm] = &[
        (
            &[1, 2, 9],
            &[("kernel_shape", &[3]), ("strides", &[2])],
            "NOTSET",
        ),
        (&[1, 2, 5, 5, 4], &[("kernel_shape", &[2, 2, 2])], "NOTSET"),
        (
            &[2, 1, 6, 7],
            &[
                ("kernel_shape", &[3, 3]),
                ("dilations", &[2, 1]),
                ("pads", &[1, 1, 2, 0]),
            ],
            "NOTSET",
        ),
        (&[1, 2, 5, 5], &[("kernel_shape", &[2, 3])], "SAME_UPPER"),
        (
            &[1, 2, 6, 5],
            &[("kernel_shape", &[3, 2]), ("strides", &[2, 2])],
            "SAME_LOWER",
        ),
        (
            &[1, 1, 2, 2],
            &[("kernel_shape", &[3, 3]), ("pads", &[2, 2, 2, 2])],
            "NOTSET",
        ),
    ];
    for &(shape, ints, auto_pad) in forms {
        for ceil in [0, 1] {
            let base = ints
                .iter()
                .fold(Attrs::new(), |a, (k, v)| a.with(k, Attr::Ints(v.to_vec())))
                .with("auto_pad", Attr::String(auto_pad.into()))
                .with("ceil_mode", Attr::Int(ceil));
            for dtype in [DType::F32, DType::U8, DType::I8, DType::F64] {
                for order in [0, 1] {
                    let mut g = Graph::new("maxpool");
                    let x = typed_param(&mut g, "x", dtype, shape);
                    let a = base.clone().with("storage_order", Attr::Int(order));
                    let Ok(n) = g.op("MaxPool", &[x], a, "") else {
                        continue;
                    };
                    g.add_output("y", n.out(0)).unwrap();
                    g.add_output("i", n.out(1)).unwrap();
                    check_any(&g, &[rng.tensor_of(dtype, shape)], POOLS, 0.0);
                }
            }
            for dtype in [DType::F32, DType::F16] {
                for (name, extra) in [
                    ("AveragePool", ("count_include_pad", 0)),
                    ("AveragePool", ("count_include_pad", 1)),
                    ("LpPool", ("p", 1)),
                    ("LpPool", ("p", 3)),
                ] {
                    let mut g = Graph::new("pool");
                    let x = typed_param(&mut g, "x", dtype, shape);
                    let a = base.clone().with(extra.0, Attr::Int(extra.1));
                    let Ok(n) = g.op(name, &[x], a, "") else {
                        continue;
                    };
                    g.add_output("y", n.out(0)).unwrap();
                    let t = tol(dtype) * 10.0;
                    check_any(&g, &[rng.tensor_of(dtype, shape)], POOLS, t);
                }
            }
        }
    }
}

/// TreeEnsemble (opset 5) on f64 and f16 rows: two trees, a membership test.
#[test]
fn tree_ensemble_other_floats() {
    let mut rng = Rng(20);
    let ints = |v: &[i64]| Attr::Ints(v.to_vec());
    let mut a = Attrs::new();
    a.set("n_targets", Attr::Int(2));
    a.set("aggregate_function", Attr::Int(1));
    a.set("post_transform", Attr::Int(0));
    a.set("tree_roots", ints(&[0, 2]));
    a.set("nodes_featureids", ints(&[0, 1, 0]));
    a.set("nodes_modes", ints(&[6, 1, 0]));
    a.set("nodes_splits", Attr::Floats(vec![0.0, 0.5, 0.0]));
    a.set("membership_values", Attr::Floats(vec![1.0, 3.0, f64::NAN]));
    a.set("nodes_missing_value_tracks_true", ints(&[0, 1, 0]));
    a.set("nodes_truenodeids", ints(&[0, 1, 3]));
    a.set("nodes_trueleafs", ints(&[1, 1, 1]));
    a.set("nodes_falsenodeids", ints(&[1, 2, 3]));
    a.set("nodes_falseleafs", ints(&[0, 1, 1]));
    a.set("leaf_targetids", ints(&[0, 1, 0, 1]));
    a.set("leaf_weights", Attr::Floats(vec![5.0, 7.0, 2.0, -1.0]));
    for dtype in [DType::F64, DType::F16] {
        let mut g = Graph::new("trees");
        let x = typed_param(&mut g, "x", dtype, &[7, 2]);
        let y = op(&mut g, "TreeEnsemble", &[x], a.clone());
        g.add_output("y", y).unwrap();
        let v: Vec<f64> = (0..14).map(|_| rng.below(4) as f64 * 0.5).collect();
        let t = Tensor::from_f64s(dtype, &[7, 2], &v).unwrap();
        check(&g, &[t], "tree-ensemble", 0.0);
    }
}

/// Conv with auto_pad and ConvTranspose with output_shape or a SAME auto_pad: lowered
/// as the explicit pads they resolve to.
#[test]
fn conv_auto_pad_and_transpose_output_shape() {
    let mut rng = Rng(21);
    const CONVS: &[&str] = &[
        "conv-im2col",
        "conv-direct",
        "conv-depthwise",
        "conv-blocked",
        "conv-winograd2",
        "conv-winograd4",
        "conv-depthwise-blocked",
    ];
    for auto_pad in ["SAME_UPPER", "SAME_LOWER", "VALID"] {
        for stride in [1i64, 2] {
            let mut g = Graph::new("conv");
            let x = typed_param(&mut g, "x", DType::F32, &[1, 2, 7, 6]);
            let w = constant(&mut g, rng.f32_tensor(&[3, 2, 3, 2], 1.0));
            let a = Attrs::new()
                .with("auto_pad", Attr::String(auto_pad.into()))
                .with("strides", Attr::Ints(vec![stride, stride]));
            let y = op(&mut g, "Conv", &[x, w], a);
            g.add_output("y", y).unwrap();
            check_any(&g, &[rng.f32_tensor(&[1, 2, 7, 6], 1.0)], CONVS, 1e-4);
        }
    }
    let forms: Vec<Attrs> = vec![
        Attrs::new()
            .with("strides", Attr::Ints(vec![3, 2]))
            .with("output_shape", Attr::Ints(vec![8, 6])),
        Attrs::new()
            .with("strides", Attr::Ints(vec![2, 2]))
            .with("auto_pad", Attr::String("SAME_UPPER".into())),
        Attrs::new()
            .with("strides", Attr::Ints(vec![2, 2]))
            .with("auto_pad", Attr::String("SAME_LOWER".into())),
    ];
    for a in forms {
        let mut g = Graph::new("convtranspose");
        let x = typed_param(&mut g, "x", DType::F32, &[1, 1, 3, 3]);
        let w = constant(&mut g, rng.f32_tensor(&[1, 2, 3, 3], 1.0));
        let y = op(&mut g, "ConvTranspose", &[x, w], a);
        g.add_output("y", y).unwrap();
        check(
            &g,
            &[rng.f32_tensor(&[1, 1, 3, 3], 1.0)],
            "conv-transpose",
            1e-4,
        );
    }
}

#[test]
fn one_hot_center_crop_pad_and_scatters() {
    let mut rng = Rng(21);
    for dtype in [DType::F16, DType::I8, DType::Bool, DType::U64] {
        for axis in [-1i64, 0, 1] {
            let mut g = Graph::new("one_hot");
            let i = typed_param(&mut g, "i", DType::I32, &[2, 3]);
            let d = constant(&mut g, scalar(4));
            let v = typed_param(&mut g, "v", dtype, &[2]);
            let y = op(&mut g, "OneHot", &[i, d, v], attrs(&[("axis", axis)]));
            g.add_output("y", y).unwrap();
            let idx = Tensor::from_vec(&[2, 3], vec![0i32, 3, -1, -4, 5, 2]).unwrap();
            check(&g, &[idx, rng.tensor_of(dtype, &[2])], "one-hot", 0.0);
        }
        for target in [[2i64, 5], [4, 1], [7, 3]] {
            let mut g = Graph::new("crop");
            let x = typed_param(&mut g, "x", dtype, &[4, 3]);
            let s = constant(&mut g, i64s(&target));
            let y = op(&mut g, "CenterCropPad", &[x, s], Attrs::new());
            g.add_output("y", y).unwrap();
            check(&g, &[rng.tensor_of(dtype, &[4, 3])], "center-crop-pad", 0.0);
        }
    }
    for dtype in [DType::F16, DType::I8, DType::U64, DType::F64] {
        for red in ["none", "add", "mul", "max", "min"] {
            let a = Attrs::new()
                .with("axis", Attr::Int(-1))
                .with("reduction", Attr::String(red.into()));
            let mut g = Graph::new("scatter_elements");
            let x = typed_param(&mut g, "x", dtype, &[3, 4]);
            let i = constant(
                &mut g,
                Tensor::from_vec(&[2, 3], vec![0i64, -1, 1, 3, 3, 0]).unwrap(),
            );
            let u = typed_param(&mut g, "u", dtype, &[2, 3]);
            let y = op(&mut g, "ScatterElements", &[x, i, u], a);
            g.add_output("y", y).unwrap();
            let ins = [rng.tensor_of(dtype, &[3, 4]), rng.tensor_of(dtype, &[2, 3])];
            check(&g, &ins, "scatter-elements", tol(dtype));
            let a = Attrs::new().with("reduction", Attr::String(red.into()));
            let mut g = Graph::new("scatter_nd");
            let x = typed_param(&mut g, "x", dtype, &[4, 3]);
            let i = constant(&mut g, Tensor::from_vec(&[2, 1], vec![-1i64, 1]).unwrap());
            let u = typed_param(&mut g, "u", dtype, &[2, 3]);
            let y = op(&mut g, "ScatterND", &[x, i, u], a);
            g.add_output("y", y).unwrap();
            let ins = [rng.tensor_of(dtype, &[4, 3]), rng.tensor_of(dtype, &[2, 3])];
            check_any(&g, &ins, &["scatter-nd", "scatter"], tol(dtype));
        }
    }
}

#[test]
fn reduce_min_max_bool() {
    let mut rng = Rng(22);
    for name in ["ReduceMax", "ReduceMin"] {
        for axes in [&[][..], &[1i64], &[-1, 0]] {
            let mut g = Graph::new("reduce_bool");
            let x = typed_param(&mut g, "x", DType::Bool, &[2, 3, 4]);
            let mut ins = vec![x];
            if !axes.is_empty() {
                ins.push(constant(&mut g, i64s(axes)));
            }
            let y = op(&mut g, name, &ins, Attrs::new());
            g.add_output("y", y).unwrap();
            check(&g, &[rng.tensor_of(DType::Bool, &[2, 3, 4])], "reduce", 0.0);
        }
    }
}

#[test]
fn top_k_other_dtypes() {
    let mut rng = Rng(23);
    for dtype in [DType::F16, DType::I8, DType::U32, DType::F64] {
        for (axis, largest) in [(-1i64, 1i64), (0, 0), (1, 1)] {
            let mut g = Graph::new("topk");
            let x = typed_param(&mut g, "x", dtype, &[4, 6]);
            let k = constant(&mut g, i64s(&[3]));
            let a = attrs(&[("axis", axis), ("largest", largest)]);
            let node = g.add_op("TopK", &[Some(x), Some(k)], a, "").unwrap();
            g.add_output("v", node.out(0)).unwrap();
            g.add_output("i", node.out(1)).unwrap();
            check(&g, &[rng.tensor_of(dtype, &[4, 6])], "topk", 0.0);
        }
    }
}

/// 64-bit integers compare exactly, not through f64 (where these all tie).
#[test]
fn top_k_of_64_bit_integers_above_2_to_the_53() {
    let big = u64::MAX - 8;
    let v: Vec<u64> = vec![big + 3, big + 7, big, big + 5, big + 1, big + 6];
    let cases: [(DType, Tensor); 2] = [
        (DType::U64, Tensor::from_vec(&[6], v.clone()).unwrap()),
        (
            DType::I64,
            Tensor::from_vec(
                &[6],
                v.iter().map(|&x| i64::MAX - 8 + (x - big) as i64).collect(),
            )
            .unwrap(),
        ),
    ];
    for (dtype, x) in cases {
        for largest in [1, 0] {
            let mut g = Graph::new("topk");
            let xp = typed_param(&mut g, "x", dtype, &[6]);
            let k = constant(&mut g, i64s(&[3]));
            let node = g
                .add_op(
                    "TopK",
                    &[Some(xp), Some(k)],
                    attrs(&[("largest", largest)]),
                    "",
                )
                .unwrap();
            g.add_output("v", node.out(0)).unwrap();
            g.add_output("i", node.out(1)).unwrap();
            check(&g, std::slice::from_ref(&x), "topk", 0.0);
            let want: &[i64] = if largest == 1 { &[1, 5, 3] } else { &[2, 4, 0] };
            let got = backend_with(Device::Interp, CompileOptions::default())
                .unwrap()
                .compile(&g)
                .unwrap()
                .run(std::slice::from_ref(&x))
                .unwrap();
            assert_eq!(got[1].to_i64_vec(), want, "{dtype} largest {largest}");
        }
    }
}
