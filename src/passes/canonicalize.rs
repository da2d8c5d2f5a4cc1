//! Canonical operand order: a commutative op's constant operand goes second, so that
//! later patterns need only look for `op(x, constant)`.
use super::{sweep, Changed, Pass, PassContext};
use crate::error::Result;
use crate::ir::Graph;

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
        "put the constant operand of commutative binary ops second"
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed> {
        sweep(g, cx, false, |g, _, id, cx| {
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
