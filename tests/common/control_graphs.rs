//! Control-flow graphs the CPU tests, the allocation test and the loop benchmark share:
//! a recurrence `h ← tanh(h·W + b)` as a `Loop` and the same computation unrolled.
use std::sync::Arc;

use kiln::ir::{Attr, Attrs, DType, Graph, Value};
use kiln::Tensor;

use super::{op, param, typed_param, Rng};

/// The loop body: (iteration, cond, h, W, b) → (cond, tanh(h·W + b)[, the same as a scan
/// output]).
pub fn recurrence_body(width: usize, scan: bool) -> Graph {
    let mut g = Graph::new("step");
    typed_param(&mut g, "i", DType::I64, &[]);
    let cond = typed_param(&mut g, "cond", DType::Bool, &[]);
    let h = param(&mut g, "h", &[1, width]);
    let w = param(&mut g, "w", &[width, width]);
    let b = param(&mut g, "b", &[width]);
    let next = step(&mut g, h, w, b);
    g.add_output("cond_out", cond).unwrap();
    g.add_output("h_out", next).unwrap();
    if scan {
        g.add_output("h_row", next).unwrap();
    }
    g
}

fn step(g: &mut Graph, h: Value, w: Value, b: Value) -> Value {
    let hw = op(g, "MatMul", &[h, w], Attrs::new());
    let pre = op(g, "Add", &[hw, b], Attrs::new());
    op(g, "Tanh", &[pre], Attrs::new())
}

/// Parameters (h0 f32[1, width], W, b); `iters` iterations of the recurrence in a
/// `Loop` with a constant trip count; outputs the final h (and, with `scan`, every h).
pub fn recurrence_loop(iters: i64, width: usize, scan: bool) -> Graph {
    let mut g = Graph::new("recurrence_loop");
    let h0 = param(&mut g, "h0", &[1, width]);
    let w = param(&mut g, "w", &[width, width]);
    let b = param(&mut g, "b", &[width]);
    let m = g.add_constant_value("m", Tensor::scalar(iters)).unwrap();
    let attrs = Attrs::new()
        .with("body", Attr::Graph(Arc::new(recurrence_body(width, scan))))
        .with("captures", Attr::Int(2));
    let l = g
        .add_op(
            "Loop",
            &[Some(m.into()), None, Some(h0), Some(w), Some(b)],
            attrs,
            "loop",
        )
        .unwrap();
    g.add_output("h", l.out(0)).unwrap();
    if scan {
        g.add_output("hs", l.out(1)).unwrap();
    }
    g
}

/// [`recurrence_loop`] (without scan outputs) as a flat graph.
pub fn recurrence_unrolled(iters: i64, width: usize) -> Graph {
    let mut g = Graph::new("recurrence_unrolled");
    let mut h = param(&mut g, "h0", &[1, width]);
    let w = param(&mut g, "w", &[width, width]);
    let b = param(&mut g, "b", &[width]);
    for _ in 0..iters {
        h = step(&mut g, h, w, b);
    }
    g.add_output("h", h).unwrap();
    g
}

/// Inputs for the recurrence graphs: small weights, so that tanh stays off saturation.
pub fn recurrence_inputs(width: usize, seed: u64) -> Vec<Tensor> {
    let mut rng = Rng(seed);
    vec![
        rng.f32_tensor(&[1, width], 1.0),
        rng.f32_tensor(&[width, width], 1.0 / width as f32),
        rng.f32_tensor(&[width], 0.1),
    ]
}
