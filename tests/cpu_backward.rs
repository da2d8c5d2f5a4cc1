//! The CPU backend's kernels for backward graphs against the reference interpreter:
//! ConvTranspose, ScatterElements, comparisons, Where, Cast, SoftmaxCrossEntropyLoss,
//! the fused Relu gradient and the per-position filter-gradient convolution, on ragged
//! shapes at 1 and 2 threads, each asserting the kernel it lowered to; then the
//! training graphs of issue 7 (MLP and small CNN, forward + backward) with no step left
//! on the fallback. `KILN_CPU_ISA=portable` reruns it on the plain Rust paths.
use crate::common;

use common::train_graphs;
use common::{constant, ints, op, typed_param, Rng};
use kiln::autodiff::grad;
use kiln::backend::cpu::{Compiled, CpuBackend};
use kiln::backend::{backend_with, Device};
use kiln::ir::{text, Attr, Attrs, DType, Graph};
use kiln::passes::CompileOptions;
use kiln::Tensor;

fn cpu(threads: usize) -> CpuBackend {
    CpuBackend::new(CompileOptions {
        threads,
        ..Default::default()
    })
}

/// The kernel kinds `g` lowers to for `inputs`.
fn kinds(g: &Graph, inputs: &[Tensor]) -> Vec<&'static str> {
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    cpu(1)
        .compile_cpu(g)
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)))
        .step_kinds(&shapes)
        .unwrap()
        .expect("lowered to kernels")
}

/// The nodes of `g` whose steps run on the fallback.
fn fallbacks(g: &Graph, inputs: &[Tensor]) -> Vec<String> {
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let exe = cpu(1).compile_cpu(g).unwrap();
    match &*exe.program(&shapes).unwrap() {
        Compiled::Program(p) => p
            .steps
            .iter()
            .filter(|s| s.kernel.kind() == "fallback")
            .map(|s| s.node.to_string())
            .collect(),
        _ => vec!["the whole graph (not one lowered program)".into()],
    }
}

/// `g` lowers to a `kind` step and no fallback, and gives the interpreter's outputs at
/// 1 and 2 threads.
fn check(g: &Graph, inputs: &[Tensor], kind: &str) {
    let k = kinds(g, inputs);
    assert!(
        k.contains(&kind),
        "no {kind} step in {k:?}\n{}",
        text::print(g)
    );
    let f = fallbacks(g, inputs);
    assert!(f.is_empty(), "fallbacks {f:?} in {k:?}\n{}", text::print(g));
    let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
    let want = interp.compile(g).unwrap().run(inputs).unwrap();
    for threads in [1, 2] {
        let got = kiln::backend::Backend::compile(&cpu(threads), g)
            .unwrap()
            .run(inputs)
            .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)));
        for (i, (w, o)) in want.iter().zip(&got).enumerate() {
            o.check_close(w, 1e-4, 1e-4).unwrap_or_else(|e| {
                panic!("output {i}, {threads} thread(s): {e}\n{}", text::print(g))
            });
        }
    }
}

/// (n, c, h, w, m/g, kernel, strides, pads, dilations, output_padding, group, bias)
type ConvTransposeCase = (
    usize,
    usize,
    usize,
    usize,
    usize,
    [i64; 2],
    [i64; 2],
    [i64; 4],
    [i64; 2],
    [i64; 2],
    i64,
    bool,
);

#[test]
fn conv_transposes_with_pads_strides_dilations_groups_and_output_padding() {
    // (n, c, h, w, m/g, kernel, strides, pads, dilations, output_padding, group, bias)
    let cases: &[ConvTransposeCase] = &[
        (
            2,
            3,
            5,
            7,
            4,
            [3, 3],
            [1, 1],
            [1, 1, 1, 1],
            [1, 1],
            [0, 0],
            1,
            true,
        ),
        (
            1,
            4,
            6,
            5,
            3,
            [3, 2],
            [2, 2],
            [1, 0, 1, 1],
            [1, 1],
            [1, 1],
            2,
            false,
        ),
        (
            2,
            5,
            4,
            4,
            3,
            [2, 3],
            [2, 3],
            [0, 2, 1, 0],
            [2, 1],
            [1, 2],
            1,
            true,
        ),
        (
            1,
            17,
            9,
            11,
            19,
            [1, 1],
            [1, 1],
            [0, 0, 0, 0],
            [1, 1],
            [0, 0],
            1,
            false,
        ),
        (
            3,
            8,
            7,
            7,
            2,
            [5, 5],
            [3, 1],
            [2, 2, 2, 2],
            [1, 2],
            [2, 0],
            4,
            true,
        ),
    ];
    let mut rng = Rng(1);
    // f64 lowers to the f64 loop (conv-transpose-elem) over the same geometry.
    for (dt, kind) in [
        (DType::F32, "conv-transpose"),
        (DType::F64, "conv-transpose-elem"),
    ] {
        for &(n, c, h, w, mg, k, st, p, d, op_, group, bias) in cases {
            let mut g = Graph::new("convt");
            let x = typed_param(&mut g, "x", dt, &[n, c, h, w]);
            let wt = typed_param(&mut g, "w", dt, &[c, mg, k[0] as usize, k[1] as usize]);
            let mut ins = vec![x, wt];
            let mut inputs = vec![
                rng.f32_tensor(&[n, c, h, w], 1.0).cast(dt),
                rng.f32_tensor(&[c, mg, k[0] as usize, k[1] as usize], 1.0)
                    .cast(dt),
            ];
            if bias {
                let m = mg * group as usize;
                ins.push(typed_param(&mut g, "b", dt, &[m]));
                inputs.push(rng.f32_tensor(&[m], 1.0).cast(dt));
            }
            let attrs = ints(&[
                ("kernel_shape", &k),
                ("strides", &st),
                ("pads", &p),
                ("dilations", &d),
                ("output_padding", &op_),
            ])
            .with("group", Attr::Int(group));
            let y = op(&mut g, "ConvTranspose", &ins, attrs);
            g.add_output("y", y).unwrap();
            check(&g, &inputs, kind);
        }
    }
}

/// 1-D and 3-D transposed convolutions (a row of 2-D planes, a depth axis over them).
#[test]
fn conv_transposes_of_one_and_three_spatial_axes() {
    // (x dims, m/g, kernel, strides, pads, dilations, output_padding, group)
    type Case<'a> = (
        &'a [usize],
        usize,
        &'a [i64],
        &'a [i64],
        &'a [i64],
        &'a [i64],
        &'a [i64],
        i64,
    );
    let cases: &[Case] = &[
        (&[2, 3, 11], 4, &[3], &[2], &[1, 0], &[1], &[1], 1),
        (&[1, 4, 9], 3, &[4], &[3], &[0, 2], &[2], &[0], 2),
        (&[1, 16, 20], 8, &[2], &[2], &[0, 0], &[1], &[0], 1),
        (
            &[2, 3, 4, 5, 3],
            2,
            &[3, 2, 3],
            &[2, 1, 2],
            &[1, 0, 1, 0, 1, 1],
            &[1, 2, 1],
            &[1, 0, 1],
            1,
        ),
        (
            &[1, 4, 3, 3, 4],
            3,
            &[2, 2, 2],
            &[2, 2, 2],
            &[0; 6],
            &[1, 1, 1],
            &[0, 0, 0],
            2,
        ),
    ];
    let mut rng = Rng(3);
    for (dt, kind) in [
        (DType::F32, "conv-transpose"),
        (DType::F64, "conv-transpose-elem"),
    ] {
        for &(xd, mg, k, st, p, d, op_, group) in cases {
            let mut g = Graph::new("convt");
            let c = xd[1];
            let mut wd = vec![c, mg];
            wd.extend(k.iter().map(|&v| v as usize));
            let m = mg * group as usize;
            let x = typed_param(&mut g, "x", dt, xd);
            let wt = typed_param(&mut g, "w", dt, &wd);
            let b = typed_param(&mut g, "b", dt, &[m]);
            let inputs = vec![
                rng.f32_tensor(xd, 1.0).cast(dt),
                rng.f32_tensor(&wd, 1.0).cast(dt),
                rng.f32_tensor(&[m], 1.0).cast(dt),
            ];
            let attrs = ints(&[
                ("kernel_shape", k),
                ("strides", st),
                ("pads", p),
                ("dilations", d),
                ("output_padding", op_),
            ])
            .with("group", Attr::Int(group));
            let y = op(&mut g, "ConvTranspose", &[x, wt, b], attrs);
            g.add_output("y", y).unwrap();
            check(&g, &inputs, kind);
        }
    }
}

/// MaxPool's gradient (zeros, flat indices, add) and scatters on every axis.
#[test]
fn scatters_of_pool_gradients_and_on_every_axis() {
    let mut rng = Rng(2);
    // The pool gradient as autodiff writes it, on a ragged image with overlapping windows.
    for (kernel, strides) in [([2, 2], [2, 2]), ([3, 3], [2, 2])] {
        let mut g = Graph::new("pool_grad");
        let x = typed_param(&mut g, "x", DType::F32, &[2, 3, 9, 7]);
        let attrs = ints(&[("kernel_shape", &kernel), ("strides", &strides)]);
        let y = op(&mut g, "MaxPool", &[x], attrs);
        let yy = op(&mut g, "Mul", &[y, y], Attrs::new());
        let loss = op(
            &mut g,
            "ReduceSum",
            &[yy],
            Attrs::new().with("keepdims", Attr::Int(0)),
        );
        let gx = grad(&mut g, loss, &[x]).unwrap()[0];
        g.add_output("gx", gx).unwrap();
        let inputs = vec![rng.f32_tensor(&[2, 3, 9, 7], 1.0)];
        check(&g, &inputs, "scatter");
    }
    // MaxPool's Indices over tiling windows (ragged images drop the last row/column).
    for (dims, k) in [
        ([2, 3, 9, 7], [2, 2]),
        ([1, 17, 8, 12], [2, 3]),
        ([3, 2, 5, 5], [1, 1]),
    ] {
        let mut g = Graph::new("pool_indices");
        let x = typed_param(&mut g, "x", DType::F32, &dims);
        let attrs = ints(&[("kernel_shape", &k), ("strides", &k)]);
        let id = g.op("MaxPool", &[x], attrs, "").unwrap();
        g.add_output("y", id.into()).unwrap();
        g.add_output("indices", id.out(1)).unwrap();
        check(&g, &[rng.f32_tensor(&dims, 1.0)], "pool-indices");
    }
    for (data, ind, axis, reduction) in [
        (&[5, 6][..], &[3, 6][..], 0, "add"),
        (&[5, 6], &[5, 4], 1, "none"),
        (&[4, 3, 5], &[4, 2, 5], -2, "max"),
        (&[4, 3, 5], &[2, 3, 5], 0, "mul"),
    ] {
        let mut g = Graph::new("scatter");
        let d = typed_param(&mut g, "d", DType::F32, data);
        let n: usize = ind.iter().product();
        let size = data[(axis + data.len() as i64) as usize % data.len()] as u64;
        let idx: Vec<i64> = (0..n)
            .map(|_| (rng.next_u64() % size) as i64 - (rng.next_u64() % 2) as i64 * size as i64)
            .collect();
        let i = constant(&mut g, Tensor::from_vec(ind, idx).unwrap());
        let u = typed_param(&mut g, "u", DType::F32, ind);
        let attrs = Attrs::new()
            .with("axis", Attr::Int(axis))
            .with("reduction", Attr::String(reduction.into()));
        let y = op(&mut g, "ScatterElements", &[d, i, u], attrs);
        g.add_output("y", y).unwrap();
        check(
            &g,
            &[rng.f32_tensor(data, 1.0), rng.f32_tensor(ind, 1.0)],
            "scatter",
        );
    }
}

/// Comparisons (f32 and i64, broadcast), Where on its own and fused with its mask
/// (Relu's gradient), and casts between floats, integers and booleans.
#[test]
fn masks_selects_and_casts() {
    let mut rng = Rng(3);
    for (a, b) in [
        (&[4, 33][..], &[33][..]),
        (&[3, 1, 5], &[2, 1]),
        (&[70], &[70]),
    ] {
        for cmp in ["Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual"] {
            let mut g = Graph::new("cmp");
            let x = typed_param(&mut g, "x", DType::F32, a);
            let y = typed_param(&mut g, "y", DType::F32, b);
            let m = op(&mut g, cmp, &[x, y], Attrs::new());
            let s = op(&mut g, "Where", &[m, x, y], Attrs::new());
            let to = |d: &str| Attrs::new().with("to", Attr::String(d.into()));
            let mf = op(&mut g, "Cast", &[m], to("f32"));
            g.add_output("mask", m).unwrap();
            g.add_output("select", s).unwrap();
            g.add_output("mask_f32", mf).unwrap();
            // Rounded to quarters so that Equal sees equal values.
            let quarters = |t: Tensor| {
                let v: Vec<f32> = t
                    .to_f64_vec()
                    .iter()
                    .map(|v| (v * 4.0).round() as f32 / 4.0)
                    .collect();
                Tensor::from_vec(t.shape(), v).unwrap()
            };
            let inputs = [
                quarters(rng.f32_tensor(a, 1.0)),
                quarters(rng.f32_tensor(b, 1.0)),
            ];
            check(&g, &inputs, "compare");
            check(&g, &inputs, "where");
            check(&g, &inputs, "cast");
        }
    }
    // An integer comparison (SoftmaxCrossEntropyLoss's one-hot) and integer casts.
    let mut g = Graph::new("onehot");
    let l = typed_param(&mut g, "labels", DType::I64, &[6, 1]);
    let range = constant(&mut g, Tensor::from_vec(&[7], (0..7i64).collect()).unwrap());
    let eq = op(&mut g, "Equal", &[l, range], Attrs::new());
    let to = |d: &str| Attrs::new().with("to", Attr::String(d.into()));
    let f = op(&mut g, "Cast", &[eq], to("f32"));
    let i = op(&mut g, "Cast", &[f], to("i32"));
    let back = op(&mut g, "Cast", &[i], to("i64"));
    let d = op(&mut g, "Cast", &[back], to("f64"));
    g.add_output("onehot", f).unwrap();
    g.add_output("f64", d).unwrap();
    let labels = Tensor::from_vec(&[6, 1], vec![0i64, 6, 3, 3, 9, -1]).unwrap();
    check(&g, &[labels], "compare");
    // The fused Relu gradient.
    for dims in [&[64, 512][..], &[2, 5, 7, 3]] {
        let mut g = Graph::new("relu_grad");
        let x = typed_param(&mut g, "x", DType::F32, dims);
        let r = op(&mut g, "Relu", &[x], Attrs::new());
        let w = typed_param(&mut g, "w", DType::F32, dims);
        let p = op(&mut g, "Mul", &[r, w], Attrs::new());
        let loss = op(
            &mut g,
            "ReduceSum",
            &[p],
            Attrs::new().with("keepdims", Attr::Int(0)),
        );
        let gx = grad(&mut g, loss, &[x]).unwrap()[0];
        g.add_output("gx", gx).unwrap();
        check(
            &g,
            &[rng.f32_tensor(dims, 1.0), rng.f32_tensor(dims, 1.0)],
            "compare-select",
        );
    }
}

#[test]
fn softmax_cross_entropy_losses() {
    let mut rng = Rng(4);
    for (n, c) in [(1, 1), (5, 3), (64, 10), (7, 37)] {
        for reduction in ["mean", "sum", "none"] {
            for ignore in [None, Some(1)] {
                let mut g = Graph::new("sce");
                let s = typed_param(&mut g, "scores", DType::F32, &[n, c]);
                let l = typed_param(&mut g, "labels", DType::I64, &[n]);
                let mut attrs = Attrs::new().with("reduction", Attr::String(reduction.into()));
                if let Some(i) = ignore {
                    attrs = attrs.with("ignore_index", Attr::Int(i));
                }
                let id = g.op("SoftmaxCrossEntropyLoss", &[s, l], attrs, "").unwrap();
                g.add_output("loss", id.into()).unwrap();
                g.add_output("log_prob", id.out(1)).unwrap();
                let labels: Vec<i64> = (0..n).map(|_| (rng.next_u64() % c as u64) as i64).collect();
                let inputs = [
                    rng.f32_tensor(&[n, c], 3.0),
                    Tensor::from_vec(&[n], labels).unwrap(),
                ];
                check(&g, &inputs, "softmax-xent");
            }
        }
    }
}

/// Conv's filter gradient (a Conv of the transposed input with the transposed output
/// gradient as its filter) runs one GEMM per kernel tap.
#[test]
fn filter_gradients_run_per_output_position() {
    let mut rng = Rng(5);
    for (n, c, hw, m, strides, pads, dil) in [
        (5, 8, [9, 7], 6, [1, 1], [1, 1, 1, 1], [1, 1]),
        (4, 9, [20, 21], 4, [2, 2], [1, 0, 1, 1], [1, 1]),
        (3, 10, [8, 8], 3, [1, 1], [2, 2, 2, 2], [2, 1]),
    ] {
        let mut g = Graph::new("filter_grad");
        let x = typed_param(&mut g, "x", DType::F32, &[n, c, hw[0], hw[1]]);
        let w = typed_param(&mut g, "w", DType::F32, &[m, c, 3, 3]);
        let attrs = ints(&[("pads", &pads), ("strides", &strides), ("dilations", &dil)]);
        let y = op(&mut g, "Conv", &[x, w], attrs);
        let yy = op(&mut g, "Mul", &[y, y], Attrs::new());
        let loss = op(
            &mut g,
            "ReduceSum",
            &[yy],
            Attrs::new().with("keepdims", Attr::Int(0)),
        );
        let gw = grad(&mut g, loss, &[w]).unwrap()[0];
        g.add_output("gw", gw).unwrap();
        let inputs = [
            rng.f32_tensor(&[n, c, hw[0], hw[1]], 1.0),
            rng.f32_tensor(&[m, c, 3, 3], 1.0),
        ];
        check(&g, &inputs, "conv-per-position");
    }
}

/// The training graphs of issue 7 lower with no fallback step at batch 64, and a small
/// batch gives the interpreter's loss and gradients.
#[test]
fn training_graphs_run_on_kernels_only() {
    for (make, kind) in [
        (
            train_graphs::mlp as fn(usize) -> train_graphs::TrainGraph,
            "softmax-xent",
        ),
        (train_graphs::cnn, "conv-transpose"),
    ] {
        let t = make(64);
        let k = kinds(&t.g, &t.inputs);
        if kind == "conv-transpose" {
            // Both filter gradients (blocked by the layout pass) run per position.
            let n = k
                .iter()
                .filter(|&&s| s == "conv-per-position-blocked")
                .count();
            assert_eq!(n, 2, "{k:?}");
            let n = k.iter().filter(|&&s| s == "pool-indices").count();
            assert_eq!(n, 2, "{k:?}");
        }
        let f = fallbacks(&t.g, &t.inputs);
        assert!(f.is_empty(), "fallbacks {f:?} in {k:?}");
        assert!(k.contains(&kind), "no {kind} in {k:?}");
        let t = make(2);
        check(&t.g, &t.inputs, kind);
    }
}
