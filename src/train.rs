//! Training-mode layers built from catalogue ops: dropout with a fresh mask every run
//! ([`dropout_training`]) and batch normalization with batch statistics and running
//! averages ([`batch_norm_training`]). Their state lives in `Variable`s that `Assign`s
//! update; every read in a run sees the values the run started with, so the updates
//! use the pre-step state. Gradients come from the rules of the ops they are made of.
use crate::error::{Error, Result};
use crate::ir::{Attr, Attrs, DType, Graph, Shape, TensorType, Value};
use crate::tensor::Tensor;

/// What [`dropout_training`] adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropoutTraining {
    /// `x · mask / (1 − ratio)`.
    pub output: Value,
    /// The bool mask (true: kept).
    pub mask: Value,
    /// The i64 scalar variable that counts runs; the mask of run k depends on
    /// (seed, k, element) only.
    pub counter: Value,
}

/// Training-mode dropout of `x` (a float value): a `Dropout` node in training mode whose
/// `counter` input is a new i64 variable (starting at 0) that an `Assign` increments on
/// every run, so each run draws a fresh mask, reproducibly from `seed`.
pub fn dropout_training(g: &mut Graph, x: Value, ratio: f64, seed: i64) -> Result<DropoutTraining> {
    let xt = g.value_type(x)?.clone();
    let x_name = g.node(x.node).name.clone();
    if !xt.dtype.is_float() {
        return Err(Error::InvalidArgument(format!(
            "dropout of '{x_name}': x must be a float value, has type {xt}"
        )));
    }
    if !(0.0..1.0).contains(&ratio) {
        return Err(Error::InvalidArgument(format!(
            "dropout of '{x_name}': ratio must be in [0, 1), got {ratio}"
        )));
    }
    let ratio_name = g.fresh_name("dropout_ratio");
    let ratio_t = Tensor::from_f64s(xt.dtype, &[], &[ratio]).map_err(Error::Graph)?;
    let ratio = g.add_constant_value(&ratio_name, ratio_t)?.into();
    let mode_name = g.fresh_name("dropout_training_mode");
    let mode = g
        .add_constant_value(&mode_name, Tensor::scalar(true))?
        .into();
    let counter_name = g.fresh_name("dropout_counter");
    let counter: Value = g
        .add_variable(
            &counter_name,
            TensorType::new(DType::I64, Shape::scalar()),
            Tensor::scalar(0i64),
        )?
        .into();
    let seed_attr = Attrs::new().with("seed", Attr::Int(seed));
    let node = g.op("Dropout", &[x, ratio, mode, counter], seed_attr, "")?;
    let one_name = g.fresh_name("dropout_one");
    let one = g
        .add_constant_value(&one_name, Tensor::scalar(1i64))?
        .into();
    let next = g.op("Add", &[counter, one], Attrs::new(), "")?;
    g.op("Assign", &[counter, next.into()], Attrs::new(), "")?;
    Ok(DropoutTraining {
        output: node.out(0),
        mask: node.out(1),
        counter,
    })
}

/// Training-mode batch normalization of `x` [N, C, d...] (ONNX's
/// `BatchNormalization` with training_mode = 1): normalized with the batch's mean and
/// biased variance over N and the spatial axes, then `· scale + bias` ([C] each). Appends
/// the `Assign`s of the running statistics (variables of type [C]):
/// `running = momentum · running + (1 − momentum) · batch`, with the biased batch
/// variance as ONNX's reference does. Returns y.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm_training(
    g: &mut Graph,
    x: Value,
    scale: Value,
    bias: Value,
    running_mean: Value,
    running_var: Value,
    momentum: f64,
    epsilon: f64,
) -> Result<Value> {
    let xt = g.value_type(x)?.clone();
    let x_name = g.node(x.node).name.clone();
    let what = |m: String| Error::InvalidArgument(format!("batch norm of '{x_name}': {m}"));
    if !xt.dtype.is_float() || xt.rank() < 2 {
        return Err(what(format!(
            "x must be a float value [N, C, d...], has type {xt}"
        )));
    }
    let channels = xt.shape.dim(1).clone();
    let vector = TensorType::new(xt.dtype, Shape::new([channels]));
    for (v, arg, variable) in [
        (scale, "scale", false),
        (bias, "bias", false),
        (running_mean, "running_mean", true),
        (running_var, "running_var", true),
    ] {
        let t = g.value_type(v)?;
        let node = g.node(v.node);
        if t.dtype != vector.dtype || t.shape.dims() != vector.shape.dims() {
            return Err(what(format!(
                "{arg} '{}' must have type {vector}, has {t}",
                node.name
            )));
        }
        if variable && (node.op != "Variable" || v.output != 0) {
            return Err(what(format!(
                "{arg} must be a Variable (it is updated in place), '{}' is a {}",
                node.name, node.op
            )));
        }
    }
    for (name, v, ok) in [
        ("momentum", momentum, (0.0..=1.0).contains(&momentum)),
        ("epsilon", epsilon, epsilon.is_finite() && epsilon >= 0.0),
    ] {
        if !ok {
            return Err(what(format!("{name} {v} is out of range")));
        }
    }
    let none = Attrs::new();
    let dt = xt.dtype;
    let axes: Vec<i64> = std::iter::once(0).chain(2..xt.rank() as i64).collect();
    let axes = g.ints("bn_axes", &axes)?;
    // Statistics as [1, C, 1...]: they broadcast against x.
    let mean = g.apply("ReduceMean", &[x, axes], none.clone())?;
    let centered = g.apply("Sub", &[x, mean], none.clone())?;
    let squares = g.apply("Mul", &[centered, centered], none.clone())?;
    let var = g.apply("ReduceMean", &[squares, axes], none.clone())?;
    let eps = g.scalar("bn_const", dt, epsilon)?;
    let var_eps = g.apply("Add", &[var, eps], none.clone())?;
    let std = g.apply("Sqrt", &[var_eps], none.clone())?;
    let normalized = g.apply("Div", &[centered, std], none.clone())?;
    let mut stat_shape = vec![1i64; xt.rank()];
    stat_shape[1] = -1;
    let stat_shape = g.ints("bn_axes", &stat_shape)?;
    let scale_b = g.apply("Reshape", &[scale, stat_shape], none.clone())?;
    let bias_b = g.apply("Reshape", &[bias, stat_shape], none.clone())?;
    let scaled = g.apply("Mul", &[normalized, scale_b], none.clone())?;
    let y = g.apply("Add", &[scaled, bias_b], none.clone())?;
    // running ← momentum · running + (1 − momentum) · batch
    // The variables have static dims (they hold data): reshape the batch's to them.
    let channels_static = vector.static_dims().map(|d| d[0] as i64);
    let flat = g.ints("bn_axes", &[channels_static.unwrap_or(-1)])?;
    let (m, c) = (
        g.scalar("bn_const", dt, momentum)?,
        g.scalar("bn_const", dt, 1.0 - momentum)?,
    );
    for (running, batch) in [(running_mean, mean), (running_var, var)] {
        let batch = g.apply("Reshape", &[batch, flat], none.clone())?;
        let kept = g.apply("Mul", &[running, m], none.clone())?;
        let new = g.apply("Mul", &[batch, c], none.clone())?;
        let updated = g.apply("Add", &[kept, new], none.clone())?;
        g.op("Assign", &[running, updated], none.clone(), "")?;
    }
    Ok(y)
}
