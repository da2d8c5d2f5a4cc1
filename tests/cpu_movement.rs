//! The CPU backend's data-movement kernels against the reference interpreter: Concat,
//! Split, Slice, Expand, Tile, Transpose, Pad (every mode), Resize (nearest, linear,
//! cubic, coordinate modes, antialias), Gather on any axis, GatherElements, ScatterND,
//! Cast between every numeric pair and Where on every dtype, at 1 and 2 threads, each
//! asserting the kernel it lowered to.
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
        ..Default::default()
    })
}

/// `g` lowers to a `kind` step and no fallback, and gives the interpreter's outputs
/// (within `tol`) at 1 and 2 threads.
fn check(g: &Graph, inputs: &[Tensor], kind: &str, tol: f64) {
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
        kinds.contains(&kind) && !kinds.contains(&"fallback"),
        "want a {kind} step and no fallback, got {kinds:?}\n{}",
        text::print(g)
    );
    let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
    let want = interp.compile(g).unwrap().run(inputs).unwrap();
    for threads in [1, 2] {
        let got = kiln::backend::Backend::compile(&cpu(threads), g)
            .unwrap()
            .run(inputs)
            .unwrap_or_else(|e| panic!("{e}\n{}", text::print(g)));
        for (i, (w, o)) in want.iter().zip(&got).enumerate() {
            o.check_close(w, tol, tol).unwrap_or_else(|e| {
                panic!("output {i}, {threads} thread(s): {e}\n{}", text::print(g))
            });
        }
    }
}

fn i64s(v: &[i64]) -> Tensor {
    Tensor::from_vec(&[v.len()], v.to_vec()).unwrap()
}

fn attr_int(k: &str, v: i64) -> Attrs {
    Attrs::new().with(k, Attr::Int(v))
}

/// Every dtype a data-movement kernel handles by element size.
const DTYPES: [DType; 6] = [
    DType::F32,
    DType::I64,
    DType::U8,
    DType::F16,
    DType::Bool,
    DType::I16,
];

/// Concat and Split along every axis, Concat over inputs of unequal sizes, every dtype.
#[test]
fn concat_and_split() {
    let mut rng = Rng(1);
    for dtype in DTYPES {
        for axis in [-3i64, 1, 2] {
            let a = [2usize, 3, 5];
            let mut b = a;
            let ax = axis.rem_euclid(3) as usize;
            b[ax] = 4;
            let mut g = Graph::new("concat");
            let x = typed_param(&mut g, "x", dtype, &a);
            let y = typed_param(&mut g, "y", dtype, &b);
            let c = op(&mut g, "Concat", &[x, y, x], attr_int("axis", axis));
            let split = constant(&mut g, i64s(&[1, 6, 2 * a[ax] as i64 - 3]));
            let parts = g
                .op("Split", &[c, split], attr_int("axis", axis), "")
                .unwrap();
            g.add_output("c", c).unwrap();
            for k in 0..3 {
                g.add_output(&format!("p{k}"), parts.out(k)).unwrap();
            }
            let inputs = [rng.tensor_of(dtype, &a), rng.tensor_of(dtype, &b)];
            check(&g, &inputs, "concat", 0.0);
            check(&g, &inputs, "split", 0.0);
        }
    }
}

/// Slices with positive, negative and clamped bounds and steps on several axes.
#[test]
fn strided_slices() {
    let mut rng = Rng(2);
    type Bounds<'a> = [&'a [i64]; 4];
    let cases: &[Bounds] = &[
        [&[1, 0], &[-1, 100], &[0, 2], &[1, 2]],
        [&[-1], &[-100], &[1], &[-1]],
        [&[4, 5, 0], &[0, 1, 3], &[2, 1, 0], &[-2, -3, 1]],
        [&[0], &[7], &[-1], &[3]],
    ];
    for dtype in [DType::F32, DType::I32, DType::U8] {
        for &[s, e, ax, st] in cases {
            let mut g = Graph::new("slice");
            let x = typed_param(&mut g, "x", dtype, &[3, 9, 7]);
            let ops = [i64s(s), i64s(e), i64s(ax), i64s(st)].map(|t| constant(&mut g, t));
            let y = op(
                &mut g,
                "Slice",
                &[x, ops[0], ops[1], ops[2], ops[3]],
                Attrs::new(),
            );
            g.add_output("y", y).unwrap();
            check(&g, &[rng.tensor_of(dtype, &[3, 9, 7])], "slice", 0.0);
        }
    }
}

/// Expand (both-ways broadcasting, rank growth), Tile and Transpose on several dtypes.
#[test]
fn expand_tile_transpose() {
    let mut rng = Rng(3);
    for dtype in DTYPES {
        let mut g = Graph::new("expand");
        let x = typed_param(&mut g, "x", dtype, &[3, 1, 5]);
        let shape = constant(&mut g, i64s(&[2, 1, 4, 1]));
        let y = op(&mut g, "Expand", &[x, shape], Attrs::new());
        g.add_output("y", y).unwrap();
        let input = [rng.tensor_of(dtype, &[3, 1, 5])];
        check(&g, &input, "expand", 0.0);

        let mut g = Graph::new("tile");
        let x = typed_param(&mut g, "x", dtype, &[3, 1, 5]);
        let reps = constant(&mut g, i64s(&[2, 3, 1]));
        let y = op(&mut g, "Tile", &[x, reps], Attrs::new());
        g.add_output("y", y).unwrap();
        check(&g, &input, "tile", 0.0);

        let mut g = Graph::new("transpose");
        let x = typed_param(&mut g, "x", dtype, &[3, 4, 5, 2]);
        let y = op(
            &mut g,
            "Transpose",
            &[x],
            common::ints(&[("perm", &[2, 0, 3, 1])]),
        );
        g.add_output("y", y).unwrap();
        check(&g, &[rng.tensor_of(dtype, &[3, 4, 5, 2])], "transpose", 0.0);
    }
}

/// Pad in every mode, with negative pads (crops), axes and a run-time constant value.
#[test]
fn pads_every_mode() {
    let mut rng = Rng(4);
    for dtype in [DType::F32, DType::I64, DType::U8] {
        for mode in ["constant", "reflect", "edge", "wrap"] {
            for (pads, axes) in [
                (&[0i64, 2, 1, 0, 3, 2][..], None),
                (&[1, -1, 2, 1][..], Some(&[1i64, -1][..])),
                (&[0, 0, 0, 0, 0, 0][..], None),
            ] {
                let mut g = Graph::new("pad");
                let x = typed_param(&mut g, "x", dtype, &[2, 4, 5]);
                let v = typed_param(&mut g, "v", dtype, &[]);
                let p = constant(&mut g, i64s(pads));
                let mut args = vec![x, p, v];
                if let Some(a) = axes {
                    args.push(constant(&mut g, i64s(a)));
                }
                let attrs = Attrs::new().with("mode", Attr::String(mode.into()));
                let y = op(&mut g, "Pad", &args, attrs);
                g.add_output("y", y).unwrap();
                let inputs = [rng.tensor_of(dtype, &[2, 4, 5]), rng.tensor_of(dtype, &[])];
                check(&g, &inputs, "pad", 0.0);
            }
        }
    }
}

/// A pad that makes an axis too long to hold is a compile error, not an abort (a mutant
/// of the ONNX corpus found the index table allocated unchecked).
#[test]
fn an_impossible_pad_is_an_error() {
    let mut g = Graph::new("pad");
    let x = typed_param(&mut g, "x", DType::F32, &[2]);
    let p = constant(&mut g, i64s(&[0, 1 << 60]));
    let y = op(&mut g, "Pad", &[x, p], Attrs::new());
    g.add_output("y", y).unwrap();
    let Err(e) = cpu(1).compile_cpu(&g) else {
        panic!("a pad of 2^60 elements compiled")
    };
    let e = e.to_string();
    assert!(
        e.contains("cannot be allocated") || e.contains("too large"),
        "{e}"
    );
}

/// Resize: nearest in every nearest_mode (a table copy, also on u8), linear and cubic in
/// every coordinate mode, antialiased downscaling, sizes with an aspect policy, axes,
/// and tf_crop_and_resize's extrapolation.
#[test]
fn resizes() {
    let mut rng = Rng(5);
    let dims = [2usize, 3, 7, 6];
    let s = |v: &[f32]| Tensor::from_vec(&[v.len()], v.to_vec()).unwrap();
    let transforms = [
        "half_pixel",
        "half_pixel_symmetric",
        "pytorch_half_pixel",
        "align_corners",
        "asymmetric",
    ];
    type Case = (
        String,
        Vec<(String, String)>,
        Option<Tensor>,
        Option<Tensor>,
        Option<Vec<i64>>,
    );
    let mut out: Vec<Case> = vec![];
    for nm in ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"] {
        for sc in [[1.0f32, 1.0, 2.0, 2.0], [1.0, 1.0, 0.6, 1.7]] {
            out.push((
                "nearest".into(),
                vec![
                    ("nearest_mode".into(), nm.into()),
                    ("coordinate_transformation_mode".into(), "asymmetric".into()),
                ],
                Some(s(&sc)),
                None,
                None,
            ));
        }
    }
    for mode in ["linear", "cubic"] {
        for t in transforms {
            for sc in [[1.0f32, 1.0, 2.0, 2.0], [1.0, 1.0, 0.6, 1.7]] {
                out.push((
                    mode.into(),
                    vec![("coordinate_transformation_mode".into(), t.into())],
                    Some(s(&sc)),
                    None,
                    None,
                ));
            }
        }
        out.push((
            mode.into(),
            vec![("antialias".into(), "1".into())],
            Some(s(&[1.0, 1.0, 0.5, 0.4])),
            None,
            None,
        ));
    }
    out.push((
        "cubic".into(),
        vec![
            ("exclude_outside".into(), "1".into()),
            ("cubic_coeff_a".into(), "-0.5".into()),
        ],
        Some(s(&[1.0, 1.0, 1.5, 0.7])),
        None,
        None,
    ));
    out.push((
        "linear".into(),
        vec![("keep_aspect_ratio_policy".into(), "not_larger".into())],
        None,
        Some(i64s(&[5, 20])),
        Some(vec![2, 3]),
    ));
    out.push((
        "linear".into(),
        vec![
            (
                "coordinate_transformation_mode".into(),
                "tf_crop_and_resize".into(),
            ),
            ("extrapolation_value".into(), "7.5".into()),
        ],
        Some(s(&[1.0, 1.0, 1.5, 2.0])),
        None,
        None,
    ));
    for (mode, attrs, scales, sizes, axes) in out {
        for dtype in [DType::F32, DType::U8] {
            if dtype == DType::U8 && mode != "nearest" {
                continue;
            }
            let mut g = Graph::new("resize");
            let x = typed_param(&mut g, "x", dtype, &dims);
            let mut a = Attrs::new().with("mode", Attr::String(mode.clone()));
            for (k, v) in &attrs {
                let value = match k.as_str() {
                    "antialias" | "exclude_outside" => Attr::Int(v.parse().unwrap()),
                    "cubic_coeff_a" | "extrapolation_value" => Attr::Float(v.parse().unwrap()),
                    _ => Attr::String(v.clone()),
                };
                a = a.with(k, value);
            }
            if let Some(ax) = &axes {
                a = a.with("axes", Attr::Ints(ax.clone()));
            }
            let crop = attrs.iter().any(|(_, v)| v == "tf_crop_and_resize");
            let roi = crop.then(|| constant(&mut g, s(&[0.0, 0.0, -0.2, 0.1, 1.0, 1.0, 1.1, 0.8])));
            let scales = scales.clone().map(|t| constant(&mut g, t));
            let sizes = sizes.clone().map(|t| constant(&mut g, t));
            let y = g
                .add_op("Resize", &[Some(x), roi, scales, sizes], a, "")
                .unwrap_or_else(|e| panic!("{e}"));
            g.add_output("y", y.out(0)).unwrap();
            let kind = if mode == "nearest" {
                "resize-nearest"
            } else {
                "resize"
            };
            check(&g, &[rng.tensor_of(dtype, &dims)], kind, 1e-5);
        }
    }
}

/// Gather on every axis with i32 and i64 indices (negative ones too), GatherElements, and
/// an out-of-range index as a run-time error naming the node.
#[test]
fn gathers() {
    let mut rng = Rng(6);
    for dtype in [DType::F32, DType::I64, DType::U8] {
        for axis in [0i64, 1, -1] {
            for wide in [true, false] {
                let idx: Vec<i64> = vec![0, -1, 2, 1, -2, 0];
                let it = if wide {
                    Tensor::from_vec(&[2, 3], idx.clone()).unwrap()
                } else {
                    Tensor::from_vec(&[2, 3], idx.iter().map(|&v| v as i32).collect()).unwrap()
                };
                let mut g = Graph::new("gather");
                let x = typed_param(&mut g, "x", dtype, &[3, 4, 5]);
                let i = typed_param(&mut g, "i", it.dtype(), &[2, 3]);
                let y = op(&mut g, "Gather", &[x, i], attr_int("axis", axis));
                g.add_output("y", y).unwrap();
                check(
                    &g,
                    &[rng.tensor_of(dtype, &[3, 4, 5]), it.clone()],
                    "gather",
                    0.0,
                );

                let mut g = Graph::new("gather_elements");
                let x = typed_param(&mut g, "x", dtype, &[3, 4, 5]);
                let i = typed_param(&mut g, "i", it.dtype(), &[2, 3, 2]);
                let y = op(&mut g, "GatherElements", &[x, i], attr_int("axis", axis));
                g.add_output("y", y).unwrap();
                let ie: Vec<i64> = (0..12).map(|k| [0, -1, 2, 1][k % 4]).collect();
                let ie = if wide {
                    Tensor::from_vec(&[2, 3, 2], ie).unwrap()
                } else {
                    Tensor::from_vec(&[2, 3, 2], ie.iter().map(|&v| v as i32).collect()).unwrap()
                };
                check(
                    &g,
                    &[rng.tensor_of(dtype, &[3, 4, 5]), ie],
                    "gather-elements",
                    0.0,
                );
            }
        }
    }
    let mut g = Graph::new("bad_gather");
    let x = typed_param(&mut g, "x", DType::F32, &[3, 4]);
    let i = typed_param(&mut g, "i", DType::I64, &[2]);
    let y = common::named_op(&mut g, "Gather", &[x, i], attr_int("axis", 1), "lookup");
    g.add_output("y", y).unwrap();
    let exe = kiln::backend::Backend::compile(&cpu(1), &g).unwrap();
    let err = exe
        .run(&[rng.f32_tensor(&[3, 4], 1.0), i64s(&[1, 4])])
        .unwrap_err()
        .to_string();
    assert!(err.contains("lookup") && err.contains("index 4"), "{err}");
}

/// ScatterND with every reduction, whole rows and single elements, repeated indices.
#[test]
fn scatter_nd() {
    let mut rng = Rng(7);
    for dtype in [DType::F32, DType::I32, DType::F64] {
        for how in ["none", "add", "mul", "max", "min"] {
            for (idx, idims, udims) in [
                (vec![1i64, -3, 1], vec![3usize, 1], vec![3usize, 4, 5]),
                (vec![0, 1, 2, 3, 2, 2], vec![3, 2], vec![3, 5]),
                (vec![0, 1, 2, 2, 3, 4], vec![2, 3], vec![2]),
            ] {
                if how == "none" && idx == vec![1, -3, 1] {
                    // Repeated indices without a reduction have no defined order.
                    continue;
                }
                let mut g = Graph::new("scatter_nd");
                let x = typed_param(&mut g, "x", dtype, &[3, 4, 5]);
                let i = constant(&mut g, Tensor::from_vec(&idims, idx).unwrap());
                let u = typed_param(&mut g, "u", dtype, &udims);
                let attrs = Attrs::new().with("reduction", Attr::String(how.into()));
                let y = op(&mut g, "ScatterND", &[x, i, u], attrs);
                g.add_output("y", y).unwrap();
                let inputs = [
                    rng.tensor_of(dtype, &[3, 4, 5]),
                    rng.tensor_of(dtype, &udims),
                ];
                check(&g, &inputs, "scatter-nd", 1e-6);
            }
        }
    }
}

/// Cast between every pair of the numeric dtypes; Where on every dtype, broadcast.
#[test]
fn casts_and_wheres() {
    let mut rng = Rng(8);
    let all = [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::U16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::U64,
        DType::Bool,
    ];
    for from in all {
        let mut g = Graph::new("cast");
        let x = typed_param(&mut g, "x", from, &[5, 7]);
        for to in all {
            let attrs = Attrs::new().with("to", Attr::String(to.to_string()));
            let y = op(&mut g, "Cast", &[x], attrs);
            g.add_output(&format!("y_{to}"), y).unwrap();
        }
        check(&g, &[rng.tensor_of(from, &[5, 7])], "cast", 0.0);
    }
    for dtype in all {
        let mut g = Graph::new("where");
        let c = typed_param(&mut g, "c", DType::Bool, &[3, 1, 5]);
        let x = typed_param(&mut g, "x", dtype, &[4, 1]);
        let y = typed_param(&mut g, "y", dtype, &[3, 4, 5]);
        let w = op(&mut g, "Where", &[c, x, y], Attrs::new());
        g.add_output("w", w).unwrap();
        let inputs = [
            rng.tensor_of(DType::Bool, &[3, 1, 5]),
            rng.tensor_of(dtype, &[4, 1]),
            rng.tensor_of(dtype, &[3, 4, 5]),
        ];
        check(&g, &inputs, "where", 0.0);
    }
}

/// Convolutions joined by a nearest 2x upsampling and a channel Concat (a feature
/// pyramid): the Resize and Concat run on the blocked layout, so one reorder remains
/// (the output's), and the result is the interpreter's.
#[test]
fn blocked_resize_and_concat_keep_the_layout() {
    let mut rng = Rng(9);
    let mut g = Graph::new("fpn");
    let x = typed_param(&mut g, "x", DType::F32, &[1, 8, 10, 10]);
    let x2 = typed_param(&mut g, "x2", DType::F32, &[1, 8, 20, 20]);
    let pads = common::ints(&[("pads", &[1, 1, 1, 1])]);
    let w1 = constant(&mut g, rng.f32_tensor(&[16, 8, 3, 3], 0.3));
    let w2 = constant(&mut g, rng.f32_tensor(&[24, 8, 3, 3], 0.3));
    let w3 = constant(&mut g, rng.f32_tensor(&[16, 40, 3, 3], 0.3));
    let a = op(&mut g, "Conv", &[x, w1], pads.clone());
    let scales = constant(
        &mut g,
        Tensor::from_vec(&[4], vec![1f32, 1.0, 2.0, 2.0]).unwrap(),
    );
    let attrs = Attrs::new().with("mode", Attr::String("nearest".into()));
    let up = g
        .add_op("Resize", &[Some(a), None, Some(scales)], attrs, "up")
        .unwrap()
        .out(0);
    let c = op(&mut g, "Conv", &[x2, w2], pads.clone());
    let cat = op(&mut g, "Concat", &[up, c], attr_int("axis", 1));
    let y = op(&mut g, "Conv", &[cat, w3], pads);
    g.add_output("y", y).unwrap();
    let inputs = [
        rng.f32_tensor(&[1, 8, 10, 10], 1.0),
        rng.f32_tensor(&[1, 8, 20, 20], 1.0),
    ];
    check(&g, &inputs, "concat", 1e-4);
    let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
    let kinds = cpu(1)
        .compile_cpu(&g)
        .unwrap()
        .step_kinds(&shapes)
        .unwrap()
        .unwrap();
    let reorders = kinds.iter().filter(|&&k| k == "reorder").count();
    assert_eq!(reorders, 1, "{kinds:?}");
    assert!(kinds.contains(&"resize-nearest"), "{kinds:?}");
}
