//! Training-mode ops and layers (`kiln::train`): Dropout's and MseLoss's gradient rules
//! and training batch normalization's gradients against central finite differences in
//! f64; running statistics and fresh dropout masks across runs of one executable.
use crate::common;

use kiln::autodiff::grad;
use kiln::backend::interp::InterpExecutable;
use kiln::backend::Executable;
use kiln::ir::{Attr, Attrs, DType, Dim, Graph, Shape, TensorType, Value};
use kiln::train::{batch_norm_training, dropout_training};
use kiln::Tensor;

use common::{check_gradients, constant, f64_type, op, Rng};

/// A graph from parameters (with their values) to `out`.
struct Case {
    g: Graph,
    params: Vec<Value>,
    values: Vec<Tensor>,
}

impl Case {
    fn new(name: &str) -> Case {
        Case {
            g: Graph::new(name),
            params: vec![],
            values: vec![],
        }
    }

    fn param(&mut self, rng: &mut Rng, dims: &[usize]) -> Value {
        let name = format!("p{}", self.params.len());
        let v: Value = self.g.add_parameter(&name, f64_type(dims)).unwrap().into();
        self.params.push(v);
        self.values.push(rng.f64_tensor(dims));
        v
    }

    /// Loss = Σ out·R (R random, fixed); its gradients by the rules against central
    /// differences, element by element: relative error ≤ 1e-6 (absolute below 1e-2).
    fn check(mut self, out: Value, rng: &mut Rng) {
        let dims = self.g.value_type(out).unwrap().shape.to_fixed().unwrap();
        let r = constant(&mut self.g, rng.f64_tensor(&dims));
        let weighted = op(&mut self.g, "Mul", &[out, r], Attrs::new());
        let keep0 = Attrs::new().with("keepdims", Attr::Int(0));
        let loss = op(&mut self.g, "ReduceSum", &[weighted], keep0);
        check_gradients(&self.g, loss, &self.params, &self.values, 0);
    }
}

#[test]
fn dropout_gradients_against_differences() {
    let mut rng = Rng(1);
    // Training mode with a fixed counter: a fixed linear map, differentiable everywhere.
    for (ratio, training) in [(0.3, true), (0.0, true), (0.6, false)] {
        let mut c = Case::new(&format!("dropout {ratio} {training}"));
        let x = c.param(&mut rng, &[3, 7]);
        let r = constant(&mut c.g, Tensor::scalar(ratio));
        let t = constant(&mut c.g, Tensor::scalar(training));
        let k = constant(&mut c.g, Tensor::scalar(5i64));
        let seed = Attrs::new().with("seed", Attr::Int(3));
        let y = op(&mut c.g, "Dropout", &[x, r, t, k], seed);
        // A square after it: the gradient's gradient path is exercised too.
        let y2 = op(&mut c.g, "Mul", &[y, x], Attrs::new());
        c.check(y2, &mut rng);
    }
    // Only data, the default ratio and inference mode.
    let mut c = Case::new("dropout defaults");
    let x = c.param(&mut rng, &[4]);
    let y = op(&mut c.g, "Dropout", &[x], Attrs::new());
    c.check(y, &mut rng);
}

#[test]
fn mse_loss_gradients_against_differences() {
    let mut rng = Rng(2);
    for reduction in ["mean", "sum", "none"] {
        let mut c = Case::new(&format!("mse {reduction}"));
        let p = c.param(&mut rng, &[2, 5]);
        let t = c.param(&mut rng, &[2, 5]);
        let a = Attrs::new().with("reduction", Attr::String(reduction.into()));
        let l = op(&mut c.g, "MseLoss", &[p, t], a);
        c.check(l, &mut rng);
    }
}

/// Variables for BatchNorm's running statistics, [C] each.
fn running(g: &mut Graph, mean: &[f64], var: &[f64]) -> (Value, Value) {
    let c = mean.len();
    let m = g
        .add_variable(
            "running_mean",
            f64_type(&[c]),
            Tensor::from_vec(&[c], mean.to_vec()).unwrap(),
        )
        .unwrap();
    let v = g
        .add_variable(
            "running_var",
            f64_type(&[c]),
            Tensor::from_vec(&[c], var.to_vec()).unwrap(),
        )
        .unwrap();
    (m.into(), v.into())
}

#[test]
fn batch_norm_training_gradients_against_differences() {
    let mut rng = Rng(3);
    for dims in [&[4, 3][..], &[2, 3, 2, 3]] {
        let mut c = Case::new(&format!("batch norm {dims:?}"));
        let x = c.param(&mut rng, dims);
        let scale = c.param(&mut rng, &[3]);
        let bias = c.param(&mut rng, &[3]);
        let (rm, rv) = running(&mut c.g, &[0.0; 3], &[1.0; 3]);
        let y = batch_norm_training(&mut c.g, x, scale, bias, rm, rv, 0.9, 1e-5).unwrap();
        c.check(y, &mut rng);
    }
}

/// Batch statistics of x [N, C, L] over N and L: (mean, biased variance) per channel.
fn channel_stats(x: &[f64], (n, c, l): (usize, usize, usize)) -> (Vec<f64>, Vec<f64>) {
    let at = |i: usize, ch: usize, j: usize| x[(i * c + ch) * l + j];
    let count = (n * l) as f64;
    let mut mean = vec![0.0; c];
    let mut var = vec![0.0; c];
    for ch in 0..c {
        let vals: Vec<f64> = (0..n)
            .flat_map(|i| (0..l).map(move |j| (i, j)))
            .map(|(i, j)| at(i, ch, j))
            .collect();
        mean[ch] = vals.iter().sum::<f64>() / count;
        var[ch] = vals.iter().map(|v| (v - mean[ch]).powi(2)).sum::<f64>() / count;
    }
    (mean, var)
}

#[test]
fn batch_norm_training_normalizes_and_updates_running_statistics() {
    let (c, l) = (2, 4);
    let (momentum, eps) = (0.8, 1e-3);
    let mut g = Graph::new("bn");
    // A symbolic batch: the statistics' count is known at run time only.
    let batch = Shape::new([Dim::Sym("N".into()), Dim::Fixed(c), Dim::Fixed(l)]);
    let x: Value = g
        .add_parameter("x", TensorType::new(DType::F64, batch))
        .unwrap()
        .into();
    let scale = constant(&mut g, Tensor::from_vec(&[2], vec![2.0, 0.5]).unwrap());
    let bias = constant(&mut g, Tensor::from_vec(&[2], vec![-1.0, 3.0]).unwrap());
    let (m0, v0) = ([0.5, -0.25], [2.0, 0.75]);
    let (rm, rv) = running(&mut g, &m0, &v0);
    let y = batch_norm_training(&mut g, x, scale, bias, rm, rv, momentum, eps).unwrap();
    g.add_output("y", y).unwrap();
    let exe = InterpExecutable::new(g).unwrap();
    let mut rng = Rng(4);
    let (mut want_m, mut want_v) = (m0.to_vec(), v0.to_vec());
    // Two runs with different batch sizes.
    for n in [3, 5] {
        let xt = rng.f64_tensor(&[n, c, l]);
        let xs = xt.to_f64_vec();
        let out = exe.run(&[xt]).unwrap();
        let (mean, var) = channel_stats(&xs, (n, c, l));
        let got = out[0].to_f64_vec();
        for (k, (&xv, &yv)) in xs.iter().zip(&got).enumerate() {
            let ch = (k / l) % c;
            let want = (xv - mean[ch]) / (var[ch] + eps).sqrt() * [2.0, 0.5][ch] + [-1.0, 3.0][ch];
            assert!((yv - want).abs() < 1e-12, "y[{k}] = {yv}, want {want}");
        }
        for ch in 0..c {
            want_m[ch] = momentum * want_m[ch] + (1.0 - momentum) * mean[ch];
            want_v[ch] = momentum * want_v[ch] + (1.0 - momentum) * var[ch];
        }
        for (name, want) in [("running_mean", &want_m), ("running_var", &want_v)] {
            let have = exe.read_variable(name).unwrap().to_f64_vec();
            for (h, w) in have.iter().zip(want.iter()) {
                assert!((h - w).abs() < 1e-12, "{name}: {have:?}, want {want:?}");
            }
        }
    }
}

#[test]
fn batch_norm_training_rejects_bad_operands_naming_them() {
    let mut g = Graph::new("bn");
    let x: Value = g.add_parameter("x", f64_type(&[4, 3])).unwrap().into();
    let s: Value = g.add_parameter("s", f64_type(&[3])).unwrap().into();
    let s2: Value = g.add_parameter("s2", f64_type(&[2])).unwrap().into();
    let i: Value = g
        .add_parameter("i", TensorType::new(DType::I64, Shape::fixed(&[4, 3])))
        .unwrap()
        .into();
    let (rm, rv) = running(&mut g, &[0.0; 3], &[1.0; 3]);
    let err = |g: &mut Graph, x, scale, mean, momentum| {
        batch_norm_training(g, x, scale, s, mean, rv, momentum, 1e-5)
            .unwrap_err()
            .to_string()
    };
    let e = err(&mut g, x, s, s, 0.9);
    assert!(
        e.contains("batch norm of 'x'")
            && e.contains("running_mean must be a Variable")
            && e.contains("'s' is a Parameter"),
        "{e}"
    );
    let e = err(&mut g, x, s2, rm, 0.9);
    assert!(e.contains("scale 's2' must have type f64[3]"), "{e}");
    let e = err(&mut g, i, s, rm, 0.9);
    assert!(e.contains("x must be a float value [N, C, d...]"), "{e}");
    let e = err(&mut g, x, s, rm, 1.5);
    assert!(e.contains("momentum 1.5 is out of range"), "{e}");
}

#[test]
fn training_dropout_draws_a_fresh_mask_every_run() {
    let (ratio, seed) = (0.5, 17);
    let mut g = Graph::new("dropout");
    let x: Value = g.add_parameter("x", f64_type(&[64])).unwrap().into();
    let d = dropout_training(&mut g, x, ratio, seed).unwrap();
    // The gradient of Σ y with respect to x is mask / (1 − ratio), the same run's mask.
    let keep0 = Attrs::new().with("keepdims", Attr::Int(0));
    let loss = op(&mut g, "ReduceSum", &[d.output], keep0);
    let gx = grad(&mut g, loss, &[x]).unwrap()[0];
    g.add_output("y", d.output).unwrap();
    g.add_output("mask", d.mask).unwrap();
    g.add_output("gx", gx).unwrap();
    let exe = InterpExecutable::new(g).unwrap();
    let xs = Rng(5).f64_tensor(&[64]);
    let mut masks = vec![];
    for run in 0..3i64 {
        let out = exe.run(std::slice::from_ref(&xs)).unwrap();
        let mask = out[1].to_f64_vec();
        // The same mask as the Dropout op with this run's counter.
        let mut one = Graph::new("one");
        let xp: Value = one.add_parameter("x", f64_type(&[64])).unwrap().into();
        let r = constant(&mut one, Tensor::scalar(ratio));
        let t = constant(&mut one, Tensor::scalar(true));
        let k = constant(&mut one, Tensor::scalar(run));
        let y = op(
            &mut one,
            "Dropout",
            &[xp, r, t, k],
            Attrs::new().with("seed", Attr::Int(seed)),
        );
        one.add_output("y", y).unwrap();
        let want = InterpExecutable::new(one)
            .unwrap()
            .run(std::slice::from_ref(&xs))
            .unwrap();
        assert_eq!(out[0], want[0], "run {run}");
        let want_gx: Vec<f64> = mask.iter().map(|m| m * 2.0).collect();
        assert_eq!(out[2].to_f64_vec(), want_gx, "run {run}");
        masks.push(mask);
    }
    assert_ne!(masks[0], masks[1]);
    assert_ne!(masks[1], masks[2]);
    assert_eq!(
        exe.read_variable(&exe_counter_name(&exe)).unwrap(),
        Tensor::scalar(3i64)
    );
}

/// The name of the one i64 variable: the dropout counter.
fn exe_counter_name(exe: &InterpExecutable) -> String {
    let vars = exe.variables();
    let (name, _) = vars
        .iter()
        .find(|(_, t)| t.dtype == DType::I64)
        .expect("a counter variable");
    name.clone()
}

#[test]
fn training_dropout_rejects_bad_arguments() {
    let mut g = Graph::new("dropout");
    let x: Value = g.add_parameter("x", f64_type(&[4])).unwrap().into();
    let i: Value = g
        .add_parameter("i", TensorType::new(DType::I32, Shape::fixed(&[4])))
        .unwrap()
        .into();
    for ratio in [1.0, -0.1, f64::NAN] {
        let e = dropout_training(&mut g, x, ratio, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("dropout of 'x': ratio must be in [0, 1)"), "{e}");
    }
    let e = dropout_training(&mut g, i, 0.5, 0).unwrap_err().to_string();
    assert!(e.contains("dropout of 'i': x must be a float value"), "{e}");
}
