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

    /// Adds `op`; returns all its outputs.
    pub(super) fn op_outputs(
        &mut self,
        op: &str,
        inputs: &[Option<Value>],
        attrs: Attrs,
    ) -> Result<Vec<Value>> {
        let name = self.next_name();
        self.imp.add(op, inputs, attrs, &name)
    }

    /// Adds `op`; returns its first output.
    pub(super) fn op(&mut self, op: &str, inputs: &[Value], attrs: Attrs) -> Result<Value> {
        let inputs: Vec<Option<Value>> = inputs.iter().map(|&v| Some(v)).collect();
        let name = self.next_name();
        Ok(self.imp.add(op, &inputs, attrs, &name)?[0])
    }

    pub(super) fn binary(&mut self, op: &str, a: Value, b: Value) -> Result<Value> {
        self.op(op, &[a, b], Attrs::new())
    }

    pub(super) fn unary(&mut self, op: &str, x: Value) -> Result<Value> {
        self.op(op, &[x], Attrs::new())
    }

    pub(super) fn dtype(&self, v: Value) -> Result<DType> {
        Ok(self.imp.value_type(v)?.dtype)
    }

    /// A scalar constant of dtype `dtype`.
    pub(super) fn scalar(&mut self, dtype: DType, v: f64) -> Result<Value> {
        let t = Tensor::from_f64s(dtype, &[], &[v]).map_err(Error::InvalidArgument)?;
        let name = self.next_name();
        self.imp.constant(&name, t)
    }

    /// A 1-D f32 constant.
    pub(super) fn floats(&mut self, v: &[f64]) -> Result<Value> {
        let t = Tensor::from_f64s(DType::F32, &[v.len()], v).map_err(Error::InvalidArgument)?;
        let name = self.next_name();
        self.imp.constant(&name, t)
    }

    pub(super) fn ints(&mut self, v: &[i64]) -> Result<Value> {
        let name = self.next_name();
        self.imp.ints(&name, v)
    }

    pub(super) fn cast(&mut self, x: Value, to: DType) -> Result<Value> {
        if self.dtype(x)? == to {
            return Ok(x);
        }
        self.op(
            "Cast",
            &[x],
            Attrs::new().with("to", Attr::String(to.name().into())),
        )
    }

    pub(super) fn reduce_mean(&mut self, x: Value, axes: &[i64], keepdims: bool) -> Result<Value> {
        let axes = self.ints(axes)?;
        self.op(
            "ReduceMean",
            &[x, axes],
            Attrs::new().with("keepdims", Attr::Int(keepdims as i64)),
        )
    }

    /// `x` reshaped to rank `rank` with its elements along `axis` (a vector's, or a
    /// scalar's broadcast): per-channel parameters lined up with a tensor's channel axis.
    pub(super) fn along_axis(&mut self, x: Value, axis: usize, rank: usize) -> Result<Value> {
        if self.rank(x)? == 0 {
            return Ok(x);
        }
        if axis >= rank {
            return Err(Error::Graph(format!(
                "a per-axis operand (rank {}) lines up with axis {axis}, but the input has rank {rank}",
                self.rank(x)?
            )));
        }
        let mut shape = vec![1i64; rank];
        shape[axis] = -1;
        let shape = self.ints(&shape)?;
        self.op("Reshape", &[x, shape], Attrs::new())
    }

    /// Dim `axis` of `x` as a one-element i64 vector (a constant when it is static).
    pub(super) fn dim(&mut self, x: Value, axis: usize) -> Result<Value> {
        let range = Attrs::new()
            .with("start", Attr::Int(axis as i64))
            .with("end", Attr::Int(axis as i64 + 1));
        self.op("Shape", &[x], range)
    }

    /// Concatenates one-element i64 vectors into a shape operand.
    pub(super) fn shape_of(&mut self, parts: &[Value]) -> Result<Value> {
        self.op("Concat", parts, Attrs::new().with("axis", Attr::Int(0)))
    }

    pub(super) fn rank(&self, x: Value) -> Result<usize> {
        Ok(self.imp.value_type(x)?.shape.rank())
    }
}

pub(super) fn need(inputs: &[Option<Value>], i: usize, what: &str) -> Result<Value> {
    inputs
        .get(i)
        .copied()
        .flatten()
        .ok_or_else(|| Error::Graph(format!("input {i} ({what}) is required")))
}

pub(super) fn int_attr(attrs: &Attrs, name: &str, default: i64) -> Result<i64> {
    attrs.int_or(name, default).map_err(Error::Graph)
}

pub(super) fn float_attr(attrs: &Attrs, name: &str, default: f64) -> Result<f64> {
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
    let axes = attrs
        .ints("axes")
        .map_err(Error::Graph)?
        .map_or(vec![0, 2, 3], |a| a.to_vec());
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
    let rank = b.rank(x)?;
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

/// The i32 `ConvInteger` or `MatMulInteger` of the float op `op`'s operands (the
/// QLinear ops' and onnxruntime's quantized matmuls' accumulation), widened to f64.
pub(super) fn integer_accumulate(
    b: &mut Builder,
    op: &str,
    inputs: &[Option<Value>],
    attrs: Attrs,
) -> Result<Value> {
    let integer_op = if op == "Conv" {
        "ConvInteger"
    } else {
        "MatMulInteger"
    };
    let operands: Vec<Option<Value>> = inputs.iter().take(4).copied().collect();
    let acc = b.op_outputs(integer_op, &operands, attrs)?[0];
    b.cast(acc, DType::F64)
}

/// `QLinearConv` and `QLinearMatMul`: the integer op (plus QLinearConv's int32 bias),
/// times `x_scale * w_scale / y_scale` (in the scales' type, as the reference computes
/// it), plus `y_zero_point`, saturated and rounded half to even into y's type.
pub(super) fn qlinear(
    b: &mut Builder,
    op: &str,
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
    let conv = op == "Conv";
    let rank = b.rank(x)?;
    let operands = [Some(x), Some(w), Some(x_zero), Some(w_zero)];
    let mut acc = integer_accumulate(b, op, &operands, attrs)?;
    let mut w_scale = w_scale;
    if conv {
        if let Some(bias) = inputs.get(8).copied().flatten() {
            let bias = b.cast(bias, DType::F64)?;
            let bias = b.along_axis(bias, 1, rank)?;
            acc = b.binary("Add", acc, bias)?;
        }
        w_scale = b.along_axis(w_scale, 1, rank)?;
    }
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

/// `Swish`: `x * sigmoid(alpha * x)`.
pub(super) fn swish(
    b: &mut Builder,
    inputs: &[Option<Value>],
    attrs: &Attrs,
) -> Result<Vec<Value>> {
    let x = need(inputs, 0, "X")?;
    let alpha = b.scalar(b.dtype(x)?, float_attr(attrs, "alpha", 1.0)?)?;
    let ax = b.binary("Mul", alpha, x)?;
    let gate = b.unary("Sigmoid", ax)?;
    Ok(vec![b.binary("Mul", x, gate)?])
}

/// The `ai.onnx.ml` ops Kiln expands: `Binarizer`, `ArrayFeatureExtractor` and `Scaler`.
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
        "Scaler" => {
            // Y = (X - offset) * scale in f32, each list one value or one per feature
            // (the last axis), as skl2onnx writes a fitted StandardScaler.
            let list = |name| match attrs.get(name) {
                Some(Attr::Floats(v)) => Ok(v.clone()),
                None => Ok(vec![]),
                Some(_) => Err(Error::InvalidArgument(format!(
                    "Scaler: attribute '{name}' must be floats"
                ))),
            };
            let (offset, scale) = (list("offset")?, list("scale")?);
            let x = b.cast(x, DType::F32)?;
            let shifted = match offset.is_empty() {
                true => x,
                false => {
                    let offset = b.floats(&offset)?;
                    b.binary("Sub", x, offset)?
                }
            };
            Ok(vec![match scale.is_empty() {
                true => shifted,
                false => {
                    let scale = b.floats(&scale)?;
                    b.binary("Mul", shifted, scale)?
                }
            }])
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
            if b.rank(x)? == 1 {
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
    if n == 0 || !operands.is_multiple_of(2 + states) {
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

/// `GroupNormalization`: each group of `C / num_groups` channels is normalized by its
/// own mean and variance, then scaled and shifted per channel (opset 21; opsets 18-20
/// give scale and bias per group, which are repeated over the group's channels).
pub(super) fn group_normalization(
    b: &mut Builder,
    inputs: &[Option<Value>],
    attrs: &Attrs,
    opset: i64,
) -> Result<Vec<Value>> {
    let x = need(inputs, 0, "X")?;
    let (scale, bias) = (need(inputs, 1, "scale")?, need(inputs, 2, "bias")?);
    let rank = b.rank(x)?;
    if rank < 3 {
        return Err(Error::Graph(format!(
            "X must be [N, C, D1, ...], got rank {rank}"
        )));
    }
    let groups = attrs
        .int("num_groups")
        .map_err(Error::Graph)?
        .ok_or_else(|| Error::Graph("attribute 'num_groups' is required".into()))?;
    if groups < 1 {
        return Err(Error::Graph(format!(
            "num_groups must be positive, got {groups}"
        )));
    }
    let epsilon = float_attr(attrs, "epsilon", 1e-5)?;
    let dtype = b.dtype(x)?;
    let shape = b.op("Shape", &[x], Attrs::new())?;
    let grouped_shape = b.ints(&[0, groups, -1])?;
    let grouped = b.op("Reshape", &[x, grouped_shape], Attrs::new())?;
    let mean = b.reduce_mean(grouped, &[2], true)?;
    let centred = b.binary("Sub", grouped, mean)?;
    let squares = b.binary("Mul", centred, centred)?;
    let variance = b.reduce_mean(squares, &[2], true)?;
    let eps = b.scalar(dtype, epsilon)?;
    let variance = b.binary("Add", variance, eps)?;
    let std = b.unary("Sqrt", variance)?;
    let normalized = b.binary("Div", centred, std)?;
    let normalized = b.op("Reshape", &[normalized, shape], Attrs::new())?;
    let (mut scale, mut bias) = (scale, bias);
    if opset < 21 {
        // Per group: repeat each value over the group's C / num_groups channels.
        let channels = b.dim(x, 1)?;
        let per_group = b.ints(&[groups])?;
        let per_group = b.binary("Div", channels, per_group)?;
        let one = b.ints(&[1])?;
        let tiles = b.shape_of(&[one, per_group])?;
        let column = b.ints(&[groups, 1])?;
        let flat = b.ints(&[-1])?;
        for v in [&mut scale, &mut bias] {
            let c = b.op("Reshape", &[*v, column], Attrs::new())?;
            let c = b.op("Tile", &[c, tiles], Attrs::new())?;
            *v = b.op("Reshape", &[c, flat], Attrs::new())?;
        }
    }
    let scale = b.along_axis(scale, 1, rank)?;
    let bias = b.along_axis(bias, 1, rank)?;
    let scaled = b.binary("Mul", normalized, scale)?;
    Ok(vec![b.binary("Add", scaled, bias)?])
}

/// `DepthToSpace` and `SpaceToDepth` (modes DCR and CRD): a reshape to six axes, a
/// transpose and a reshape back, as ONNX defines them.
pub(super) fn depth_space(
    b: &mut Builder,
    op: &str,
    inputs: &[Option<Value>],
    attrs: &Attrs,
) -> Result<Vec<Value>> {
    let x = need(inputs, 0, "input")?;
    if b.rank(x)? != 4 {
        return Err(Error::Graph(format!(
            "input must be [N, C, H, W], got rank {}",
            b.rank(x)?
        )));
    }
    let block = attrs
        .int("blocksize")
        .map_err(Error::Graph)?
        .filter(|&v| v >= 1)
        .ok_or_else(|| Error::Graph("attribute 'blocksize' (>= 1) is required".into()))?;
    let crd = match attrs.string_or("mode", "DCR").map_err(Error::Graph)? {
        "DCR" => false,
        "CRD" => true,
        m => return Err(Error::Graph(format!("mode must be DCR or CRD, got '{m}'"))),
    };
    let [n, c, h, w] = [0, 1, 2, 3].map(|a| b.dim(x, a));
    let (n, c, h, w) = (n?, c?, h?, w?);
    let bs = b.ints(&[block])?;
    let squared = block
        .checked_mul(block)
        .ok_or_else(|| Error::Graph(format!("blocksize {block} is too large")))?;
    let bb = b.ints(&[squared])?;
    let (split, perm, joined) = if op == "DepthToSpace" {
        let c_out = b.binary("Div", c, bb)?;
        let split = if crd {
            [n, c_out, bs, bs, h, w]
        } else {
            [n, bs, bs, c_out, h, w]
        };
        let perm = if crd {
            [0, 1, 4, 2, 5, 3]
        } else {
            [0, 3, 4, 1, 5, 2]
        };
        let (hb, wb) = (b.binary("Mul", h, bs)?, b.binary("Mul", w, bs)?);
        (split, perm, [n, c_out, hb, wb])
    } else {
        let (h_out, w_out) = (b.binary("Div", h, bs)?, b.binary("Div", w, bs)?);
        let perm = if crd {
            [0, 1, 3, 5, 2, 4]
        } else {
            [0, 3, 5, 1, 2, 4]
        };
        let c_out = b.binary("Mul", c, bb)?;
        ([n, c, h_out, bs, w_out, bs], perm, [n, c_out, h_out, w_out])
    };
    let split = b.shape_of(&split)?;
    let y = b.op("Reshape", &[x, split], Attrs::new())?;
    let y = b.op(
        "Transpose",
        &[y],
        Attrs::new().with("perm", Attr::Ints(perm.to_vec())),
    )?;
    let joined = b.shape_of(&joined)?;
    Ok(vec![b.op("Reshape", &[y, joined], Attrs::new())?])
}

/// `Compress`: the slices along `axis` (of the flattened input without one) where the
/// condition is true; a condition shorter than the axis drops the rest.
pub(super) fn compress(
    b: &mut Builder,
    inputs: &[Option<Value>],
    attrs: &Attrs,
) -> Result<Vec<Value>> {
    let (mut x, condition) = (need(inputs, 0, "input")?, need(inputs, 1, "condition")?);
    let axis = match attrs.int("axis").map_err(Error::Graph)? {
        Some(a) => a,
        None => {
            let flat = b.ints(&[-1])?;
            x = b.op("Reshape", &[x, flat], Attrs::new())?;
            0
        }
    };
    let picked = b.unary("NonZero", condition)?;
    let flat = b.ints(&[-1])?;
    let picked = b.op("Reshape", &[picked, flat], Attrs::new())?;
    Ok(vec![b.op(
        "Gather",
        &[x, picked],
        Attrs::new().with("axis", Attr::Int(axis)),
    )?])
}

/// `EyeLike`: ones where `column - row == k`, of the input's 2-D shape, in `dtype`
/// (default: the input's). A constant when the input's shape is static.
pub(super) fn eye_like(
    b: &mut Builder,
    inputs: &[Option<Value>],
    attrs: &Attrs,
) -> Result<Vec<Value>> {
    let x = need(inputs, 0, "input")?;
    if b.rank(x)? != 2 {
        return Err(Error::Graph(format!(
            "input must be 2-D, got rank {}",
            b.rank(x)?
        )));
    }
    let dtype = match attrs.int("dtype").map_err(Error::Graph)? {
        Some(code) => {
            let name = super::tensor::dtype_name(code).map_err(Error::Unsupported)?;
            name.parse::<DType>().map_err(Error::Unsupported)?
        }
        None => b.dtype(x)?,
    };
    let k = b.ints(&[int_attr(attrs, "k", 0)?])?;
    let scalar = b.ints(&[])?;
    let (zero, one) = (b.ints(&[0])?, b.ints(&[1])?);
    let zero = b.op("Reshape", &[zero, scalar], Attrs::new())?;
    let one = b.op("Reshape", &[one, scalar], Attrs::new())?;
    let mut ranges = vec![];
    for axis in 0..2 {
        let n = b.dim(x, axis)?;
        let n = b.op("Reshape", &[n, scalar], Attrs::new())?;
        ranges.push(b.op("Range", &[zero, n, one], Attrs::new())?);
    }
    let column = b.ints(&[-1, 1])?;
    let rows = b.op("Reshape", &[ranges[0], column], Attrs::new())?;
    let offset = b.binary("Sub", ranges[1], rows)?;
    let on_diagonal = b.binary("Equal", offset, k)?;
    Ok(vec![b.cast(on_diagonal, dtype)?])
}
