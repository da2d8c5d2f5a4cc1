//! Inference-mode BatchNormalization folded away. After a Conv, a 2-D Gemm or a 2-D
//! MatMul with constant weights that nothing else reads, `s = scale / sqrt(var + eps)`
//! scales the weights per output channel and `B - mean * s` joins the bias. A
//! BatchNormalization after anything else becomes `x * s + t` with per-channel
//! constants, which elementwise fusion then absorbs. Arithmetic in f64, rounded once.
use super::pattern::{alt, any, constant, op, Pat, Uses};
use super::{add_const, add_in_place_of, sweep, Changed, Pass, PassContext};
use crate::error::Result;
use crate::ir::{Attr, Attrs, Graph, NodeId, Value};
use crate::tensor::Tensor;

pub struct FoldBatchNorm;

impl Pass for FoldBatchNorm {
    fn name(&self) -> &'static str {
        "fold-batchnorm"
    }
    fn summary(&self) -> &'static str {
        "fold inference BatchNormalization into the Conv/Gemm/MatMul before it, else into x*s+t"
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed> {
        let bn = batchnorm_pattern();
        sweep(g, cx, false, |g, uses, id, cx| fold(g, uses, id, cx, &bn))
    }
}

fn batchnorm_pattern() -> Pat {
    let producer = alt(vec![
        op("Conv")
            .single_use()
            .args(vec![any(), constant(), alt(vec![constant(), Pat::Absent])])
            .pat(),
        op("Gemm")
            .single_use()
            .args(vec![any(), constant(), alt(vec![constant(), Pat::Absent])])
            .pat(),
        op("MatMul")
            .single_use()
            .args(vec![any(), constant()])
            .pat(),
    ])
    .capture("producer");
    op("BatchNormalization")
        .args(vec![
            alt(vec![producer, any().capture("x")]),
            constant().capture("scale"),
            constant().capture("bias"),
            constant().capture("mean"),
            constant().capture("var"),
        ])
        .pat()
}

fn data(g: &Graph, v: Value) -> Vec<f64> {
    g.node(v.node)
        .data
        .as_ref()
        .expect("a constant")
        .to_f64_vec()
}

fn fold(g: &mut Graph, uses: &Uses, id: NodeId, cx: &mut PassContext, pat: &Pat) -> Result<bool> {
    let Some(m) = pat.matches(g, uses, id.into()) else {
        return Ok(false);
    };
    let y = g.node(id).outputs[0].clone();
    if !y.dtype.is_float() || y.rank() < 2 {
        return Ok(false);
    }
    let eps = g.node(id).attrs.float_or("epsilon", 1e-5).unwrap_or(1e-5);
    let (scale, bias, mean, var) = (
        data(g, m.value("scale")),
        data(g, m.value("bias")),
        data(g, m.value("mean")),
        data(g, m.value("var")),
    );
    let c = scale.len();
    if [bias.len(), mean.len(), var.len()].iter().any(|&k| k != c) {
        return Ok(false);
    }
    let s: Vec<f64> = (0..c).map(|i| scale[i] / (var[i] + eps).sqrt()).collect();
    let t: Vec<f64> = (0..c).map(|i| bias[i] - mean[i] * s[i]).collect();
    let new = match m.get("producer") {
        Some(p) => fold_into(g, uses, id, p.node, &s, &t, cx)?,
        None if cx.allow_rewrite() => Some(scale_shift(g, id, m.value("x"), &s, &t)?),
        None => None,
    };
    let Some(new) = new else { return Ok(false) };
    if g.value_type(new)? != &y {
        return Err(crate::Error::Graph(format!(
            "folding {} changed its type to {}",
            g.describe(id),
            g.value_type(new)?
        )));
    }
    g.replace_uses(id.into(), new)?;
    // Folded into its producer, the BatchNormalization is part of what that replaced.
    g.record_replaced(new.node, id);
    Ok(true)
}

/// `x * s + t` with s and t shaped to broadcast over channel axis 1; the Add stands in
/// for the BatchNormalization `bn`.
fn scale_shift(g: &mut Graph, bn: NodeId, x: Value, s: &[f64], t: &[f64]) -> Result<Value> {
    let ty = g.value_type(x)?.clone();
    let name = g.node(bn).name.clone();
    let mut dims = vec![s.len()];
    dims.extend(std::iter::repeat_n(1, ty.rank() - 2));
    let per_channel =
        |v: &[f64]| Tensor::from_f64s(ty.dtype, &dims, v).map_err(crate::Error::Graph);
    let sc = add_const(g, &format!("{name}.scale"), per_channel(s)?)?;
    let sh = add_const(g, &format!("{name}.shift"), per_channel(t)?)?;
    let mul = g.op(
        "Mul",
        &[x, sc.into()],
        Attrs::new(),
        &g.fresh_name(&format!("{name}.mul")),
    )?;
    let add = add_in_place_of(
        g,
        bn,
        "Add",
        &[Some(mul.into()), Some(sh.into())],
        Attrs::new(),
    )
    .ok_or_else(|| crate::Error::Graph(format!("{}: x * s + t does not infer", g.describe(bn))))?;
    Ok(add.into())
}

/// Which weight elements belong to which output channel, in row-major order.
#[derive(Clone, Copy)]
enum Channels {
    /// Element i belongs to channel i / k (Conv's W, Gemm's transposed B).
    Rows(usize),
    /// Element i belongs to channel i % k (MatMul's and Gemm's B).
    Cols(usize),
}

/// `w` with each element multiplied by its channel's `s`, in f64, rounded once. The
/// f32 case (every real model; ResNet-50's weights are 25 M elements) works on slices,
/// without converting the whole tensor through f64 vectors.
fn scale_weights(w: &Tensor, channels: Channels, s: &[f64]) -> Result<Tensor> {
    let err = crate::Error::Graph;
    fn apply<T: Copy>(w: &[T], channels: Channels, s: &[f64], f: impl Fn(T, f64) -> T) -> Vec<T> {
        let mut out = Vec::with_capacity(w.len());
        match channels {
            Channels::Rows(k) => {
                for (row, &sc) in w.chunks(k.max(1)).zip(s) {
                    out.extend(row.iter().map(|&x| f(x, sc)));
                }
            }
            Channels::Cols(k) => {
                for row in w.chunks(k.max(1)) {
                    out.extend(row.iter().zip(s).map(|(&x, &sc)| f(x, sc)));
                }
            }
        }
        out
    }
    if let Some(a) = w.view::<f32>() {
        let a = a.as_standard_layout();
        let data = a.as_slice().expect("standard layout");
        let v = apply(data, channels, s, |x, sc| (x as f64 * sc) as f32);
        return Tensor::from_vec(w.shape(), v).map_err(err);
    }
    let v = apply(&w.to_f64_vec(), channels, s, |x, sc| x * sc);
    Tensor::from_f64s(w.dtype(), w.shape(), &v).map_err(err)
}

/// The producer with scaled weights and shifted bias, or None when its shapes do not
/// line up with the channels.
/// The producer with scaled weights and shifted bias, or None when its shapes do not
/// line up with the channels (or the rewrite budget is spent). Every check comes before
/// the first change: the weights may be scaled in place.
fn fold_into(
    g: &mut Graph,
    uses: &Uses,
    bn: NodeId,
    p: NodeId,
    s: &[f64],
    t: &[f64],
    cx: &mut PassContext,
) -> Result<Option<Value>> {
    let name = g.node(bn).name.clone();
    let node = g.node(p).clone();
    let w_val = node.inputs[1].expect("matched");
    let w_t = g.node(w_val.node).data.clone().expect("constant");
    let len = w_t.len();
    let dims = w_t.shape().to_vec();
    let c = s.len();
    let dtype = w_t.dtype();
    drop(w_t);
    let channels = match node.op.as_str() {
        "Conv" if dims.first() == Some(&c) => Channels::Rows(len / c.max(1)),
        "Gemm" if dims.len() == 2 => {
            let trans_b = node.attrs.int_or("transB", 0).unwrap_or(0) != 0;
            let (rows, cols) = (dims[0], dims[1]);
            match (trans_b, rows == c, cols == c) {
                (true, true, _) => Channels::Rows(cols),
                (false, _, true) => Channels::Cols(cols),
                _ => return Ok(None),
            }
        }
        "MatMul" if dims.len() == 2 && dims[1] == c && g.node(p).outputs[0].rank() == 2 => {
            Channels::Cols(c)
        }
        _ => return Ok(None),
    };
    // The old bias, per channel (absent = 0).
    let old_bias: Vec<f64> = match node.inputs.get(2).copied().flatten() {
        None => vec![0.0; c],
        Some(b) => {
            let v = data(g, b);
            match v.len() {
                1 => vec![v[0]; c],
                k if k == c => v,
                _ => return Ok(None),
            }
        }
    };
    let beta = node.attrs.float_or("beta", 1.0).unwrap_or(1.0);
    if node.op == "Gemm" && beta == 0.0 {
        return Ok(None);
    }
    if !cx.allow_rewrite() {
        return Ok(None);
    }
    let new_bias: Vec<f64> = (0..c)
        .map(|i| match node.op.as_str() {
            // Gemm adds beta * C: C' = C * s + t / beta.
            "Gemm" => old_bias[i] * s[i] + t[i] / beta,
            _ => old_bias[i] * s[i] + t[i],
        })
        .collect();
    let b = add_const(
        g,
        &format!("{name}.bias"),
        Tensor::from_f64s(dtype, &[c], &new_bias).map_err(crate::Error::Graph)?,
    )?;
    // Weights only this producer reads are scaled where they are (no second copy of
    // ResNet-50's 100 MB); shared ones get a scaled copy.
    let new_w = if uses.users(w_val).len() == 1 {
        let data = g.node_mut(w_val.node).data.as_mut().expect("constant");
        let scaled = scale_weights(data, channels, s)?;
        *std::sync::Arc::make_mut(data) = scaled;
        w_val
    } else {
        let w_t = g.node(w_val.node).data.clone().expect("constant");
        let scaled = scale_weights(&w_t, channels, s)?;
        add_const(g, &format!("{}.w", node.name), scaled)?.into()
    };
    let mut inputs = node.inputs.clone();
    inputs[1] = Some(new_w);
    let what = g.describe(p);
    let rejected = || crate::Error::Graph(format!("{what}: the folded form does not infer"));
    let out = if node.op == "MatMul" {
        let mm = add_in_place_of(
            g,
            p,
            "MatMul",
            &[inputs[0], Some(new_w)],
            node.attrs.clone(),
        )
        .ok_or_else(rejected)?;
        add_in_place_of(
            g,
            bn,
            "Add",
            &[Some(mm.into()), Some(b.into())],
            Attrs::new(),
        )
        .ok_or_else(rejected)?
    } else {
        if inputs.len() < 3 {
            inputs.push(None);
        }
        inputs[2] = Some(b.into());
        let mut attrs = node.attrs.clone();
        if node.op == "Gemm" && attrs.get("beta").is_none() {
            attrs.set("beta", Attr::Float(1.0));
        }
        add_in_place_of(g, p, &node.op, &inputs, attrs).ok_or_else(rejected)?
    };
    Ok(Some(out.into()))
}
