//! Dequantization fusion: a dynamically quantized convolution as exported —
//! `ConvInteger → Add(i32 bias) → Cast(f32) → Mul(scale)`, then optionally a residual
//! Add and an activation — becomes one `FusedConvInteger`, so that a backend adds the
//! bias, converts, scales and activates the integer accumulators while they are still
//! in registers instead of in four passes over the output. The bias and the scale may
//! be computed at run time (they come from `DynamicQuantizeLinear`'s scale); the
//! scale must be one value. Matched root-first (reverse schedule), so the longest
//! epilogue wins.
use super::pattern::{alt, any, non_constant, op, ops, Match, NodePat, Pat};
use super::{replace_node, sweep, Changed, Pass, PassContext};
use crate::error::Result;
use crate::ir::ops::fused::{scalar_text, ACTIVATIONS};
use crate::ir::{Attr, Attrs, DType, Graph, NodeId, Value};

pub struct FuseQuant;

impl Pass for FuseQuant {
    fn name(&self) -> &'static str {
        "fuse-quant"
    }
    fn summary(&self) -> &'static str {
        "ConvInteger + i32 bias + Cast + scale (+ residual + activation) into FusedConvInteger"
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed> {
        let pat = pattern();
        sweep(g, cx, true, |g, uses, id, cx| {
            match pat.matches(g, uses, id.into()) {
                Some(m) => fuse(g, id, &m, cx),
                None => Ok(false),
            }
        })
    }
}

fn maybe_single(p: NodePat, single: bool) -> NodePat {
    if single {
        p.single_use()
    } else {
        p
    }
}

/// ConvInteger, an optional Add of an i32 bias, a Cast to f32 and a Mul by the scale,
/// then an optional residual Add and an optional activation. Every node below the root
/// must have no other reader.
fn pattern() -> Pat {
    let core = || op("ConvInteger").single_use().capture("core");
    let biased = || {
        alt(vec![
            op("Add")
                .commutative()
                .args(vec![core(), any().capture("bias")])
                .single_use()
                .pat(),
            core(),
        ])
    };
    let cast = || {
        op("Cast")
            .when(|_, n| n.outputs[0].dtype == DType::F32)
            .args(vec![biased()])
            .single_use()
            .pat()
    };
    let scaled = |single: bool| {
        maybe_single(
            op("Mul")
                .commutative()
                .args(vec![cast(), any().capture("scale")]),
            single,
        )
        .capture("mul")
    };
    let residual = |single: bool| {
        alt(vec![
            maybe_single(
                op("Add")
                    .commutative()
                    .args(vec![scaled(true), non_constant().capture("z")]),
                single,
            )
            .capture("residual_add"),
            scaled(single),
        ])
    };
    alt(vec![
        ops(ACTIVATIONS).args(vec![residual(true)]).capture("act"),
        residual(false),
    ])
}

/// The activation's attributes as `activation` / `activation_attrs`, or None when it
/// has operands besides its input (Clip's bounds: left to the elementwise fusion).
fn activation_attrs(g: &Graph, act: NodeId, attrs: &mut Attrs) -> Option<()> {
    let n = g.node(act);
    if n.inputs.len() > 1 {
        return None;
    }
    let list = n
        .attrs
        .iter()
        .map(|(k, v)| Some(format!("{k}={}", scalar_text(v)?)))
        .collect::<Option<Vec<String>>>()?;
    attrs.set("activation", Attr::String(n.op.clone()));
    if !list.is_empty() {
        attrs.set("activation_attrs", Attr::Strings(list));
    }
    Some(())
}

fn fuse(g: &mut Graph, root: NodeId, m: &Match, cx: &mut PassContext) -> Result<bool> {
    let core_id = m.node("core");
    let core = g.node(core_id).clone();
    let scale: Value = m.value("scale");
    let scale_ty = g.value_type(scale)?;
    // One scale for the whole output: what a dynamically quantized layer has.
    let one = scale_ty
        .static_dims()
        .is_some_and(|d| d.iter().all(|&x| x == 1));
    if scale_ty.dtype != DType::F32 || !one {
        return Ok(false);
    }
    // What a kernel applies in its epilogue: a bias per output channel (or one), a
    // residual of the output's shape; anything else stays unfused.
    let out_rank = g.node(core_id).outputs[0].rank();
    let bias = m.get("bias");
    if let Some(b) = bias {
        let t = g.value_type(b)?;
        let per_channel = t.static_dims().is_some_and(|d| {
            let at = out_rank.checked_sub(d.len());
            at.is_some_and(|at| d.iter().enumerate().all(|(i, &n)| n == 1 || at + i == 1))
        });
        if t.dtype != DType::I32 || !per_channel {
            return Ok(false);
        }
    }
    if let Some(z) = m.get("z") {
        if g.value_type(z)?.shape != g.node(root).outputs[0].shape {
            return Ok(false);
        }
    }
    let mut attrs = core.attrs.clone();
    if let Some(act) = m.get("act") {
        if activation_attrs(g, act.node, &mut attrs).is_none() {
            return Ok(false);
        }
    }
    let mut inputs: Vec<Option<Value>> = core.inputs.clone();
    inputs.resize(4, None);
    inputs.extend([bias, Some(scale), m.get("z")]);
    while inputs.last() == Some(&None) {
        inputs.pop();
    }
    replace_node(g, root, core_id, "FusedConvInteger", &inputs, attrs, cx)
}
