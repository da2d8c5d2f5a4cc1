//! Constant folding: a node whose operands are all constants becomes constants (its
//! reference evaluation, at most `fold-limit` elements per output), and `Shape` / `Size`
//! of a static shape become constants whatever their operand. Folding refines types
//! downstream (a `Reshape` whose shape became constant gets exact dims: the manager
//! re-infers after every pass that changed something).
use super::{add_const, sweep, Changed, Pass, PassContext};
use crate::error::{Error, Result};
use crate::ir::ops::EvalCtx;
use crate::ir::{Graph, NodeId, TensorType};
use crate::tensor::Tensor;

pub struct ConstantFold;

impl Pass for ConstantFold {
    fn name(&self) -> &'static str {
        "constant-fold"
    }
    fn summary(&self) -> &'static str {
        "evaluate nodes of constants (up to fold-limit elements) and Shape/Size of static shapes"
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed> {
        let limit = cx.options.fold_limit;
        sweep(g, cx, false, |g, _, id, cx| {
            let Some(values) = fold(g, id, limit)? else {
                return Ok(false);
            };
            if !cx.allow_rewrite() {
                return Ok(false);
            }
            let base = format!("{}.const", g.node(id).name);
            for (i, t) in values.into_iter().enumerate() {
                let c = add_const(g, &base, t)?;
                g.replace_uses(id.out(i as u32), c.into())?;
            }
            Ok(true)
        })
    }
}

/// The values of `id`'s outputs, if it folds.
fn fold(g: &Graph, id: NodeId, limit: usize) -> Result<Option<Vec<Tensor>>> {
    let n = g.node(id);
    if matches!(
        n.op.as_str(),
        "Parameter" | "Constant" | "Variable" | "Assign"
    ) || !n.control_deps.is_empty()
    {
        return Ok(None);
    }
    if let Some(t) = static_shape_op(g, id) {
        return Ok(Some(vec![t]));
    }
    let consts: Option<Vec<Option<&Tensor>>> = n
        .inputs
        .iter()
        .map(|v| match v {
            None => Some(None),
            Some(v) => {
                let src = g.node(v.node);
                (src.op == "Constant").then_some(src.data.as_deref())
            }
        })
        .collect();
    let Some(consts) = consts else {
        return Ok(None);
    };
    let trip_count = consts.first().copied().flatten();
    if !crate::ir::ops::control::folds_in_bounded_time(&n.op, trip_count, &n.attrs) {
        return Ok(None);
    }
    // Types as inference gives them now: operands folded earlier in this sweep are
    // constants whose exact dims the recorded types may not show yet.
    let Ok(out_types) = g.infer_node(n) else {
        return Ok(None);
    };
    let small = |t: &TensorType| t.num_elements().is_some_and(|k| k <= limit);
    if n.inputs.is_empty() || !out_types.iter().all(small) {
        return Ok(None);
    }
    let op = g
        .op_impl(&n.op)
        .ok_or_else(|| Error::UnknownOp(n.op.clone()))?;
    // A registered op folds only if it says it is pure (same inputs, same outputs, no
    // side effects); catalogue ops are.
    if !op.pure() {
        return Ok(None);
    }
    let types: Vec<Option<&TensorType>> = n
        .inputs
        .iter()
        .map(|v| v.map(|v| &g.node(v.node).outputs[v.output as usize]))
        .collect();
    let cx = EvalCtx {
        inputs: &consts,
        input_types: &types,
        attrs: &n.attrs,
    };
    // A node that fails on its constants fails at run time too: leave it to say so there.
    let Ok(values) = crate::ir::ops::custom::contain(&op, || crate::ir::ops::evaluate(&*op, &cx))
    else {
        return Ok(None);
    };
    let fits = values.len() == out_types.len()
        && values.iter().zip(&out_types).all(|(t, ty)| {
            // A constant holds a tensor, never a sequence or optional.
            ty.is_tensor()
                && t.dtype() == ty.dtype
                && ty.static_dims().as_deref() == Some(t.shape())
        });
    Ok(fits.then_some(values))
}

/// `Shape` or `Size` of an operand whose shape is static.
fn static_shape_op(g: &Graph, id: NodeId) -> Option<Tensor> {
    let n = g.node(id);
    if !matches!(n.op.as_str(), "Shape" | "Size") {
        return None;
    }
    let v = n.inputs.first().copied().flatten()?;
    if g.node(v.node).op == "Constant" {
        return None; // the general rule folds it
    }
    let dims = g.value_type(v).ok()?.static_dims()?;
    let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    if n.op == "Size" {
        return Some(Tensor::scalar(dims.iter().product::<i64>()));
    }
    let r = dims.len() as i64;
    let clamp = |a: i64| (if a < 0 { a + r } else { a }).clamp(0, r) as usize;
    let start = clamp(n.attrs.int_or("start", 0).ok()?);
    let end = clamp(n.attrs.int_or("end", r).ok()?);
    let part = dims.get(start..end.max(start)).unwrap_or(&[]).to_vec();
    Tensor::from_vec(&[part.len()], part).ok()
}
