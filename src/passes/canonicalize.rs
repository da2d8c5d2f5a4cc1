//! Canonical forms: a commutative op's constant operand goes second, so that later
//! patterns need only look for `op(x, constant)`; a convolution's or pool's `auto_pad`
//! becomes the explicit `pads` it means once the input's spatial dims are known, so that
//! kernels and the layout pass see one form.
use super::{sweep, Changed, Pass, PassContext};
use crate::error::Result;
use crate::ir::{Attr, Graph, NodeId};

pub struct Canonicalize;

const COMMUTATIVE: &[&str] = &[
    "Add",
    "Mul",
    "And",
    "Or",
    "Xor",
    "Equal",
    "Max",
    "Min",
    "Sum",
    "Mean",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
];

impl Pass for Canonicalize {
    fn name(&self) -> &'static str {
        "canonicalize"
    }
    fn summary(&self) -> &'static str {
        "put the constant operand of commutative binary ops second; auto_pad as explicit pads"
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed> {
        sweep(g, cx, false, |g, _, id, cx| {
            if explicit_pads(g, id, cx)? {
                return Ok(true);
            }
            let n = g.node(id);
            let is_const = |i: usize| n.inputs[i].is_some_and(|v| g.node(v.node).op == "Constant");
            if !COMMUTATIVE.contains(&n.op.as_str())
                || n.inputs.len() != 2
                || n.inputs.iter().any(|v| v.is_none())
                || !is_const(0)
                || is_const(1)
                || !cx.allow_rewrite()
            {
                return Ok(false);
            }
            // Broadcasting is symmetric but for which operand's axis names win: the
            // manager re-infers the types after the pass.
            g.node_mut(id).inputs.swap(0, 1);
            Ok(true)
        })
    }
}

/// Rewrites `auto_pad` (SAME_UPPER, SAME_LOWER, VALID) of a Conv, FusedConv, ConvInteger
/// or pool with static spatial input dims into the `pads` it stands for. The node's type
/// is unchanged (inference applies the same windows), so the attributes are edited in
/// place.
fn explicit_pads(g: &mut Graph, id: NodeId, cx: &mut PassContext) -> Result<bool> {
    let n = g.node(id);
    let conv = matches!(n.op.as_str(), "Conv" | "FusedConv" | "ConvInteger");
    let pool = matches!(n.op.as_str(), "MaxPool" | "AveragePool" | "LpPool");
    if !(conv || pool)
        || matches!(n.attrs.string_or("auto_pad", "NOTSET"), Ok("NOTSET") | Err(_))
        || n.attrs.int_or("block", 0) != Ok(0)
        // With ceil_mode, explicit pads could give one more window than SAME does.
        || n.attrs.int_or("ceil_mode", 0) != Ok(0)
    {
        return Ok(false);
    }
    let Some(Ok(x)) = n.inputs.first().copied().flatten().map(|v| g.value_type(v)) else {
        return Ok(false);
    };
    let input: Vec<Option<usize>> = x.shape.axes.iter().skip(2).map(|a| a.dim.fixed()).collect();
    let kernel: Option<Vec<usize>> = if conv {
        let w = n.inputs.get(1).copied().flatten().map(|v| g.value_type(v));
        match w {
            Some(Ok(w)) => w.shape.axes.iter().skip(2).map(|a| a.dim.fixed()).collect(),
            _ => None,
        }
    } else {
        match n.attrs.ints("kernel_shape") {
            Ok(Some(k)) => k.iter().map(|&v| usize::try_from(v).ok()).collect(),
            _ => None,
        }
    };
    let Some(kernel) = kernel else {
        return Ok(false);
    };
    if input.len() != kernel.len() || input.iter().any(Option::is_none) || !cx.allow_rewrite() {
        return Ok(false);
    }
    // An attribute the catalogue refuses is left for verification to report.
    let Ok(windows) = crate::ir::ops::conv::windows(&n.attrs, &kernel, &input) else {
        return Ok(false);
    };
    let begin = windows.iter().map(|w| w.pad_begin as i64);
    let pads: Vec<i64> = begin
        .chain(windows.iter().map(|w| w.pad_end as i64))
        .collect();
    let attrs = &mut g.node_mut(id).attrs;
    attrs.0.remove("auto_pad");
    attrs.set("pads", Attr::Ints(pads));
    Ok(true)
}
