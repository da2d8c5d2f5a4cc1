//! Gradient rules of the reductions (ReduceSum/Mean and the rest) and the variadic
//! extrema (Max, Min over several inputs).
use super::{bin, const_ints, graph_err, input, mul, sum_over, un, Cx, Grads};
use crate::error::{Error, Result};
use crate::ir::ops::reduce::reduce_axes;
use crate::ir::{Attr, Attrs, Node, Value};

/// ReduceSum / ReduceMean: `gy` brought back to the reduced axes and broadcast over them.
pub(super) fn reduce(
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

/// Max/Min of any number of operands: gy to the first operand equal to the result.
pub(super) fn variadic_extremum(cx: &mut Cx, node: &Node, y: Value, gy: Value) -> Result<Grads> {
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
pub(super) fn expand_back(
    cx: &mut Cx,
    v: Value,
    x: Value,
    axes: &[usize],
    keepdims: bool,
) -> Result<Value> {
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
pub(super) fn reduction(cx: &mut Cx, node: &Node, y: Value, gy: Value) -> Result<Grads> {
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
