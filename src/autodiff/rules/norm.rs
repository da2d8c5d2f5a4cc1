//! Gradient rules of the normalizations: BatchNormalization (training statistics),
//! LayerNormalization, RMSNormalization and InstanceNormalization.
use super::{bin, graph_err, input, keep, mul, sum_over, un, Cx, Grads};
use crate::error::Result;
use crate::ir::{Attr, Attrs, Node, NodeId, Value};

/// `v` ([C]) shaped [C, 1, ...] to broadcast over axis 1 of a rank-`rank` tensor.
pub(super) fn per_channel(cx: &mut Cx, v: Value, rank: usize) -> Result<Value> {
    if rank <= 2 {
        return Ok(v);
    }
    let a: Vec<i64> = (1..rank as i64 - 1).collect();
    let a = cx.ints(&a)?;
    cx.op("Unsqueeze", &[v, a], Attrs::new())
}

/// All axes of a rank-`rank` tensor but the channels (1).
pub(super) fn non_channel_axes(rank: usize) -> Vec<i64> {
    (0..rank as i64).filter(|&a| a != 1).collect()
}

/// BatchNormalization (inference): y = (x − mean)·k + B, k = scale/√(var + ε). Every
/// input gets its true gradient.
pub(super) fn batch_norm(cx: &mut Cx, node: &Node, gy: Value) -> Result<Grads> {
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
pub(super) fn normalized_grad(
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
pub(super) fn moments(cx: &mut Cx, x: Value, axes: &[i64], eps: f64) -> Result<(Value, Value)> {
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
pub(super) fn layer_norm(
    cx: &mut Cx,
    node: &Node,
    id: NodeId,
    gys: &[Option<Value>],
) -> Result<Grads> {
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
pub(super) fn rms_norm(cx: &mut Cx, node: &Node, gy: Value) -> Result<Grads> {
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
pub(super) fn instance_norm(cx: &mut Cx, node: &Node, gy: Value) -> Result<Grads> {
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
