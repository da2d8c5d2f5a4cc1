//! One gradient rule per differentiable op: given the node and the gradients of its
//! outputs (`None`: an output the loss does not use), the gradients of its inputs
//! (`None`: an input the op is not differentiable in, such as a shape). Every rule builds
//! its result from catalogue ops through [`Cx`].
//!
//! The dispatch is here: [`backward`] for the core catalogue, then `single` (through
//! `backward_nn`) for the network families, each answering by op name; the longer rules
//! live in one file per op family, as in `ir::ops`, and the small graph-building
//! helpers they share (`mul`, `bin`, `sum_over`, ...) are here too.
use super::Cx;
use crate::error::{Error, Result};
use crate::ir::{Attr, Attrs, Node, NodeId, Value};

mod control;
mod conv;
mod elementwise;
mod loss;
mod matmul;
mod norm;
mod pool;
mod reduce;
mod select;
mod shape;
mod train;

use conv::conv;
use elementwise::gelu;
use loss::softmax_cross_entropy;
use matmul::matmul;
use norm::{batch_norm, instance_norm, layer_norm, rms_norm};
use pool::average_pool;
use reduce::{reduce, reduction, variadic_extremum};
use select::scatter_back;
use shape::{concat, pad, slice, split};

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
    if matches!(node.op.as_str(), "If" | "Loop" | "Scan") {
        return control::backward(cx, id, gys);
    }
    if node.op == "SoftmaxCrossEntropyLoss" {
        return softmax_cross_entropy(cx, id, gys);
    }
    if let Some(r) = backward_nn(cx, id, gys) {
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
        "Dropout" | "MseLoss" => train::backward(cx, &node, gy),
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

pub(super) type Grads = Vec<Option<Value>>;

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
pub(super) fn input(node: &Node, k: usize) -> Result<Value> {
    node.inputs
        .get(k)
        .copied()
        .flatten()
        .ok_or_else(|| Error::Graph(format!("input {k} is missing")))
}

pub(super) fn graph_err(e: String) -> Error {
    Error::Graph(e)
}

/// The values of a constant i64 input (axes, pads, repeats), if it is one.
pub(super) fn const_ints(cx: &Cx, v: Option<Value>) -> Option<Vec<i64>> {
    let v = v?;
    cx.g.node(v.node).data.as_ref().map(|t| t.to_i64_vec())
}

/// Applies `op` with optional inputs.
pub(super) fn op_opt(
    cx: &mut Cx,
    op: &str,
    inputs: &[Option<Value>],
    attrs: Attrs,
) -> Result<Value> {
    cx.g.apply_opt(op, inputs, attrs)
}

pub(super) fn mul(cx: &mut Cx, a: Value, b: Value) -> Result<Value> {
    cx.op("Mul", &[a, b], Attrs::new())
}

pub(super) fn bin(cx: &mut Cx, op: &str, a: Value, b: Value) -> Result<Value> {
    cx.op(op, &[a, b], Attrs::new())
}

pub(super) fn un(cx: &mut Cx, op: &str, a: Value) -> Result<Value> {
    cx.op(op, &[a], Attrs::new())
}

pub(super) fn keep(k: bool) -> Attrs {
    Attrs::new().with("keepdims", Attr::Int(k as i64))
}

/// Σ `v` over `axes` (none: `v` itself).
pub(super) fn sum_over(cx: &mut Cx, v: Value, axes: &[i64], keepdims: bool) -> Result<Value> {
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
