//! Gradient rules of the shape ops that move whole slices: Concat, Slice, Pad and
//! Split.
use super::select::scatter_back;
use super::{bin, const_ints, graph_err, input, keep, op_opt, Cx, Grads};
use crate::error::{Error, Result};
use crate::ir::{Attr, Attrs, Node, NodeId, Value};

/// Concat: each input's slice of `gy` along the axis (the inputs' sizes along it must be
/// static).
pub(super) fn concat(
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

/// Slice: with unit steps and constant bounds over static dims, `gy` padded back with
/// zeros; otherwise the general selection backward.
pub(super) fn slice(cx: &mut Cx, node: &Node, gy: Value) -> Result<Grads> {
    let xv = input(node, 0)?;
    let at = |k: usize| node.inputs.get(k).copied().flatten();
    let dims = cx.ty(xv).static_dims();
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
pub(super) fn pad(cx: &mut Cx, node: &Node, gy: Value) -> Result<Grads> {
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
pub(super) fn split(cx: &mut Cx, node: &Node, id: NodeId, gys: &[Option<Value>]) -> Result<Grads> {
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
