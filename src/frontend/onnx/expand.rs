//! ONNX ops that the importer builds from catalogue ops rather than mapping to one:
//! functions of the ONNX library (`MeanVarianceNormalization`), forms the catalogue op
//! leaves out (`BatchNormalization` in training mode), the integer convolutions and
//! matmuls, and the small ops of the `ai.onnx.ml` and `ai.onnx.preview.training`
//! domains. Each follows the ONNX reference implementation's arithmetic.
use super::Importer;
use crate::error::{Error, Result};
use crate::ir::{Attr, Attrs, DType, Value};
use crate::tensor::Tensor;

/// Adds the nodes of one expansion, named `<node>.<k>` so that dumps and errors still
/// point at the ONNX node.
pub(super) struct Builder<'i, 'a> {
    imp: &'i mut Importer<'a>,
    name: String,
    k: usize,
}

impl<'i, 'a> Builder<'i, 'a> {
    pub(super) fn new(imp: &'i mut Importer<'a>, name: &str) -> Self {
        Builder {
            imp,
            name: name.to_string(),
            k: 0,
        }
    }

    fn next_name(&mut self) -> String {
        self.k += 1;
        format!("{}.{}", self.name, self.k)
    }

    /// Adds `op`; returns its first output.
    fn op(&mut self, op: &str, inputs: &[Value], attrs: Attrs) -> Result<Value> {
        let inputs: Vec<Option<Value>> = inputs.iter().map(|&v| Some(v)).collect();
        let name = self.next_name();
        Ok(self.imp.add(op, &inputs, attrs, &name)?[0])
    }

    fn binary(&mut self, op: &str, a: Value, b: Value) -> Result<Value> {
        self.op(op, &[a, b], Attrs::new())
    }

    fn unary(&mut self, op: &str, x: Value) -> Result<Value> {
        self.op(op, &[x], Attrs::new())
    }

    fn dtype(&self, v: Value) -> Result<DType> {
        Ok(self.imp.value_type(v)?.dtype)
    }

    /// A scalar constant of dtype `dtype`.
    fn scalar(&mut self, dtype: DType, v: f64) -> Result<Value> {
        let t = Tensor::from_f64s(dtype, &[], &[v]).map_err(Error::InvalidArgument)?;
        let name = self.next_name();
        self.imp.constant(&name, t)
    }

    fn ints(&mut self, v: &[i64]) -> Result<Value> {
        let name = self.next_name();
        self.imp.ints(&name, v)
    }

    fn cast(&mut self, x: Value, to: DType) -> Result<Value> {
        if self.dtype(x)? == to {
            return Ok(x);
        }
        self.op(
            "Cast",
            &[x],
            Attrs::new().with("to", Attr::String(to.name().into())),
        )
    }

    fn reduce_mean(&mut self, x: Value, axes: &[i64], keepdims: bool) -> Result<Value> {
        let axes = self.ints(axes)?;
        self.op(
            "ReduceMean",
            &[x, axes],
            Attrs::new().with("keepdims", Attr::Int(keepdims as i64)),
        )
    }

    /// `x` reshaped to rank `rank` with its elements along `axis` (a vector's, or a
    /// scalar's broadcast): per-channel parameters lined up with a tensor's channel axis.
    fn along_axis(&mut self, x: Value, axis: usize, rank: usize) -> Result<Value> {
        if self.imp.value_type(x)?.shape.rank() == 0 {
            return Ok(x);
        }
        let mut shape = vec![1i64; rank];
        shape[axis] = -1;
        let shape = self.ints(&shape)?;
        self.op("Reshape", &[x, shape], Attrs::new())
    }
}

fn need(inputs: &[Option<Value>], i: usize, what: &str) -> Result<Value> {
    inputs
        .get(i)
        .copied()
        .flatten()
        .ok_or_else(|| Error::Graph(format!("input {i} ({what}) is required")))
}

fn float_attr(attrs: &Attrs, name: &str, default: f64) -> Result<f64> {
    attrs.float_or(name, default).map_err(Error::Graph)
}

/// `MeanVarianceNormalization`: `(X - mean) / (std + 1e-9)` over `axes` (default
/// [0, 2, 3]), the ONNX function's definition.
pub(super) fn mean_variance_normalization(
    b: &mut Builder,
    inputs: &[Option<Value>],
    attrs: &Attrs,
) -> Result<Vec<Value>> {
    let x = need(inputs, 0, "X")?;
    let axes = match attrs.get("axes") {
        Some(Attr::Ints(a)) => a.clone(),
        Some(_) => return Err(Error::Graph("attribute 'axes' must be ints".into())),
        None => vec![0, 2, 3],
    };
    let dtype = b.dtype(x)?;
    let mean = b.reduce_mean(x, &axes, true)?;
    let centred = b.binary("Sub", x, mean)?;
    let squares = b.binary("Mul", centred, centred)?;
    let variance = b.reduce_mean(squares, &axes, true)?;
    let std = b.unary("Sqrt", variance)?;
    let eps = b.scalar(dtype, 1e-9)?;
    let denominator = b.binary("Add", std, eps)?;
    Ok(vec![b.binary("Div", centred, denominator)?])
}

/// `BatchNormalization` with `training_mode = 1`: normalizes by the batch's own mean
/// and (population) variance, and returns the updated running statistics
/// `running * momentum + batch * (1 - momentum)`.
pub(super) fn batch_normalization_training(
    b: &mut Builder,
    inputs: &[Option<Value>],
    attrs: &Attrs,
    n_outputs: usize,
) -> Result<Vec<Value>> {
    let x = need(inputs, 0, "X")?;
    let (scale, bias) = (need(inputs, 1, "scale")?, need(inputs, 2, "B")?);
    let (mean_in, var_in) = (
        need(inputs, 3, "input_mean")?,
        need(inputs, 4, "input_var")?,
    );
    let rank = b.imp.value_type(x)?.shape.rank();
    if rank < 2 {
        return Err(Error::Graph(format!(
            "X must have rank 2 or more, got {rank}"
        )));
    }
    let axes: Vec<i64> = (0..rank as i64).filter(|&a| a != 1).collect();
    let batch_mean = b.reduce_mean(x, &axes, false)?;
    let mean_kept = b.along_axis(batch_mean, 1, rank)?;
    let centred = b.binary("Sub", x, mean_kept)?;
    let squares = b.binary("Mul", centred, centred)?;
    let batch_var = b.reduce_mean(squares, &axes, false)?;
    let epsilon = float_attr(attrs, "epsilon", 1e-5)?;
    let y = b.op(
        "BatchNormalization",
        &[x, scale, bias, batch_mean, batch_var],
        Attrs::new().with("epsilon", Attr::Float(epsilon)),
    )?;
    let mut outs = vec![y];
    if n_outputs > 1 {
        let momentum = float_attr(attrs, "momentum", 0.9)?;
        for (running, batch) in [(mean_in, batch_mean), (var_in, batch_var)] {
            let dtype = b.dtype(running)?;
            let m = b.scalar(dtype, momentum)?;
            let one_minus_m = b.scalar(dtype, 1.0 - momentum)?;
            let kept = b.binary("Mul", running, m)?;
            let batch = b.cast(batch, dtype)?;
            let new = b.binary("Mul", batch, one_minus_m)?;
            outs.push(b.binary("Add", kept, new)?);
        }
    }
    Ok(outs)
}

/// `ConvInteger` and `MatMulInteger`: `(x - x_zero_point) op (w - w_zero_point)` in
/// int32. The operands are widened to f64, where every product and every sum of up to
/// 2^37 of them is exact, so the result equals integer arithmetic.
pub(super) fn integer_op(
    b: &mut Builder,
    op: &str,
    inputs: &[Option<Value>],
    attrs: Attrs,
) -> Result<Vec<Value>> {
    let acc = integer_accumulate(b, op, inputs, attrs)?;
    Ok(vec![b.cast(acc, DType::I32)?])
}

/// The f64 accumulation of [`integer_op`]; a zero point applies per row of a matmul's
/// A, per column of its B, per output channel of a convolution's W.
fn integer_accumulate(
    b: &mut Builder,
    op: &str,
    inputs: &[Option<Value>],
    attrs: Attrs,
) -> Result<Value> {
    let conv = op == "Conv";
    let (x, w) = (need(inputs, 0, "A")?, need(inputs, 1, "B")?);
    let rank = b.imp.value_type(x)?.shape.rank();
    let mut widened = vec![];
    for (i, v) in [x, w].into_iter().enumerate() {
        let zero = inputs.get(2 + i).copied().flatten();
        for (at, v) in [(i, Some(v)), (2 + i, zero)] {
            if let Some(v) = v {
                let d = b.dtype(v)?;
                if !matches!(d, DType::I8 | DType::U8) {
                    return Err(Error::Graph(format!(
                        "input {at} must be int8 or uint8, got {}",
                        d.name()
                    )));
                }
            }
        }
        let mut v = b.cast(v, DType::F64)?;
        if let Some(z) = zero {
            let z = b.cast(z, DType::F64)?;
            let z = match (conv, i) {
                (true, 1) => b.along_axis(z, 0, rank)?,
                (false, 0) => b.along_axis(z, rank.saturating_sub(2), rank)?,
                _ => z,
            };
            v = b.binary("Sub", v, z)?;
        }
        widened.push(v);
    }
    b.op(op, &widened, attrs)
}

/// `QLinearConv`: the integer convolution plus the int32 bias, times
/// `x_scale * w_scale / y_scale` (computed in the scales' f32 as the reference does),
/// plus `y_zero_point`, saturated and rounded half to even into y's type.
pub(super) fn qlinear_conv(
    b: &mut Builder,
    inputs: &[Option<Value>],
    attrs: Attrs,
) -> Result<Vec<Value>> {
    let x = need(inputs, 0, "x")?;
    let (x_scale, x_zero) = (
        need(inputs, 1, "x_scale")?,
        need(inputs, 2, "x_zero_point")?,
    );
    let w = need(inputs, 3, "w")?;
    let (w_scale, w_zero) = (
        need(inputs, 4, "w_scale")?,
        need(inputs, 5, "w_zero_point")?,
    );
    let (y_scale, y_zero) = (
        need(inputs, 6, "y_scale")?,
        need(inputs, 7, "y_zero_point")?,
    );
    let rank = b.imp.value_type(x)?.shape.rank();
    let conv_inputs = [Some(x), Some(w), Some(x_zero), Some(w_zero)];
    let mut acc = integer_accumulate(b, "Conv", &conv_inputs, attrs)?;
    if let Some(bias) = inputs.get(8).copied().flatten() {
        let bias = b.cast(bias, DType::F64)?;
        let bias = b.along_axis(bias, 1, rank)?;
        acc = b.binary("Add", acc, bias)?;
    }
    let w_scale = b.along_axis(w_scale, 1, rank)?;
    let factor = b.binary("Mul", x_scale, w_scale)?;
    let factor = b.binary("Div", factor, y_scale)?;
    let factor = b.cast(factor, DType::F64)?;
    let real = b.binary("Mul", acc, factor)?;
    let out_dtype = b.dtype(y_zero)?;
    let zero = b.cast(y_zero, DType::F64)?;
    let real = b.binary("Add", real, zero)?;
    let (lo, hi) = match out_dtype {
        DType::I8 => (-128.0, 127.0),
        DType::U8 => (0.0, 255.0),
        d => {
            return Err(Error::Graph(format!(
                "y_zero_point must be int8 or uint8, got {}",
                d.name()
            )))
        }
    };
    let (lo, hi) = (b.scalar(DType::F64, lo)?, b.scalar(DType::F64, hi)?);
    let clipped = b.op("Clip", &[real, lo, hi], Attrs::new())?;
    let rounded = b.unary("Round", clipped)?;
    Ok(vec![b.cast(rounded, out_dtype)?])
}

/// The `ai.onnx.ml` ops Kiln expands: `Binarizer` and `ArrayFeatureExtractor`.
pub(super) fn ml(
    b: &mut Builder,
    op: &str,
    inputs: &[Option<Value>],
    attrs: &Attrs,
) -> Result<Vec<Value>> {
    let x = need(inputs, 0, "X")?;
    match op {
        "Binarizer" => {
            let dtype = b.dtype(x)?;
            let threshold = b.scalar(dtype, float_attr(attrs, "threshold", 0.0)?)?;
            let above = b.binary("Greater", x, threshold)?;
            Ok(vec![b.cast(above, dtype)?])
        }
        "ArrayFeatureExtractor" => {
            // The indices pick along the last axis; a vector's result is one row.
            let indices = need(inputs, 1, "Y")?;
            let flat = b.ints(&[-1])?;
            let indices = b.op("Reshape", &[indices, flat], Attrs::new())?;
            let y = b.op(
                "Gather",
                &[x, indices],
                Attrs::new().with("axis", Attr::Int(-1)),
            )?;
            if b.imp.value_type(x)?.shape.rank() == 1 {
                let row = b.ints(&[1, -1])?;
                return Ok(vec![b.op("Reshape", &[y, row], Attrs::new())?]);
            }
            Ok(vec![y])
        }
        _ => Err(Error::UnknownOp(format!("op '{op}' is not supported"))),
    }
}

/// The `ai.onnx.preview.training` optimizers `Adagrad`, `Momentum` and `Adam`: inputs
/// `R` (learning rate), `T` (step count), then n tensors to update and n of each of
/// their state tensors; outputs the n updated tensors, then the updated states.
pub(super) fn training(
    b: &mut Builder,
    op: &str,
    inputs: &[Option<Value>],
    attrs: &Attrs,
) -> Result<Vec<Value>> {
    let states = match op {
        "Adagrad" => 1,
        "Momentum" => 1,
        "Adam" => 2,
        _ => return Err(Error::UnknownOp(format!("op '{op}' is not supported"))),
    };
    let operands = inputs.len().saturating_sub(2);
    let n = operands / (2 + states);
    if n == 0 || operands % (2 + states) != 0 {
        return Err(Error::Graph(format!(
            "{op} takes R, T and {} groups of n tensors, got {} inputs",
            2 + states,
            inputs.len()
        )));
    }
    let (r, t) = (need(inputs, 0, "R")?, need(inputs, 1, "T")?);
    let f = |name, default| float_attr(attrs, name, default);
    let norm = f("norm_coefficient", 0.0)?;
    let t_dtype = b.dtype(t)?;
    let zero_t = b.scalar(t_dtype, 0.0)?;
    let started = b.binary("Greater", t, zero_t)?;
    let mut updated = vec![];
    let mut new_states = vec![vec![]; states];
    for i in 0..n {
        let x = need(inputs, 2 + i, "X")?;
        let g = need(inputs, 2 + n + i, "G")?;
        let dtype = b.dtype(x)?;
        let r = b.cast(r, dtype)?;
        let t = b.cast(t, dtype)?;
        let c = |b: &mut Builder, v: f64| b.scalar(dtype, v);
        // g + norm_coefficient * x: the gradient of the L2 regularization term.
        let norm_c = c(b, norm)?;
        let nx = b.binary("Mul", norm_c, x)?;
        let g = b.binary("Add", nx, g)?;
        let state = |k: usize| need(inputs, 2 + (2 + k) * n + i, "state");
        match op {
            "Adagrad" => {
                let decay = c(b, f("decay_factor", 0.0)?)?;
                let one = c(b, 1.0)?;
                let td = b.binary("Mul", t, decay)?;
                let denom = b.binary("Add", one, td)?;
                let rate = b.binary("Div", r, denom)?;
                let g2 = b.binary("Mul", g, g)?;
                let h = b.binary("Add", state(0)?, g2)?;
                let root = b.unary("Sqrt", h)?;
                let eps = c(b, f("epsilon", 1e-6)?)?;
                let root = b.binary("Add", root, eps)?;
                let step = b.binary("Mul", rate, g)?;
                let step = b.binary("Div", step, root)?;
                updated.push(b.binary("Sub", x, step)?);
                new_states[0].push(h);
            }
            "Momentum" => {
                let alpha = c(b, f("alpha", 0.0)?)?;
                let beta = c(b, f("beta", 0.0)?)?;
                let one = c(b, 1.0)?;
                // The gradient's coefficient is 1 at the first step.
                let beta = b.op("Where", &[started, beta, one], Attrs::new())?;
                let av = b.binary("Mul", alpha, state(0)?)?;
                let bg = b.binary("Mul", beta, g)?;
                let v = b.binary("Add", av, bg)?;
                let direction = match attrs.get("mode") {
                    Some(Attr::String(m)) if m == "nesterov" => {
                        let alpha_v = b.binary("Mul", alpha, v)?;
                        b.binary("Add", g, alpha_v)?
                    }
                    Some(Attr::String(m)) if m == "standard" => v,
                    _ => {
                        return Err(Error::Graph(
                            "attribute 'mode' must be \"standard\" or \"nesterov\"".into(),
                        ))
                    }
                };
                let step = b.binary("Mul", r, direction)?;
                updated.push(b.binary("Sub", x, step)?);
                new_states[0].push(v);
            }
            _ => {
                let (alpha, beta) = (f("alpha", 0.9)?, f("beta", 0.999)?);
                let (a, one_minus_a) = (c(b, alpha)?, c(b, 1.0 - alpha)?);
                let (bt, one_minus_b) = (c(b, beta)?, c(b, 1.0 - beta)?);
                let av = b.binary("Mul", a, state(0)?)?;
                let ag = b.binary("Mul", one_minus_a, g)?;
                let v = b.binary("Add", av, ag)?;
                let g2 = b.binary("Mul", g, g)?;
                let bh = b.binary("Mul", bt, state(1)?)?;
                let bg2 = b.binary("Mul", one_minus_b, g2)?;
                let h = b.binary("Add", bh, bg2)?;
                let root = b.unary("Sqrt", h)?;
                let eps = c(b, f("epsilon", 1e-6)?)?;
                let root = b.binary("Add", root, eps)?;
                // Bias correction r * sqrt(1 - beta^t) / (1 - alpha^t), once t > 0.
                let one = c(b, 1.0)?;
                let beta_t = b.binary("Pow", bt, t)?;
                let alpha_t = b.binary("Pow", a, t)?;
                let num = b.binary("Sub", one, beta_t)?;
                let num = b.unary("Sqrt", num)?;
                let den = b.binary("Sub", one, alpha_t)?;
                let corrected = b.binary("Mul", r, num)?;
                let corrected = b.binary("Div", corrected, den)?;
                let rate = b.op("Where", &[started, corrected, r], Attrs::new())?;
                let ratio = b.binary("Div", v, root)?;
                let step = b.binary("Mul", rate, ratio)?;
                let x_new = b.binary("Sub", x, step)?;
                let post = c(b, 1.0 - f("norm_coefficient_post", 0.0)?)?;
                updated.push(b.binary("Mul", post, x_new)?);
                new_states[0].push(v);
                new_states[1].push(h);
            }
        }
    }
    updated.extend(new_states.into_iter().flatten());
    Ok(updated)
}
