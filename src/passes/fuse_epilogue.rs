//! Epilogue fusion: a Conv, MatMul or Gemm with what follows it — a bias Add of a
//! constant, a residual Add, an activation — becomes one `FusedConv` / `FusedMatMul`
//! computing `activation(op(...) + bias + Z)`, so that a backend applies the epilogue
//! while the output is still in registers. Matched root-first (reverse schedule), so
//! the longest epilogue wins.
use super::pattern::{alt, any, constant, non_constant, op, ops, Match, NodePat, Pat};
use super::{add_const, replace_node, sweep, Changed, Pass, PassContext};
use crate::error::Result;
use crate::ir::ops::fused::{scalar_text, ACTIVATIONS};
use crate::ir::{Attr, Attrs, DType, Graph, NodeId, Value};
use crate::tensor::Tensor;

pub struct FuseEpilogue;

impl Pass for FuseEpilogue {
    fn name(&self) -> &'static str {
        "fuse-epilogue"
    }
    fn summary(&self) -> &'static str {
        "Conv/MatMul/Gemm + bias + residual Add + activation into FusedConv/FusedMatMul"
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed> {
        let pats = [epilogue_pattern(Core::Conv), epilogue_pattern(Core::MatMul)];
        sweep(g, cx, true, |g, uses, id, cx| {
            for (core, pat) in [Core::Conv, Core::MatMul].into_iter().zip(&pats) {
                if let Some(m) = pat.matches(g, uses, id.into()) {
                    if fuse(g, id, &m, core, cx)? {
                        return Ok(true);
                    }
                }
            }
            Ok(false)
        })
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Core {
    Conv,
    MatMul,
}

/// The core op, then an optional bias Add, residual Add and activation. Every node
/// below the root must have no other reader.
fn epilogue_pattern(core: Core) -> Pat {
    let core_pat = |single: bool| {
        let p = match core {
            Core::Conv => op("Conv").args(vec![any(), constant()]),
            Core::MatMul => ops(&["MatMul", "Gemm", "FusedMatMul"]).when(|_, n| {
                let plain = n.attrs.float_or("alpha", 1.0) == Ok(1.0)
                    && n.attrs.float_or("beta", 1.0) == Ok(1.0);
                let bare = n.op != "FusedMatMul"
                    || (n.inputs.len() <= 2 && n.attrs.get("activation").is_none());
                plain && bare
            }),
        };
        maybe_single(p, single).capture("core")
    };
    let biased = |single: bool| {
        alt(vec![
            maybe_single(
                op("Add")
                    .commutative()
                    .args(vec![core_pat(true), constant().capture("bias")]),
                single,
            )
            .capture("bias_add"),
            core_pat(single),
        ])
    };
    let residual = |single: bool| {
        alt(vec![
            maybe_single(
                op("Add")
                    .commutative()
                    // A constant is a bias, not a residual.
                    .args(vec![biased(true), non_constant().capture("z")]),
                single,
            )
            .capture("residual_add"),
            biased(single),
        ])
    };
    alt(vec![
        NodePat::pat(
            // Clip's bounds must be constant scalars: `activation_attrs` checks.
            ops(ACTIVATIONS).args(vec![residual(true)]),
        )
        .capture("act"),
        residual(false),
    ])
}

fn maybe_single(p: NodePat, single: bool) -> NodePat {
    if single {
        p.single_use()
    } else {
        p
    }
}

/// The bias as the fused op wants it: per output channel (Conv: shape [C]) or over the
/// last axis (MatMul: the constant as is), or None when it broadcasts otherwise.
fn bias_for(
    g: &mut Graph,
    core: Core,
    out_rank: usize,
    channels: usize,
    b: Value,
    old: Option<Value>,
) -> Result<Option<Value>> {
    let t = g.node(b.node).data.clone().expect("constant");
    let dims = t.shape().to_vec();
    if dims.len() > out_rank {
        return Ok(None);
    }
    let vals = t.to_f64_vec();
    let per_channel = match core {
        // [C, 1, 1] or [1, C, 1, 1]: aligned to the output's channel axis (a plain [C]
        // would broadcast over the last spatial axis instead).
        Core::Conv => {
            let axis = out_rank - dims.len();
            let ok =
                dims.iter()
                    .enumerate()
                    .all(|(i, &d)| if axis + i == 1 { d == channels } else { d == 1 })
                    && dims.len() + 1 >= out_rank;
            if !ok {
                return Ok(None);
            }
            vals
        }
        Core::MatMul => {
            if old.is_none() {
                return Ok(Some(b));
            }
            if t.len() != channels || dims.last() != Some(&channels) {
                return Ok(None);
            }
            vals
        }
    };
    let summed: Vec<f64> = match old {
        None => per_channel,
        Some(o) => {
            let prev = g.node(o.node).data.as_ref().map(|d| d.to_f64_vec());
            match (prev, g.node(o.node).op.as_str()) {
                (Some(p), "Constant") if p.len() == channels => {
                    p.iter().zip(&per_channel).map(|(a, b)| a + b).collect()
                }
                _ => return Ok(None),
            }
        }
    };
    let name = format!("{}.bias", g.node(b.node).name);
    let c = add_const(
        g,
        &name,
        Tensor::from_f64s(t.dtype(), &[channels], &summed).map_err(crate::Error::Graph)?,
    )?;
    Ok(Some(c.into()))
}

/// The activation's attributes as `activation` / `activation_attrs`, or None when its
/// operands are not constant scalars.
fn activation_attrs(g: &Graph, act: NodeId, attrs: &mut Attrs) -> Option<()> {
    let n = g.node(act);
    let mut list: Vec<String> = vec![];
    for (k, v) in n.attrs.iter() {
        list.push(format!("{k}={}", scalar_text(v)?));
    }
    for (i, bound) in [(1usize, "min"), (2, "max")] {
        if let Some(v) = n.inputs.get(i).copied().flatten() {
            let src = g.node(v.node);
            let t = src.data.as_ref().filter(|_| src.op == "Constant")?;
            if t.len() != 1 {
                return None;
            }
            list.push(format!("{bound}={:?}", t.to_f64_vec()[0]));
        }
    }
    attrs.set("activation", Attr::String(n.op.clone()));
    if !list.is_empty() {
        attrs.set("activation_attrs", Attr::Strings(list));
    }
    Some(())
}

fn fuse(
    g: &mut Graph,
    root: NodeId,
    m: &Match,
    core_kind: Core,
    cx: &mut PassContext,
) -> Result<bool> {
    let has_epilogue = ["bias_add", "residual_add", "act"]
        .iter()
        .any(|c| m.get(c).is_some());
    if !has_epilogue {
        return Ok(false);
    }
    let core_id = m.node("core");
    let core = g.node(core_id).clone();
    let out_ty = g.node(root).outputs[0].clone();
    if !out_ty.dtype.is_float() {
        return Ok(false);
    }
    // The fused convolution kernels are f32's; the fused matmul's typed loop applies
    // activations in f32, so an f64 activation stays its own op, in f64.
    let kernel_exists = match core_kind {
        Core::Conv => out_ty.dtype == DType::F32,
        Core::MatMul => out_ty.dtype != DType::F64 || m.get("act").is_none(),
    };
    if !kernel_exists {
        return Ok(false);
    }
    let core_ty = core.outputs[0].clone();
    let channels = match (core_kind, core_ty.static_dims()) {
        (Core::Conv, _) => match g
            .value_type(core.inputs[1].expect("W"))?
            .shape
            .dim(0)
            .fixed()
        {
            Some(c) => c,
            None => return Ok(false),
        },
        (Core::MatMul, Some(d)) if !d.is_empty() => d[d.len() - 1],
        (Core::MatMul, _) => match core_ty.shape.axes.last().and_then(|a| a.dim.fixed()) {
            Some(c) => c,
            None => return Ok(false),
        },
    };
    let mut attrs = core.attrs.clone();
    let mut inputs: Vec<Option<Value>> = core.inputs.iter().take(2).copied().collect();
    let old_bias = core.inputs.get(2).copied().flatten();
    let bias = match m.get("bias") {
        Some(b) => match bias_for(g, core_kind, core_ty.rank(), channels, b, old_bias)? {
            Some(v) => Some(v),
            None => return Ok(false),
        },
        None => old_bias,
    };
    inputs.push(bias);
    inputs.push(m.get("z"));
    if let Some(act) = m.get("act") {
        if activation_attrs(g, act.node, &mut attrs).is_none() {
            return Ok(false);
        }
    }
    let fused_op = match core_kind {
        Core::Conv => "FusedConv",
        Core::MatMul => {
            attrs.0.remove("alpha");
            attrs.0.remove("beta");
            "FusedMatMul"
        }
    };
    while inputs.last() == Some(&None) {
        inputs.pop();
    }
    replace_node(g, root, core_id, fused_op, &inputs, attrs, cx)
}
