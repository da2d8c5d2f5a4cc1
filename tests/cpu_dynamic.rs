//! Data-dependent shapes on the CPU backend: `NonMaxSuppression`, `NonZero` and `Unique` steps and
//! the dynamic tail after them, checked against the interpreter and that no step runs on
//! it; and `If`s on data whose branches settle once the input shapes are bound.
use crate::common;

use std::sync::Arc;

use kiln::backend::cpu::{CpuBackend, CpuExecutable};
use kiln::backend::{backend_with, Device, Executable};
use kiln::ir::{Attr, Attrs, DType, Graph, Value};
use kiln::passes::CompileOptions;
use kiln::Tensor;

use common::{constant, op, typed_param, Rng};

pub(crate) fn cpu(g: &Graph) -> CpuExecutable {
    CpuBackend::new(CompileOptions {
        threads: 2,
        ..Default::default()
    })
    .compile_cpu(g)
    .unwrap()
}

fn interp(g: &Graph, inputs: &[Tensor]) -> Vec<Tensor> {
    backend_with(Device::Interp, CompileOptions::default())
        .unwrap()
        .compile(g)
        .unwrap()
        .run(inputs)
        .unwrap()
}

/// Runs `g` on cpu and interp and compares (integers exactly, floats to rounding).
pub(crate) fn check(exe: &CpuExecutable, g: &Graph, inputs: &[Tensor]) {
    let want = interp(g, inputs);
    let got = exe.run(inputs).unwrap();
    assert_eq!(got.len(), want.len());
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.shape(), b.shape(), "output {k}");
        a.check_close(b, 1e-6, 1e-6)
            .unwrap_or_else(|e| panic!("output {k}: {e}"));
    }
}

/// The step kinds of `exe`'s program for `inputs`, which must run no step on the
/// interpreter.
pub(crate) fn kinds(exe: &CpuExecutable, inputs: &[Tensor]) -> Vec<&'static str> {
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let report = exe.step_report(&shapes).unwrap();
    for s in &report {
        assert!(!s.is_fallback(), "{} runs on the {}", s.node, s.kind);
    }
    report.iter().map(|s| s.kind).collect()
}

/// Boxes [b, n, 4] that overlap often (corners or centers in a small square) and
/// scores [b, c, n] on a coarse grid, so that ties are common.
fn boxes_and_scores(rng: &mut Rng, b: usize, c: usize, n: usize) -> (Tensor, Tensor) {
    let boxes: Vec<f32> = (0..b * n * 4).map(|_| (rng.f32() + 1.0) * 2.0).collect();
    let scores: Vec<f32> = (0..b * c * n)
        .map(|_| (rng.below(9) as f32) / 8.0)
        .collect();
    (
        Tensor::from_vec(&[b, n, 4], boxes).unwrap(),
        Tensor::from_vec(&[b, c, n], scores).unwrap(),
    )
}

fn scalar_f32(v: f32) -> Tensor {
    Tensor::from_vec(&[1], vec![v]).unwrap()
}

/// `NonMaxSuppression(boxes, scores, max, iou, score?)` on boxes and scores of `dtype`,
/// the limits constants or (with `limits_as_inputs`) graph inputs.
fn nms_graph(
    dtype: DType,
    b: usize,
    c: usize,
    n: usize,
    center: bool,
    limits: (i64, f32, Option<f32>),
    limits_as_inputs: bool,
) -> Graph {
    let mut g = Graph::new("nms");
    let boxes = typed_param(&mut g, "boxes", dtype, &[b, n, 4]);
    let scores = typed_param(&mut g, "scores", dtype, &[b, c, n]);
    let (max, iou, score) = if limits_as_inputs {
        (
            typed_param(&mut g, "max", DType::I64, &[1]),
            typed_param(&mut g, "iou", DType::F32, &[1]),
            limits
                .2
                .map(|_| typed_param(&mut g, "score", DType::F32, &[1])),
        )
    } else {
        (
            constant(&mut g, Tensor::from_vec(&[1], vec![limits.0]).unwrap()),
            constant(&mut g, scalar_f32(limits.1)),
            limits.2.map(|s| constant(&mut g, scalar_f32(s))),
        )
    };
    let mut ins: Vec<Option<Value>> = vec![Some(boxes), Some(scores), Some(max), Some(iou)];
    ins.extend(score.map(Some));
    let attrs = Attrs::new().with("center_point_box", Attr::Int(center as i64));
    let sel = g.add_op("NonMaxSuppression", &ins, attrs, "nms").unwrap();
    g.add_output("selected", sel.into()).unwrap();
    g
}

#[test]
fn non_max_suppression_matches_the_interpreter_on_random_boxes() {
    let mut rng = Rng(23);
    let cases = [
        (1, 1, 10, false, (10, 0.5, None)),
        (2, 3, 40, true, (5, 0.3, Some(0.4))),
        (3, 2, 64, false, (100, 0.0, Some(0.0))),
        (1, 4, 33, true, (0, 0.5, None)),
        (2, 2, 25, false, (3, 0.7, Some(0.9))),
    ];
    // Boxes and scores of f64, f16 and bf16 are read as f64, as the reference reads them.
    let dtypes = [DType::F32, DType::F64, DType::F16, DType::BF16];
    for ((b, c, n, center, limits), dtype) in dtypes
        .iter()
        .flat_map(|&d| cases.iter().map(move |&case| (case, d)))
    {
        for as_inputs in [false, true] {
            let g = nms_graph(dtype, b, c, n, center, limits, as_inputs);
            let exe = cpu(&g);
            for _ in 0..4 {
                let (boxes, scores) = boxes_and_scores(&mut rng, b, c, n);
                let mut inputs = vec![boxes.cast(dtype), scores.cast(dtype)];
                if as_inputs {
                    inputs.push(Tensor::from_vec(&[1], vec![limits.0]).unwrap());
                    inputs.push(scalar_f32(limits.1));
                    inputs.extend(limits.2.map(scalar_f32));
                }
                check(&exe, &g, &inputs);
                assert!(kinds(&exe, &inputs).contains(&"nms"));
            }
        }
    }
}

#[test]
fn non_zero_matches_the_interpreter_on_every_dtype() {
    let mut rng = Rng(5);
    for dtype in [
        DType::F32,
        DType::F64,
        DType::Bool,
        DType::I64,
        DType::I32,
        DType::U8,
    ] {
        for dims in [&[7][..], &[3, 4], &[2, 3, 5], &[]] {
            let mut g = Graph::new("nonzero");
            let x = typed_param(&mut g, "x", dtype, dims);
            let y = op(&mut g, "NonZero", &[x], Attrs::new());
            g.add_output("y", y).unwrap();
            let exe = cpu(&g);
            for _ in 0..3 {
                // Mostly zeros (and a negative zero), so that the count varies.
                let t = rng.tensor_of(dtype, dims);
                let v: Vec<f64> = t
                    .to_f64_vec()
                    .into_iter()
                    .map(|v| if rng.below(3) == 0 { v } else { -0.0 })
                    .collect();
                let x = Tensor::from_f64s(dtype, dims, &v).unwrap();
                check(&exe, &g, std::slice::from_ref(&x));
                assert!(kinds(&exe, std::slice::from_ref(&x)).contains(&"nonzero"));
            }
        }
    }
}

/// Unique on several dtypes, flattened and along each axis, sorted and not, with many
/// duplicates (values from a few), its outputs also read by a tail (Y scaled).
#[test]
fn unique_matches_the_interpreter_along_axes_sorted_and_not() {
    let mut rng = Rng(11);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::I8, DType::U64] {
        for axis in [None, Some(0), Some(1), Some(-1)] {
            for sorted in [1, 0] {
                let dims = [4, 6];
                let mut g = Graph::new("unique");
                let x = typed_param(&mut g, "x", dtype, &dims);
                let mut a = Attrs::new().with("sorted", Attr::Int(sorted));
                if let Some(axis) = axis {
                    a = a.with("axis", Attr::Int(axis));
                }
                let u = g.add_op("Unique", &[Some(x)], a, "u").unwrap();
                for k in 0..4 {
                    g.add_output(&format!("o{k}"), u.out(k)).unwrap();
                }
                let doubled = op(&mut g, "Add", &[u.out(0), u.out(0)], Attrs::new());
                g.add_output("doubled", doubled).unwrap();
                let exe = cpu(&g);
                for _ in 0..3 {
                    // Rows and columns drawn from a few, so that slices repeat too.
                    let pool: Vec<f64> = (0..3).map(|_| rng.below(4) as f64 - 1.0).collect();
                    let v: Vec<f64> = (0..24)
                        .map(|i| {
                            pool[if rng.below(2) == 0 {
                                i % 3
                            } else {
                                rng.below(3)
                            }]
                        })
                        .map(|v| {
                            if dtype == DType::U64 || dtype == DType::I8 {
                                v.abs()
                            } else {
                                v
                            }
                        })
                        .collect();
                    let x = Tensor::from_f64s(dtype, &dims, &v).unwrap();
                    check(&exe, &g, std::slice::from_ref(&x));
                    assert!(kinds(&exe, std::slice::from_ref(&x)).contains(&"unique"));
                }
            }
        }
    }
}

/// A float `Range` whose limit is a run-time scalar: a program per limit (by value),
/// its result read by a Mul, on f32, f64 and f16.
#[test]
fn a_float_range_to_a_run_time_limit_compiles_per_value() {
    for dtype in [DType::F32, DType::F64, DType::F16] {
        let mut g = Graph::new("range");
        let scalar = |v: f64| Tensor::from_f64s(dtype, &[], &[v]).unwrap();
        let start = constant(&mut g, scalar(0.5));
        let limit = typed_param(&mut g, "limit", dtype, &[]);
        let delta = constant(&mut g, scalar(0.75));
        let r = op(&mut g, "Range", &[start, limit, delta], Attrs::new());
        let y = op(&mut g, "Mul", &[r, r], Attrs::new());
        g.add_output("y", y).unwrap();
        let exe = cpu(&g);
        for limit in [4.0, -1.0, 0.5, 7.25, 4.0] {
            check(&exe, &g, &[scalar(limit)]);
        }
    }
}

/// Boxes kept by NMS, gathered and scaled (a dynamic tail), beside a static output.
#[test]
fn a_dynamic_tail_runs_on_kernels_for_each_extent() {
    let (c, n) = (2, 30);
    let mut g = Graph::new("tail");
    let boxes = typed_param(&mut g, "boxes", DType::F32, &[1, n, 4]);
    let scores = typed_param(&mut g, "scores", DType::F32, &[1, c, n]);
    let max = constant(&mut g, Tensor::from_vec(&[1], vec![10i64]).unwrap());
    let iou = constant(&mut g, scalar_f32(0.1));
    let score = constant(&mut g, scalar_f32(0.6));
    let sel = op(
        &mut g,
        "NonMaxSuppression",
        &[boxes, scores, max, iou, score],
        Attrs::new(),
    );
    let col = constant(&mut g, Tensor::from_vec(&[], vec![2i64]).unwrap());
    let cols = op(&mut g, "Transpose", &[sel], Attrs::new());
    let which = op(&mut g, "Gather", &[cols, col], Attrs::new());
    let shape = constant(&mut g, Tensor::from_vec(&[2], vec![n as i64, 4]).unwrap());
    let flat = op(&mut g, "Reshape", &[boxes, shape], Attrs::new());
    let picked = op(
        &mut g,
        "Gather",
        &[flat, which],
        Attrs::new().with("axis", Attr::Int(0)),
    );
    let two = constant(&mut g, Tensor::from_vec(&[], vec![2.0f32]).unwrap());
    let scaled = op(&mut g, "Mul", &[picked, two], Attrs::new());
    let relu = op(&mut g, "Relu", &[scores], Attrs::new());
    g.add_output("picked", scaled).unwrap();
    g.add_output("selected", sel).unwrap();
    g.add_output("relu", relu).unwrap();
    let exe = cpu(&g);
    let mut rng = Rng(7);
    let mut extents = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let (b, s) = boxes_and_scores(&mut rng, 1, c, n);
        let inputs = [b, s];
        check(&exe, &g, &inputs);
        extents.insert(exe.run(&inputs).unwrap()[1].shape()[0]);
        let kinds = kinds(&exe, &inputs);
        assert!(kinds.contains(&"nms"), "{kinds:?}");
    }
    assert!(extents.len() > 1, "the extent should vary: {extents:?}");
}

/// `If(c, x)` whose branches squeeze `x`'s last axis only when it is 1 (so that their
/// rank is unknown until `x`'s shape is bound), as exporters write it.
#[test]
fn an_if_on_data_settles_when_its_branches_do() {
    let branch = |neg: bool| {
        let squeeze_if_one = |then: bool| {
            let mut b = Graph::new(if then { "squeeze" } else { "keep" });
            let x = b
                .add_parameter("x", kiln::ir::TensorType::unranked(DType::F32))
                .unwrap()
                .into();
            let y = if then {
                let axes = constant(&mut b, Tensor::from_vec(&[1], vec![-1i64]).unwrap());
                op(&mut b, "Squeeze", &[x, axes], Attrs::new())
            } else {
                op(&mut b, "Identity", &[x], Attrs::new())
            };
            b.add_output("y", y).unwrap();
            b
        };
        let mut b = Graph::new(if neg { "neg" } else { "relu" });
        let x = b
            .add_parameter(
                "x",
                kiln::ir::TensorType::new(
                    DType::F32,
                    kiln::ir::Shape::new([
                        kiln::ir::Dim::Sym("n".into()),
                        kiln::ir::Dim::Fixed(3),
                        kiln::ir::Dim::Sym("k".into()),
                    ]),
                ),
            )
            .unwrap()
            .into();
        let shape = op(&mut b, "Shape", &[x], Attrs::new());
        let last = constant(&mut b, Tensor::from_vec(&[1], vec![-1i64]).unwrap());
        let k = op(
            &mut b,
            "Gather",
            &[shape, last],
            Attrs::new().with("axis", Attr::Int(0)),
        );
        let one = constant(&mut b, Tensor::from_vec(&[1], vec![1i64]).unwrap());
        let is_one = op(&mut b, "Equal", &[k, one], Attrs::new());
        let attrs = Attrs::new()
            .with("then_branch", Attr::Graph(Arc::new(squeeze_if_one(true))))
            .with("else_branch", Attr::Graph(Arc::new(squeeze_if_one(false))))
            .with("captures", Attr::Int(1));
        let y = op(&mut b, "If", &[is_one, x], attrs);
        let r = op(&mut b, if neg { "Neg" } else { "Relu" }, &[y], Attrs::new());
        b.add_output("r", r).unwrap();
        b
    };
    let mut g = Graph::new("if");
    let c = typed_param(&mut g, "c", DType::Bool, &[]);
    let x = g
        .add_parameter(
            "x",
            kiln::ir::TensorType::new(
                DType::F32,
                kiln::ir::Shape::new([
                    kiln::ir::Dim::Sym("n".into()),
                    kiln::ir::Dim::Fixed(3),
                    kiln::ir::Dim::Sym("k".into()),
                ]),
            ),
        )
        .unwrap()
        .into();
    let attrs = Attrs::new()
        .with("then_branch", Attr::Graph(Arc::new(branch(false))))
        .with("else_branch", Attr::Graph(Arc::new(branch(true))))
        .with("captures", Attr::Int(1));
    let r = op(&mut g, "If", &[c, x], attrs);
    assert!(g.value_type(r).unwrap().is_unranked_tensor());
    g.add_output("r", r).unwrap();
    let exe = cpu(&g);
    let mut rng = Rng(3);
    for dims in [[2, 3, 1], [4, 3, 2]] {
        for cond in [true, false] {
            let inputs = [
                Tensor::from_vec(&[], vec![cond]).unwrap(),
                rng.f32_tensor(&dims, 1.0),
            ];
            check(&exe, &g, &inputs);
            let kinds = kinds(&exe, &inputs);
            assert!(kinds.contains(&"if"), "{kinds:?}");
        }
    }
}

/// `If(c, x)` whose else branch fits only some shapes of `x`: for the others, the `If`
/// takes the then branch's types and taking the else branch is a run-time error.
#[test]
fn an_if_whose_other_branch_cannot_run_still_compiles() {
    let x_type = || {
        kiln::ir::TensorType::new(
            DType::F32,
            kiln::ir::Shape::new([
                kiln::ir::Dim::Sym("n".into()),
                kiln::ir::Dim::Fixed(3),
                kiln::ir::Dim::Sym("k".into()),
            ]),
        )
    };
    let branch = |then: bool| {
        let mut b = Graph::new(if then { "relu" } else { "flatten6" });
        let x: Value = b.add_parameter("x", x_type()).unwrap().into();
        let y = if then {
            op(&mut b, "Relu", &[x], Attrs::new())
        } else {
            let six = constant(&mut b, Tensor::from_vec(&[1], vec![6i64]).unwrap());
            op(&mut b, "Reshape", &[x, six], Attrs::new())
        };
        b.add_output("y", y).unwrap();
        b
    };
    let mut g = Graph::new("if");
    let c = typed_param(&mut g, "c", DType::Bool, &[]);
    let x: Value = g.add_parameter("x", x_type()).unwrap().into();
    let attrs = Attrs::new()
        .with("then_branch", Attr::Graph(Arc::new(branch(true))))
        .with("else_branch", Attr::Graph(Arc::new(branch(false))))
        .with("captures", Attr::Int(1));
    let r = op(&mut g, "If", &[c, x], attrs);
    g.add_output("r", r).unwrap();
    let exe = cpu(&g);
    let x = Rng(9).f32_tensor(&[4, 3, 2], 1.0);
    let taken = [Tensor::from_vec(&[], vec![true]).unwrap(), x.clone()];
    check(&exe, &g, &taken);
    assert!(kinds(&exe, &taken).contains(&"if"));
    let other = [Tensor::from_vec(&[], vec![false]).unwrap(), x];
    let err = exe.run(&other).unwrap_err().to_string();
    assert!(err.contains("cannot run on these input shapes"), "{err}");
}

/// Types that depend on small integer inputs (axes and a shape given at run time)
/// compile once per value of those inputs, with the fallback off: the reductions and the
/// Reshape run on kernels, not the interpreter, and each new value gets its own program.
#[test]
fn run_time_axes_and_shapes_compile_per_value() {
    let mut g = Graph::new("by_value");
    let x = typed_param(&mut g, "x", DType::F32, &[2, 3, 4]);
    let axes = typed_param(&mut g, "axes", DType::I64, &[1]);
    let shape = typed_param(&mut g, "shape", DType::I64, &[2]);
    let r = op(&mut g, "ReduceSum", &[x, axes], Attrs::new());
    let y = op(&mut g, "Reshape", &[x, shape], Attrs::new());
    let z = op(&mut g, "Relu", &[y], Attrs::new());
    g.add_output("r", r).unwrap();
    g.add_output("z", z).unwrap();
    let exe = CpuBackend::new(CompileOptions {
        threads: 1,
        allow_fallback: false,
        ..Default::default()
    })
    .compile_cpu(&g)
    .unwrap();
    let mut rng = Rng(5);
    let x = rng.f32_tensor(&[2, 3, 4], 1.0);
    let i64s = |v: &[i64]| Tensor::from_vec(&[v.len()], v.to_vec()).unwrap();
    for (a, s) in [(1, [6, 4]), (-1, [4, 6]), (1, [6, 4])] {
        let inputs = [x.clone(), i64s(&[a]), i64s(&s)];
        check(&exe, &g, &inputs);
    }
    let k = kinds(&exe, &[x.clone(), i64s(&[0]), i64s(&[2, 12])]);
    assert_eq!(k[0], "by-value", "{k:?}");
    // The two values seen, each its own program of kernels.
    assert!(k.iter().filter(|&&s| s == "reduce").count() >= 2, "{k:?}");
}
