//! The CPU backend's typed attention, normalization and matrix-product kernels against
//! the reference interpreter, compiled with no fallback: Attention in every form (masks
//! bool / float / rank 0 / shorter than the keys, causal, windows, a past cache with its
//! present outputs, GQA, nonpad_kv_seqlen, softcap, every qk_matmul_output_mode, f16,
//! f64), RotaryEmbedding, RMSNormalization, BatchNormalization with run-time statistics,
//! LRN, Softmax on f64/f16, and MatMul / Gemm / FusedMatMul on f64, f16, bf16, i32 and
//! the f32 forms past the GEMM epilogue, each asserting the step kind it lowered to.
use crate::common;

use common::{typed_param, Rng};
use kiln::backend::cpu::CpuBackend;
use kiln::backend::{backend_with, Device};
use kiln::ir::{text, Attr, Attrs, DType, Graph, Value};
use kiln::passes::CompileOptions;
use kiln::Tensor;

fn cpu(threads: usize) -> CpuBackend {
    CpuBackend::new(CompileOptions {
        threads,
        allow_fallback: false,
        ..Default::default()
    })
}

/// `g` lowers (no fallback allowed) to a `kind` step and gives the interpreter's
/// outputs within `tol`, at 1 and 2 threads.
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
        kinds.contains(&kind),
        "want a {kind} step, got {kinds:?}\n{}",
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

/// A graph of one `op` node over params (`None`: an omitted input) and all its
/// `outputs` as graph outputs, with random inputs of those dtypes and shapes.
fn one_op(
    rng: &mut Rng,
    op: &str,
    ins: &[Option<(DType, &[usize])>],
    attrs: Attrs,
    outputs: usize,
) -> (Graph, Vec<Tensor>) {
    let mut g = Graph::new(op);
    let mut tensors = vec![];
    let vals: Vec<Option<Value>> = ins
        .iter()
        .enumerate()
        .map(|(k, i)| {
            i.map(|(dtype, dims)| {
                tensors.push(rng.tensor_of(dtype, dims));
                typed_param(&mut g, &format!("x{k}"), dtype, dims)
            })
        })
        .collect();
    let node = g.add_op(op, &vals, attrs, "").unwrap();
    for k in 0..outputs {
        g.add_output(&format!("y{k}"), node.out(k as u32)).unwrap();
    }
    (g, tensors)
}

fn int(k: &str, v: i64) -> Attrs {
    Attrs::new().with(k, Attr::Int(v))
}

/// A tolerance for `dtype`'s results (the kernels round as the reference does).
fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F16 | DType::BF16 => 1e-2,
        DType::F32 => 1e-5,
        _ => 1e-10,
    }
}

#[test]
fn attention_every_form() {
    let mut rng = Rng(11);
    for dtype in [DType::F32, DType::F16, DType::F64] {
        let f = |d: &'static [usize]| Some((dtype, d));
        let q4: &[usize] = &[2, 4, 3, 8];
        let kv4: &[usize] = &[2, 2, 5, 8];
        type Case<'a> = (Vec<Option<(DType, &'a [usize])>>, Attrs);
        let cases: Vec<Case> = vec![
            // A boolean mask [Sq, T], causal.
            (
                vec![
                    Some((dtype, q4)),
                    Some((dtype, kv4)),
                    Some((dtype, kv4)),
                    Some((DType::Bool, &[3, 5])),
                ],
                int("is_causal", 1),
            ),
            // A float mask shorter than the keys with a broadcast head axis, softcap.
            (
                vec![f(q4), f(kv4), f(kv4), f(&[2, 1, 3, 4])],
                Attrs::new().with("softcap", Attr::Float(2.0)),
            ),
            // A rank-0 mask; a window; qk output with the bias.
            (
                vec![f(q4), f(kv4), f(kv4), f(&[])],
                int("left_window_size", 1)
                    .with("right_window_size", Attr::Int(2))
                    .with("qk_matmul_output_mode", Attr::Int(2)),
            ),
            // A past cache: present outputs, causal after the past, softmax output.
            (
                vec![
                    f(q4),
                    f(kv4),
                    f(kv4),
                    None,
                    f(&[2, 2, 4, 8]),
                    f(&[2, 2, 4, 8]),
                ],
                int("is_causal", 1).with("qk_matmul_output_mode", Attr::Int(3)),
            ),
            // 3-D, grouped heads, a value head size unlike the key's, a scale.
            (
                vec![f(&[2, 3, 32]), f(&[2, 5, 16]), f(&[2, 5, 12])],
                int("q_num_heads", 4)
                    .with("kv_num_heads", Attr::Int(2))
                    .with("scale", Attr::Float(0.3))
                    .with("qk_matmul_output_mode", Attr::Int(1)),
            ),
            // One query, one key (size-1 dims).
            (
                vec![f(&[1, 1, 1, 8]), f(&[1, 1, 1, 8]), f(&[1, 1, 1, 4])],
                Attrs::new(),
            ),
        ];
        for (ins, attrs) in cases {
            let (g, inputs) = one_op(&mut rng, "Attention", &ins, attrs, 4);
            check(&g, &inputs, "attention-elem", tol(dtype));
        }
        // nonpad_kv_seqlen: keys past each batch's length are masked (one row wholly).
        let mut g = Graph::new("nonpad");
        let p: Vec<Value> = [q4, kv4, kv4]
            .iter()
            .enumerate()
            .map(|(k, d)| typed_param(&mut g, &format!("x{k}"), dtype, d))
            .collect();
        let n = typed_param(&mut g, "n", DType::I64, &[2]);
        let ins = [
            Some(p[0]),
            Some(p[1]),
            Some(p[2]),
            None,
            None,
            None,
            Some(n),
        ];
        let node = g
            .add_op("Attention", &ins, int("is_causal", 1), "")
            .unwrap();
        for k in 0..4 {
            g.add_output(&format!("y{k}"), node.out(k)).unwrap();
        }
        let mut inputs: Vec<Tensor> = [q4, kv4, kv4]
            .iter()
            .map(|d| rng.tensor_of(dtype, d))
            .collect();
        inputs.push(Tensor::from_vec(&[2], vec![4i64, 1]).unwrap());
        check(&g, &inputs, "attention-elem", tol(dtype));
    }
    // Large enough that the batches split over the pool at 2 threads.
    let f = |d: &'static [usize]| Some((DType::F32, d));
    let ins = [f(&[4, 4, 16, 16]), f(&[4, 2, 32, 16]), f(&[4, 2, 32, 16])];
    let (g, inputs) = one_op(&mut rng, "Attention", &ins, int("is_causal", 1), 4);
    check(&g, &inputs, "attention-elem", 1e-5);
}

#[test]
fn rotary_embedding_forms() {
    let mut rng = Rng(12);
    for dtype in [DType::F32, DType::F16] {
        for interleaved in [0, 1] {
            for dim in [0, 4] {
                let attrs =
                    int("interleaved", interleaved).with("rotary_embedding_dim", Attr::Int(dim));
                let half: &[usize] = if dim == 4 { &[2] } else { &[4] };
                let cache: &[usize] = &[10, half[0]];
                // 4-D with position_ids.
                let mut g = Graph::new("rope");
                let x = typed_param(&mut g, "x", dtype, &[2, 3, 4, 8]);
                let c = typed_param(&mut g, "c", dtype, cache);
                let s = typed_param(&mut g, "s", dtype, cache);
                let p = typed_param(&mut g, "p", DType::I64, &[2, 4]);
                let y = g
                    .op("RotaryEmbedding", &[x, c, s, p], attrs.clone(), "")
                    .unwrap();
                g.add_output("y", y.out(0)).unwrap();
                let pos: Vec<i64> = (0..8).map(|_| rng.below(10) as i64).collect();
                let inputs = vec![
                    rng.tensor_of(dtype, &[2, 3, 4, 8]),
                    rng.tensor_of(dtype, cache),
                    rng.tensor_of(dtype, cache),
                    Tensor::from_vec(&[2, 4], pos).unwrap(),
                ];
                check(&g, &inputs, "rotary-embedding", tol(dtype));
                // 3-D without position_ids: caches [B, S, half].
                let bs: &[usize] = &[2, 4, half[0]];
                let attrs = attrs.with("num_heads", Attr::Int(3));
                let ins = [
                    Some((dtype, &[2usize, 4, 24][..])),
                    Some((dtype, bs)),
                    Some((dtype, bs)),
                ];
                let (g, inputs) = one_op(&mut rng, "RotaryEmbedding", &ins, attrs, 1);
                check(&g, &inputs, "rotary-embedding", tol(dtype));
            }
        }
    }
}

#[test]
fn normalizations() {
    let mut rng = Rng(13);
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let x: &[usize] = &[2, 3, 4, 5];
        for (axis, scale) in [
            (-1i64, &[5usize][..]),
            (1, &[3, 1, 5]),
            (-4, &[1]),
            (2, &[4, 5]),
        ] {
            let ins = [Some((dtype, x)), Some((dtype, scale))];
            let attrs = int("axis", axis).with("epsilon", Attr::Float(1e-3));
            let (g, inputs) = one_op(&mut rng, "RMSNormalization", &ins, attrs, 1);
            check(&g, &inputs, "rmsnorm", tol(dtype));
        }
        // Empty rows, and rank 1.
        for (x, scale) in [(&[2usize, 0, 3][..], &[3usize][..]), (&[6], &[6])] {
            let ins = [Some((dtype, x)), Some((dtype, scale))];
            let (g, inputs) = one_op(&mut rng, "RMSNormalization", &ins, Attrs::new(), 1);
            check(&g, &inputs, "rmsnorm", tol(dtype));
        }
        // BatchNormalization with statistics that are inputs (not folded).
        let mut g = Graph::new("bn");
        let xv = typed_param(&mut g, "x", dtype, &[2, 3, 4]);
        let ps: Vec<Value> = (0..4)
            .map(|k| typed_param(&mut g, &format!("p{k}"), dtype, &[3]))
            .collect();
        let attrs = Attrs::new().with("epsilon", Attr::Float(1e-2));
        let y = g
            .op(
                "BatchNormalization",
                &[xv, ps[0], ps[1], ps[2], ps[3]],
                attrs,
                "",
            )
            .unwrap();
        g.add_output("y", y.out(0)).unwrap();
        let mut inputs = vec![rng.tensor_of(dtype, &[2, 3, 4])];
        for _ in 0..3 {
            inputs.push(rng.tensor_of(dtype, &[3]));
        }
        // A variance is positive.
        inputs.push(Tensor::from_f64s(dtype, &[3], &[0.5, 1.0, 2.0]).unwrap());
        check(&g, &inputs, "batchnorm", tol(dtype));
        for size in [1, 2, 3] {
            let attrs = int("size", size)
                .with("alpha", Attr::Float(0.01))
                .with("bias", Attr::Float(2.0));
            let ins = [Some((dtype, &[2usize, 5, 3, 2][..]))];
            let (g, inputs) = one_op(&mut rng, "LRN", &ins, attrs, 1);
            check(&g, &inputs, "lrn", tol(dtype));
        }
        if dtype != DType::F32 {
            for (op, axis) in [("Softmax", -1i64), ("LogSoftmax", 1), ("Softmax", 0)] {
                let ins = [Some((dtype, &[3usize, 4, 5][..]))];
                let (g, inputs) = one_op(&mut rng, op, &ins, int("axis", axis), 1);
                check(&g, &inputs, "softmax-elem", tol(dtype));
            }
        }
    }
}

#[test]
fn layer_instance_lp_norms_and_global_pools_off_f32() {
    let mut rng = Rng(23);
    for dtype in [DType::F64, DType::F16, DType::BF16] {
        let x: &[usize] = &[2, 3, 4];
        for (axis, scale, bias, stash, outs) in [
            (-1i64, &[4usize][..], Some(&[4usize][..]), 1, 3),
            (1, &[3, 4], None, 1, 1),
            (0, &[1], Some(&[3, 1]), 0, 3),
        ] {
            let ins = [
                Some((dtype, x)),
                Some((dtype, scale)),
                bias.map(|b| (dtype, b)),
            ];
            let attrs = int("axis", axis).with("stash_type", Attr::Int(stash));
            let (g, inputs) = one_op(&mut rng, "LayerNormalization", &ins, attrs, outs);
            check(&g, &inputs, "layer-norm-elem", tol(dtype));
        }
        let c: &[usize] = &[3];
        for x in [&[2usize, 3, 5][..], &[1, 3, 2, 2, 2]] {
            let ins = [Some((dtype, x)), Some((dtype, c)), Some((dtype, c))];
            let attrs = Attrs::new().with("epsilon", Attr::Float(1e-3));
            let (g, inputs) = one_op(&mut rng, "InstanceNormalization", &ins, attrs, 1);
            check(&g, &inputs, "instance-norm", tol(dtype));
        }
        for (p, axis) in [(2i64, -1i64), (1, 0), (2, 1)] {
            let ins = [Some((dtype, &[3usize, 4, 2][..]))];
            let attrs = int("p", p).with("axis", Attr::Int(axis));
            let (g, inputs) = one_op(&mut rng, "LpNormalization", &ins, attrs, 1);
            check(&g, &inputs, "lp-norm", tol(dtype));
        }
    }
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for (op, attrs) in [
            ("GlobalLpPool", int("p", 3)),
            ("GlobalLpPool", Attrs::new()),
            ("GlobalAveragePool", Attrs::new()),
            ("GlobalMaxPool", Attrs::new()),
        ] {
            if dtype == DType::F32 && op != "GlobalLpPool" {
                continue;
            }
            for x in [&[2usize, 3, 5][..], &[1, 2, 3, 2, 2]] {
                let (g, inputs) = one_op(&mut rng, op, &[Some((dtype, x))], attrs.clone(), 1);
                check(&g, &inputs, "global-pool-elem", tol(dtype));
            }
        }
    }
}

#[test]
fn conv_off_f32() {
    let mut rng = Rng(31);
    for dtype in [DType::F64, DType::F16, DType::BF16] {
        let pads = |k: usize| Attr::Ints(vec![1; 2 * k]);
        for (x, w, bias, attrs) in [
            (
                &[1usize, 4, 5, 5][..],
                &[4usize, 2, 3, 3][..],
                true,
                int("group", 2).with("pads", pads(2)),
            ),
            (
                &[2, 3, 7],
                &[2, 3, 2],
                false,
                Attrs::new().with("strides", Attr::Ints(vec![2])),
            ),
            (
                &[1, 2, 3, 3, 3],
                &[3, 2, 2, 2, 2],
                true,
                Attrs::new().with("pads", pads(3)),
            ),
        ] {
            let m = [w[0]];
            let ins = [
                Some((dtype, x)),
                Some((dtype, w)),
                bias.then_some((dtype, &m[..])),
            ];
            let (g, inputs) = one_op(&mut rng, "Conv", &ins, attrs, 1);
            check(&g, &inputs, "conv-elem", tol(dtype));
        }
    }
}

#[test]
fn matrix_products_every_dtype() {
    let mut rng = Rng(14);
    for dtype in [DType::F64, DType::F16, DType::BF16, DType::I32] {
        let t = if dtype == DType::I32 { 0.0 } else { tol(dtype) };
        for (a, b) in [
            (&[2usize, 3, 4][..], &[2usize, 4, 5][..]),
            (&[4], &[3, 4, 2]),
            (&[2, 1, 3, 4], &[3, 4, 1]),
            (&[5], &[5]),
            (&[0, 3], &[3, 2]),
        ] {
            let (g, inputs) = one_op(
                &mut rng,
                "MatMul",
                &[Some((dtype, a)), Some((dtype, b))],
                Attrs::new(),
                1,
            );
            check(&g, &inputs, "matmul-elem", t);
        }
        for (ta, tb, c) in [
            (0, 0, &[4usize][..]),
            (1, 0, &[3, 1]),
            (0, 1, &[]),
            (1, 1, &[3, 4]),
        ] {
            let sa: &[usize] = if ta == 1 { &[5, 3] } else { &[3, 5] };
            let sb: &[usize] = if tb == 1 { &[4, 5] } else { &[5, 4] };
            let attrs = int("transA", ta)
                .with("transB", Attr::Int(tb))
                .with("alpha", Attr::Float(0.5))
                .with("beta", Attr::Float(2.0));
            let ins = [Some((dtype, sa)), Some((dtype, sb)), Some((dtype, c))];
            let (g, inputs) = one_op(&mut rng, "Gemm", &ins, attrs, 1);
            check(&g, &inputs, "matmul-elem", t);
        }
        if dtype != DType::I32 {
            // FusedMatMul: a bias broadcast over the batch, Z, transposed B.
            let ins = [
                Some((dtype, &[2usize, 3, 4][..])),
                Some((dtype, &[2, 5, 4][..])),
                Some((dtype, &[3, 5][..])),
                Some((dtype, &[2, 3, 5][..])),
            ];
            let (g, inputs) = one_op(&mut rng, "FusedMatMul", &ins, int("transB", 1), 1);
            check(&g, &inputs, "matmul-elem", t);
        }
    }
    // f32 forms past the GEMM epilogue: alpha, beta, a scalar C, a bias per batch.
    for (sa, sb, c) in [
        (&[4usize, 3][..], &[5usize, 4][..], &[1usize, 5][..]),
        (&[2, 3], &[4, 3], &[]),
    ] {
        let attrs = int("transA", i64::from(sa[0] == 4))
            .with("transB", Attr::Int(1))
            .with("alpha", Attr::Float(0.25))
            .with("beta", Attr::Float(0.5));
        let ins = [
            Some((DType::F32, sa)),
            Some((DType::F32, sb)),
            Some((DType::F32, c)),
        ];
        let (g, inputs) = one_op(&mut rng, "Gemm", &ins, attrs, 1);
        check(&g, &inputs, "gemm", 1e-5);
    }
    let ins = [
        Some((DType::F32, &[2usize, 3, 4, 8][..])),
        Some((DType::F32, &[2, 3, 8, 6][..])),
        Some((DType::F32, &[4, 6][..])),
    ];
    let (g, inputs) = one_op(&mut rng, "FusedMatMul", &ins, Attrs::new(), 1);
    check(&g, &inputs, "gemm", 1e-5);
    let ins = [
        Some((DType::F32, &[3usize, 4][..])),
        Some((DType::F32, &[4, 2][..])),
        Some((DType::F32, &[][..])),
    ];
    let (g, inputs) = one_op(
        &mut rng,
        "FusedMatMul",
        &ins,
        Attrs::new().with("activation", Attr::String("Relu".into())),
        1,
    );
    check(&g, &inputs, "gemm", 1e-5);
}
