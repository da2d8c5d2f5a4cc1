//! Optimizer steps built as graph nodes (`kiln::optim`) against the same updates written
//! out in plain Rust, over several runs of one executable (its variables persist).
use kiln::autodiff::grad;
use kiln::backend::{backend_with, Device};
use kiln::ir::{Attr, Attrs, DType, Graph, Shape, TensorType, Value};
use kiln::optim::{add_optimizer, Optimizer, Rule};
use kiln::passes::CompileOptions;
use kiln::Tensor;

const W0: [f64; 3] = [0.5, -1.5, 2.0];
const X: [f64; 3] = [1.0, 2.0, -3.0];

/// loss = Σ (w − x)² + 0.1·Σ w³: gradient 2(w − x) + 0.3w².
fn gradient(w: &[f64]) -> Vec<f64> {
    w.iter()
        .zip(X)
        .map(|(w, x)| 2.0 * (w - x) + 0.3 * w * w)
        .collect()
}

/// The weights after each of `steps` steps, as plain Rust computes them.
fn reference(opt: &Optimizer, lr: f64, steps: usize) -> Vec<Vec<f64>> {
    let mut w = W0.to_vec();
    let (mut m, mut v) = (vec![0.0; 3], vec![0.0; 3]);
    let mut out = vec![w.clone()];
    for t in 1..=steps {
        let mut g = gradient(&w);
        if let Some(c) = opt.clip_norm {
            let norm = g.iter().map(|x| x * x).sum::<f64>().sqrt();
            if norm > c {
                g.iter_mut().for_each(|x| *x *= c / norm);
            }
        }
        let decoupled = matches!(
            opt.rule,
            Rule::Adam {
                decoupled: true,
                ..
            }
        );
        if !decoupled {
            for (g, w) in g.iter_mut().zip(&w) {
                *g += opt.weight_decay * w;
            }
        }
        for i in 0..3 {
            let u = match opt.rule {
                Rule::Sgd { momentum, nesterov } => {
                    m[i] = momentum * m[i] + g[i];
                    if nesterov {
                        g[i] + momentum * m[i]
                    } else {
                        m[i]
                    }
                }
                Rule::Adam {
                    beta1,
                    beta2,
                    epsilon,
                    decoupled,
                } => {
                    m[i] = beta1 * m[i] + (1.0 - beta1) * g[i];
                    v[i] = beta2 * v[i] + (1.0 - beta2) * g[i] * g[i];
                    let mh = m[i] / (1.0 - beta1.powi(t as i32));
                    let vh = v[i] / (1.0 - beta2.powi(t as i32));
                    let d = if decoupled {
                        opt.weight_decay * w[i]
                    } else {
                        0.0
                    };
                    mh / (vh.sqrt() + epsilon) + d
                }
            };
            w[i] -= lr * u;
        }
        out.push(w.clone());
    }
    out
}

/// The weights the graph's optimizer leaves after each run.
fn graph_steps(opt: &Optimizer, lr: f64, steps: usize) -> Vec<Vec<f64>> {
    let mut g = Graph::new("train");
    let ty = TensorType::new(DType::F64, Shape::fixed(&[3]));
    let w: Value = g
        .add_variable(
            "w",
            ty.clone(),
            Tensor::from_vec(&[3], W0.to_vec()).unwrap(),
        )
        .unwrap()
        .into();
    let x: Value = g.add_parameter("x", ty).unwrap().into();
    let lr_in: Value = g
        .add_parameter("lr", TensorType::new(DType::F32, Shape::scalar()))
        .unwrap()
        .into();
    let op = |g: &mut Graph, op: &str, ins: &[Value]| -> Value {
        g.op(op, ins, Attrs::new(), "").unwrap().into()
    };
    let d = op(&mut g, "Sub", &[w, x]);
    let d2 = op(&mut g, "Mul", &[d, d]);
    let w2 = op(&mut g, "Mul", &[w, w]);
    let w3 = op(&mut g, "Mul", &[w2, w]);
    let k: Value = g
        .add_constant_value("k", Tensor::scalar(0.1f64))
        .unwrap()
        .into();
    let w3 = op(&mut g, "Mul", &[w3, k]);
    let s = op(&mut g, "Add", &[d2, w3]);
    let keep0 = Attrs::new().with("keepdims", Attr::Int(0));
    let loss: Value = g.op("ReduceSum", &[s], keep0, "loss").unwrap().into();
    let gw = grad(&mut g, loss, &[w]).unwrap();
    add_optimizer(&mut g, opt, &[w], &gw, lr_in).unwrap();
    let seen = op(&mut g, "Identity", &[w]);
    g.add_output("w", seen).unwrap();
    let exe = backend_with(
        Device::Cpu,
        CompileOptions {
            threads: 1,
            ..Default::default()
        },
    )
    .unwrap()
    .compile(&g)
    .unwrap();
    let inputs = [
        Tensor::from_vec(&[3], X.to_vec()).unwrap(),
        Tensor::scalar(lr as f32),
    ];
    (0..=steps)
        .map(|_| exe.run(&inputs).unwrap()[0].to_f64_vec())
        .collect()
}

#[test]
fn optimizers_match_their_formulas() {
    let sgd = |momentum, nesterov| Rule::Sgd { momentum, nesterov };
    let adam = |decoupled| Rule::Adam {
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
        decoupled,
    };
    let cases = [
        (sgd(0.0, false), 0.0, None),
        (sgd(0.9, false), 0.0, None),
        (sgd(0.9, true), 0.01, None),
        (sgd(0.5, false), 0.0, Some(1.0)),
        (adam(false), 0.0, None),
        (adam(false), 0.05, Some(2.0)),
        (adam(true), 0.05, None),
    ];
    for (rule, weight_decay, clip_norm) in cases {
        let opt = Optimizer {
            rule,
            weight_decay,
            clip_norm,
        };
        // lr as f32 (the graph's input type), so both sides use the same value.
        let lr = 0.05f32 as f64;
        let want = reference(&opt, lr, 4);
        let got = graph_steps(&opt, lr, 4);
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            for (a, b) in g.iter().zip(w) {
                assert!(
                    (a - b).abs() <= 1e-12 * b.abs().max(1.0),
                    "{opt:?} step {step}: {g:?} vs {w:?}"
                );
            }
        }
        // Training moved the weights.
        assert!(got[4] != got[0], "{opt:?}");
    }
}
