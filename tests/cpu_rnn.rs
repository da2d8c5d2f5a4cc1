//! The CPU backend's recurrent kernels (RNN, GRU, LSTM) against the reference
//! interpreter over a grid of shapes and attributes: directions, activations, sequence
//! lengths, initial states, peepholes, layouts, clipping, weights constant or not, at 1
//! and 2 threads; each must lower to its kernel, not the fallback.
use crate::common;

use kiln::backend::cpu::CpuBackend;
use kiln::backend::{backend_with, Device};
use kiln::ir::{text, Attr, Attrs, DType, Graph, Value};
use kiln::passes::CompileOptions;
use kiln::Tensor;

use common::{constant, param, typed_param, Rng};

#[derive(Clone)]
struct Case {
    op: &'static str,
    direction: &'static str,
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    batch_first: bool,
    bias: bool,
    /// Some: per-row lengths (a graph input).
    lens: Option<Vec<i32>>,
    initial: bool,
    peepholes: bool,
    clip: Option<f32>,
    activations: Option<Vec<&'static str>>,
    alphas: Option<Vec<f32>>,
    betas: Option<Vec<f32>>,
    input_forget: bool,
    linear_before_reset: bool,
    /// W and R graph inputs rather than constants (nothing to pack).
    weights_as_inputs: bool,
    /// The layer's float dtype (the data drawn as f32, then cast).
    dtype: DType,
}

impl Case {
    fn new(op: &'static str) -> Case {
        Case {
            op,
            direction: "forward",
            seq: 5,
            batch: 3,
            input: 7,
            hidden: 9,
            batch_first: false,
            bias: true,
            lens: None,
            initial: false,
            peepholes: false,
            clip: None,
            activations: None,
            alphas: None,
            betas: None,
            input_forget: false,
            linear_before_reset: false,
            weights_as_inputs: false,
            dtype: DType::F32,
        }
    }

    fn gates(&self) -> usize {
        match self.op {
            "RNN" => 1,
            "GRU" => 3,
            _ => 4,
        }
    }

    fn dirs(&self) -> usize {
        if self.direction == "bidirectional" {
            2
        } else {
            1
        }
    }

    /// The graph and its inputs.
    fn graph(&self, seed: u64) -> (Graph, Vec<Tensor>) {
        let mut rng = Rng(seed);
        let mut g = Graph::new("rnn");
        let mut inputs = vec![];
        let (d, gh, h) = (self.dirs(), self.gates() * self.hidden, self.hidden);
        let x_dims = if self.batch_first {
            [self.batch, self.seq, self.input]
        } else {
            [self.seq, self.batch, self.input]
        };
        let state = if self.batch_first {
            [self.batch, d, h]
        } else {
            [d, self.batch, h]
        };
        let dtype = self.dtype;
        let x = typed_param(&mut g, "x", dtype, &x_dims);
        inputs.push(rng.f32_tensor(&x_dims, 1.0).cast(dtype));
        let scale = 1.0 / (self.hidden as f32).sqrt();
        let mut weight = |g: &mut Graph, name: &str, dims: &[usize], inputs: &mut Vec<Tensor>| {
            let t = rng.f32_tensor(dims, scale).cast(dtype);
            if self.weights_as_inputs {
                inputs.push(t);
                typed_param(g, name, dtype, dims)
            } else {
                constant(g, t)
            }
        };
        let w = weight(&mut g, "w", &[d, gh, self.input], &mut inputs);
        let r = weight(&mut g, "r", &[d, gh, h], &mut inputs);
        let mut ops: Vec<Option<Value>> = vec![Some(x), Some(w), Some(r)];
        let mut rng = Rng(seed ^ 0x55);
        ops.push(
            self.bias
                .then(|| constant(&mut g, rng.f32_tensor(&[d, 2 * gh], 0.5).cast(dtype))),
        );
        ops.push(self.lens.as_ref().map(|l| {
            inputs.push(Tensor::from_vec(&[self.batch], l.clone()).unwrap());
            typed_param(&mut g, "lens", DType::I32, &[self.batch])
        }));
        let mut state_input = |g: &mut Graph, name: &str, inputs: &mut Vec<Tensor>| {
            inputs.push(rng.f32_tensor(&state, 0.8).cast(dtype));
            typed_param(g, name, dtype, &state)
        };
        ops.push(self.initial.then(|| state_input(&mut g, "h0", &mut inputs)));
        if self.op == "LSTM" {
            ops.push(self.initial.then(|| state_input(&mut g, "c0", &mut inputs)));
            ops.push(
                self.peepholes
                    .then(|| constant(&mut g, rng.f32_tensor(&[d, 3 * h], 0.5).cast(dtype))),
            );
        }
        while ops.last() == Some(&None) {
            ops.pop();
        }
        let mut a = Attrs::new()
            .with("direction", Attr::String(self.direction.into()))
            .with("hidden_size", Attr::Int(h as i64));
        if self.batch_first {
            a = a.with("layout", Attr::Int(1));
        }
        if let Some(c) = self.clip {
            a = a.with("clip", Attr::Float(c as f64));
        }
        if let Some(names) = &self.activations {
            a = a.with(
                "activations",
                Attr::Strings(names.iter().map(|s| s.to_string()).collect()),
            );
        }
        if let Some(v) = &self.alphas {
            a = a.with(
                "activation_alpha",
                Attr::Floats(v.iter().map(|&f| f as f64).collect()),
            );
        }
        if let Some(v) = &self.betas {
            a = a.with(
                "activation_beta",
                Attr::Floats(v.iter().map(|&f| f as f64).collect()),
            );
        }
        if self.input_forget {
            a = a.with("input_forget", Attr::Int(1));
        }
        if self.linear_before_reset {
            a = a.with("linear_before_reset", Attr::Int(1));
        }
        let node = g
            .add_op(self.op, &ops, a, "layer")
            .unwrap_or_else(|e| panic!("{e}\n{}", text::print(&g)));
        let outs = if self.op == "LSTM" { 3 } else { 2 };
        for k in 0..outs {
            g.add_output(&format!("y{k}"), node.out(k as u32)).unwrap();
        }
        (g, inputs)
    }
}

fn cpu(threads: usize) -> CpuBackend {
    CpuBackend::new(CompileOptions {
        threads,
        ..Default::default()
    })
}

/// The case on cpu at 1 and 2 threads matches the interpreter, through its kernel.
fn check(case: &Case, seed: u64) {
    let (g, inputs) = case.graph(seed);
    let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
    let want = interp.compile(&g).unwrap().run(&inputs).unwrap();
    let mut kind = case.op.to_ascii_lowercase();
    if case.dtype != DType::F32 {
        kind += "-elem";
    }
    // f16 and bf16 outputs are rounded from f64 by both sides: at most an ulp apart.
    let (atol, rtol) = match case.dtype {
        DType::F64 => (1e-12, 1e-12),
        DType::F16 => (2e-3, 2e-3),
        DType::BF16 => (1.6e-2, 1.6e-2),
        _ => (2e-5, 2e-4),
    };
    for threads in [1, 2] {
        let exe = cpu(threads).compile_cpu(&g).unwrap();
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|t| t.shape().to_vec()).collect();
        let kinds = exe.step_kinds(&shapes).unwrap().expect("lowered");
        assert!(
            kinds.contains(&kind.as_str()) && !kinds.contains(&"fallback"),
            "{kinds:?}\n{}",
            text::print(&g)
        );
        let got = kiln::backend::Executable::run(&exe, &inputs).unwrap();
        for (i, (w, o)) in want.iter().zip(&got).enumerate() {
            o.check_close(w, atol, rtol).unwrap_or_else(|e| {
                panic!("output {i}, {threads} thread(s): {e}\n{}", text::print(&g))
            });
        }
    }
}

#[test]
fn recurrent_layers_over_directions_layouts_lengths_and_states() {
    let mut seed = 0;
    for op in ["RNN", "GRU", "LSTM"] {
        for direction in ["forward", "reverse", "bidirectional"] {
            for batch_first in [false, true] {
                for (lens, initial) in [
                    (None, false),
                    (Some(vec![5, 0, 3]), true),
                    (Some(vec![2, 5, 1]), false),
                ] {
                    seed += 1;
                    let case = Case {
                        direction,
                        batch_first,
                        lens,
                        initial,
                        bias: seed % 3 != 0,
                        ..Case::new(op)
                    };
                    check(&case, seed);
                }
            }
        }
    }
}

#[test]
fn recurrent_layers_on_f64_f16_bf16_over_directions_layouts_lengths_and_states() {
    let mut seed = 500;
    for dtype in [DType::F64, DType::F16, DType::BF16] {
        for op in ["RNN", "GRU", "LSTM"] {
            for (direction, batch_first, lens, initial) in [
                ("forward", false, None, false),
                ("reverse", true, Some(vec![5, 0, 3]), true),
                ("bidirectional", false, Some(vec![2, 5, 1]), true),
                ("bidirectional", true, None, false),
            ] {
                seed += 1;
                let case = Case {
                    direction,
                    batch_first,
                    lens,
                    initial,
                    bias: seed % 3 != 0,
                    peepholes: op == "LSTM" && initial,
                    linear_before_reset: op == "GRU" && batch_first,
                    clip: (seed % 4 == 0).then_some(0.3),
                    weights_as_inputs: seed % 2 == 0,
                    dtype,
                    ..Case::new(op)
                };
                check(&case, seed);
            }
        }
    }
}

#[test]
fn gru_resets_before_and_after_the_recurrent_product() {
    for (i, lbr) in [false, true].into_iter().enumerate() {
        for direction in ["forward", "bidirectional"] {
            let case = Case {
                direction,
                linear_before_reset: lbr,
                initial: true,
                lens: Some(vec![4, 5, 2]),
                ..Case::new("GRU")
            };
            check(&case, 100 + i as u64);
        }
    }
}

#[test]
fn lstm_peepholes_input_forget_and_clip() {
    let mut seed = 200;
    for peepholes in [false, true] {
        for input_forget in [false, true] {
            for clip in [None, Some(0.3)] {
                seed += 1;
                let case = Case {
                    direction: "bidirectional",
                    peepholes,
                    input_forget,
                    clip,
                    initial: true,
                    ..Case::new("LSTM")
                };
                check(&case, seed);
            }
        }
    }
}

#[test]
fn every_activation_with_its_alpha_and_beta() {
    let all = [
        "Relu",
        "Tanh",
        "Sigmoid",
        "Affine",
        "LeakyRelu",
        "ThresholdedRelu",
        "ScaledTanh",
        "HardSigmoid",
        "Elu",
        "Softsign",
        "Softplus",
    ];
    for (i, act) in all.iter().enumerate() {
        // Each activation in every position of an LSTM, a GRU and an RNN, with alphas
        // and betas given for some.
        let with_params = i % 2 == 0;
        for op in ["RNN", "GRU", "LSTM"] {
            let n = match op {
                "RNN" => 1,
                "GRU" => 2,
                _ => 3,
            };
            for pos in 0..n {
                let mut names = match op {
                    "RNN" => vec!["Tanh"],
                    "GRU" => vec!["Sigmoid", "Tanh"],
                    _ => vec!["Sigmoid", "Tanh", "Tanh"],
                };
                names[pos] = act;
                let case = Case {
                    activations: Some(names),
                    alphas: with_params.then(|| [0.7, 0.4, 1.3][..n].to_vec()),
                    betas: with_params.then(|| [0.2, 0.6, 0.9][..n].to_vec()),
                    clip: (i % 3 == 0).then_some(2.0),
                    ..Case::new(op)
                };
                check(&case, 300 + (i * 10 + pos) as u64);
            }
        }
    }
    // Different activations per direction.
    let case = Case {
        direction: "bidirectional",
        activations: Some(vec!["Sigmoid", "Tanh", "Relu", "HardSigmoid", "Softsign"]),
        ..Case::new("GRU")
    };
    check(
        &Case {
            activations: Some(vec!["Sigmoid", "Tanh", "HardSigmoid", "Softsign"]),
            ..case
        },
        400,
    );
}

#[test]
fn weights_that_are_inputs_and_ragged_sizes() {
    let shapes = [(1, 1, 1, 1), (3, 1, 17, 33), (2, 13, 5, 20), (7, 8, 40, 16)];
    for (i, &(seq, batch, input, hidden)) in shapes.iter().enumerate() {
        for op in ["RNN", "GRU", "LSTM"] {
            for weights_as_inputs in [false, true] {
                let case = Case {
                    seq,
                    batch,
                    input,
                    hidden,
                    direction: "bidirectional",
                    weights_as_inputs,
                    initial: true,
                    linear_before_reset: op == "GRU" && i % 2 == 1,
                    ..Case::new(op)
                };
                check(&case, 500 + i as u64);
            }
        }
    }
}

#[test]
fn a_large_layer_uses_the_pool() {
    // Large enough that each recurrent product and the gate math split over threads.
    let case = Case {
        seq: 3,
        batch: 64,
        input: 96,
        hidden: 160,
        direction: "bidirectional",
        initial: true,
        lens: Some((0..64).map(|n| n % 4).collect()),
        ..Case::new("LSTM")
    };
    check(&case, 600);
    check(&Case { op: "GRU", ..case }, 601);
}

#[test]
fn sequence_lengths_out_of_range_are_an_error() {
    let case = Case {
        lens: Some(vec![6, 1, 1]),
        ..Case::new("LSTM")
    };
    let (g, inputs) = case.graph(700);
    let e = kiln::backend::Executable::run(&cpu(1).compile_cpu(&g).unwrap(), &inputs)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sequence_lens[0] is 6"), "{e}");
}

/// A `DynamicQuantizeLSTM` graph: 8-bit W and R (int8 or uint8, per-direction or
/// per-column scales), the optional inputs as `case` says.
fn quant_lstm(case: &Case, unsigned: bool, per_column: bool, seed: u64) -> (Graph, Vec<Tensor>) {
    let mut rng = Rng(seed);
    let mut g = Graph::new("qlstm");
    let (d, h, b) = (case.dirs(), case.hidden, case.batch);
    let g4 = 4 * h;
    let mut inputs = vec![];
    let x = param(&mut g, "x", &[case.seq, b, case.input]);
    inputs.push(rng.f32_tensor(&[case.seq, b, case.input], 1.0));
    let mut int8 = |g: &mut Graph, dims: &[usize]| {
        let n: usize = dims.iter().product();
        let t = if unsigned {
            let v: Vec<u8> = (0..n).map(|_| rng.below(256) as u8).collect();
            Tensor::from_vec(dims, v).unwrap()
        } else {
            let v: Vec<i8> = (0..n)
                .map(|_| (rng.below(256) as i32 - 128) as i8)
                .collect();
            Tensor::from_vec(dims, v).unwrap()
        };
        constant(g, t)
    };
    let w = int8(&mut g, &[d, case.input, g4]);
    let r = int8(&mut g, &[d, h, g4]);
    let mut rng = Rng(seed ^ 0x77);
    let scale_dims: Vec<usize> = if per_column { vec![d, g4] } else { vec![d] };
    let mut scales = |g: &mut Graph| {
        let n: usize = scale_dims.iter().product();
        let v: Vec<f32> = (0..n).map(|_| 0.001 + 0.004 * rng.unit() as f32).collect();
        constant(g, Tensor::from_vec(&scale_dims, v).unwrap())
    };
    let (ws, rs) = (scales(&mut g), scales(&mut g));
    let zero = |g: &mut Graph, v: i64| {
        let n: usize = scale_dims.iter().product();
        let t = if unsigned {
            Tensor::from_vec(&scale_dims, vec![v as u8; n]).unwrap()
        } else {
            Tensor::from_vec(&scale_dims, vec![(v - 128) as i8; n]).unwrap()
        };
        constant(g, t)
    };
    let (wz, rz) = (zero(&mut g, 131), zero(&mut g, 120));
    let mut rng = Rng(seed ^ 0x99);
    let bias = case
        .bias
        .then(|| constant(&mut g, rng.f32_tensor(&[d, 2 * g4], 0.5)));
    let lens = case.lens.as_ref().map(|l| {
        inputs.push(Tensor::from_vec(&[b], l.clone()).unwrap());
        typed_param(&mut g, "lens", DType::I32, &[b])
    });
    let mut state = |g: &mut Graph, name: &str, inputs: &mut Vec<Tensor>| {
        inputs.push(rng.f32_tensor(&[d, b, h], 0.8));
        param(g, name, &[d, b, h])
    };
    let h0 = case.initial.then(|| state(&mut g, "h0", &mut inputs));
    let c0 = case.initial.then(|| state(&mut g, "c0", &mut inputs));
    let p = case
        .peepholes
        .then(|| constant(&mut g, rng.f32_tensor(&[d, 3 * h], 0.5)));
    let ops = [
        Some(x),
        Some(w),
        Some(r),
        bias,
        lens,
        h0,
        c0,
        p,
        Some(ws),
        Some(wz),
        Some(rs),
        Some(rz),
    ];
    let mut a = Attrs::new()
        .with("direction", Attr::String(case.direction.into()))
        .with("hidden_size", Attr::Int(h as i64));
    if let Some(c) = case.clip {
        a = a.with("clip", Attr::Float(c as f64));
    }
    if case.input_forget {
        a = a.with("input_forget", Attr::Int(1));
    }
    let node = g
        .add_op("DynamicQuantizeLSTM", &ops, a, "layer")
        .unwrap_or_else(|e| panic!("{e}\n{}", text::print(&g)));
    for k in 0..3 {
        g.add_output(&format!("y{k}"), node.out(k)).unwrap();
    }
    (g, inputs)
}

#[test]
fn dynamic_quantize_lstm_computes_what_the_interpreter_does() {
    let mut seed = 800;
    for direction in ["forward", "reverse", "bidirectional"] {
        for (lens, initial, peepholes) in [
            (None, false, false),
            (Some(vec![5, 0, 3]), true, true),
            (Some(vec![2, 4, 1]), true, false),
        ] {
            for (unsigned, per_column) in [(false, false), (true, true)] {
                seed += 1;
                let case = Case {
                    direction,
                    lens: lens.clone(),
                    initial,
                    peepholes,
                    clip: (seed % 4 == 0).then_some(0.5),
                    input_forget: seed % 5 == 0,
                    bias: seed % 3 != 0,
                    hidden: 20,
                    input: 13,
                    ..Case::new("LSTM")
                };
                let (g, inputs) = quant_lstm(&case, unsigned, per_column, seed);
                let interp = backend_with(Device::Interp, CompileOptions::default()).unwrap();
                let want = interp.compile(&g).unwrap().run(&inputs).unwrap();
                for threads in [1, 2] {
                    let exe = cpu(threads).compile_cpu(&g).unwrap();
                    let shapes: Vec<Vec<usize>> =
                        inputs.iter().map(|t| t.shape().to_vec()).collect();
                    let kinds = exe.step_kinds(&shapes).unwrap().expect("lowered");
                    assert!(kinds.contains(&"lstm-quant"), "{kinds:?}");
                    let got = kiln::backend::Executable::run(&exe, &inputs).unwrap();
                    for (i, (w, o)) in want.iter().zip(&got).enumerate() {
                        o.check_close(w, 0.0, 0.0).unwrap_or_else(|e| {
                            panic!("case {seed} output {i}, {threads} thread(s): {e}")
                        });
                    }
                }
            }
        }
    }
}
