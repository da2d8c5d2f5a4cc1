//! One gradient rule per differentiable op: given the node and the gradients of its
//! outputs (`None`: an output the loss does not use), the gradients of its inputs
//! (`None`: an input the op is not differentiable in, such as a shape). Every rule builds
//! its result from catalogue ops through [`Cx`].
use super::Cx;
use crate::error::{Error, Result};
use crate::ir::ops::reduce::reduce_axes;
use crate::ir::{Attr, Attrs, DType, NodeId, Value};

/// The gradients of node `id`'s inputs from its outputs' gradients `gys`.
pub(crate) fn backward(
    cx: &mut Cx,
    id: NodeId,
    gys: &[Option<Value>],
) -> Result<Vec<Option<Value>>> {
    let node = cx.g.node(id).clone();
    let x = |k: usize| -> Result<Value> {
        node.inputs
            .get(k)
            .copied()
            .flatten()
            .ok_or_else(|| Error::Graph(format!("input {k} is missing")))
    };
    let y: Value = id.into();
    if node.op == "SoftmaxCrossEntropyLoss" {
        return softmax_cross_entropy(cx, id, gys);
    }
    if let Some(r) = super::rules_nn::backward_nn(cx, id, gys) {
        return r;
    }
    // Every op below has one output.
    let Some(gy) = gys.first().copied().flatten() else {
        return Err(Error::Graph(
            "only the first output of this op has a rule".into(),
        ));
    };
    let attrs = &node.attrs;
    let none = Attrs::new();
    let some = |v: Value| Ok(vec![Some(v)]);
    match node.op.as_str() {
        "Identity" => some(gy),
        "Dropout" | "MseLoss" => super::rules_train::backward(cx, &node, gy),
        "Neg" => some(cx.op("Neg", &[gy], none)?),
        "Add" | "Sub" => {
            let (a, b) = (x(0)?, x(1)?);
            let gb = if node.op == "Sub" {
                cx.op("Neg", &[gy], none.clone())?
            } else {
                gy
            };
            Ok(vec![
                Some(cx.unbroadcast(gy, a)?),
                Some(cx.unbroadcast(gb, b)?),
            ])
        }
        "Mul" => {
            let (a, b) = (x(0)?, x(1)?);
            let ga = cx.op("Mul", &[gy, b], none.clone())?;
            let gb = cx.op("Mul", &[gy, a], none)?;
            Ok(vec![
                Some(cx.unbroadcast(ga, a)?),
                Some(cx.unbroadcast(gb, b)?),
            ])
        }
        "Div" => {
            // d(a/b)/db = -(a/b)/b = -y/b.
            let (a, b) = (x(0)?, x(1)?);
            let ga = cx.op("Div", &[gy, b], none.clone())?;
            let yb = cx.op("Div", &[y, b], none.clone())?;
            let gb = cx.op("Mul", &[gy, yb], none.clone())?;
            let gb = cx.op("Neg", &[gb], none)?;
            Ok(vec![
                Some(cx.unbroadcast(ga, a)?),
                Some(cx.unbroadcast(gb, b)?),
            ])
        }
        "Pow" => {
            // d(a^b)/da = b·a^(b-1); d(a^b)/db = y·ln a.
            let (a, b) = (x(0)?, x(1)?);
            let one = cx.scalar(cx.ty(b).dtype, 1.0)?;
            let bm1 = cx.op("Sub", &[b, one], none.clone())?;
            let p = cx.op("Pow", &[a, bm1], none.clone())?;
            let ga = cx.op("Mul", &[p, b], none.clone())?;
            let ga = cx.op("Mul", &[gy, ga], none.clone())?;
            let ln = cx.op("Log", &[a], none.clone())?;
            let gb = cx.op("Mul", &[y, ln], none.clone())?;
            let gb = cx.op("Mul", &[gy, gb], none)?;
            Ok(vec![
                Some(cx.unbroadcast(ga, a)?),
                Some(cx.unbroadcast(gb, b)?),
            ])
        }
        "Exp" => some(cx.op("Mul", &[gy, y], none)?),
        "Log" => some(cx.op("Div", &[gy, x(0)?], none)?),
        "Sqrt" => {
            let two = cx.scalar(cx.ty(y).dtype, 2.0)?;
            let d = cx.op("Mul", &[y, two], none.clone())?;
            some(cx.op("Div", &[gy, d], none)?)
        }
        "Reciprocal" => {
            let yy = cx.op("Mul", &[y, y], none.clone())?;
            let g = cx.op("Mul", &[gy, yy], none.clone())?;
            some(cx.op("Neg", &[g], none)?)
        }
        "Abs" => {
            let s = cx.op("Sign", &[x(0)?], none.clone())?;
            some(cx.op("Mul", &[gy, s], none)?)
        }
        "Tanh" => {
            // 1 - y².
            let one = cx.scalar(cx.ty(y).dtype, 1.0)?;
            let yy = cx.op("Mul", &[y, y], none.clone())?;
            let d = cx.op("Sub", &[one, yy], none.clone())?;
            some(cx.op("Mul", &[gy, d], none)?)
        }
        "Sigmoid" => {
            // y·(1 - y).
            let one = cx.scalar(cx.ty(y).dtype, 1.0)?;
            let d = cx.op("Sub", &[one, y], none.clone())?;
            let d = cx.op("Mul", &[y, d], none.clone())?;
            some(cx.op("Mul", &[gy, d], none)?)
        }
        "Relu" => {
            let xv = x(0)?;
            let zero = cx.scalar(cx.ty(xv).dtype, 0.0)?;
            let pos = cx.op("Greater", &[xv, zero], none.clone())?;
            some(cx.op("Where", &[pos, gy, zero], none)?)
        }
        "LeakyRelu" => {
            let xv = x(0)?;
            let alpha = attrs.float_or("alpha", 0.01).map_err(Error::Graph)?;
            let dt = cx.ty(xv).dtype;
            let (zero, a) = (cx.scalar(dt, 0.0)?, cx.scalar(dt, alpha)?);
            let pos = cx.op("GreaterOrEqual", &[xv, zero], none.clone())?;
            let neg = cx.op("Mul", &[gy, a], none.clone())?;
            some(cx.op("Where", &[pos, gy, neg], none)?)
        }
        "Erf" => {
            // 2/√π · e^(-x²)
            let xv = x(0)?;
            let dt = cx.ty(xv).dtype;
            let xx = cx.op("Mul", &[xv, xv], none.clone())?;
            let e = cx.op("Neg", &[xx], none.clone())?;
            let e = cx.op("Exp", &[e], none.clone())?;
            let k = cx.scalar(dt, std::f64::consts::FRAC_2_SQRT_PI)?;
            let d = cx.op("Mul", &[e, k], none.clone())?;
            some(cx.op("Mul", &[gy, d], none)?)
        }
        "Gelu" => some(gelu(cx, x(0)?, gy, attrs)?),
        "Where" => {
            // The condition has no gradient; each branch gets gy where it was chosen.
            let (c, a, b) = (x(0)?, x(1)?, x(2)?);
            let zero = cx.scalar(cx.ty(gy).dtype, 0.0)?;
            let ga = cx.op("Where", &[c, gy, zero], none.clone())?;
            let gb = cx.op("Where", &[c, zero, gy], none)?;
            Ok(vec![
                None,
                Some(cx.unbroadcast(ga, a)?),
                Some(cx.unbroadcast(gb, b)?),
            ])
        }
        "Max" | "Min" if node.inputs.len() == 2 => {
            // gy to the operand that was chosen, to `a` on ties.
            let (a, b) = (x(0)?, x(1)?);
            let zero = cx.scalar(cx.ty(gy).dtype, 0.0)?;
            let from_a = cx.op("Equal", &[y, a], none.clone())?;
            let ga = cx.op("Where", &[from_a, gy, zero], none.clone())?;
            let gb = cx.op("Where", &[from_a, zero, gy], none)?;
            Ok(vec![
                Some(cx.unbroadcast(ga, a)?),
                Some(cx.unbroadcast(gb, b)?),
            ])
        }
        "Clip" => {
            // gy inside [min, max]; the bounds are not differentiated.
            let xv = x(0)?;
            let zero = cx.scalar(cx.ty(gy).dtype, 0.0)?;
            let mut inside: Option<Value> = None;
            for (k, cmp) in [(1, "GreaterOrEqual"), (2, "LessOrEqual")] {
                if let Some(bound) = node.inputs.get(k).copied().flatten() {
                    let m = cx.op(cmp, &[xv, bound], none.clone())?;
                    inside = Some(match inside {
                        Some(i) => cx.op("And", &[i, m], none.clone())?,
                        None => m,
                    });
                }
            }
            let g = match inside {
                Some(m) => cx.op("Where", &[m, gy, zero], none)?,
                None => gy,
            };
            Ok(vec![Some(g), None, None])
        }
        "Expand" => Ok(vec![Some(cx.unbroadcast(gy, x(0)?)?), None]),
        "Concat" => concat(cx, &node.inputs, attrs, gy),
        "MaxPool" => {
            // gy added at the argmax of each window (the op's Indices output, flat
            // over the whole input).
            let xv = x(0)?;
            let idx = id.out(1);
            let flat = cx.ints(&[-1])?;
            let i = cx.op("Reshape", &[idx, flat], none.clone())?;
            let u = cx.op("Reshape", &[gy, flat], none.clone())?;
            let z = cx.zeros_like(xv, &cx.ty(xv))?;
            let z = cx.op("Reshape", &[z, flat], none.clone())?;
            let add = Attrs::new().with("reduction", Attr::String("add".into()));
            let d = cx.op("ScatterElements", &[z, i, u], add)?;
            some(cx.reshape_like(d, xv)?)
        }
        "GlobalAveragePool" | "GlobalMaxPool"
            if attrs.int_or("block", 0).map_err(Error::Graph)? == 0 =>
        {
            let xv = x(0)?;
            let shape = cx.shape_of(xv)?;
            let g = cx.op("Expand", &[gy, shape], none.clone())?;
            if node.op == "GlobalMaxPool" {
                // gy to the positions equal to the maximum.
                let at_max = cx.op("Equal", &[xv, y], none.clone())?;
                let zero = cx.scalar(cx.ty(gy).dtype, 0.0)?;
                some(cx.op("Where", &[at_max, g, zero], none)?)
            } else {
                let count = cx.count_ratio(xv, y)?;
                some(cx.op("Div", &[g, count], none)?)
            }
        }
        "MatMul" => matmul(cx, x(0)?, x(1)?, gy, false, false, 1.0),
        "Gemm" => {
            let ta = attrs.int_or("transA", 0).map_err(Error::Graph)? != 0;
            let tb = attrs.int_or("transB", 0).map_err(Error::Graph)? != 0;
            let alpha = attrs.float_or("alpha", 1.0).map_err(Error::Graph)?;
            let beta = attrs.float_or("beta", 1.0).map_err(Error::Graph)?;
            let mut g = matmul(cx, x(0)?, x(1)?, gy, ta, tb, alpha)?;
            if let Some(c) = node.inputs.get(2).copied().flatten() {
                let gc = if beta == 1.0 {
                    gy
                } else {
                    let s = cx.scalar(cx.ty(gy).dtype, beta)?;
                    cx.op("Mul", &[gy, s], none)?
                };
                g.push(Some(cx.unbroadcast(gc, c)?));
            }
            Ok(g)
        }
        "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze" => {
            Ok(vec![Some(cx.reshape_like(gy, x(0)?)?), None])
        }
        "Transpose" => {
            let rank = cx.ty(y).rank();
            let perm: Vec<i64> = match attrs.get("perm") {
                Some(Attr::Ints(p)) => p.clone(),
                _ => (0..rank as i64).rev().collect(),
            };
            let mut inverse = vec![0i64; perm.len()];
            for (i, &p) in perm.iter().enumerate() {
                inverse[p as usize] = i as i64;
            }
            let t = Attrs::new().with("perm", Attr::Ints(inverse));
            some(cx.op("Transpose", &[gy], t)?)
        }
        "ReduceSum" | "ReduceMean" => reduce(cx, &node.op, x(0)?, &node.inputs, attrs, gy),
        "Softmax" => {
            // y·(gy - Σ gy·y) over the axis.
            let axis = attrs.int_or("axis", -1).map_err(Error::Graph)?;
            let a = cx.ints(&[axis])?;
            let gyy = cx.op("Mul", &[gy, y], none.clone())?;
            let s = cx.op("ReduceSum", &[gyy, a], none.clone())?;
            let d = cx.op("Sub", &[gy, s], none.clone())?;
            some(cx.op("Mul", &[y, d], none)?)
        }
        "LogSoftmax" => {
            // gy - e^y · Σ gy over the axis.
            let axis = attrs.int_or("axis", -1).map_err(Error::Graph)?;
            let a = cx.ints(&[axis])?;
            let s = cx.op("ReduceSum", &[gy, a], none.clone())?;
            let p = cx.op("Exp", &[y], none.clone())?;
            let ps = cx.op("Mul", &[p, s], none.clone())?;
            some(cx.op("Sub", &[gy, ps], none)?)
        }
        "Cast" => {
            let back = Attrs::new().with("to", Attr::String(cx.ty(x(0)?).dtype.to_string()));
            some(cx.op("Cast", &[gy], back)?)
        }
        op => Err(Error::Graph(format!("no gradient rule for {op}"))),
    }
}

/// `a` with its last two axes swapped.
fn swap_last(cx: &mut Cx, a: Value) -> Result<Value> {
    let r = cx.ty(a).rank();
    let mut perm: Vec<i64> = (0..r as i64).collect();
    perm.swap(r - 2, r - 1);
    cx.op(
        "Transpose",
        &[a],
        Attrs::new().with("perm", Attr::Ints(perm)),
    )
}

/// Gradients of `alpha · op(a) · op(b)` (`op` transposes the last two axes when asked);
/// batch axes broadcast and are summed back.
fn matmul(
    cx: &mut Cx,
    a: Value,
    b: Value,
    gy: Value,
    ta: bool,
    tb: bool,
    alpha: f64,
) -> Result<Vec<Option<Value>>> {
    if cx.ty(a).rank() < 2 || cx.ty(b).rank() < 2 {
        return Err(Error::Graph(
            "the rule covers operands of rank 2 and more (vectors are not yet covered)".into(),
        ));
    }
    let none = Attrs::new();
    let gy = if alpha == 1.0 {
        gy
    } else {
        let s = cx.scalar(cx.ty(gy).dtype, alpha)?;
        cx.op("Mul", &[gy, s], none.clone())?
    };
    // With A' = op(a), B' = op(b): dA' = gy·B'ᵀ, dB' = A'ᵀ·gy; op(b)ᵀ is b itself when
    // tb, and dA = dA'ᵀ when ta.
    let bt = if tb { b } else { swap_last(cx, b)? };
    let at = if ta { a } else { swap_last(cx, a)? };
    let ga = if ta {
        // dA = (gy·B'ᵀ)ᵀ = B'·gyᵀ
        let bp = if tb { swap_last(cx, b)? } else { b };
        let gyt = swap_last(cx, gy)?;
        cx.op("MatMul", &[bp, gyt], none.clone())?
    } else {
        cx.op("MatMul", &[gy, bt], none.clone())?
    };
    let gb = if tb {
        // dB = (A'ᵀ·gy)ᵀ = gyᵀ·A'
        let ap = if ta { swap_last(cx, a)? } else { a };
        let gyt = swap_last(cx, gy)?;
        cx.op("MatMul", &[gyt, ap], none)?
    } else {
        cx.op("MatMul", &[at, gy], none)?
    };
    Ok(vec![
        Some(cx.unbroadcast(ga, a)?),
        Some(cx.unbroadcast(gb, b)?),
    ])
}

/// ReduceSum / ReduceMean: `gy` brought back to the reduced axes and broadcast over them.
fn reduce(
    cx: &mut Cx,
    op: &str,
    xv: Value,
    inputs: &[Option<Value>],
    attrs: &Attrs,
    gy: Value,
) -> Result<Vec<Option<Value>>> {
    let none = Attrs::new();
    let xt = cx.ty(xv);
    let axes_input = match inputs.get(1).copied().flatten() {
        None => None,
        Some(v) => Some(cx.g.node(v.node).data.as_ref().map(|t| t.to_i64_vec())),
    };
    let axes = reduce_axes(&xt.shape, axes_input, attrs)
        .map_err(Error::Graph)?
        .ok_or_else(|| Error::Graph("the axes must be constant".into()))?;
    let keepdims = attrs.int_or("keepdims", 1).map_err(Error::Graph)? != 0;
    let mut g = gy;
    if !keepdims && !axes.is_empty() {
        let a: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
        let a = cx.ints(&a)?;
        g = cx.op("Unsqueeze", &[g, a], none.clone())?;
    }
    let shape = cx.shape_of(xv)?;
    g = cx.op("Expand", &[g, shape], none.clone())?;
    if op == "ReduceMean" {
        // The count as a run-time value: dims may be symbolic.
        let count = cx.count_ratio(xv, gy)?;
        g = cx.op("Div", &[g, count], none)?;
    }
    Ok(vec![Some(g), None])
}

/// Gelu: exact, Φ(x) + x·φ(x); with the tanh approximation, the derivative of
/// ½x(1 + tanh u), u = √(2/π)(x + 0.044715x³).
fn gelu(cx: &mut Cx, xv: Value, gy: Value, attrs: &Attrs) -> Result<Value> {
    let none = Attrs::new();
    let dt = cx.ty(xv).dtype;
    let approx = attrs
        .string_or("approximate", "none")
        .map_err(Error::Graph)?
        == "tanh";
    let half = cx.scalar(dt, 0.5)?;
    let one = cx.scalar(dt, 1.0)?;
    let d = if approx {
        let k = (2.0 / std::f64::consts::PI).sqrt();
        let (kc, c3) = (cx.scalar(dt, k)?, cx.scalar(dt, 3.0 * 0.044715)?);
        let c = cx.scalar(dt, 0.044715)?;
        let xx = cx.op("Mul", &[xv, xv], none.clone())?;
        let x3 = cx.op("Mul", &[xx, xv], none.clone())?;
        let cx3 = cx.op("Mul", &[c, x3], none.clone())?;
        let inner = cx.op("Add", &[xv, cx3], none.clone())?;
        let u = cx.op("Mul", &[kc, inner], none.clone())?;
        let t = cx.op("Tanh", &[u], none.clone())?;
        // d = ½(1 + t) + ½x(1 - t²)·k(1 + 3c·x²)
        let a = cx.op("Add", &[one, t], none.clone())?;
        let a = cx.op("Mul", &[half, a], none.clone())?;
        let tt = cx.op("Mul", &[t, t], none.clone())?;
        let sech2 = cx.op("Sub", &[one, tt], none.clone())?;
        let du = cx.op("Mul", &[c3, xx], none.clone())?;
        let du = cx.op("Add", &[one, du], none.clone())?;
        let du = cx.op("Mul", &[kc, du], none.clone())?;
        let b = cx.op("Mul", &[half, xv], none.clone())?;
        let b = cx.op("Mul", &[b, sech2], none.clone())?;
        let b = cx.op("Mul", &[b, du], none.clone())?;
        cx.op("Add", &[a, b], none.clone())?
    } else {
        // Φ(x) = ½(1 + erf(x/√2)), φ(x) = e^(-x²/2)/√(2π)
        let r2 = cx.scalar(dt, std::f64::consts::FRAC_1_SQRT_2)?;
        let z = cx.op("Mul", &[xv, r2], none.clone())?;
        let e = cx.op("Erf", &[z], none.clone())?;
        let cdf = cx.op("Add", &[one, e], none.clone())?;
        let cdf = cx.op("Mul", &[half, cdf], none.clone())?;
        let xx = cx.op("Mul", &[xv, xv], none.clone())?;
        let h = cx.op("Mul", &[xx, half], none.clone())?;
        let h = cx.op("Neg", &[h], none.clone())?;
        let pdf = cx.op("Exp", &[h], none.clone())?;
        let k = cx.scalar(dt, 1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
        let pdf = cx.op("Mul", &[pdf, k], none.clone())?;
        let xp = cx.op("Mul", &[xv, pdf], none.clone())?;
        cx.op("Add", &[cdf, xp], none.clone())?
    };
    cx.op("Mul", &[gy, d], none)
}

/// Concat: each input's slice of `gy` along the axis (the inputs' sizes along it must be
/// static).
fn concat(
    cx: &mut Cx,
    inputs: &[Option<Value>],
    attrs: &Attrs,
    gy: Value,
) -> Result<Vec<Option<Value>>> {
    let none = Attrs::new();
    let rank = cx.ty(gy).rank();
    let axis = attrs.int_or("axis", 0).map_err(Error::Graph)?;
    let axis = crate::ir::shape::norm_axis(axis, rank).map_err(Error::Graph)?;
    let mut at = 0i64;
    let mut out = vec![];
    for v in inputs {
        let Some(v) = *v else {
            out.push(None);
            continue;
        };
        let size =
            cx.ty(v).shape.dim(axis).fixed().ok_or_else(|| {
                Error::Graph(format!("input sizes along axis {axis} must be static"))
            })? as i64;
        let (starts, ends, ax) = (
            cx.ints(&[at])?,
            cx.ints(&[at + size])?,
            cx.ints(&[axis as i64])?,
        );
        out.push(Some(cx.op(
            "Slice",
            &[gy, starts, ends, ax],
            none.clone(),
        )?));
        at += size;
    }
    Ok(out)
}

/// SoftmaxCrossEntropyLoss over [N, C] scores and [N] labels (no weights, no
/// ignore_index): d loss / d scores = (softmax − onehot) scaled by the reduction; a
/// gradient reaching the log_prob output adds log-softmax's own.
fn softmax_cross_entropy(
    cx: &mut Cx,
    id: NodeId,
    gys: &[Option<Value>],
) -> Result<Vec<Option<Value>>> {
    let node = cx.g.node(id).clone();
    let none = Attrs::new();
    let (Some(scores), Some(labels)) = (node.inputs[0], node.inputs.get(1).copied().flatten())
    else {
        return Err(Error::Graph("scores and labels are required".into()));
    };
    if node.inputs.get(2).copied().flatten().is_some() || node.attrs.get("ignore_index").is_some() {
        return Err(Error::Graph(
            "the rule covers neither weights nor ignore_index".into(),
        ));
    }
    let st = cx.ty(scores);
    let classes = match (st.rank(), st.shape.dim(1).fixed()) {
        (2, Some(c)) => c,
        _ => {
            return Err(Error::Graph(format!(
                "the rule covers [N, C] scores with a static C, got {st}"
            )))
        }
    };
    let to = |dt: &str| Attrs::new().with("to", Attr::String(dt.to_string()));
    let dt = st.dtype.to_string();
    let p = cx.op("Exp", &[id.out(1)], none.clone())?;
    let mut total: Option<Value> = None;
    if let Some(gl) = gys.first().copied().flatten() {
        let reduction = node
            .attrs
            .string_or("reduction", "mean")
            .map_err(Error::Graph)?
            .to_string();
        // onehot[n, c] = (labels[n] == c)
        let range = cx.ints(&(0..classes as i64).collect::<Vec<_>>())?;
        let col = cx.ints(&[1])?;
        let l = cx.op("Unsqueeze", &[labels, col], none.clone())?;
        let l = if cx.ty(l).dtype == DType::I64 {
            l
        } else {
            cx.op("Cast", &[l], to("i64"))?
        };
        let eq = cx.op("Equal", &[l, range], none.clone())?;
        let onehot = cx.op("Cast", &[eq], to(&dt))?;
        let d = cx.op("Sub", &[p, onehot], none.clone())?;
        let g = match reduction.as_str() {
            "none" => {
                let gcol = cx.op("Unsqueeze", &[gl, col], none.clone())?;
                cx.op("Mul", &[d, gcol], none.clone())?
            }
            "sum" => cx.op("Mul", &[d, gl], none.clone())?,
            "mean" => {
                let n = cx.op("Size", &[labels], none.clone())?;
                let n = cx.op("Cast", &[n], to(&dt))?;
                let s = cx.op("Div", &[gl, n], none.clone())?;
                cx.op("Mul", &[d, s], none.clone())?
            }
            r => return Err(Error::Graph(format!("unknown reduction '{r}'"))),
        };
        total = Some(g);
    }
    if let Some(glp) = gys.get(1).copied().flatten() {
        let col = cx.ints(&[1])?;
        let s = cx.op("ReduceSum", &[glp, col], none.clone())?;
        let ps = cx.op("Mul", &[p, s], none.clone())?;
        let g = cx.op("Sub", &[glp, ps], none.clone())?;
        total = Some(match total {
            Some(t) => cx.op("Add", &[t, g], none)?,
            None => g,
        });
    }
    Ok(vec![total, None, None])
}
