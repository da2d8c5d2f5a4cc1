//! Gradient rules for the network families beyond the core catalogue of `rules.rs`:
//! convolutions of any rank and group, pools, normalizations, selections (Gather,
//! Slice, Pad, Tile, Split), CumSum, variadic sums and extrema, the remaining reductions
//! and the unary activations. [`backward_nn`] answers `None` for an op it has no rule for, so
//! `rules.rs` keeps the final word (and its error naming the op).
//!
//! Selections share one exact backward: the op applied to an "iota" (each element's
//! flat index in its input) says where every output element came from, and
//! ScatterElements with reduction "add" sums the output gradient back there, so
//! duplicates (a Gather of one row twice, Tile, reflect padding) add up.
use super::Cx;
use crate::error::{Error, Result};
use crate::ir::ops::reduce::reduce_axes;
use crate::ir::{Attr, Attrs, DType, Node, NodeId, TensorType, Value};
use crate::tensor::Tensor;

type Grads = Vec<Option<Value>>;

/// The gradients of node `id`'s inputs, or `None` when this file has no rule for its op.
pub(crate) fn backward_nn(cx: &mut Cx, id: NodeId, gys: &[Option<Value>]) -> Option<Result<Grads>> {
    let node = cx.g.node(id).clone();
    match node.op.as_str() {
        // Ops with several outputs: each takes whichever of its outputs have gradients.
        "LayerNormalization" => Some(layer_norm(cx, &node, id, gys)),
        "Split" => Some(split(cx, &node, id, gys)),
        _ => single(cx, &node, id, gys).transpose(),
    }
}

/// `node`'s input `k`, which must be present.
fn input(node: &Node, k: usize) -> Result<Value> {
    node.inputs
        .get(k)
        .copied()
        .flatten()
        .ok_or_else(|| Error::Graph(format!("input {k} is missing")))
}

fn graph_err(e: String) -> Error {
    Error::Graph(e)
}

/// The values of a constant i64 input (axes, pads, repeats), if it is one.
fn const_ints(cx: &Cx, v: Option<Value>) -> Option<Vec<i64>> {
    let v = v?;
    cx.g.node(v.node).data.as_ref().map(|t| t.to_i64_vec())
}

/// Applies `op` with optional inputs.
fn op_opt(cx: &mut Cx, op: &str, inputs: &[Option<Value>], attrs: Attrs) -> Result<Value> {
    Ok(cx.g.add_op(op, inputs, attrs, "")?.into())
}

fn mul(cx: &mut Cx, a: Value, b: Value) -> Result<Value> {
    cx.op("Mul", &[a, b], Attrs::new())
}

fn bin(cx: &mut Cx, op: &str, a: Value, b: Value) -> Result<Value> {
    cx.op(op, &[a, b], Attrs::new())
}

fn un(cx: &mut Cx, op: &str, a: Value) -> Result<Value> {
    cx.op(op, &[a], Attrs::new())
}

fn keep(k: bool) -> Attrs {
    Attrs::new().with("keepdims", Attr::Int(k as i64))
}

/// Σ `v` over `axes` (none: `v` itself).
fn sum_over(cx: &mut Cx, v: Value, axes: &[i64], keepdims: bool) -> Result<Value> {
    if axes.is_empty() {
        return Ok(v);
    }
    let a = cx.ints(axes)?;
    cx.op("ReduceSum", &[v, a], keep(keepdims))
}

/// The rules of single-output ops (`Ok(None)`: no rule here).
fn single(cx: &mut Cx, node: &Node, id: NodeId, gys: &[Option<Value>]) -> Result<Option<Grads>> {
    let y: Value = id.into();
    let attrs = &node.attrs;
    let x0 = || input(node, 0);
    let gy = || {
        gys.first()
            .copied()
            .flatten()
            .ok_or_else(|| Error::Graph("only the first output of this op has a rule".into()))
    };
    let one = |g: Value| Ok(Some(vec![Some(g)]));
    let float = |k: &str, d: f64| attrs.float_or(k, d).map_err(graph_err);
    Ok(match node.op.as_str() {
        "Conv" => Some(conv(cx, node, y, gy()?)?),
        "AveragePool" => Some(average_pool(cx, node, y, gy()?)?),
        "BatchNormalization" => Some(batch_norm(cx, node, gy()?)?),
        "RMSNormalization" => Some(rms_norm(cx, node, gy()?)?),
        "InstanceNormalization" => Some(instance_norm(cx, node, gy()?)?),
        "Gather" | "GatherElements" | "GatherND" | "ReverseSequence" => {
            let (xv, idx) = (x0()?, input(node, 1)?);
            let (op, a) = (node.op.clone(), attrs.clone());
            let g = scatter_back(cx, xv, gy()?, |cx, iota| cx.op(&op, &[iota, idx], a))?;
            Some(vec![Some(g), None])
        }
        "Tile" => {
            let (xv, reps) = (x0()?, input(node, 1)?);
            let g = scatter_back(cx, xv, gy()?, |cx, iota| {
                cx.op("Tile", &[iota, reps], Attrs::new())
            })?;
            Some(vec![Some(g), None])
        }
        "Slice" => Some(slice(cx, node, gy()?)?),
        "Trilu" => {
            // The kept triangle passes gy; the zeroed one has none.
            let mut ins = vec![Some(gy()?)];
            ins.extend(node.inputs.get(1).copied());
            let g = op_opt(cx, "Trilu", &ins, attrs.clone())?;
            Some(vec![Some(g), None])
        }
        "CumSum" => {
            // Each input element feeds the sums after it (before it, reversed): the
            // cumulative sum of gy the other way, with the same exclusivity.
            let reverse = attrs.int_or("reverse", 0).map_err(graph_err)? != 0;
            let a = attrs.clone().with("reverse", Attr::Int(!reverse as i64));
            let g = cx.op("CumSum", &[gy()?, input(node, 1)?], a)?;
            Some(vec![Some(g), None])
        }
        "Pad" => Some(pad(cx, node, gy()?)?),
        "Sum" | "Mean" => {
            let mut g = gy()?;
            if node.op == "Mean" {
                let n = cx.scalar(cx.ty(g).dtype, node.inputs.len() as f64)?;
                g = bin(cx, "Div", g, n)?;
            }
            let mut out = vec![];
            for v in node.inputs.iter() {
                out.push(match *v {
                    Some(v) => Some(cx.unbroadcast(g, v)?),
                    None => None,
                });
            }
            Some(out)
        }
        // Two operands are `rules.rs`'s; any other count comes here.
        "Max" | "Min" if node.inputs.len() != 2 => Some(variadic_extremum(cx, node, y, gy()?)?),
        "ReduceMax" | "ReduceMin" | "ReduceL1" | "ReduceL2" | "ReduceSumSquare"
        | "ReduceLogSumExp" | "ReduceLogSum" => Some(reduction(cx, node, y, gy()?)?),
        "Softplus" => {
            let s = un(cx, "Sigmoid", x0()?)?;
            one(mul(cx, gy()?, s)?)?
        }
        "Mish" => {
            // tanh(sp) + x·σ(x)·(1 − tanh²(sp)), sp = softplus(x).
            let xv = x0()?;
            let c1 = cx.scalar(cx.ty(xv).dtype, 1.0)?;
            let sp = un(cx, "Softplus", xv)?;
            let t = un(cx, "Tanh", sp)?;
            let tt = mul(cx, t, t)?;
            let sech2 = bin(cx, "Sub", c1, tt)?;
            let s = un(cx, "Sigmoid", xv)?;
            let d = mul(cx, xv, s)?;
            let d = mul(cx, d, sech2)?;
            let d = bin(cx, "Add", t, d)?;
            one(mul(cx, gy()?, d)?)?
        }
        "Sin" => {
            let c = un(cx, "Cos", x0()?)?;
            one(mul(cx, gy()?, c)?)?
        }
        "Cos" => {
            let s = un(cx, "Sin", x0()?)?;
            let g = mul(cx, gy()?, s)?;
            one(un(cx, "Neg", g)?)?
        }
        "Tan" => {
            // 1 + y²
            let dt = cx.ty(y).dtype;
            let c1 = cx.scalar(dt, 1.0)?;
            let yy = mul(cx, y, y)?;
            let d = bin(cx, "Add", c1, yy)?;
            one(mul(cx, gy()?, d)?)?
        }
        "Sinh" => {
            let c = un(cx, "Cosh", x0()?)?;
            one(mul(cx, gy()?, c)?)?
        }
        "Cosh" => {
            let s = un(cx, "Sinh", x0()?)?;
            one(mul(cx, gy()?, s)?)?
        }
        "Asin" | "Acos" | "Atan" | "Asinh" | "Acosh" | "Atanh" => {
            // asin: 1/√(1-x²), acos: its negative, atan: 1/(1+x²), asinh: 1/√(x²+1),
            // acosh: 1/√(x²-1), atanh: 1/(1-x²).
            let xv = x0()?;
            let c1 = cx.scalar(cx.ty(xv).dtype, 1.0)?;
            let xx = mul(cx, xv, xv)?;
            let (d, root) = match node.op.as_str() {
                "Asin" | "Acos" => (bin(cx, "Sub", c1, xx)?, true),
                "Atan" => (bin(cx, "Add", c1, xx)?, false),
                "Asinh" => (bin(cx, "Add", xx, c1)?, true),
                "Acosh" => (bin(cx, "Sub", xx, c1)?, true),
                _ => (bin(cx, "Sub", c1, xx)?, false),
            };
            let d = if root { un(cx, "Sqrt", d)? } else { d };
            let g = bin(cx, "Div", gy()?, d)?;
            one(if node.op == "Acos" {
                un(cx, "Neg", g)?
            } else {
                g
            })?
        }
        "Softsign" => {
            // 1/(1+|x|)²
            let xv = x0()?;
            let c1 = cx.scalar(cx.ty(xv).dtype, 1.0)?;
            let a = un(cx, "Abs", xv)?;
            let d = bin(cx, "Add", c1, a)?;
            let d = mul(cx, d, d)?;
            one(bin(cx, "Div", gy()?, d)?)?
        }
        "HardSwish" => {
            // x/3 + 1/2 on (-3, 3), 0 below, 1 above.
            let xv = x0()?;
            let dt = cx.ty(xv).dtype;
            let (c3, m3, third, half) = (
                cx.scalar(dt, 3.0)?,
                cx.scalar(dt, -3.0)?,
                cx.scalar(dt, 1.0 / 3.0)?,
                cx.scalar(dt, 0.5)?,
            );
            let (c0, c1) = (cx.scalar(dt, 0.0)?, cx.scalar(dt, 1.0)?);
            let mid = mul(cx, xv, third)?;
            let mid = bin(cx, "Add", mid, half)?;
            let above = bin(cx, "Greater", xv, c3)?;
            let below = bin(cx, "Less", xv, m3)?;
            let d = cx.op("Where", &[above, c1, mid], Attrs::new())?;
            let d = cx.op("Where", &[below, c0, d], Attrs::new())?;
            one(mul(cx, gy()?, d)?)?
        }
        "Elu" | "Celu" | "Selu" => {
            // Elu: alpha·e^x below 0; Celu: e^(x/alpha); Selu: gamma·(1 or alpha·e^x).
            let xv = x0()?;
            let dt = cx.ty(xv).dtype;
            let (alpha, gamma) = match node.op.as_str() {
                "Selu" => (
                    float("alpha", 1.673_263_192_176_818_8)?,
                    float("gamma", 1.050_701_022_148_132_3)?,
                ),
                _ => (float("alpha", 1.0)?, 1.0),
            };
            let (c0, a, c1) = (
                cx.scalar(dt, 0.0)?,
                cx.scalar(dt, alpha)?,
                cx.scalar(dt, 1.0)?,
            );
            let neg = if node.op == "Celu" {
                let z = bin(cx, "Div", xv, a)?;
                un(cx, "Exp", z)?
            } else {
                let e = un(cx, "Exp", xv)?;
                mul(cx, e, a)?
            };
            // Elu and Celu take the x ≥ 0 branch at 0, Selu the x > 0 one.
            let cmp = if node.op == "Selu" {
                "Greater"
            } else {
                "GreaterOrEqual"
            };
            let pos = bin(cx, cmp, xv, c0)?;
            let mut d = cx.op("Where", &[pos, c1, neg], Attrs::new())?;
            if gamma != 1.0 {
                let gm = cx.scalar(dt, gamma)?;
                d = mul(cx, d, gm)?;
            }
            one(mul(cx, gy()?, d)?)?
        }
        "HardSigmoid" => {
            // alpha where 0 < alpha·x + beta < 1.
            let xv = x0()?;
            let dt = cx.ty(xv).dtype;
            let (alpha, beta) = (float("alpha", 0.2)?, float("beta", 0.5)?);
            let (a, b) = (cx.scalar(dt, alpha)?, cx.scalar(dt, beta)?);
            let (c0, c1) = (cx.scalar(dt, 0.0)?, cx.scalar(dt, 1.0)?);
            let z = mul(cx, xv, a)?;
            let z = bin(cx, "Add", z, b)?;
            let lo = bin(cx, "Greater", z, c0)?;
            let hi = bin(cx, "Less", z, c1)?;
            let inside = bin(cx, "And", lo, hi)?;
            let ga = mul(cx, gy()?, a)?;
            one(cx.op("Where", &[inside, ga, c0], Attrs::new())?)?
        }
        "ThresholdedRelu" => {
            let xv = x0()?;
            let dt = cx.ty(xv).dtype;
            let (a, c0) = (cx.scalar(dt, float("alpha", 1.0)?)?, cx.scalar(dt, 0.0)?);
            let above = bin(cx, "Greater", xv, a)?;
            one(cx.op("Where", &[above, gy()?, c0], Attrs::new())?)?
        }
        "PRelu" => {
            // x ≥ 0: gy to x; below: slope·gy to x and x·gy to the slope.
            let (xv, slope) = (x0()?, input(node, 1)?);
            let g = gy()?;
            let c0 = cx.scalar(cx.ty(xv).dtype, 0.0)?;
            let neg = bin(cx, "Less", xv, c0)?;
            let gs = mul(cx, g, slope)?;
            let gx = cx.op("Where", &[neg, gs, g], Attrs::new())?;
            let gx = cx.unbroadcast(gx, xv)?;
            let xg = mul(cx, xv, g)?;
            let gsl = cx.op("Where", &[neg, xg, c0], Attrs::new())?;
            Some(vec![Some(gx), Some(cx.unbroadcast(gsl, slope)?)])
        }
        _ => None,
    })
}

// ---------------------------------------------------------------- selections

/// The gradient of a pure selection of `x` (each output element is some element of `x`):
/// `select` applied to an iota of `x`'s shape gives each output element's flat source
/// index, and `gy` is summed there.
fn scatter_back(
    cx: &mut Cx,
    x: Value,
    gy: Value,
    select: impl FnOnce(&mut Cx, Value) -> Result<Value>,
) -> Result<Value> {
    let none = Attrs::new();
    let n = cx.op("Size", &[x], none.clone())?;
    let (zero, step) = (cx.scalar(DType::I64, 0.0)?, cx.scalar(DType::I64, 1.0)?);
    let range = cx.op("Range", &[zero, n, step], none.clone())?;
    let shape = cx.shape_of(x)?;
    let iota = cx.op("Reshape", &[range, shape], none.clone())?;
    let from = select(cx, iota)?;
    let flat = cx.ints(&[-1])?;
    let from = cx.op("Reshape", &[from, flat], none.clone())?;
    let updates = cx.op("Reshape", &[gy, flat], none.clone())?;
    let z = cx.zeros_like(x, &cx.ty(x))?;
    let z = cx.op("Reshape", &[z, flat], none.clone())?;
    let add = Attrs::new().with("reduction", Attr::String("add".into()));
    let d = cx.op("ScatterElements", &[z, from, updates], add)?;
    cx.reshape_like(d, x)
}

/// Slice: with unit steps and constant bounds over static dims, `gy` padded back with
/// zeros; otherwise the general selection backward.
fn slice(cx: &mut Cx, node: &Node, gy: Value) -> Result<Grads> {
    let xv = input(node, 0)?;
    let at = |k: usize| node.inputs.get(k).copied().flatten();
    let dims = cx.ty(xv).shape.to_fixed();
    let (starts, ends) = (const_ints(cx, at(1)), const_ints(cx, at(2)));
    let axes = match at(3) {
        None => starts.as_ref().map(|s| (0..s.len() as i64).collect()),
        v => const_ints(cx, v),
    };
    let unit_steps = match at(4) {
        None => true,
        v => const_ints(cx, v).is_some_and(|s| s.iter().all(|&s| s == 1)),
    };
    let mut out = vec![None; node.inputs.len()];
    if let (Some(dims), Some(starts), Some(ends), Some(axes), true) =
        (dims, starts, ends, axes, unit_steps)
    {
        let r = dims.len();
        let mut pads = vec![0i64; 2 * r];
        for (i, &a) in axes.iter().enumerate() {
            let a = crate::ir::shape::norm_axis(a, r).map_err(graph_err)?;
            let d = dims[a] as i64;
            let clamp = |v: i64| if v < 0 { (v + d).max(0) } else { v.min(d) };
            let (s, e) = (clamp(starts[i]), clamp(ends[i]));
            pads[a] = s;
            pads[a + r] = d - e.max(s);
        }
        let p = cx.ints(&pads)?;
        out[0] = Some(cx.op("Pad", &[gy, p], Attrs::new())?);
        return Ok(out);
    }
    let ins: Vec<Option<Value>> = node.inputs[1..].to_vec();
    out[0] = Some(scatter_back(cx, xv, gy, |cx, iota| {
        let mut all = vec![Some(iota)];
        all.extend(ins);
        op_opt(cx, "Slice", &all, Attrs::new())
    })?);
    Ok(out)
}

/// Pad: in constant mode, `gy` cropped by the same pads (Pad with the pads negated);
/// the padding value gets the sum of `gy` over the padding. Other modes copy input
/// elements outward: the selection backward.
fn pad(cx: &mut Cx, node: &Node, gy: Value) -> Result<Grads> {
    let xv = input(node, 0)?;
    let mode = node
        .attrs
        .string_or("mode", "constant")
        .map_err(graph_err)?
        .to_string();
    let at = |k: usize| node.inputs.get(k).copied().flatten();
    let mut out = vec![None; node.inputs.len()];
    if mode != "constant" {
        let (pads, axes) = (input(node, 1)?, at(3));
        let a = node.attrs.clone();
        out[0] = Some(scatter_back(cx, xv, gy, |cx, iota| {
            op_opt(cx, "Pad", &[Some(iota), Some(pads), None, axes], a)
        })?);
        return Ok(out);
    }
    let pads = input(node, 1)?;
    let neg = cx.op("Neg", &[pads], Attrs::new())?;
    let gx = op_opt(cx, "Pad", &[Some(gy), Some(neg), None, at(3)], Attrs::new())?;
    if at(2).is_some() {
        let all = keep(false);
        let total = cx.op("ReduceSum", &[gy], all.clone())?;
        let inside = cx.op("ReduceSum", &[gx], all)?;
        let gv = bin(cx, "Sub", total, inside)?;
        out[2] = Some(cx.reshape_like(gv, input(node, 2)?)?);
    }
    out[0] = Some(gx);
    Ok(out)
}

/// Split: the outputs' gradients joined along the axis, zeros for an unused output.
fn split(cx: &mut Cx, node: &Node, id: NodeId, gys: &[Option<Value>]) -> Result<Grads> {
    let axis = node.attrs.int_or("axis", 0).map_err(graph_err)?;
    let mut parts = vec![];
    for (o, g) in gys.iter().enumerate() {
        let yo = id.out(o as u32);
        parts.push(match g {
            Some(g) => *g,
            None => {
                let ty = cx.ty(yo);
                cx.zeros_like(yo, &ty)?
            }
        });
    }
    let g = cx.op("Concat", &parts, Attrs::new().with("axis", Attr::Int(axis)))?;
    let mut out = vec![Some(g)];
    out.resize(node.inputs.len(), None);
    Ok(out)
}

// ---------------------------------------------------------------- variadic, reductions

/// Max/Min of any number of operands: gy to the first operand equal to the result.
fn variadic_extremum(cx: &mut Cx, node: &Node, y: Value, gy: Value) -> Result<Grads> {
    let c0 = cx.scalar(cx.ty(gy).dtype, 0.0)?;
    let mut taken: Option<Value> = None;
    let mut out = vec![];
    for v in node.inputs.iter() {
        let Some(v) = *v else {
            out.push(None);
            continue;
        };
        let eq = bin(cx, "Equal", v, y)?;
        let chosen = match taken {
            None => eq,
            Some(t) => {
                let free = un(cx, "Not", t)?;
                bin(cx, "And", eq, free)?
            }
        };
        taken = Some(match taken {
            None => eq,
            Some(t) => bin(cx, "Or", t, eq)?,
        });
        let g = cx.op("Where", &[chosen, gy, c0], Attrs::new())?;
        out.push(Some(cx.unbroadcast(g, v)?));
    }
    Ok(out)
}

/// `v` (shaped like the reduction's output) unsqueezed back over the reduced axes and
/// broadcast to `x`'s shape.
fn expand_back(cx: &mut Cx, v: Value, x: Value, axes: &[usize], keepdims: bool) -> Result<Value> {
    let mut g = v;
    if !keepdims && !axes.is_empty() {
        let a: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
        let a = cx.ints(&a)?;
        g = cx.op("Unsqueeze", &[g, a], Attrs::new())?;
    }
    let shape = cx.shape_of(x)?;
    cx.op("Expand", &[g, shape], Attrs::new())
}

/// ReduceMax/ReduceMin (gy split evenly between the elements equal to the result, so
/// that ties share it as the average of the one-sided derivatives would), ReduceL1,
/// ReduceL2 (x/y; 0 where y is 0), ReduceSumSquare, ReduceLogSumExp, ReduceLogSum.
fn reduction(cx: &mut Cx, node: &Node, y: Value, gy: Value) -> Result<Grads> {
    let xv = input(node, 0)?;
    let xt = cx.ty(xv);
    let axes_input = node
        .inputs
        .get(1)
        .copied()
        .flatten()
        .map(|v| const_ints(cx, Some(v)));
    let axes = reduce_axes(&xt.shape, axes_input, &node.attrs)
        .map_err(graph_err)?
        .ok_or_else(|| Error::Graph("the axes must be constant".into()))?;
    let keepdims = node.attrs.int_or("keepdims", 1).map_err(graph_err)? != 0;
    let dt = xt.dtype;
    let g = expand_back(cx, gy, xv, &axes, keepdims)?;
    let yb = expand_back(cx, y, xv, &axes, keepdims)?;
    let c0 = cx.scalar(dt, 0.0)?;
    let d = match node.op.as_str() {
        "ReduceMax" | "ReduceMin" => {
            let at = bin(cx, "Equal", xv, yb)?;
            let to = Attrs::new().with("to", Attr::String(dt.to_string()));
            let m = cx.op("Cast", &[at], to)?;
            let ax: Vec<i64> = axes.iter().map(|&a| a as i64).collect();
            let ties = sum_over(cx, m, &ax, true)?;
            let share = bin(cx, "Div", m, ties)?;
            return Ok(vec![Some(mul(cx, g, share)?), None]);
        }
        "ReduceL1" => un(cx, "Sign", xv)?,
        "ReduceL2" => {
            let zero = bin(cx, "Equal", yb, c0)?;
            let q = bin(cx, "Div", xv, yb)?;
            cx.op("Where", &[zero, c0, q], Attrs::new())?
        }
        "ReduceSumSquare" => {
            let two = cx.scalar(dt, 2.0)?;
            mul(cx, xv, two)?
        }
        "ReduceLogSumExp" => {
            let e = bin(cx, "Sub", xv, yb)?;
            un(cx, "Exp", e)?
        }
        // ReduceLogSum: 1 / Σx = e^-y.
        _ => {
            let n = un(cx, "Neg", yb)?;
            un(cx, "Exp", n)?
        }
    };
    Ok(vec![Some(mul(cx, g, d)?), None])
}

// ---------------------------------------------------------------- normalizations

/// `v` ([C]) shaped [C, 1, ...] to broadcast over axis 1 of a rank-`rank` tensor.
fn per_channel(cx: &mut Cx, v: Value, rank: usize) -> Result<Value> {
    if rank <= 2 {
        return Ok(v);
    }
    let a: Vec<i64> = (1..rank as i64 - 1).collect();
    let a = cx.ints(&a)?;
    cx.op("Unsqueeze", &[v, a], Attrs::new())
}

/// All axes of a rank-`rank` tensor but the channels (1).
fn non_channel_axes(rank: usize) -> Vec<i64> {
    (0..rank as i64).filter(|&a| a != 1).collect()
}

/// BatchNormalization (inference): y = (x − mean)·k + B, k = scale/√(var + ε). Every
/// input gets its true gradient.
fn batch_norm(cx: &mut Cx, node: &Node, gy: Value) -> Result<Grads> {
    let [xv, scale, _b, mean, var] = [0, 1, 2, 3, 4].map(|k| input(node, k));
    let (xv, scale, mean, var) = (xv?, scale?, mean?, var?);
    let eps = node.attrs.float_or("epsilon", 1e-5).map_err(graph_err)?;
    let r = cx.ty(xv).rank();
    let dt = cx.ty(xv).dtype;
    let e = cx.scalar(dt, eps)?;
    let ve = bin(cx, "Add", var, e)?;
    let sd = un(cx, "Sqrt", ve)?;
    let k = bin(cx, "Div", scale, sd)?;
    let kb = per_channel(cx, k, r)?;
    let gx = mul(cx, gy, kb)?;
    let axes = non_channel_axes(r);
    let gb = sum_over(cx, gy, &axes, false)?;
    let mb = per_channel(cx, mean, r)?;
    let xc = bin(cx, "Sub", xv, mb)?;
    let gxc = mul(cx, gy, xc)?;
    // Σ gy·(x − mean) per channel: scale's and var's gradients both follow from it.
    let s = sum_over(cx, gxc, &axes, false)?;
    let gscale = bin(cx, "Div", s, sd)?;
    let gk = mul(cx, gb, k)?;
    let gmean = un(cx, "Neg", gk)?;
    // d/dvar of scale·(var+ε)^(-1/2) = −½·scale·(var+ε)^(-3/2).
    let half = cx.scalar(dt, -0.5)?;
    let t = mul(cx, s, scale)?;
    let t = mul(cx, t, half)?;
    let ve3 = mul(cx, ve, sd)?;
    let gvar = bin(cx, "Div", t, ve3)?;
    Ok(vec![
        Some(gx),
        Some(gscale),
        Some(gb),
        Some(gmean),
        Some(gvar),
    ])
}

/// The gradient of x̂ = (x − mean)·inv over `axes` with respect to x, given dx̂:
/// inv·(dx̂ − mean(dx̂) − x̂·mean(dx̂·x̂)) (`centered`: without the mean(dx̂) term,
/// for RMS normalization, which does not subtract the mean).
fn normalized_grad(
    cx: &mut Cx,
    dxhat: Value,
    xhat: Value,
    inv: Value,
    axes: &[i64],
    centered: bool,
) -> Result<Value> {
    let a = cx.ints(axes)?;
    let m = |cx: &mut Cx, v: Value| cx.op("ReduceMean", &[v, a], keep(true));
    let dxx = mul(cx, dxhat, xhat)?;
    let mdxx = m(cx, dxx)?;
    let t = mul(cx, xhat, mdxx)?;
    let mut d = bin(cx, "Sub", dxhat, t)?;
    if centered {
        let md = m(cx, dxhat)?;
        d = bin(cx, "Sub", d, md)?;
    }
    mul(cx, d, inv)
}

/// The mean and 1/√(var + ε) of `x` over `axes` (kept), in x's dtype.
fn moments(cx: &mut Cx, x: Value, axes: &[i64], eps: f64) -> Result<(Value, Value)> {
    let a = cx.ints(axes)?;
    let mean = cx.op("ReduceMean", &[x, a], keep(true))?;
    let xc = bin(cx, "Sub", x, mean)?;
    let sq = mul(cx, xc, xc)?;
    let var = cx.op("ReduceMean", &[sq, a], keep(true))?;
    let e = cx.scalar(cx.ty(x).dtype, eps)?;
    let ve = bin(cx, "Add", var, e)?;
    let sd = un(cx, "Sqrt", ve)?;
    Ok((mean, un(cx, "Reciprocal", sd)?))
}

/// LayerNormalization: gradients from Y, and from the Mean and InvStdDev outputs when
/// the loss uses them.
fn layer_norm(cx: &mut Cx, node: &Node, id: NodeId, gys: &[Option<Value>]) -> Result<Grads> {
    let (xv, scale) = (input(node, 0)?, input(node, 1)?);
    let bias = node.inputs.get(2).copied().flatten();
    let xt = cx.ty(xv);
    let r = xt.rank();
    let axis = xt
        .shape
        .norm_axis(node.attrs.int_or("axis", -1).map_err(graph_err)?)
        .map_err(graph_err)?;
    let eps = node.attrs.float_or("epsilon", 1e-5).map_err(graph_err)?;
    let norm_axes: Vec<i64> = (axis as i64..r as i64).collect();
    let lead: Vec<i64> = (0..axis as i64).collect();
    let to_x = Attrs::new().with("to", Attr::String(xt.dtype.to_string()));
    // The op's own statistics when stashed in x's dtype; else recomputed in it, so that
    // an f32 stash does not cost an f64 gradient its precision.
    let (mean, inv) = if cx.ty(id.out(1)).dtype == xt.dtype {
        (id.out(1), id.out(2))
    } else {
        moments(cx, xv, &norm_axes, eps)?
    };
    let xc = bin(cx, "Sub", xv, mean)?;
    let xhat = mul(cx, xc, inv)?;
    let mut gx: Option<Value> = None;
    let mut out = vec![None; node.inputs.len()];
    if let Some(gy) = gys.first().copied().flatten() {
        let dxhat = mul(cx, gy, scale)?;
        gx = Some(normalized_grad(cx, dxhat, xhat, inv, &norm_axes, true)?);
        let gyx = mul(cx, gy, xhat)?;
        let gs = sum_over(cx, gyx, &lead, false)?;
        out[1] = Some(cx.unbroadcast(gs, scale)?);
        if let Some(b) = bias {
            let gb = sum_over(cx, gy, &lead, false)?;
            out[2] = Some(cx.unbroadcast(gb, b)?);
        }
    } else {
        // Only the statistics are used: Scale and B get zeros.
        out[1] = Some(cx.zeros_like(scale, &cx.ty(scale))?);
        if let Some(b) = bias {
            out[2] = Some(cx.zeros_like(b, &cx.ty(b))?);
        }
    }
    // d mean/dx = 1/n; d inv/dx = −inv³·(x − mean)/n = −inv²·x̂/n.
    let n = cx.count_ratio(xv, id.out(1))?;
    let mut extra = |cx: &mut Cx, g: Value| -> Result<()> {
        gx = Some(match gx {
            Some(t) => bin(cx, "Add", t, g)?,
            None => {
                let shape = cx.shape_of(xv)?;
                cx.op("Expand", &[g, shape], Attrs::new())?
            }
        });
        Ok(())
    };
    if let Some(gm) = gys.get(1).copied().flatten() {
        let gm = cx.op("Cast", &[gm], to_x.clone())?;
        let g = bin(cx, "Div", gm, n)?;
        extra(cx, g)?;
    }
    if let Some(gi) = gys.get(2).copied().flatten() {
        let gi = cx.op("Cast", &[gi], to_x)?;
        let ii = mul(cx, inv, inv)?;
        let t = mul(cx, gi, ii)?;
        let t = mul(cx, t, xhat)?;
        let t = bin(cx, "Div", t, n)?;
        let g = un(cx, "Neg", t)?;
        extra(cx, g)?;
    }
    out[0] = gx;
    Ok(out)
}

/// RMSNormalization: y = x·inv·scale, inv = 1/√(mean(x²) + ε) over the axes from `axis`.
fn rms_norm(cx: &mut Cx, node: &Node, gy: Value) -> Result<Grads> {
    let (xv, scale) = (input(node, 0)?, input(node, 1)?);
    let xt = cx.ty(xv);
    let r = xt.rank();
    let axis = xt
        .shape
        .norm_axis(node.attrs.int_or("axis", -1).map_err(graph_err)?)
        .map_err(graph_err)?;
    let eps = node.attrs.float_or("epsilon", 1e-5).map_err(graph_err)?;
    let norm_axes: Vec<i64> = (axis as i64..r as i64).collect();
    let lead: Vec<i64> = (0..axis as i64).collect();
    let a = cx.ints(&norm_axes)?;
    let sq = mul(cx, xv, xv)?;
    let ms = cx.op("ReduceMean", &[sq, a], keep(true))?;
    let e = cx.scalar(xt.dtype, eps)?;
    let ms = bin(cx, "Add", ms, e)?;
    let rms = un(cx, "Sqrt", ms)?;
    let inv = un(cx, "Reciprocal", rms)?;
    let xhat = mul(cx, xv, inv)?;
    let dxhat = mul(cx, gy, scale)?;
    let gx = normalized_grad(cx, dxhat, xhat, inv, &norm_axes, false)?;
    let gyx = mul(cx, gy, xhat)?;
    let gs = sum_over(cx, gyx, &lead, false)?;
    Ok(vec![Some(gx), Some(cx.unbroadcast(gs, scale)?)])
}

/// InstanceNormalization: each (n, c) plane normalized over the spatial axes, then
/// scaled and shifted per channel.
fn instance_norm(cx: &mut Cx, node: &Node, gy: Value) -> Result<Grads> {
    let (xv, scale) = (input(node, 0)?, input(node, 1)?);
    let r = cx.ty(xv).rank();
    let eps = node.attrs.float_or("epsilon", 1e-5).map_err(graph_err)?;
    let spatial: Vec<i64> = (2..r as i64).collect();
    let (mean, inv) = moments(cx, xv, &spatial, eps)?;
    let xc = bin(cx, "Sub", xv, mean)?;
    let xhat = mul(cx, xc, inv)?;
    let sb = per_channel(cx, scale, r)?;
    let dxhat = mul(cx, gy, sb)?;
    let gx = normalized_grad(cx, dxhat, xhat, inv, &spatial, true)?;
    let axes = non_channel_axes(r);
    let gyx = mul(cx, gy, xhat)?;
    let gs = sum_over(cx, gyx, &axes, false)?;
    let gb = sum_over(cx, gy, &axes, false)?;
    Ok(vec![Some(gx), Some(gs), Some(gb)])
}

// ---------------------------------------------------------------- convolutions, pools

/// Per-axis window geometry of a Conv or pool, with every dim static.
struct Geometry {
    kernel: Vec<i64>,
    strides: Vec<i64>,
    dilations: Vec<i64>,
    /// Explicit pads [begin..., end...] (auto_pad resolved).
    pads: Vec<i64>,
    input: Vec<i64>,
    output: Vec<i64>,
}

impl Geometry {
    fn new(attrs: &Attrs, kernel: Vec<i64>, input: Vec<i64>, output: Vec<i64>) -> Result<Self> {
        let k = kernel.len();
        let per_axis = |name: &str, n: usize, d: i64| -> Result<Vec<i64>> {
            match attrs.ints(name).map_err(graph_err)? {
                Some(v) if v.len() == n => Ok(v.to_vec()),
                Some(v) => Err(Error::Graph(format!(
                    "{name} has {} values, {n} needed",
                    v.len()
                ))),
                None => Ok(vec![d; n]),
            }
        };
        let strides = per_axis("strides", k, 1)?;
        let dilations = per_axis("dilations", k, 1)?;
        let mut pads = per_axis("pads", 2 * k, 0)?;
        match attrs.string_or("auto_pad", "NOTSET").map_err(graph_err)? {
            "NOTSET" => {}
            "VALID" => pads = vec![0; 2 * k],
            same @ ("SAME_UPPER" | "SAME_LOWER") => {
                // As the op resolves it: the output is ⌈n / stride⌉.
                for i in 0..k {
                    let ext = (kernel[i] - 1) * dilations[i] + 1;
                    let o = (input[i] + strides[i] - 1) / strides[i];
                    let total = ((o.max(1) - 1) * strides[i] + ext - input[i]).max(0);
                    let small = total / 2;
                    (pads[i], pads[i + k]) = if same == "SAME_UPPER" {
                        (small, total - small)
                    } else {
                        (total - small, small)
                    };
                }
            }
            other => return Err(Error::Graph(format!("unknown auto_pad '{other}'"))),
        }
        Ok(Geometry {
            kernel,
            strides,
            dilations,
            pads,
            input,
            output,
        })
    }

    /// The attributes of the transposed convolution that spreads each output position
    /// back over its window, sized exactly like the input: it crops (pads) or extends
    /// (output_padding) the end of its full output as needed.
    fn transpose_attrs(&self, group: i64) -> Result<Attrs> {
        let k = self.kernel.len();
        let (mut pads, mut extra) = (vec![0; 2 * k], vec![0; k]);
        for i in 0..k {
            let full = (self.output[i] - 1) * self.strides[i]
                + (self.kernel[i] - 1) * self.dilations[i]
                + 1;
            let begin = self.pads[i];
            pads[i] = begin;
            pads[i + k] = (full - begin - self.input[i]).max(0);
            extra[i] = (self.input[i] + begin - full).max(0);
            if extra[i] >= self.strides[i].max(self.dilations[i]) {
                return Err(Error::Graph(format!(
                    "axis {i}: the window geometry leaves {} trailing input positions unused",
                    extra[i]
                )));
            }
        }
        Ok(Attrs::new()
            .with("strides", Attr::Ints(self.strides.clone()))
            .with("dilations", Attr::Ints(self.dilations.clone()))
            .with("pads", Attr::Ints(pads))
            .with("output_padding", Attr::Ints(extra))
            .with("group", Attr::Int(group)))
    }
}

/// Static dims `from..` of `v`, as i64, or an error naming what needs them.
fn fixed_from(cx: &Cx, v: Value, from: usize, what: &str) -> Result<Vec<i64>> {
    let t = cx.ty(v);
    (from..t.rank())
        .map(|i| {
            t.shape
                .dim(i)
                .fixed()
                .map(|d| d as i64)
                .ok_or_else(|| Error::Graph(format!("the rule needs static {what}, got {t}")))
        })
        .collect()
}

/// Conv of any spatial rank and group: the data gradient is the transposed
/// convolution of `gy` with the same weights and group; the filter gradient a
/// convolution of the input with `gy` as the filter (batch and channels swapped, strides
/// and dilations swapped, the groups kept apart by folding them into the channels),
/// cropped to the kernel; the bias gradient `gy` summed over all but the channels.
fn conv(cx: &mut Cx, node: &Node, y: Value, gy: Value) -> Result<Grads> {
    let none = Attrs::new();
    let (xv, w) = (input(node, 0)?, input(node, 1)?);
    let r = cx.ty(xv).rank();
    if r < 3 {
        return Err(Error::Graph("X must be [N, C, D1, ...]".into()));
    }
    let group = node.attrs.int_or("group", 1).map_err(graph_err)?;
    let geo = Geometry::new(
        &node.attrs,
        fixed_from(cx, w, 2, "kernel dims")?,
        fixed_from(cx, xv, 2, "spatial dims")?,
        fixed_from(cx, y, 2, "spatial dims")?,
    )?;
    let dx = cx.op("ConvTranspose", &[gy, w], geo.transpose_attrs(group)?)?;
    let spatial: Vec<i64> = (2..r as i64).collect();
    let mut swap: Vec<i64> = vec![1, 0];
    swap.extend(&spatial);
    let perm = |p: Vec<i64>| Attrs::new().with("perm", Attr::Ints(p));
    let (xs, gs) = if group == 1 {
        (
            cx.op("Transpose", &[xv], perm(swap.clone()))?,
            cx.op("Transpose", &[gy], perm(swap.clone()))?,
        )
    } else {
        // x [N, G·Cg, sp] → [Cg, G·N, sp]; gy [N, G·Mg, osp] → [G·Mg, N, osp]: group g
        // of the filter-gradient convolution pairs x's group g with gy's.
        let c = fixed_from(cx, xv, 1, "channels")?[0];
        let m = fixed_from(cx, w, 0, "output channels")?[0];
        let (cg, mg) = (c / group, m / group);
        let split = |a: i64, b: i64, sp: &[i64]| {
            let mut s = vec![-1, a, b];
            s.extend(sp);
            s
        };
        let rest: Vec<i64> = (3..r as i64 + 1).collect();
        let s = cx.ints(&split(group, cg, &geo.input))?;
        let xs = cx.op("Reshape", &[xv, s], none.clone())?;
        let xs = cx.op(
            "Transpose",
            &[xs],
            perm([vec![2, 1, 0], rest.clone()].concat()),
        )?;
        let s = cx.ints(&[vec![cg, -1], geo.input.clone()].concat())?;
        let xs = cx.op("Reshape", &[xs, s], none.clone())?;
        let s = cx.ints(&split(group, mg, &geo.output))?;
        let gs = cx.op("Reshape", &[gy, s], none.clone())?;
        let gs = cx.op("Transpose", &[gs], perm([vec![1, 2, 0], rest].concat()))?;
        let s = cx.ints(&[vec![m, -1], geo.output.clone()].concat())?;
        let gs = cx.op("Reshape", &[gs, s], none.clone())?;
        (xs, gs)
    };
    let filt = Attrs::new()
        .with("strides", Attr::Ints(geo.dilations.clone()))
        .with("dilations", Attr::Ints(geo.strides.clone()))
        .with("pads", Attr::Ints(geo.pads.clone()))
        .with("group", Attr::Int(group));
    let dw = cx.op("Conv", &[xs, gs], filt)?;
    let (starts, ends, axes) = (
        cx.ints(&vec![0; geo.kernel.len()])?,
        cx.ints(&geo.kernel)?,
        cx.ints(&spatial)?,
    );
    let dw = cx.op("Slice", &[dw, starts, ends, axes], none)?;
    let dw = cx.op("Transpose", &[dw], perm(swap))?;
    let mut out = vec![Some(dx), Some(dw)];
    if node.inputs.get(2).copied().flatten().is_some() {
        let a: Vec<i64> = non_channel_axes(r);
        out.push(Some(sum_over(cx, gy, &a, false)?));
    }
    Ok(out)
}

/// AveragePool (any spatial rank, pads, strides, dilations, ceil_mode, either
/// count_include_pad): gy divided by each window's count (static: it depends only on
/// the geometry), spread back over the window by a transposed convolution with a
/// kernel of ones, one group per channel.
fn average_pool(cx: &mut Cx, node: &Node, y: Value, gy: Value) -> Result<Grads> {
    let attrs = &node.attrs;
    if attrs.int_or("block", 0).map_err(graph_err)? != 0 {
        return Err(Error::Graph(
            "the rule covers the plain layout (block 0)".into(),
        ));
    }
    let xv = input(node, 0)?;
    let xt = cx.ty(xv);
    let kernel = attrs
        .ints("kernel_shape")
        .map_err(graph_err)?
        .ok_or_else(|| Error::Graph("kernel_shape is required".into()))?
        .to_vec();
    let c = fixed_from(cx, xv, 1, "channels")?[0];
    let geo = Geometry::new(
        attrs,
        kernel.clone(),
        fixed_from(cx, xv, 2, "spatial dims")?,
        fixed_from(cx, y, 2, "spatial dims")?,
    )?;
    let include_pad = attrs.int_or("count_include_pad", 0).map_err(graph_err)? != 0;
    let k = kernel.len();
    // Per axis, how many taps of the window at each output position count: inside the
    // input, or (count_include_pad) inside its explicit padding.
    let counts: Vec<Vec<f64>> = (0..k)
        .map(|i| {
            let (lo, hi) = if include_pad {
                (-geo.pads[i], geo.input[i] + geo.pads[i + k])
            } else {
                (0, geo.input[i])
            };
            (0..geo.output[i])
                .map(|o| {
                    (0..kernel[i])
                        .map(|t| o * geo.strides[i] + t * geo.dilations[i] - geo.pads[i])
                        .filter(|p| (lo..hi).contains(p))
                        .count() as f64
                })
                .collect()
        })
        .collect();
    let out_dims: Vec<usize> = geo.output.iter().map(|&d| d as usize).collect();
    let scale: Vec<f64> = ndarray::indices(ndarray::IxDyn(&out_dims))
        .into_iter()
        .map(|o| {
            let n: f64 = (0..k).map(|i| counts[i][o[i]]).product();
            // A window with nothing in it is NaN forward and depends on no input.
            if n > 0.0 {
                1.0 / n
            } else {
                0.0
            }
        })
        .collect();
    let mut sdims = vec![1, 1];
    sdims.extend(&out_dims);
    let t = Tensor::from_f64s(xt.dtype, &sdims, &scale).map_err(graph_err)?;
    let name = cx.g.fresh_name("grad_pool_scale");
    let scale: Value =
        cx.g.add_constant(
            &name,
            TensorType::new(xt.dtype, crate::ir::Shape::fixed(&sdims)),
            t,
        )?
        .into();
    let g = mul(cx, gy, scale)?;
    let mut wdims = vec![c as usize, 1];
    wdims.extend(kernel.iter().map(|&d| d as usize));
    let ones = cx.constant(
        &TensorType::new(xt.dtype, crate::ir::Shape::fixed(&wdims)),
        1.0,
    )?;
    let dx = cx.op("ConvTranspose", &[g, ones], geo.transpose_attrs(c)?)?;
    Ok(vec![Some(dx)])
}
