//! The training steps of issue 7's JAX comparison, built through the Rust API: the MLP
//! 784-512-512-10 (ReLU) and the small CNN of `bench/models.py` (`cnn()`), each with a
//! mean softmax cross-entropy loss and an Adam update of every weight. Shared by
//! `benches/train_step.rs` (timing against JAX) and `tests/train_memory.rs` (the
//! step's planned arena), included by `#[path]`.
//!
//! The graph's inputs are, in order, `x` (the batch), `labels` (i64 class indices) and
//! `lr` (an f32 scalar, so a schedule needs no recompile); its one output is `loss`.
//! Weights are `Variable`s named as in [`weight_shapes`], the names the comparison
//! script's `.npy` files carry.
#![allow(dead_code)]

use kiln::autodiff::grad;
use kiln::ir::{Attr, Attrs, DType, Graph, Shape, TensorType, Value};
use kiln::optim::{add_optimizer, Optimizer, Rule};
use kiln::{Result, Tensor};

/// The models the comparison covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    Mlp,
    Cnn,
}

impl Model {
    pub fn parse(s: &str) -> Option<Model> {
        match s {
            "mlp" => Some(Model::Mlp),
            "cnn" => Some(Model::Cnn),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Model::Mlp => "mlp",
            Model::Cnn => "cnn",
        }
    }

    /// The shape of one sample.
    pub fn sample_shape(self) -> Vec<usize> {
        match self {
            Model::Mlp => vec![784],
            Model::Cnn => vec![1, 28, 28],
        }
    }

    pub const CLASSES: usize = 10;
}

/// The weights in graph order, by name and shape: Gemm weights are `[out, in]`
/// (`transB = 1`, as in the ONNX models), conv filters `[out, in, kh, kw]`.
pub fn weight_shapes(model: Model) -> Vec<(&'static str, Vec<usize>)> {
    match model {
        Model::Mlp => vec![
            ("fc1_w", vec![512, 784]),
            ("fc1_b", vec![512]),
            ("fc2_w", vec![512, 512]),
            ("fc2_b", vec![512]),
            ("fc3_w", vec![10, 512]),
            ("fc3_b", vec![10]),
        ],
        Model::Cnn => vec![
            ("conv1_w", vec![32, 1, 3, 3]),
            ("conv1_b", vec![32]),
            ("conv2_w", vec![64, 32, 3, 3]),
            ("conv2_b", vec![64]),
            ("fc1_w", vec![128, 3136]),
            ("fc1_b", vec![128]),
            ("fc2_w", vec![10, 128]),
            ("fc2_b", vec![10]),
        ],
    }
}

/// Adam as the comparison runs it (lr comes in as the `lr` input).
pub const ADAM: Optimizer = Optimizer {
    rule: Rule::Adam {
        beta1: 0.9,
        beta2: 0.999,
        epsilon: 1e-8,
        decoupled: false,
    },
    weight_decay: 0.0,
    clip_norm: None,
};

/// Deterministic weights when no files are given: uniform in ±1/√fan_in (fan_in: the
/// elements of one output unit's weights; a bias takes its layer's), from a fixed LCG.
pub fn default_weights(model: Model) -> Vec<Tensor> {
    let shapes = weight_shapes(model);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut fan_in = 1;
    shapes
        .iter()
        .map(|(_, shape)| {
            if shape.len() > 1 {
                fan_in = shape[1..].iter().product::<usize>();
            }
            let bound = 1.0 / (fan_in as f32).sqrt();
            let n: usize = shape.iter().product();
            let data = (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let u = (state >> 40) as f32 / (1u64 << 24) as f32;
                    (2.0 * u - 1.0) * bound
                })
                .collect();
            Tensor::from_vec(shape, data).expect("the shape's element count")
        })
        .collect()
}

/// A fixed batch: `x` uniform in [-1, 1), labels cycling through the classes.
pub fn default_batch(model: Model, batch: usize) -> (Tensor, Tensor) {
    let mut shape = vec![batch];
    shape.extend(model.sample_shape());
    let n: usize = shape.iter().product();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let x = (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect();
    let labels = (0..batch)
        .map(|i| (i * 7 % Model::CLASSES) as i64)
        .collect();
    (
        Tensor::from_vec(&shape, x).expect("the shape's element count"),
        Tensor::from_vec(&[batch], labels).expect("one label per sample"),
    )
}

/// The training step of `model` at a fixed `batch`, its weights starting from
/// `weights` (in [`weight_shapes`] order).
pub fn train_step(model: Model, batch: usize, weights: &[Tensor]) -> Result<Graph> {
    let shapes = weight_shapes(model);
    if weights.len() != shapes.len() {
        return Err(kiln::Error::InvalidArgument(format!(
            "{model:?} has {} weights, {} given",
            shapes.len(),
            weights.len()
        )));
    }
    let mut g = Graph::new(match model {
        Model::Mlp => "mlp_train_step",
        Model::Cnn => "cnn_train_step",
    });
    let mut x_shape = vec![batch];
    x_shape.extend(model.sample_shape());
    let x: Value = g
        .add_parameter("x", TensorType::new(DType::F32, Shape::fixed(&x_shape)))?
        .into();
    let labels: Value = g
        .add_parameter(
            "labels",
            TensorType::new(DType::I64, Shape::fixed(&[batch])),
        )?
        .into();
    let lr: Value = g
        .add_parameter("lr", TensorType::new(DType::F32, Shape::scalar()))?
        .into();
    let mut vars = vec![];
    for ((name, shape), init) in shapes.iter().zip(weights) {
        let ty = TensorType::new(DType::F32, Shape::fixed(shape));
        vars.push(Value::from(g.add_variable(name, ty, init.clone())?));
    }
    let op = |g: &mut Graph, op: &str, ins: &[Value], attrs: Attrs| -> Result<Value> {
        Ok(g.op(op, ins, attrs, "")?.into())
    };
    let dense = |g: &mut Graph, h: Value, w: Value, b: Value| {
        op(
            g,
            "Gemm",
            &[h, w, b],
            Attrs::new().with("transB", Attr::Int(1)),
        )
    };
    let relu = |g: &mut Graph, h: Value| op(g, "Relu", &[h], Attrs::new());
    let scores = match model {
        Model::Mlp => {
            let h = dense(&mut g, x, vars[0], vars[1])?;
            let h = relu(&mut g, h)?;
            let h = dense(&mut g, h, vars[2], vars[3])?;
            let h = relu(&mut g, h)?;
            dense(&mut g, h, vars[4], vars[5])?
        }
        Model::Cnn => {
            let conv = Attrs::new()
                .with("pads", Attr::Ints(vec![1, 1, 1, 1]))
                .with("kernel_shape", Attr::Ints(vec![3, 3]));
            let pool = Attrs::new()
                .with("kernel_shape", Attr::Ints(vec![2, 2]))
                .with("strides", Attr::Ints(vec![2, 2]));
            let h = op(&mut g, "Conv", &[x, vars[0], vars[1]], conv.clone())?;
            let h = relu(&mut g, h)?;
            let h = op(&mut g, "MaxPool", &[h], pool.clone())?;
            let h = op(&mut g, "Conv", &[h, vars[2], vars[3]], conv)?;
            let h = relu(&mut g, h)?;
            let h = op(&mut g, "MaxPool", &[h], pool)?;
            let h = op(
                &mut g,
                "Flatten",
                &[h],
                Attrs::new().with("axis", Attr::Int(1)),
            )?;
            let h = dense(&mut g, h, vars[4], vars[5])?;
            let h = relu(&mut g, h)?;
            dense(&mut g, h, vars[6], vars[7])?
        }
    };
    let loss: Value = g
        .op(
            "SoftmaxCrossEntropyLoss",
            &[scores, labels],
            Attrs::new().with("reduction", Attr::String("mean".into())),
            "loss",
        )?
        .into();
    let grads = grad(&mut g, loss, &vars)?;
    add_optimizer(&mut g, &ADAM, &vars, &grads, lr)?;
    g.add_output("loss", loss)?;
    Ok(g)
}
