//! Algebraic simplification: identities (`x * 1`, `x + 0`, `x - 0`, `x / 1`,
//! `x ^ 1`, integer `x - x`), no-op data movement (Identity, a Cast, Reshape, Expand,
//! Squeeze, Unsqueeze or Flatten to the operand's own type, a one-operand Concat),
//! Transpose∘Transpose composed, Reshape of a reshape collapsed, and transposes of the
//! last two axes folded into Gemm's and FusedMatMul's `trans` flags; two-operand Einsums
//! lowered to a MatMul ([`super::einsum`]). Control flow: an
//! `If` on a constant condition becomes its chosen branch (inlined, the captures bound
//! to the operands), and a `Loop` that surely runs a small constant number of trips is
//! unrolled (at most [`MAX_UNROLLED_TRIPS`] trips and [`MAX_UNROLLED_NODES`] copied nodes).
//!
//! `x - x` is not folded for floats: it is NaN, not 0, where x is infinite or NaN.
use super::pattern::{any, op, ops, splat, Pat, Uses};
use super::{add_const, add_in_place_of, replace_node, sweep, Changed, Pass, PassContext};
use crate::error::Result;
use crate::ir::{Attr, Attrs, Graph, NodeId, Value};
use crate::tensor::Tensor;

pub struct Simplify;

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }
    fn summary(&self) -> &'static str {
        "algebraic identities, no-op data movement, transpose/reshape chains, transposes into matmul flags"
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed> {
        let rules = Rules::new();
        sweep(g, cx, false, |g, uses, id, cx| rules.apply(g, uses, id, cx))
    }
}

/// Only the `If`s on a constant condition, inlined: the part of [`Simplify`] that
/// specialization runs while some ranks are still unknown (its other rules compare
/// types, which say too little then).
pub struct InlineConstantIf;

impl Pass for InlineConstantIf {
    fn name(&self) -> &'static str {
        "inline-constant-if"
    }
    fn summary(&self) -> &'static str {
        "If on a constant condition becomes its chosen branch"
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed> {
        sweep(g, cx, false, |g, _, id, cx| match g.node(id).op.as_str() {
            "If" => inline_if(g, id, cx),
            _ => Ok(false),
        })
    }
}

struct Rules {
    identity: Pat,
    transpose2: Pat,
    reshape2: Pat,
    sub_self: Pat,
}

/// The perm of a Transpose node (reversed axes when absent).
fn perm(g: &Graph, id: NodeId) -> Option<Vec<usize>> {
    let n = g.node(id);
    let rank = g.value_type(n.inputs[0]?).ok()?.rank();
    match n.attrs.ints("perm").ok()? {
        None => Some((0..rank).rev().collect()),
        Some(p) => p
            .iter()
            .map(|&a| usize::try_from(if a < 0 { a + rank as i64 } else { a }).ok())
            .collect(),
    }
}

/// Whether `id` is a Transpose swapping exactly its last two axes.
fn swaps_last_two(g: &Graph, id: NodeId) -> bool {
    let n = g.node(id);
    if n.op != "Transpose" {
        return false;
    }
    let Some(p) = perm(g, id) else { return false };
    let r = p.len();
    r >= 2
        && p[..r - 2].iter().enumerate().all(|(i, &a)| a == i)
        && p[r - 2] == r - 1
        && p[r - 1] == r - 2
}

impl Rules {
    fn new() -> Rules {
        let x = || any().capture("x");
        Rules {
            // Ops whose output is their first operand when the rest are neutral.
            identity: crate::passes::pattern::alt(vec![
                op("Identity").args(vec![x()]).pat(),
                op("Add").commutative().args(vec![x(), splat(0.0)]).pat(),
                op("Mul").commutative().args(vec![x(), splat(1.0)]).pat(),
                ops(&["Sub"]).args(vec![x(), splat(0.0)]).pat(),
                ops(&["Div", "Pow"]).args(vec![x(), splat(1.0)]).pat(),
                ops(&[
                    "Cast",
                    "Reshape",
                    "Expand",
                    "Squeeze",
                    "Unsqueeze",
                    "Flatten",
                ])
                .args(vec![x()])
                .pat(),
                op("Concat")
                    .args(vec![x()])
                    .when(|_, n| n.inputs.len() == 1)
                    .pat(),
            ]),
            transpose2: op("Transpose")
                .args(vec![op("Transpose").args(vec![x()]).capture("inner")])
                .pat(),
            reshape2: op("Reshape")
                .args(vec![
                    ops(&["Reshape", "Flatten", "Squeeze", "Unsqueeze"])
                        .args(vec![x()])
                        .pat(),
                    crate::passes::pattern::const_where(|d| d != 0.0).capture("shape"),
                ])
                .when(|_, n| n.attrs.int_or("allowzero", 0) == Ok(0))
                .pat(),
            sub_self: op("Sub").args(vec![x(), x()]).pat(),
        }
    }

    fn apply(&self, g: &mut Graph, uses: &Uses, id: NodeId, cx: &mut PassContext) -> Result<bool> {
        match g.node(id).op.as_str() {
            "If" => return inline_if(g, id, cx),
            "Loop" => return unroll_loop(g, id, cx),
            "Einsum" => return super::einsum::lower(g, id, cx),
            _ => {}
        }
        let root: Value = id.into();
        if g.node(id).outputs.len() != 1 {
            return Ok(false);
        }
        let out_ty = g.node(id).outputs[0].clone();
        // x op neutral -> x, when that changes neither dtype nor shape.
        if let Some(m) = self.identity.matches(g, uses, root) {
            let x = m.value("x");
            if *g.value_type(x)? == out_ty && cx.allow_rewrite() {
                g.replace_uses(root, x)?;
                return Ok(true);
            }
        }
        if let Some(m) = self.transpose2.matches(g, uses, root) {
            let (Some(outer), Some(inner)) = (perm(g, id), perm(g, m.node("inner"))) else {
                return Ok(false);
            };
            let x = m.value("x");
            let composed: Vec<usize> = outer.iter().map(|&i| inner[i]).collect();
            if !cx.allow_rewrite() {
                return Ok(false);
            }
            if composed.iter().enumerate().all(|(i, &a)| a == i) {
                g.replace_uses(root, x)?;
            } else {
                let perm = Attr::Ints(composed.iter().map(|&a| a as i64).collect());
                let attrs = Attrs::new().with("perm", perm);
                let t = add_in_place_of(g, id, "Transpose", &[Some(x)], attrs)
                    .expect("a permutation of x's axes");
                g.replace_uses(root, t.into())?;
            }
            return Ok(true);
        }
        if let Some(m) = self.reshape2.matches(g, uses, root) {
            let attrs = g.node(id).attrs.clone();
            let inputs = [Some(m.value("x")), Some(m.value("shape"))];
            if replace_node(g, id, id, "Reshape", &inputs, attrs, cx)? {
                return Ok(true);
            }
        }
        if self.sub_self.matches(g, uses, root).is_some() {
            let dims = out_ty.static_dims();
            if let (true, Some(dims)) = (out_ty.dtype.is_int(), dims) {
                if cx.allow_rewrite() {
                    let base = format!("{}.zero", g.node(id).name);
                    let c = add_const(g, &base, Tensor::zeros(out_ty.dtype, &dims))?;
                    g.replace_uses(root, c.into())?;
                    return Ok(true);
                }
            }
        }
        self.transpose_into_flags(g, id, cx)
    }

    /// Gemm / MatMul / FusedMatMul of a last-two-axes transpose: the flag instead.
    fn transpose_into_flags(
        &self,
        g: &mut Graph,
        id: NodeId,
        cx: &mut PassContext,
    ) -> Result<bool> {
        let n = g.node(id).clone();
        if !n.control_deps.is_empty() {
            return Ok(false);
        }
        let (flags_op, rank_ok) = match n.op.as_str() {
            "Gemm" => ("Gemm", true),
            "MatMul" | "FusedMatMul" => ("FusedMatMul", true),
            _ => ("", false),
        };
        if !rank_ok {
            return Ok(false);
        }
        let mut inputs = n.inputs.clone();
        let mut attrs = n.attrs.clone();
        let mut any_folded = false;
        for (i, flag) in [(0usize, "transA"), (1, "transB")] {
            let Some(v) = inputs[i] else { continue };
            if v.output != 0 || !swaps_last_two(g, v.node) {
                continue;
            }
            // Gemm's operands are matrices: its transpose is the 2-D swap.
            if n.op == "Gemm" && g.value_type(v)?.rank() != 2 {
                continue;
            }
            let flipped = 1 - attrs.int_or(flag, 0).unwrap_or(0).clamp(0, 1);
            attrs.set(flag, Attr::Int(flipped));
            inputs[i] = g.node(v.node).inputs[0];
            any_folded = true;
        }
        if !any_folded {
            return Ok(false);
        }
        replace_node(g, id, id, flags_op, &inputs, attrs, cx)
    }
}

/// The most trips a `Loop` is unrolled for.
pub const MAX_UNROLLED_TRIPS: usize = 16;
/// The most body nodes an unrolled `Loop` copies in all (trips × body size).
pub const MAX_UNROLLED_NODES: usize = 256;

/// The one element of a constant operand, if it is one.
fn const_scalar(g: &Graph, v: Option<Value>) -> Option<i64> {
    let n = g.node(v?.node);
    match (n.op.as_str(), n.data.as_deref()) {
        ("Constant", Some(t)) if t.len() == 1 => t.to_i64_vec().first().copied(),
        _ => None,
    }
}

/// Replaces every output of `id` by `values`, in order.
fn replace_outputs(g: &mut Graph, id: NodeId, values: &[Value]) -> Result<()> {
    for (i, &v) in values.iter().enumerate() {
        g.replace_uses(id.out(i as u32), v)?;
    }
    Ok(())
}

/// `If` on a constant condition: the chosen branch's nodes in the parent.
fn inline_if(g: &mut Graph, id: NodeId, cx: &mut PassContext) -> Result<bool> {
    let n = g.node(id).clone();
    let Some(cond) = const_scalar(g, n.inputs[0]) else {
        return Ok(false);
    };
    let branch = if cond != 0 {
        "then_branch"
    } else {
        "else_branch"
    };
    let Ok(Some(body)) = n.attrs.graph(branch) else {
        return Ok(false);
    };
    let args: Option<Vec<Value>> = n.inputs[1..].iter().copied().collect();
    let Some(args) = args else { return Ok(false) };
    if !cx.allow_rewrite() {
        return Ok(false);
    }
    let outs = g.inline(body, &args, &n.name)?;
    replace_outputs(g, id, &outs)?;
    Ok(true)
}

/// A `Loop` with a small constant trip count whose condition stays true: each trip's
/// body inlined, the scan outputs stacked by Concat.
fn unroll_loop(g: &mut Graph, id: NodeId, cx: &mut PassContext) -> Result<bool> {
    let n = g.node(id).clone();
    let Ok(Some(body)) = n.attrs.graph("body") else {
        return Ok(false);
    };
    let Some(trips) = const_scalar(g, n.inputs[0]) else {
        return Ok(false);
    };
    let trips = usize::try_from(trips).unwrap_or(0);
    let captures = n.attrs.int_or("captures", 0).unwrap_or(0) as usize;
    let starts_true = n.inputs[1].is_none() || const_scalar(g, n.inputs[1]) == Some(1);
    let (Some(cond_out), Some(&cond_param)) = (body.outputs().first(), body.inputs().get(1)) else {
        return Ok(false);
    };
    let cond_node = body.node(cond_out.value.node);
    let stays_true = cond_out.value == cond_param.into()
        || (cond_node.op == "Constant"
            && cond_node
                .data
                .as_deref()
                .is_some_and(|t| t.to_i64_vec() == [1]));
    let operands: Option<Vec<Value>> = n.inputs[2..].iter().copied().collect();
    let Some(operands) = operands else {
        return Ok(false);
    };
    let Some(carried) = operands.len().checked_sub(captures) else {
        return Ok(false);
    };
    if trips == 0
        || trips > MAX_UNROLLED_TRIPS
        || trips.saturating_mul(body.len()) > MAX_UNROLLED_NODES
        || !starts_true
        || !stays_true
        || !cx.allow_rewrite()
    {
        return Ok(false);
    }
    let yes = add_const(g, &format!("{}.cond", n.name), Tensor::scalar(true))?;
    let mut state: Vec<Value> = operands[..carried].to_vec();
    let mut scans: Vec<Vec<Value>> = vec![];
    for trip in 0..trips {
        let i = add_const(
            g,
            &format!("{}.i{trip}", n.name),
            Tensor::scalar(trip as i64),
        )?;
        let mut args = vec![i.into(), yes.into()];
        args.extend(&state);
        args.extend(&operands[carried..]);
        let outs = g.inline(body, &args, &format!("{}.{trip}", n.name))?;
        state = outs[1..1 + carried].to_vec();
        scans.resize(outs.len() - 1 - carried, vec![]);
        for (acc, &v) in scans.iter_mut().zip(&outs[1 + carried..]) {
            acc.push(v);
        }
    }
    let mut results = state;
    let axes = add_const(
        g,
        &format!("{}.axes", n.name),
        Tensor::from_vec(&[1], vec![0i64]).map_err(crate::error::Error::Graph)?,
    )?;
    for parts in scans {
        let mut rows = vec![];
        for v in parts {
            rows.push(g.apply("Unsqueeze", &[v, axes.into()], Attrs::new())?);
        }
        results.push(g.apply("Concat", &rows, Attrs::new().with("axis", Attr::Int(0)))?);
    }
    replace_outputs(g, id, &results)?;
    Ok(true)
}
