//! The two training graphs of issue 7's benchmark, forward and backward without state:
//! the MLP 784-512-512-10 and the small CNN of `bench/models.py` (`mlp()`, `cnn()`),
//! with SoftmaxCrossEntropyLoss (mean) on integer labels. The weights are parameters
//! (after the images and labels) and the outputs are the loss, then one gradient per
//! weight, in order. Shared by `tests/cpu_backward.rs` and `benches/backward_step.rs`.
use kiln::autodiff::grad;
use kiln::ir::{Attr, Attrs, DType, Graph, Shape, TensorType, Value};
use kiln::Tensor;

use super::Rng;

/// A training graph and inputs to run it on.
pub struct TrainGraph {
    pub g: Graph,
    pub inputs: Vec<Tensor>,
}

struct Builder {
    g: Graph,
    rng: Rng,
    weights: Vec<Value>,
    values: Vec<Tensor>,
}

impl Builder {
    fn new(name: &str) -> Builder {
        Builder {
            g: Graph::new(name),
            rng: Rng(7),
            weights: vec![],
            values: vec![],
        }
    }
    fn param(&mut self, name: &str, dtype: DType, dims: &[usize]) -> Value {
        let ty = TensorType::new(dtype, Shape::fixed(dims));
        self.g.add_parameter(name, ty).unwrap().into()
    }
    /// A weight of `dims`, uniform in ±1/√fan_in (the fan-in: all dims but the first).
    fn weight(&mut self, dims: &[usize]) -> Value {
        let name = format!("w{}", self.weights.len());
        let v = self.param(&name, DType::F32, dims);
        let fan_in: usize = dims[1..].iter().product::<usize>().max(1);
        let t = self.rng.f32_tensor(dims, 1.0 / (fan_in as f32).sqrt());
        self.weights.push(v);
        self.values.push(t);
        v
    }
    fn op(&mut self, op: &str, inputs: &[Value], attrs: Attrs) -> Value {
        self.g.op(op, inputs, attrs, "").unwrap().into()
    }
    fn dense(&mut self, h: Value, n_in: usize, n_out: usize, relu: bool) -> Value {
        let w = self.weight(&[n_out, n_in]);
        let b = self.weight(&[n_out]);
        let y = self.op(
            "Gemm",
            &[h, w, b],
            Attrs::new().with("transB", Attr::Int(1)),
        );
        if relu {
            self.op("Relu", &[y], Attrs::new())
        } else {
            y
        }
    }
    /// Loss and gradients as outputs; inputs: `data` then the weights' values.
    fn finish(mut self, logits: Value, labels: Value, data: Vec<Tensor>) -> TrainGraph {
        let attrs = Attrs::new().with("reduction", Attr::String("mean".into()));
        let loss = self.op("SoftmaxCrossEntropyLoss", &[logits, labels], attrs);
        let grads = grad(&mut self.g, loss, &self.weights).unwrap();
        self.g.add_output("loss", loss).unwrap();
        for (k, gw) in grads.into_iter().enumerate() {
            self.g.add_output(&format!("grad_w{k}"), gw).unwrap();
        }
        let mut inputs = data;
        inputs.extend(self.values);
        TrainGraph { g: self.g, inputs }
    }
}

fn labels(rng: &mut Rng, batch: usize, classes: usize) -> Tensor {
    let v: Vec<i64> = (0..batch)
        .map(|_| (rng.next_u64() % classes as u64) as i64)
        .collect();
    Tensor::from_vec(&[batch], v).unwrap()
}

/// MLP 784-512-512-10 (Gemm transB=1 + Relu), as `bench/models.py` `mlp()`.
pub fn mlp(batch: usize) -> TrainGraph {
    let mut b = Builder::new("mlp_train");
    let x = b.param("x", DType::F32, &[batch, 784]);
    let y = b.param("labels", DType::I64, &[batch]);
    let h = b.dense(x, 784, 512, true);
    let h = b.dense(h, 512, 512, true);
    let logits = b.dense(h, 512, 10, false);
    let mut rng = Rng(11);
    let data = vec![
        rng.f32_tensor(&[batch, 784], 1.0),
        labels(&mut rng, batch, 10),
    ];
    b.finish(logits, y, data)
}

/// The small CNN of `bench/models.py` `cnn()` on 28×28 images: Conv 1→32 3×3 pad 1,
/// Relu, MaxPool 2×2/2, Conv 32→64 3×3 pad 1, Relu, MaxPool 2×2/2, Flatten, Gemm
/// 3136→128, Relu, Gemm 128→10.
pub fn cnn(batch: usize) -> TrainGraph {
    let mut b = Builder::new("cnn_train");
    let x = b.param("x", DType::F32, &[batch, 1, 28, 28]);
    let y = b.param("labels", DType::I64, &[batch]);
    let conv = |b: &mut Builder, h: Value, ic: usize, oc: usize| {
        let w = b.weight(&[oc, ic, 3, 3]);
        let bias = b.weight(&[oc]);
        let pads = Attrs::new().with("pads", Attr::Ints(vec![1; 4]));
        let h = b.op("Conv", &[h, w, bias], pads);
        let h = b.op("Relu", &[h], Attrs::new());
        let pool = Attrs::new()
            .with("kernel_shape", Attr::Ints(vec![2, 2]))
            .with("strides", Attr::Ints(vec![2, 2]));
        b.op("MaxPool", &[h], pool)
    };
    let h = conv(&mut b, x, 1, 32);
    let h = conv(&mut b, h, 32, 64);
    let h = b.op("Flatten", &[h], Attrs::new().with("axis", Attr::Int(1)));
    let h = b.dense(h, 3136, 128, true);
    let logits = b.dense(h, 128, 10, false);
    let mut rng = Rng(12);
    let data = vec![
        rng.f32_tensor(&[batch, 1, 28, 28], 1.0),
        labels(&mut rng, batch, 10),
    ];
    b.finish(logits, y, data)
}
