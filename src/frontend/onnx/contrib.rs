//! onnxruntime's contrib ops (domain `com.microsoft`, and the two it registers in the
//! default domain, `SimplifiedLayerNormalization` and `SkipSimplifiedLayerNormalization`'s
//! sibling forms) built from catalogue ops, so that every backend and pass gets them.
//! These are what onnxruntime's quantization and transformer-optimization tools write;
//! each follows onnxruntime's CPU kernel, including its dynamic quantization of float
//! activations to uint8 where the op defines one. The ms-domain `FusedConv` and
//! `FusedMatMul` are not Kiln's internal ops of those names: they expand here.
use super::expand::{float_attr, int_attr, integer_accumulate, need, swish, Builder};
use crate::error::{Error, Result};
use crate::ir::{Attr, Attrs, DType, Value};

type Inputs = [Option<Value>];

/// The contrib op `op`, or an error naming it when Kiln has no expansion for it.
/// `named` says which of the node's outputs are used (an unused one has no name).
pub(super) fn convert(
    b: &mut Builder,
    op: &str,
    inputs: &Inputs,
    attrs: Attrs,
    named: &[bool],
) -> Result<Vec<Value>> {
    let outs = match op {
        "Gelu" => vec![gelu(b, need(inputs, 0, "X")?, "none")?],
        "BiasGelu" => {
            let sum = b.binary("Add", need(inputs, 0, "A")?, need(inputs, 1, "B")?)?;
            vec![gelu(b, sum, "none")?]
        }
        "FastGelu" => {
            let x = with_bias(b, need(inputs, 0, "X")?, input(inputs, 1))?;
            vec![gelu(b, x, "tanh")?]
        }
        "QuickGelu" => {
            // x * sigmoid(alpha * x): Swish with QuickGelu's default alpha.
            let alpha = float_attr(&attrs, "alpha", 1.702)?;
            let attrs = Attrs::new().with("alpha", Attr::Float(alpha));
            swish(b, inputs, &attrs)?
        }
        "BiasAdd" => {
            let x = with_bias(b, need(inputs, 0, "X")?, Some(need(inputs, 1, "bias")?))?;
            vec![b.binary("Add", x, need(inputs, 2, "skip")?)?]
        }
        "LayerNormalization" => {
            // The same op as ONNX's (onnxruntime's form before opset 17).
            b.op_outputs("LayerNormalization", inputs, attrs)?
        }
        "SimplifiedLayerNormalization" => {
            let x = need(inputs, 0, "X")?;
            rms_normalization(b, x, need(inputs, 1, "scale")?, &attrs, named, 1)?
        }
        "SkipLayerNormalization" | "SkipSimplifiedLayerNormalization" => {
            skip_normalization(b, op, inputs, &attrs, named)?
        }
        "FusedMatMul" => vec![fused_matmul(b, inputs, &attrs)?],
        "FusedConv" => {
            let conv_attrs = without(&attrs, &["activation", "activation_params"]);
            let y = b.op_outputs("Conv", &inputs[..3.min(inputs.len())], conv_attrs)?[0];
            let y = with_bias(b, y, input(inputs, 3))?;
            vec![activation(b, y, &attrs)?]
        }
        "FusedGemm" => {
            let gemm_attrs = without(
                &attrs,
                &[
                    "activation",
                    "activation_alpha",
                    "activation_beta",
                    "activation_gamma",
                ],
            );
            let y = b.op_outputs("Gemm", inputs, gemm_attrs)?[0];
            vec![gemm_activation(b, y, &attrs)?]
        }
        "QLinearAdd" | "QLinearMul" => vec![qlinear_binary(b, op, inputs)?],
        "DynamicQuantizeMatMul" => {
            let a = need(inputs, 0, "A")?;
            let (b_scale, b_zero) = (need(inputs, 2, "b_scale")?, input(inputs, 3));
            let q = b.op_outputs("DynamicQuantizeLinear", &[Some(a)], Attrs::new())?;
            let operands = [Some(q[0]), input(inputs, 1), Some(q[2]), b_zero];
            vec![integer_to_float(
                b,
                &operands,
                q[1],
                b_scale,
                input(inputs, 4),
            )?]
        }
        "MatMulIntegerToFloat" => {
            let operands = [
                input(inputs, 0),
                input(inputs, 1),
                input(inputs, 4),
                input(inputs, 5),
            ];
            let (a_scale, b_scale) = (need(inputs, 2, "a_scale")?, need(inputs, 3, "b_scale")?);
            vec![integer_to_float(
                b,
                &operands,
                a_scale,
                b_scale,
                input(inputs, 6),
            )?]
        }
        // One op (the sequence length may be symbolic); the catalogue's, which
        // quantizes activations as onnxruntime's kernel does.
        "DynamicQuantizeLSTM" => b.op_outputs("DynamicQuantizeLSTM", inputs, attrs)?,
        "Attention" => {
            let projection = b.binary(
                "MatMul",
                need(inputs, 0, "input")?,
                need(inputs, 1, "weights")?,
            )?;
            vec![attention(b, projection, inputs, &attrs)?]
        }
        "QAttention" => {
            let operands = [
                input(inputs, 0),
                input(inputs, 1),
                input(inputs, 6),
                input(inputs, 7),
            ];
            let (a_scale, w_scale) = (
                need(inputs, 3, "input_scale")?,
                need(inputs, 4, "weight_scale")?,
            );
            let projection = integer_to_float(b, &operands, a_scale, w_scale, None)?;
            // QAttention's inputs 2 (bias), 5 (mask_index) and 8 (past) sit where
            // Attention's 2, 3 and 4 do.
            let rest = [
                None,
                None,
                input(inputs, 2),
                input(inputs, 5),
                input(inputs, 8),
            ];
            vec![attention(b, projection, &rest, &attrs)?]
        }
        "QGemm" => vec![qgemm(b, inputs, &attrs)?],
        "QLinearGlobalAveragePool" => vec![qlinear_global_average_pool(b, inputs, &attrs)?],
        "MultiHeadAttention" => vec![multi_head_attention(b, inputs, &attrs)?],
        "EmbedLayerNormalization" => embed_layer_normalization(b, inputs, &attrs, named)?,
        _ => {
            return Err(Error::UnknownOp(format!(
                "op '{op}' of domain 'com.microsoft' is not supported"
            )))
        }
    };
    used_outputs_exist(op, outs, named)
}

/// `outs`, after checking that every output the node uses is one Kiln computes.
fn used_outputs_exist(op: &str, outs: Vec<Value>, named: &[bool]) -> Result<Vec<Value>> {
    if let Some(k) = (outs.len()..named.len()).find(|&k| named[k]) {
        return Err(Error::Unsupported(format!(
            "{op}: output {k} is not supported (Kiln computes the first {})",
            outs.len()
        )));
    }
    Ok(outs)
}

fn input(inputs: &Inputs, i: usize) -> Option<Value> {
    inputs.get(i).copied().flatten()
}

fn unsupported_input(inputs: &Inputs, i: usize, op: &str, what: &str) -> Result<()> {
    match input(inputs, i) {
        Some(_) => Err(Error::Unsupported(format!(
            "{op}: input {i} ({what}) is not supported"
        ))),
        None => Ok(()),
    }
}

/// `attrs` without the attributes `names`.
fn without(attrs: &Attrs, names: &[&str]) -> Attrs {
    let mut kept = attrs.clone();
    for n in names {
        kept.0.remove(*n);
    }
    kept
}

fn with_bias(b: &mut Builder, x: Value, bias: Option<Value>) -> Result<Value> {
    match bias {
        Some(bias) => b.binary("Add", x, bias),
        None => Ok(x),
    }
}

fn gelu(b: &mut Builder, x: Value, approximate: &str) -> Result<Value> {
    let attrs = Attrs::new().with("approximate", Attr::String(approximate.into()));
    b.op("Gelu", &[x], attrs)
}

/// `x / sqrt(mean(x^2) + epsilon) * scale` over the axes from `axis`, and when the node
/// uses output `inv_std_at`, `1 / sqrt(mean(x^2) + epsilon)` (f32, the axes kept as 1).
fn rms_normalization(
    b: &mut Builder,
    x: Value,
    scale: Value,
    attrs: &Attrs,
    named: &[bool],
    inv_std_at: usize,
) -> Result<Vec<Value>> {
    let epsilon = float_attr(attrs, "epsilon", 1e-5)?;
    let axis = int_attr(attrs, "axis", -1)?;
    let norm_attrs = Attrs::new()
        .with("axis", Attr::Int(axis))
        .with("epsilon", Attr::Float(epsilon));
    let y = b.op("RMSNormalization", &[x, scale], norm_attrs)?;
    if !named.get(inv_std_at).copied().unwrap_or(false) {
        return Ok(vec![y]);
    }
    let rank = b.rank(x)? as i64;
    let first = if axis < 0 { axis + rank } else { axis };
    if !(0..rank).contains(&first) {
        return Err(Error::Graph(format!(
            "axis {axis} is out of range for rank {rank}"
        )));
    }
    let wide = b.cast(x, DType::F32)?;
    let squares = b.binary("Mul", wide, wide)?;
    let axes: Vec<i64> = (first..rank).collect();
    let mean = b.reduce_mean(squares, &axes, true)?;
    let eps = b.scalar(DType::F32, epsilon)?;
    let var = b.binary("Add", mean, eps)?;
    let std = b.unary("Sqrt", var)?;
    let inv_std = b.unary("Reciprocal", std)?;
    let mut outs = vec![y; inv_std_at];
    outs.push(inv_std);
    Ok(outs)
}

/// `SkipLayerNormalization` and `SkipSimplifiedLayerNormalization`: the layer (or RMS)
/// normalization of `input + skip + bias` over the last axis; outputs `output`, `mean`,
/// `inv_std_var` and `input_skip_bias_sum`.
fn skip_normalization(
    b: &mut Builder,
    op: &str,
    inputs: &Inputs,
    attrs: &Attrs,
    named: &[bool],
) -> Result<Vec<Value>> {
    let simplified = op == "SkipSimplifiedLayerNormalization";
    let x = need(inputs, 0, "input")?;
    let skip = need(inputs, 1, "skip")?;
    let gamma = need(inputs, 2, "gamma")?;
    let (beta, bias) = if simplified {
        (None, input(inputs, 3))
    } else {
        (input(inputs, 3), input(inputs, 4))
    };
    let sum = b.binary("Add", x, skip)?;
    let sum = with_bias(b, sum, bias)?;
    let epsilon = float_attr(attrs, "epsilon", 1e-12)?;
    let norm_attrs = Attrs::new()
        .with("axis", Attr::Int(-1))
        .with("epsilon", Attr::Float(epsilon));
    let mut outs = if simplified {
        if named.get(1).copied().unwrap_or(false) {
            return Err(Error::Unsupported(format!(
                "{op}: output 1 (mean) is not defined for RMS normalization"
            )));
        }
        let mut outs = rms_normalization(b, sum, gamma, &norm_attrs, named, 2)?;
        outs.resize(3, outs[0]);
        outs
    } else {
        b.op_outputs(
            "LayerNormalization",
            &[Some(sum), Some(gamma), beta],
            norm_attrs,
        )?
    };
    outs.push(sum);
    Ok(outs)
}

/// `FusedMatMul`: `alpha * op(A) op(B)`, `op` transposing the last two axes when
/// `transA` / `transB` ask.
fn fused_matmul(b: &mut Builder, inputs: &Inputs, attrs: &Attrs) -> Result<Value> {
    for batch in ["transBatchA", "transBatchB"] {
        if int_attr(attrs, batch, 0)? != 0 {
            return Err(Error::Unsupported(format!(
                "FusedMatMul: {batch} = 1 is not supported"
            )));
        }
    }
    let mut operands = vec![];
    for (i, (name, flag)) in [("A", "transA"), ("B", "transB")].into_iter().enumerate() {
        let v = need(inputs, i, name)?;
        let rank = b.rank(v)?;
        let v = if int_attr(attrs, flag, 0)? != 0 && rank >= 2 {
            let mut perm: Vec<i64> = (0..rank as i64).collect();
            perm.swap(rank - 2, rank - 1);
            b.op(
                "Transpose",
                &[v],
                Attrs::new().with("perm", Attr::Ints(perm)),
            )?
        } else {
            v
        };
        operands.push(v);
    }
    let y = b.binary("MatMul", operands[0], operands[1])?;
    let alpha = float_attr(attrs, "alpha", 1.0)?;
    if alpha == 1.0 {
        return Ok(y);
    }
    let alpha = b.scalar(b.dtype(y)?, alpha)?;
    b.binary("Mul", y, alpha)
}

/// `FusedConv`'s `activation` (with `activation_params`) applied to `y`.
fn activation(b: &mut Builder, y: Value, attrs: &Attrs) -> Result<Value> {
    let Some(name) = attrs.string("activation").map_err(Error::Graph)? else {
        return Ok(y);
    };
    let params = attrs
        .floats("activation_params")
        .map_err(Error::Graph)?
        .unwrap_or_default();
    let param = |k: usize, default: f64| params.get(k).copied().unwrap_or(default);
    apply_activation(b, y, name, param(0, f64::NAN), param(1, f64::NAN))
}

/// `FusedGemm`'s `activation` with its `activation_alpha` / `activation_beta`.
fn gemm_activation(b: &mut Builder, y: Value, attrs: &Attrs) -> Result<Value> {
    let Some(name) = attrs.string("activation").map_err(Error::Graph)? else {
        return Ok(y);
    };
    let alpha = float_attr(attrs, "activation_alpha", f64::NAN)?;
    let beta = float_attr(attrs, "activation_beta", f64::NAN)?;
    apply_activation(b, y, name, alpha, beta)
}

/// The activation `name` with parameters `p0`, `p1` (NaN: the op's default).
fn apply_activation(b: &mut Builder, y: Value, name: &str, p0: f64, p1: f64) -> Result<Value> {
    let or = |v: f64, default: f64| if v.is_nan() { default } else { v };
    match name {
        "Relu" | "Tanh" | "Sigmoid" => b.unary(name, y),
        "LeakyRelu" => {
            let attrs = Attrs::new().with("alpha", Attr::Float(or(p0, 0.01)));
            b.op("LeakyRelu", &[y], attrs)
        }
        "HardSigmoid" => {
            let attrs = Attrs::new()
                .with("alpha", Attr::Float(or(p0, 0.2)))
                .with("beta", Attr::Float(or(p1, 0.5)));
            b.op("HardSigmoid", &[y], attrs)
        }
        "Clip" => {
            let dtype = b.dtype(y)?;
            let lo = b.scalar(dtype, or(p0, f64::MIN))?;
            let hi = b.scalar(dtype, or(p1, f64::MAX))?;
            b.op("Clip", &[y, lo, hi], Attrs::new())
        }
        other => Err(Error::Unsupported(format!(
            "activation '{other}' is not supported (Relu, Tanh, Sigmoid, LeakyRelu, HardSigmoid and Clip are)"
        ))),
    }
}

/// `QLinearAdd` / `QLinearMul`: the dequantized operands added (multiplied) and
/// quantized to C's scale and zero point, in f32 as onnxruntime computes them:
/// `(a - za) * (sa / sc) + (b - zb) * (sb / sc) + zc`, or
/// `(a - za) (b - zb) * (sa sb / sc) + zc`, rounded half to even and saturated.
fn qlinear_binary(b: &mut Builder, op: &str, inputs: &Inputs) -> Result<Value> {
    let dtype = b.dtype(need(inputs, 0, "A")?)?;
    let mut centred = vec![];
    for (at, what) in [(0, "A"), (3, "B")] {
        let v = need(inputs, at, what)?;
        let v = b.cast(v, DType::F32)?;
        centred.push(match input(inputs, at + 2) {
            Some(zero) => {
                let zero = b.cast(zero, DType::F32)?;
                b.binary("Sub", v, zero)?
            }
            None => v,
        });
    }
    let scale = |b: &mut Builder, at: usize, what: &str| -> Result<Value> {
        let s = need(inputs, at, what)?;
        b.cast(s, DType::F32)
    };
    let (sa, sb, sc) = (
        scale(b, 1, "A_scale")?,
        scale(b, 4, "B_scale")?,
        scale(b, 6, "C_scale")?,
    );
    let real = if op == "QLinearAdd" {
        let ra = b.binary("Div", sa, sc)?;
        let rb = b.binary("Div", sb, sc)?;
        let ta = b.binary("Mul", centred[0], ra)?;
        let tb = b.binary("Mul", centred[1], rb)?;
        b.binary("Add", ta, tb)?
    } else {
        let sab = b.binary("Mul", sa, sb)?;
        let ratio = b.binary("Div", sab, sc)?;
        let product = b.binary("Mul", centred[0], centred[1])?;
        b.binary("Mul", product, ratio)?
    };
    requantize(b, real, input(inputs, 7), dtype)
}

/// `QGemm`: `alpha (A - za)(B - zb) + C` (op(A), op(B) transposed as asked, C an int32
/// bias) times `a_scale * b_scale`; as f32, or when `y_scale` is given requantized
/// to y's type, all in f32 as onnxruntime's kernel computes it.
fn qgemm(b: &mut Builder, inputs: &Inputs, attrs: &Attrs) -> Result<Value> {
    let mut operands = [
        input(inputs, 0),
        input(inputs, 3),
        input(inputs, 2),
        input(inputs, 5),
    ];
    for (k, (name, flag)) in [("A", "transA"), ("B", "transB")].into_iter().enumerate() {
        let v = need(inputs, 3 * k, name)?;
        if int_attr(attrs, flag, 0)? != 0 {
            let perm = Attrs::new().with("perm", Attr::Ints(vec![1, 0]));
            operands[k] = Some(b.op("Transpose", &[v], perm)?);
        }
    }
    let mut acc = integer_accumulate(b, "MatMul", &operands, Attrs::new())?;
    if let Some(c) = input(inputs, 6) {
        let c = b.cast(c, DType::F64)?;
        acc = b.binary("Add", acc, c)?;
    }
    let acc = b.cast(acc, DType::F32)?;
    let (a_scale, b_scale) = (need(inputs, 1, "a_scale")?, need(inputs, 4, "b_scale")?);
    let mut scale = b.binary("Mul", a_scale, b_scale)?;
    let alpha = float_attr(attrs, "alpha", 1.0)?;
    if alpha != 1.0 {
        let alpha = b.scalar(DType::F32, alpha)?;
        scale = b.binary("Mul", scale, alpha)?;
    }
    let Some(y_scale) = input(inputs, 7) else {
        return b.binary("Mul", acc, scale);
    };
    let ratio = b.binary("Div", scale, y_scale)?;
    let real = b.binary("Mul", acc, ratio)?;
    requantize(b, real, input(inputs, 8), DType::U8)
}

/// `real` rounded half to even, plus `zero` (of the output type; `default` when
/// absent), saturated to the output type.
fn requantize(b: &mut Builder, real: Value, zero: Option<Value>, default: DType) -> Result<Value> {
    let dtype = zero.map(|z| b.dtype(z)).transpose()?.unwrap_or(default);
    let (lo, hi) = match dtype {
        DType::U8 => (0.0, 255.0),
        DType::I8 => (-128.0, 127.0),
        d => {
            return Err(Error::Graph(format!(
                "the output zero point must be int8 or uint8, got {}",
                d.name()
            )))
        }
    };
    let mut y = b.unary("Round", real)?;
    if let Some(zero) = zero {
        let zero = b.cast(zero, DType::F32)?;
        y = b.binary("Add", y, zero)?;
    }
    let (lo, hi) = (b.scalar(DType::F32, lo)?, b.scalar(DType::F32, hi)?);
    let clipped = b.op("Clip", &[y, lo, hi], Attrs::new())?;
    b.cast(clipped, dtype)
}

/// `QLinearGlobalAveragePool`, as onnxruntime's kernel computes it: the integer sum
/// of `x - x_zero_point` over the spatial axes (channels first, or last with
/// `channels_last`) times the f32 `x_scale / (y_scale * n)`, requantized.
fn qlinear_global_average_pool(b: &mut Builder, inputs: &Inputs, attrs: &Attrs) -> Result<Value> {
    let x = need(inputs, 0, "X")?;
    let rank = b.rank(x)? as i64;
    if rank < 3 {
        return Err(Error::Graph(format!(
            "X must have rank 3 or more, got {rank}"
        )));
    }
    let (first, end) = if int_attr(attrs, "channels_last", 0)? != 0 {
        (1, rank - 1)
    } else {
        (2, rank)
    };
    let mut centred = b.cast(x, DType::F64)?;
    if let Some(zero) = input(inputs, 2) {
        let zero = b.cast(zero, DType::F64)?;
        centred = b.binary("Sub", centred, zero)?;
    }
    let axes = b.ints(&(first..end).collect::<Vec<_>>())?;
    let keep = Attrs::new().with("keepdims", Attr::Int(1));
    let sum = b.op("ReduceSum", &[centred, axes], keep)?;
    let sum = b.cast(sum, DType::F32)?;
    let range = Attrs::new()
        .with("start", Attr::Int(first))
        .with("end", Attr::Int(end));
    let spatial = b.op("Shape", &[x], range)?;
    let n = b.op(
        "ReduceProd",
        &[spatial],
        Attrs::new().with("keepdims", Attr::Int(0)),
    )?;
    let n = b.cast(n, DType::F32)?;
    let (x_scale, y_scale) = (need(inputs, 1, "x_scale")?, need(inputs, 3, "y_scale")?);
    let denominator = b.binary("Mul", y_scale, n)?;
    let scale = b.binary("Div", x_scale, denominator)?;
    let real = b.binary("Mul", sum, scale)?;
    let default = b.dtype(x)?;
    requantize(b, real, input(inputs, 4), default)
}

/// The integer matmul of `operands` (A, B, A's and B's zero points) as f32, times
/// `a_scale * b_scale`, plus `bias`: `DynamicQuantizeMatMul`'s and
/// `MatMulIntegerToFloat`'s arithmetic.
fn integer_to_float(
    b: &mut Builder,
    operands: &Inputs,
    a_scale: Value,
    b_scale: Value,
    bias: Option<Value>,
) -> Result<Value> {
    let acc = integer_accumulate(b, "MatMul", operands, Attrs::new())?;
    let acc = b.cast(acc, DType::F32)?;
    let scale = b.binary("Mul", a_scale, b_scale)?;
    let y = b.binary("Mul", acc, scale)?;
    with_bias(b, y, bias)
}

/// A 0/1 key mask (`[B, T]`, any integer type) or key lengths (`[B]`: keys from the
/// length on are masked) as an additive float bias `[B, 1, 1, T]`: 0 where kept,
/// `filter` where masked, as onnxruntime's attention kernels add it. `keys` is a value
/// whose axis 1 has the T keys.
fn key_mask_bias(b: &mut Builder, mask: Value, keys: Value, filter: f64) -> Result<Value> {
    let keep = match b.rank(mask)? {
        2 => b.cast(mask, DType::F32)?,
        1 => {
            let t = b.dim(keys, 1)?;
            let t = b.op("Squeeze", &[t], Attrs::new())?;
            let (zero, one) = (b.scalar(DType::I64, 0.0)?, b.scalar(DType::I64, 1.0)?);
            let positions = b.op("Range", &[zero, t, one], Attrs::new())?;
            let lengths = b.cast(mask, DType::I64)?;
            let axis = b.ints(&[1])?;
            let lengths = b.op("Unsqueeze", &[lengths, axis], Attrs::new())?;
            let kept = b.binary("Less", positions, lengths)?;
            b.cast(kept, DType::F32)?
        }
        r => {
            return Err(Error::Unsupported(format!(
                "a key mask of rank {r} is not supported (a [batch, keys] 0/1 mask or [batch] lengths are)"
            )))
        }
    };
    let one = b.scalar(DType::F32, 1.0)?;
    let masked = b.binary("Sub", one, keep)?;
    let filter = b.scalar(DType::F32, filter)?;
    let bias = b.binary("Mul", masked, filter)?;
    let axes = b.ints(&[1, 2])?;
    b.op("Unsqueeze", &[bias, axes], Attrs::new())
}

/// Scaled dot-product attention of 3-D `q`, `k`, `v` (`[B, S, heads * D]`) with an
/// additive bias, through the catalogue's `Attention`.
fn sdpa(
    b: &mut Builder,
    qkv: [Value; 3],
    bias: Option<Value>,
    heads: i64,
    attrs: &Attrs,
) -> Result<Value> {
    let mut att = Attrs::new()
        .with("q_num_heads", Attr::Int(heads))
        .with("kv_num_heads", Attr::Int(heads))
        .with(
            "is_causal",
            Attr::Int(int_attr(attrs, "unidirectional", 0)?),
        );
    let scale = float_attr(attrs, "scale", 0.0)?;
    if scale != 0.0 {
        att.set("scale", Attr::Float(scale));
    }
    let [q, k, v] = qkv;
    Ok(b.op_outputs("Attention", &[Some(q), Some(k), Some(v), bias], att)?[0])
}

fn heads(attrs: &Attrs, op: &str) -> Result<i64> {
    match attrs.int("num_heads").map_err(Error::Graph)? {
        Some(n) if n > 0 => Ok(n),
        _ => Err(Error::Graph(format!(
            "{op}: num_heads must be a positive int"
        ))),
    }
}

/// The mask and attention bias of an attention op as one additive bias.
fn attention_bias(
    b: &mut Builder,
    mask: Option<Value>,
    extra: Option<Value>,
    keys: Value,
    attrs: &Attrs,
) -> Result<Option<Value>> {
    let filter = float_attr(attrs, "mask_filter_value", -10000.0)?;
    let mask = mask
        .map(|m| key_mask_bias(b, m, keys, filter))
        .transpose()?;
    Ok(match (mask, extra) {
        (Some(m), Some(e)) => Some(b.binary("Add", m, e)?),
        (m, e) => m.or(e),
    })
}

/// `Attention` given its input's `projection` (`input @ weights`): Q, K and V from it
/// plus the bias, split by `qkv_hidden_sizes` or in thirds, then multi-head attention.
fn attention(b: &mut Builder, projection: Value, inputs: &Inputs, attrs: &Attrs) -> Result<Value> {
    let op = "Attention";
    let heads = heads(attrs, op)?;
    for (i, what) in [(4, "past"), (6, "past_sequence_length")] {
        unsupported_input(inputs, i, op, what)?;
    }
    if int_attr(attrs, "do_rotary", 0)? != 0 {
        return Err(Error::Unsupported(
            "Attention: do_rotary = 1 is not supported".into(),
        ));
    }
    let projected = with_bias(b, projection, input(inputs, 2))?;
    let mut split = Attrs::new().with("axis", Attr::Int(-1));
    let sizes = attrs.ints("qkv_hidden_sizes").map_err(Error::Graph)?;
    let split_inputs = match sizes {
        Some(s) if s.len() == 3 => vec![Some(projected), Some(b.ints(s)?)],
        Some(s) => {
            return Err(Error::Graph(format!(
                "qkv_hidden_sizes must have 3 elements, got {}",
                s.len()
            )))
        }
        None => {
            split.set("num_outputs", Attr::Int(3));
            vec![Some(projected)]
        }
    };
    let qkv = b.op_outputs("Split", &split_inputs, split)?;
    let [q, k, v] = <[Value; 3]>::try_from(qkv)
        .map_err(|_| Error::Graph("the projection did not split in three".into()))?;
    let bias = attention_bias(b, input(inputs, 3), input(inputs, 5), projection, attrs)?;
    sdpa(b, [q, k, v], bias, heads, attrs)
}

/// `MultiHeadAttention` with separate 3-D query, key and value (and an optional packed
/// bias for the three).
fn multi_head_attention(b: &mut Builder, inputs: &Inputs, attrs: &Attrs) -> Result<Value> {
    let op = "MultiHeadAttention";
    let heads = heads(attrs, op)?;
    for (i, what) in [(6, "past_key"), (7, "past_value")] {
        unsupported_input(inputs, i, op, what)?;
    }
    let q = need(inputs, 0, "query")?;
    let (k, v) = (need(inputs, 1, "key")?, need(inputs, 2, "value")?);
    for (v, what) in [(q, "query"), (k, "key"), (v, "value")] {
        if b.rank(v)? != 3 {
            return Err(Error::Unsupported(format!(
                "{op}: only 3-D {what} is supported (not packed or past forms)"
            )));
        }
    }
    let mut qkv = [q, k, v];
    if let Some(bias) = input(inputs, 3) {
        let split = Attrs::new()
            .with("axis", Attr::Int(0))
            .with("num_outputs", Attr::Int(3));
        let parts = b.op_outputs("Split", &[Some(bias)], split)?;
        for (x, part) in qkv.iter_mut().zip(parts) {
            *x = b.binary("Add", *x, part)?;
        }
    }
    let bias = attention_bias(b, input(inputs, 4), input(inputs, 5), k, attrs)?;
    sdpa(b, qkv, bias, heads, attrs)
}

/// `EmbedLayerNormalization`: the word, position and segment embeddings summed and
/// layer-normalized; `mask_index` is each row's count of mask ones (int32).
fn embed_layer_normalization(
    b: &mut Builder,
    inputs: &Inputs,
    attrs: &Attrs,
    named: &[bool],
) -> Result<Vec<Value>> {
    let ids = need(inputs, 0, "input_ids")?;
    let word = need(inputs, 2, "word_embedding")?;
    let position = need(inputs, 3, "position_embedding")?;
    let (gamma, beta) = (need(inputs, 5, "gamma")?, need(inputs, 6, "beta")?);
    let gather = |b: &mut Builder, table: Value, ids: Value| -> Result<Value> {
        b.op(
            "Gather",
            &[table, ids],
            Attrs::new().with("axis", Attr::Int(0)),
        )
    };
    let mut sum = gather(b, word, ids)?;
    let position_ids = match input(inputs, 8) {
        Some(p) => p,
        None => {
            let s = b.dim(ids, 1)?;
            let s = b.op("Squeeze", &[s], Attrs::new())?;
            let (zero, one) = (b.scalar(DType::I64, 0.0)?, b.scalar(DType::I64, 1.0)?);
            b.op("Range", &[zero, s, one], Attrs::new())?
        }
    };
    let positions = gather(b, position, position_ids)?;
    sum = b.binary("Add", sum, positions)?;
    if let (Some(segments), Some(table)) = (input(inputs, 1), input(inputs, 4)) {
        let s = gather(b, table, segments)?;
        sum = b.binary("Add", sum, s)?;
    }
    let epsilon = float_attr(attrs, "epsilon", 1e-12)?;
    let norm_attrs = Attrs::new()
        .with("axis", Attr::Int(-1))
        .with("epsilon", Attr::Float(epsilon));
    let y = b.op("LayerNormalization", &[sum, gamma, beta], norm_attrs)?;
    let mut outs = vec![y];
    if named.get(1).copied().unwrap_or(false) || named.get(2).copied().unwrap_or(false) {
        let mask_index = match input(inputs, 7) {
            Some(mask) => {
                let mask = b.cast(mask, DType::I32)?;
                let axes = b.ints(&[1])?;
                b.op(
                    "ReduceSum",
                    &[mask, axes],
                    Attrs::new().with("keepdims", Attr::Int(0)),
                )?
            }
            None => {
                // No mask: every row's count is 0, one per batch row.
                let rows = b.dim(ids, 0)?;
                let attrs = Attrs::new()
                    .with("value", Attr::Float(0.0))
                    .with("dtype", Attr::String(DType::I32.name().into()));
                b.op("ConstantOfShape", &[rows], attrs)?
            }
        };
        outs.push(mask_index);
        outs.push(sum);
    }
    Ok(outs)
}
