//! Layout assignment, driven by the backend: when the options ask for a blocked layout
//! (`layout = nchw16c`, which the CPU backend asks for: 16 f32 lanes of AVX-512), every
//! convolution whose channel counts are multiples of the block runs blocked — it reads
//! `Reorder(X, to blocked)` and its readers get `Reorder(Y, to plain)` — and a reorder
//! to plain followed by one back to blocked cancels, so a chain of convolutions stays
//! blocked and reorders remain only where a plain op (a pool, a reshape) meets it.
use super::pattern::{any, op, ops, Pat, Uses};
use super::{add_in_place_of, give_back_name, sweep, try_add, Changed, Pass, PassContext};
use crate::error::Result;
use crate::ir::{Attr, Attrs, Graph, Node, NodeId, Value};

pub struct Layout;

impl Pass for Layout {
    fn name(&self) -> &'static str {
        "layout"
    }
    fn summary(&self) -> &'static str {
        "blocked layouts (NCHW16c) for convolutions when the backend asks; reorders cancel"
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed> {
        let Some(b) = cx.options.layout_block.filter(|&b| b > 0) else {
            return Ok(false);
        };
        let conv = ops(&["Conv", "FusedConv"])
            .when(move |g, n| blockable(g, n, b))
            .pat();
        let cancel = op("Reorder")
            .when(move |_, n| reorder_is(n, "blocked", b))
            .args(vec![op("Reorder")
                .when(move |_, n| reorder_is(n, "plain", b))
                .args(vec![any().capture("x")])
                .pat()])
            .pat();
        sweep(g, cx, false, |g, uses, id, cx| {
            if conv.matches(g, uses, id.into()).is_some() {
                return block_conv(g, id, b, cx);
            }
            cancel_pair(g, uses, id, &cancel, cx)
        })
    }
}

fn reorder_is(n: &Node, to: &str, b: usize) -> bool {
    n.attrs.string("to") == Ok(Some(to)) && n.attrs.int("block") == Ok(Some(b as i64))
}

/// A plain group-1 convolution over [N, C, spatial...] whose input and output channel
/// counts are static multiples of `b` (a 3-channel image stays plain: padding it to 16
/// lanes would cost more than it gains).
fn blocked_channels(g: &Graph, n: &Node, b: usize) -> Option<(usize, usize)> {
    let x = g.value_type(n.inputs.first().copied().flatten()?).ok()?;
    let y = n.outputs.first()?;
    let c = x.shape.dim(1).fixed().filter(|_| x.rank() >= 3)?;
    let m = y.shape.dim(1).fixed()?;
    Some((c, m)).filter(|&(c, m)| c % b == 0 && m % b == 0)
}

fn blockable(g: &Graph, n: &Node, b: usize) -> bool {
    n.attrs.int_or("group", 1) == Ok(1)
        && n.attrs.int_or("block", 0) == Ok(0)
        && n.outputs.first().is_some_and(|t| t.dtype.is_float())
        && blocked_channels(g, n, b).is_some()
}

fn reorder(
    g: &mut Graph,
    v: Value,
    to: &str,
    b: usize,
    channels: usize,
    base: &str,
) -> Option<Value> {
    let mut attrs = Attrs::new()
        .with("to", Attr::String(to.into()))
        .with("block", Attr::Int(b as i64));
    if to == "plain" {
        attrs.set("channels", Attr::Int(channels as i64));
    }
    try_add(g, "Reorder", &[Some(v)], attrs, base).map(Value::from)
}

fn block_conv(g: &mut Graph, id: NodeId, b: usize, cx: &mut PassContext) -> Result<bool> {
    let n = g.node(id).clone();
    let (c, m) = blocked_channels(g, &n, b).expect("matched");
    let mut inputs = n.inputs.clone();
    let name = &n.name;
    let x = inputs[0].expect("X");
    inputs[0] = reorder(g, x, "blocked", b, c, &format!("{name}.x_blocked"));
    if let Some(z) = inputs.get(3).copied().flatten() {
        inputs[3] = reorder(g, z, "blocked", b, m, &format!("{name}.z_blocked"));
    }
    let mut attrs = n.attrs.clone();
    attrs.set("block", Attr::Int(b as i64));
    let Some(conv) = add_in_place_of(g, id, "FusedConv", &inputs, attrs) else {
        return Ok(false);
    };
    let plain = reorder(g, conv.into(), "plain", b, m, &format!("{name}.y_plain"));
    match plain {
        Some(p) if g.value_type(p)? == &n.outputs[0] && cx.allow_rewrite() => {
            g.replace_uses(id.into(), p)?;
            Ok(true)
        }
        _ => {
            give_back_name(g, conv, id);
            Ok(false)
        }
    }
}

/// `Reorder(blocked, Reorder(plain, x))` is `x` (up to its pad lanes, which are
/// unspecified).
fn cancel_pair(
    g: &mut Graph,
    uses: &Uses,
    id: NodeId,
    pat: &Pat,
    cx: &mut PassContext,
) -> Result<bool> {
    let Some(m) = pat.matches(g, uses, id.into()) else {
        return Ok(false);
    };
    let x = m.value("x");
    if g.value_type(x)? != &g.node(id).outputs[0] || !cx.allow_rewrite() {
        return Ok(false);
    }
    g.replace_uses(id.into(), x)?;
    Ok(true)
}
