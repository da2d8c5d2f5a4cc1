//! Gradients through control flow. Each rule builds a closed "vector-Jacobian product"
//! graph ([`vjp_graph`]) of a forward body: its parameters are the body's, then one
//! cotangent per output whose gradient is wanted; its outputs are the gradients of the
//! body's float parameters, from [`grad`](crate::autodiff::grad) of Σ sum(yₖ·cotₖ).
//! The forward body is recomputed inside it (nothing is saved between the passes).
//!
//! - `If`: a new `If` on the same condition whose branches are the branches' VJP graphs;
//!   the captures and the cotangents are its captures.
//! - `Loop` and `Scan` with a trip count fixed in the graph (a constant `M`, no `cond` or
//!   a constant true one and a body whose condition stays a constant true; a scan axis of
//!   fixed length): the forward is unrolled into one closed graph, whose VJP graph is
//!   spliced into the parent. Unrolling keeps every iteration's values for the backward
//!   (what a reverse loop over stacked values would store) and lets the backward use
//!   the ordinary rules and passes; its cost is a graph proportional to the trip count.
use std::sync::Arc;

use super::super::{grad, Cx};
use crate::error::{Error, Result};
use crate::ir::{Attr, Attrs, DType, Graph, Node, NodeId, TensorType, Value};
use crate::tensor::Tensor;

type Grads = Vec<Option<Value>>;

/// The gradients of control-flow node `id`'s inputs.
pub(super) fn backward(cx: &mut Cx, id: NodeId, gys: &[Option<Value>]) -> Result<Grads> {
    let node = cx.g.node(id).clone();
    match node.op.as_str() {
        "If" => if_grad(cx, &node, gys),
        "Loop" => loop_grad(cx, &node, gys),
        "Scan" => scan_grad(cx, &node, gys),
        op => Err(Error::Graph(format!("{op} is not control flow"))),
    }
}

fn body<'a>(node: &'a Node, name: &str) -> Result<&'a Arc<Graph>> {
    node.attrs
        .graph(name)
        .map_err(Error::Graph)?
        .ok_or_else(|| Error::Graph(format!("no {name} attribute")))
}

fn count_attr(node: &Node, name: &str) -> Result<usize> {
    let v = node.attrs.int_or(name, 0).map_err(Error::Graph)?;
    usize::try_from(v).map_err(|_| Error::Graph(format!("{name} must be >= 0, got {v}")))
}

/// `body` inlined into `g` with its parameters bound to `args` (a body with variables
/// has no gradient rule: inlining refuses it).
fn inline(g: &mut Graph, body: &Graph, args: &[Value]) -> Result<Vec<Value>> {
    g.inline(body, args, &body.name)
}

/// The VJP graph of closed graph `f` for the outputs `wanted` (see the module comment);
/// its outputs are the gradients of `f`'s float parameters, in order.
fn vjp_graph(f: &Graph, wanted: &[usize]) -> Result<Graph> {
    let mut g = Graph::new(&format!("{}.vjp", f.name));
    let mut params = vec![];
    for p in f.inputs() {
        let n = f.node(p);
        params.push(Value::from(g.add_parameter(&n.name, n.outputs[0].clone())?));
    }
    let ys = inline(&mut g, f, &params)?;
    let float: Vec<Value> = params
        .iter()
        .copied()
        .filter(|&p| g.value_type(p).is_ok_and(|t| t.dtype.is_float()))
        .collect();
    let mut totals: Vec<Option<Value>> = vec![None; float.len()];
    for &k in wanted {
        let y = *ys
            .get(k)
            .ok_or_else(|| Error::Graph(format!("no body output {k}")))?;
        let ty = g.value_type(y)?.clone();
        let name = g.fresh_name(&format!("cotangent{k}"));
        let cot: Value = g.add_parameter(&name, ty)?.into();
        if float.is_empty() {
            continue;
        }
        let prod = g.apply("Mul", &[y, cot], Attrs::new())?;
        let keep = Attrs::new().with("keepdims", Attr::Int(0));
        let loss = g.apply("ReduceSum", &[prod], keep)?;
        for (total, gv) in totals.iter_mut().zip(grad(&mut g, loss, &float)?) {
            *total = Some(match *total {
                Some(t) => g.apply("Add", &[t, gv], Attrs::new())?,
                None => gv,
            });
        }
    }
    for (k, (&p, total)) in float.iter().zip(totals).enumerate() {
        let v = match total {
            Some(v) => v,
            // No wanted output: zero gradients, shaped like the parameter.
            None => {
                let shape = g.apply("Shape", &[p], Attrs::new())?;
                let ty = g.value_type(p)?.clone();
                let attrs = Attrs::new()
                    .with("value", Attr::Float(0.0))
                    .with("dtype", Attr::String(ty.dtype.to_string()));
                g.apply("ConstantOfShape", &[shape], attrs)?
            }
        };
        g.add_output(&format!("grad{k}"), v)?;
    }
    Ok(g)
}

/// Which outputs have a gradient, and those gradients.
fn wanted(gys: &[Option<Value>]) -> (Vec<usize>, Vec<Value>) {
    gys.iter()
        .enumerate()
        .filter_map(|(k, g)| g.map(|g| (k, g)))
        .unzip()
}

/// The gradient for each of `operands` (those of a float type take the next of `grads`).
fn spread(cx: &Cx, operands: &[Option<Value>], grads: &[Value]) -> Grads {
    let mut it = grads.iter();
    operands
        .iter()
        .map(|v| {
            let v = (*v)?;
            cx.g.value_type(v)
                .is_ok_and(|t| t.dtype.is_float())
                .then(|| it.next().copied())
                .flatten()
        })
        .collect()
}

fn if_grad(cx: &mut Cx, node: &Node, gys: &[Option<Value>]) -> Result<Grads> {
    let (k, cots) = wanted(gys);
    let then_vjp = vjp_graph(body(node, "then_branch")?, &k)?;
    let else_vjp = vjp_graph(body(node, "else_branch")?, &k)?;
    let captures = node.inputs.get(1..).unwrap_or_default();
    let mut ins: Vec<Option<Value>> = node.inputs.clone();
    ins.extend(cots.iter().map(|&c| Some(c)));
    let attrs = Attrs::new()
        .with("then_branch", Attr::Graph(Arc::new(then_vjp)))
        .with("else_branch", Attr::Graph(Arc::new(else_vjp)))
        .with("captures", Attr::Int((captures.len() + cots.len()) as i64));
    let id = cx.g.add_op("If", &ins, attrs, "")?;
    let n = cx.g.node(id).outputs.len();
    let grads: Vec<Value> = (0..n as u32).map(|o| id.out(o)).collect();
    let mut out = vec![None];
    out.extend(spread(cx, captures, &grads));
    Ok(out)
}

/// The scalar constant `v` of `dtype` in `g`.
fn scalar(g: &mut Graph, dtype: DType, v: i64) -> Result<Value> {
    let t = Tensor::from_i64s(dtype, &[], &[v]).map_err(Error::Graph)?;
    let name = g.fresh_name("unrolled");
    Ok(g.add_constant_value(&name, t)?.into())
}

/// The value of a one-element constant operand, if it is one.
fn constant_value(g: &Graph, v: Option<Value>) -> Option<i64> {
    let n = g.node(v?.node);
    let t = n.data.as_deref().filter(|_| n.op == "Constant")?;
    match t.to_i64_vec().as_slice() {
        [x] => Some(*x),
        _ => None,
    }
}

/// A closed graph with parameters typed like `operands`.
fn closed_graph(cx: &Cx, name: &str, operands: &[Option<Value>]) -> Result<(Graph, Vec<Value>)> {
    let mut f = Graph::new(name);
    let mut params = vec![];
    for (k, v) in operands.iter().enumerate() {
        let v = v.ok_or_else(|| Error::Graph(format!("operand {k} is missing")))?;
        let ty: TensorType = cx.g.value_type(v)?.clone();
        params.push(f.add_parameter(&format!("x{k}"), ty)?.into());
    }
    Ok((f, params))
}

/// Rows stacked along `axis` (each row gains that axis).
fn stack(f: &mut Graph, rows: &[Value], axis: usize) -> Result<Value> {
    let axes = f.ints("axis", &[axis as i64])?;
    let rows = rows
        .iter()
        .map(|&r| f.apply("Unsqueeze", &[r, axes], Attrs::new()))
        .collect::<Result<Vec<_>>>()?;
    f.apply(
        "Concat",
        &rows,
        Attrs::new().with("axis", Attr::Int(axis as i64)),
    )
}

/// The VJP of closed graph `f` spliced into the parent with `args` then the cotangents.
fn splice_vjp(cx: &mut Cx, f: &Graph, args: &[Value], gys: &[Option<Value>]) -> Result<Vec<Value>> {
    let (k, cots) = wanted(gys);
    let vjp = vjp_graph(f, &k)?;
    let mut all = args.to_vec();
    all.extend(cots);
    inline(cx.g, &vjp, &all)
}

fn loop_grad(cx: &mut Cx, node: &Node, gys: &[Option<Value>]) -> Result<Grads> {
    let b = body(node, "body")?;
    let caps = count_attr(node, "captures")?;
    let trips = constant_value(cx.g, node.inputs.first().copied().flatten());
    let cond_ok = node.inputs.get(1).copied().flatten().is_none()
        || constant_value(cx.g, node.inputs[1]) == Some(1);
    let body_cond = b.outputs().first().map(|o| o.value);
    let stays_true = body_cond.is_some_and(|v| {
        b.inputs().get(1).is_some_and(|&p| p.out(0) == v) || constant_value(b, Some(v)) == Some(1)
    });
    let (Some(trips), true, true) = (trips, cond_ok, stays_true) else {
        return Err(Error::Graph(
            "a Loop has a gradient only with a constant trip count M, no cond (or a constant \
             true one) and a body whose condition stays a constant true"
                .into(),
        ));
    };
    let operands = node.inputs.get(2..).unwrap_or_default();
    let carried = operands
        .len()
        .checked_sub(caps)
        .ok_or_else(|| Error::Graph(format!("captures is {caps}, more than the operands")))?;
    let (mut f, params) = closed_graph(cx, &format!("{}.unrolled", node.name), operands)?;
    let mut state = params[..carried].to_vec();
    let captures = params[carried..].to_vec();
    let n_scan = b.outputs().len().saturating_sub(1 + carried);
    let mut rows: Vec<Vec<Value>> = vec![vec![]; n_scan];
    let yes = {
        let t = Tensor::from_vec(&[], vec![true]).map_err(Error::Graph)?;
        let name = f.fresh_name("cond");
        Value::from(f.add_constant_value(&name, t)?)
    };
    for i in 0..trips.max(0) {
        let mut args = vec![scalar(&mut f, DType::I64, i)?, yes];
        args.extend(&state);
        args.extend(&captures);
        let outs = inline(&mut f, b, &args)?;
        state = outs[1..1 + carried].to_vec();
        for (r, &v) in rows.iter_mut().zip(&outs[1 + carried..]) {
            r.push(v);
        }
    }
    for (k, &v) in state.iter().enumerate() {
        f.add_output(&format!("carried{k}"), v)?;
    }
    for (j, r) in rows.iter().enumerate() {
        if r.is_empty() {
            return Err(Error::Graph(
                "a Loop of no iterations has no gradient through its scan outputs".into(),
            ));
        }
        let v = stack(&mut f, r, 0)?;
        f.add_output(&format!("scan{j}"), v)?;
    }
    let args: Vec<Value> = operands.iter().map(|v| v.expect("checked")).collect();
    let grads = splice_vjp(cx, &f, &args, gys)?;
    let mut out = vec![None, None];
    out.extend(spread(cx, operands, &grads));
    Ok(out)
}

fn scan_grad(cx: &mut Cx, node: &Node, gys: &[Option<Value>]) -> Result<Grads> {
    let b = body(node, "body")?;
    let caps = count_attr(node, "captures")?;
    let n_in = count_attr(node, "num_scan_inputs")?;
    let operands = &node.inputs[..];
    let states = operands
        .len()
        .checked_sub(caps + n_in)
        .ok_or_else(|| Error::Graph("too few operands".into()))?;
    let ints = |name: &str, n: usize| -> Result<Vec<i64>> {
        let v = node.attrs.ints(name).map_err(Error::Graph)?;
        Ok(v.map_or(vec![0; n], <[i64]>::to_vec))
    };
    let (mut f, params) = closed_graph(cx, &format!("{}.unrolled", node.name), operands)?;
    let in_axes = ints("scan_input_axes", n_in)?;
    let in_dirs = ints("scan_input_directions", n_in)?;
    let mut len = None;
    let mut scanned = vec![];
    for k in 0..n_in {
        let x = params[states + k];
        let ty = f.value_type(x)?.clone();
        let axis = crate::ir::shape::norm_axis(in_axes[k], ty.rank()).map_err(Error::Graph)?;
        let n = ty.shape.dim(axis).fixed().ok_or_else(|| {
            Error::Graph(format!(
                "a Scan has a gradient only along scan axes of fixed length; scan input {k} \
                 has type {ty}"
            ))
        })?;
        len = Some(n);
        scanned.push((x, axis, in_dirs[k] == 1, n));
    }
    let len = len.ok_or_else(|| Error::Graph("a Scan with no scan input".into()))?;
    let mut state = params[..states].to_vec();
    let captures = params[states + n_in..].to_vec();
    let n_out = b.outputs().len().saturating_sub(states);
    let mut rows: Vec<Vec<Value>> = vec![vec![]; n_out];
    for t in 0..len {
        let mut args = state.clone();
        for &(x, axis, reverse, n) in &scanned {
            let row = if reverse { n - 1 - t } else { t };
            let i = scalar(&mut f, DType::I64, row as i64)?;
            let attrs = Attrs::new().with("axis", Attr::Int(axis as i64));
            args.push(f.apply("Gather", &[x, i], attrs)?);
        }
        args.extend(&captures);
        let outs = inline(&mut f, b, &args)?;
        state = outs[..states].to_vec();
        for (r, &v) in rows.iter_mut().zip(&outs[states..]) {
            r.push(v);
        }
    }
    for (k, &v) in state.iter().enumerate() {
        f.add_output(&format!("state{k}"), v)?;
    }
    let out_axes = ints("scan_output_axes", n_out)?;
    let out_dirs = ints("scan_output_directions", n_out)?;
    for (j, r) in rows.iter_mut().enumerate() {
        if r.is_empty() {
            return Err(Error::Graph(
                "a Scan of no iterations has no gradient through its scan outputs".into(),
            ));
        }
        if out_dirs.get(j) == Some(&1) {
            r.reverse();
        }
        let rank = f.value_type(r[0])?.rank() + 1;
        let axis = crate::ir::shape::norm_axis(out_axes.get(j).copied().unwrap_or(0), rank)
            .map_err(Error::Graph)?;
        let v = stack(&mut f, r, axis)?;
        f.add_output(&format!("scan{j}"), v)?;
    }
    let args: Vec<Value> = operands
        .iter()
        .map(|v| v.ok_or_else(|| Error::Graph("a Scan operand is missing".into())))
        .collect::<Result<_>>()?;
    let grads = splice_vjp(cx, &f, &args, gys)?;
    Ok(spread(cx, operands, &grads))
}
