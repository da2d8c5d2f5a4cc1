//! Layout assignment, driven by the backend: when the options ask for a blocked layout
//! (`layout = nchw16c`, which the CPU backend asks for: 16 f32 lanes of AVX-512), the
//! ops that have a blocked form run blocked, and a reorder to plain followed by one
//! back to blocked cancels, so a chain of convolutions and pools stays blocked and
//! reorders remain only where a plain op (a reshape, a flatten) meets it. The rules:
//!
//! - a group-1, 1-D or 2-D convolution with at least `b` output channels (any count: the last
//!   block's pad lanes are unspecified) becomes a blocked `FusedConv`: it reads
//!   `Reorder(X, to blocked)` and its readers get `Reorder(Y, to plain)`. With fewer
//!   than `b` input channels (a first layer on a 1- or 3-channel image) X stays plain
//!   (`plain_x = 1`) rather than being padded to `b` lanes, when its packed weights fit
//!   L1 (else, an STFT's long filter, it stays plain: `plain_x_weights_fit`); with `b`
//!   or more, a ragged last input block is cheaper than a plain read.
//! - a depthwise 1-D or 2-D convolution (one input and one output channel per group, at
//!   least `b` channels, constant weights: the CPU kernel packs them at compile time)
//!   is blocked the same way, so a MobileNet block runs pointwise → depthwise →
//!   pointwise with no reorder between. Lanes never mix across channels, so the pad
//!   lanes stay harmless.
//! - a grouped 1-D or 2-D convolution whose groups each hold whole blocks of `b` input
//!   and output channels (constant weights) is blocked too: a group's channels are then
//!   whole blocks, contiguous in each image, and run as their own group-1 convolution.
//! - a 2-D MaxPool (its Indices unused), AveragePool, GlobalMaxPool or
//!   GlobalAveragePool reading `Reorder(Xb, to plain)` pools `Xb` itself (`block = b`)
//!   and its readers get `Reorder(Y, to plain)`. Pools act on each channel alone, so
//!   the pad lanes they pool stay unspecified and harmless.
//! - a `Concat` along channels of `Reorder(Xb_i, to plain)`, every input but the last a
//!   whole number of blocks, concatenates the `Xb_i` along their block axis (a block
//!   copy); a `Resize` of `Reorder(Xb, to plain)` over spatial axes only (constant
//!   scales or sizes, no roi, `stretch`) resizes `Xb` over the same axes. Their readers
//!   get `Reorder(Y, to plain)`, which cancels against a blocked convolution's input.
//! - an elementwise op or `Fused` on [N, C, H, W] whose operands are each either
//!   `Reorder(Xb_i, to plain)` of the output's shape or a constant that is a scalar or
//!   per channel ([C, 1, 1] after leading ones) runs on the `Xb_i`, each per-channel
//!   constant blocked as [1, C/b, 1, 1, b] (zeros in its pad lanes), and its readers get
//!   `Reorder(Y, to plain)`: the unfolded scale, shift and activation between two
//!   convolutions (PP-LCNet's) stay blocked. Lanes never mix, so pad lanes stay
//!   harmless.
use super::pattern::{any, op, ops, Pat, Uses};
use super::{add_in_place_of, give_back_name, sweep, try_add, Changed, Pass, PassContext};
use crate::error::Result;
use crate::ir::{Attr, Attrs, DType, Graph, Node, NodeId, Value};

pub struct Layout;

impl Pass for Layout {
    fn name(&self) -> &'static str {
        "layout"
    }
    fn summary(&self) -> &'static str {
        "blocked layouts (NCHW16c) for convolutions and pools when the backend asks; \
         reorders cancel"
    }
    fn run(&self, g: &mut Graph, cx: &mut PassContext) -> Result<Changed> {
        let Some(b) = cx.options.layout_block.filter(|&b| b > 0) else {
            return Ok(false);
        };
        let conv = ops(&["Conv", "FusedConv"])
            .when(move |g, n| blockable(g, n, b))
            .pat();
        let pool = ops(POOLS)
            .when(|g, n| n.attrs.int_or("block", 0) == Ok(0) && plain_2d(g, n))
            .args(vec![op("Reorder")
                .when(move |_, n| reorder_is(n, "plain", b))
                .args(vec![any().capture("xb")])
                .pat()])
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
            if let Some(m) = pool.matches(g, uses, id.into()) {
                return block_pool(g, uses, id, m.value("xb"), b, cx);
            }
            match g.node(id).op.as_str() {
                "Concat" => return block_concat(g, uses, id, b, cx),
                "Resize" => return block_resize(g, uses, id, b, cx),
                op if ELEMENTWISE.contains(&op) => return block_elementwise(g, uses, id, b, cx),
                _ => {}
            }
            cancel_pair(g, uses, id, &cancel, cx)
        })
    }
}

fn reorder_is(n: &Node, to: &str, b: usize) -> bool {
    n.attrs.string("to") == Ok(Some(to)) && n.attrs.int("block") == Ok(Some(b as i64))
}

/// The pools with a blocked form.
const POOLS: &[&str] = &[
    "MaxPool",
    "AveragePool",
    "GlobalMaxPool",
    "GlobalAveragePool",
];

/// The static input and output channel counts of a plain 1-D or 2-D convolution over
/// [N, C, spatial...] with at least `b` output channels (fewer would leave most lanes of
/// its one block idle). The blocked kernels are 2-D (a 1-D convolution is one row).
fn blocked_channels(g: &Graph, n: &Node, b: usize) -> Option<(usize, usize)> {
    let x = g.value_type(n.inputs.first().copied().flatten()?).ok()?;
    let y = n.outputs.first()?;
    let c = x
        .shape
        .dim(1)
        .fixed()
        .filter(|_| matches!(x.rank(), 3 | 4))?;
    let m = y.shape.dim(1).fixed()?;
    Some((c, m)).filter(|&(c, m)| c > 0 && m >= b)
}

/// A float pool over a plain [N, C, H, W] (the CPU kernels' 2-D pools) whose Indices,
/// if it has them, nobody reads.
fn plain_2d(g: &Graph, n: &Node) -> bool {
    let Some(x) = n.inputs.first().copied().flatten() else {
        return false;
    };
    g.value_type(x)
        .is_ok_and(|t| t.rank() == 4 && t.dtype.is_float() && t.shape.dim(1).fixed().is_some())
        && n.attrs.string_or("auto_pad", "NOTSET") == Ok("NOTSET")
}

/// Only f32 convs: the blocked kernels are f32 (others run plain, unreordered).
fn blockable(g: &Graph, n: &Node, b: usize) -> bool {
    let Some((c, m)) = blocked_channels(g, n, b) else {
        return false;
    };
    let grouped = match n.attrs.int_or("group", 1) {
        Ok(1) => true,
        Ok(group) => depthwise(g, n, group, c, m) || whole_block_groups(g, n, group, c, m, b),
        Err(_) => false,
    };
    grouped
        && n.attrs.int_or("block", 0) == Ok(0)
        && n.outputs.first().is_some_and(|t| t.dtype == DType::F32)
        && (c >= b || plain_x_weights_fit(g, n, b))
}

/// The packed weights of a plain-input blocked convolution (fewer than `b` input
/// channels, read unblocked) that its kernel streams for each tile of output pixels.
const PLAIN_X_WEIGHT_BYTES: usize = 64 << 10;

/// Whether a convolution of fewer input channels than a block packs its weights into at
/// most [`PLAIN_X_WEIGHT_BYTES`], so that they stay in L1 across its tiles (an image
/// stem: 3 channels × 7×7 taps into 64 is 37 KiB). Longer ones stream them from L2
/// for every tile: an STFT as a convolution, 1 channel × 256 taps into 258, ran at 2 % of
/// the FMA peak blocked and 10 % on im2col, with its 5 output pixels an image.
fn plain_x_weights_fit(g: &Graph, n: &Node, b: usize) -> bool {
    let Some(w) = n.inputs.get(1).copied().flatten() else {
        return false;
    };
    let Ok(w) = g.value_type(w) else { return false };
    let dims: Option<Vec<usize>> = (0..w.rank()).map(|k| w.shape.dim(k).fixed()).collect();
    let bytes = dims.and_then(|d| {
        let (&m, taps) = d.split_first()?;
        (taps.iter()).try_fold(m.checked_next_multiple_of(b)?.checked_mul(4)?, |n, &t| {
            n.checked_mul(t)
        })
    });
    bytes.is_some_and(|bytes| bytes <= PLAIN_X_WEIGHT_BYTES)
}

/// A convolution of `group` groups of one input and one output channel each over `c`
/// channels (into `m`) whose weights [C, 1, k...] are a constant.
fn depthwise(g: &Graph, n: &Node, group: i64, c: usize, m: usize) -> bool {
    let Some(w) = n.inputs.get(1).copied().flatten() else {
        return false;
    };
    let one = |axis: usize| {
        g.value_type(w)
            .is_ok_and(|t| t.shape.dim(axis).fixed() == Some(1))
    };
    usize::try_from(group) == Ok(c) && c == m && one(1) && g.node(w.node).op == "Constant"
}

/// A convolution of `group` groups each of whole blocks of `b` input and output
/// channels, with constant weights (packed per group at compile time).
fn whole_block_groups(g: &Graph, n: &Node, group: i64, c: usize, m: usize, b: usize) -> bool {
    let Some(w) = n.inputs.get(1).copied().flatten() else {
        return false;
    };
    let whole = |channels: usize| {
        usize::try_from(group).is_ok_and(|group| {
            group > 0 && channels.is_multiple_of(group) && (channels / group).is_multiple_of(b)
        })
    };
    whole(c) && whole(m) && g.node(w.node).op == "Constant"
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
    let mut attrs = n.attrs.clone();
    if c < b {
        attrs.set("plain_x", Attr::Int(1));
    } else {
        inputs[0] = reorder(g, x, "blocked", b, c, &format!("{name}.x_blocked"));
    }
    if let Some(z) = inputs.get(3).copied().flatten() {
        inputs[3] = reorder(g, z, "blocked", b, m, &format!("{name}.z_blocked"));
    }
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

/// `Pool(Reorder(plain, xb))` as `Reorder(plain, Pool(xb) {block = b})`.
fn block_pool(
    g: &mut Graph,
    uses: &Uses,
    id: NodeId,
    xb: Value,
    b: usize,
    cx: &mut PassContext,
) -> Result<bool> {
    let n = g.node(id).clone();
    // The blocked kernels compute no Indices.
    let indices = id.out(1);
    if n.outputs.len() > 1 && (!uses.users(indices).is_empty() || uses.is_graph_output(indices)) {
        return Ok(false);
    }
    let c = n.outputs[0].shape.dim(1).fixed().expect("checked");
    let mut attrs = n.attrs.clone();
    attrs.set("block", Attr::Int(b as i64));
    let Some(pool) = add_in_place_of(g, id, &n.op, &[Some(xb)], attrs) else {
        return Ok(false);
    };
    let plain = reorder(
        g,
        pool.into(),
        "plain",
        b,
        c,
        &format!("{}.y_plain", n.name),
    );
    match plain {
        Some(p) if g.value_type(p)? == &n.outputs[0] && cx.allow_rewrite() => {
            g.replace_uses(id.into(), p)?;
            Ok(true)
        }
        _ => {
            give_back_name(g, pool, id);
            Ok(false)
        }
    }
}

/// The blocked value and channel count behind `v` when `v` is `Reorder(xb, to plain)`
/// with block `b`, read by nobody else (so that blocking its reader removes it).
fn plain_of_blocked(g: &Graph, uses: &Uses, v: Value, b: usize) -> Option<(Value, usize)> {
    let n = g.node(v.node);
    if n.op != "Reorder" || !reorder_is(n, "plain", b) || v.output != 0 {
        return None;
    }
    if uses.users(v).len() != 1 || uses.is_graph_output(v) {
        return None;
    }
    let c = usize::try_from(n.attrs.int("channels").ok()??).ok()?;
    Some((n.inputs.first().copied().flatten()?, c))
}

/// Replaces `id` by `op(inputs) {attrs}` on blocked values, its readers reading
/// `Reorder(that, to plain)` of `channels`.
fn restore_plain(
    g: &mut Graph,
    id: NodeId,
    inputs: &[Option<Value>],
    attrs: Attrs,
    b: usize,
    channels: usize,
    cx: &mut PassContext,
) -> Result<bool> {
    let n = g.node(id).clone();
    let Some(blocked) = add_in_place_of(g, id, &n.op, inputs, attrs) else {
        return Ok(false);
    };
    let name = format!("{}.y_plain", n.name);
    match reorder(g, blocked.into(), "plain", b, channels, &name) {
        Some(p) if g.value_type(p)? == &n.outputs[0] && cx.allow_rewrite() => {
            g.replace_uses(id.into(), p)?;
            Ok(true)
        }
        _ => {
            give_back_name(g, blocked, id);
            Ok(false)
        }
    }
}

/// `Concat(Reorder(plain, xb_i)..., axis = 1)` as `Reorder(plain, Concat(xb_i..., axis = 1))`
/// when every input but the last fills whole blocks.
fn block_concat(
    g: &mut Graph,
    uses: &Uses,
    id: NodeId,
    b: usize,
    cx: &mut PassContext,
) -> Result<bool> {
    let n = g.node(id).clone();
    let Some(y) = n.outputs.first() else {
        return Ok(false);
    };
    if y.dtype != crate::ir::DType::F32 || y.rank() < 3 {
        return Ok(false);
    }
    let axis = n.attrs.int("axis").ok().flatten();
    if axis != Some(1) && axis != Some(1 - y.rank() as i64) {
        return Ok(false);
    }
    let mut inputs = vec![];
    let mut channels = 0;
    for (k, v) in n.inputs.iter().enumerate() {
        let Some((xb, c)) = v.and_then(|v| plain_of_blocked(g, uses, v, b)) else {
            return Ok(false);
        };
        if k + 1 < n.inputs.len() && c % b != 0 {
            return Ok(false);
        }
        inputs.push(Some(xb));
        channels += c;
    }
    let attrs = n.attrs.clone().with("axis", Attr::Int(1));
    restore_plain(g, id, &inputs, attrs, b, channels, cx)
}

/// `Resize(Reorder(plain, xb))` over spatial axes as `Reorder(plain, Resize(xb))` with
/// the same axes (a blocked tensor keeps the spatial axes' positions).
fn block_resize(
    g: &mut Graph,
    uses: &Uses,
    id: NodeId,
    b: usize,
    cx: &mut PassContext,
) -> Result<bool> {
    let n = g.node(id).clone();
    let Some((xb, c)) = n
        .inputs
        .first()
        .copied()
        .flatten()
        .and_then(|v| plain_of_blocked(g, uses, v, b))
    else {
        return Ok(false);
    };
    let x = g.value_type(n.inputs[0].expect("checked"))?.clone();
    let Some(dims) = x.static_dims() else {
        return Ok(false);
    };
    let r = dims.len();
    let stretch = n.attrs.string_or("keep_aspect_ratio_policy", "stretch") == Ok("stretch");
    let crop = n.attrs.string_or("coordinate_transformation_mode", "") == Ok("tf_crop_and_resize");
    let roi = n.inputs.get(1).copied().flatten();
    let konst = |k: usize| -> Option<Option<crate::tensor::Tensor>> {
        match n.inputs.get(k).copied().flatten() {
            None => Some(None),
            Some(v) => {
                let c = g.node(v.node);
                (c.op == "Constant").then(|| c.data.as_deref().filter(|t| !t.is_empty()).cloned())
            }
        }
    };
    let (Some(scales), Some(sizes)) = (konst(2), konst(3)) else {
        return Ok(false);
    };
    let empty_roi = roi.is_none() || konst(1) == Some(None);
    if !stretch || crop || !empty_roi || n.attrs.ints("axes").ok().flatten().is_some() {
        return Ok(false);
    }
    // Axes 0 and 1 (N and C) must stay as they are.
    let spatial: Vec<i64> = (2..r as i64).collect();
    let operand = match (&scales, &sizes) {
        (Some(s), None) if s.len() == r => {
            let v = s.to_f64_vec();
            if v[0] != 1.0 || v[1] != 1.0 {
                return Ok(false);
            }
            (
                2,
                crate::tensor::Tensor::from_f64s(s.dtype(), &[r - 2], &v[2..]),
            )
        }
        (None, Some(z)) if z.len() == r => {
            let v = z.to_i64_vec();
            if v[0] != dims[0] as i64 || v[1] != dims[1] as i64 {
                return Ok(false);
            }
            (
                3,
                crate::tensor::Tensor::from_i64s(z.dtype(), &[r - 2], &v[2..]),
            )
        }
        _ => return Ok(false),
    };
    let (slot, Ok(t)) = operand else {
        return Ok(false);
    };
    let name = format!(
        "{}.blocked_{}",
        n.name,
        if slot == 2 { "scales" } else { "sizes" }
    );
    let k = super::add_const(g, &name, t)?;
    let mut inputs = vec![Some(xb), None, None, None];
    inputs[slot] = Some(k.into());
    let attrs = n.attrs.clone().with("axes", Attr::Ints(spatial));
    restore_plain(g, id, &inputs, attrs, b, c, cx)
}

/// Elementwise ops that [`block_elementwise`] runs on blocked tensors.
const ELEMENTWISE: &[&str] = &[
    "Fused",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Relu",
    "HardSwish",
    "HardSigmoid",
    "Sigmoid",
    "Tanh",
    "LeakyRelu",
    "Clip",
];

/// An elementwise op over `Reorder(plain, xb_i)` operands and scalar or per-channel
/// constants as `Reorder(plain, op(xb_i..., blocked constants))`.
fn block_elementwise(
    g: &mut Graph,
    uses: &Uses,
    id: NodeId,
    b: usize,
    cx: &mut PassContext,
) -> Result<bool> {
    let n = g.node(id).clone();
    let [y] = n.outputs.as_slice() else {
        return Ok(false);
    };
    let Some(dims) = y.static_dims().filter(|d| d.len() == 4) else {
        return Ok(false);
    };
    if y.dtype != DType::F32 {
        return Ok(false);
    }
    let c = dims[1];
    let mut inputs = vec![];
    let mut blocked = false;
    for (k, v) in n.inputs.iter().enumerate() {
        let Some(v) = *v else {
            inputs.push(None);
            continue;
        };
        if let Some((xb, ch)) = plain_of_blocked(g, uses, v, b) {
            if ch != c || g.value_type(v)? != y {
                return Ok(false);
            }
            inputs.push(Some(xb));
            blocked = true;
            continue;
        }
        let Some(t) = g
            .node(v.node)
            .data
            .clone()
            .filter(|_| g.node(v.node).op == "Constant")
        else {
            return Ok(false);
        };
        if t.len() == 1 {
            inputs.push(Some(v));
            continue;
        }
        let shape = t.shape();
        let r = shape.len();
        let per_channel = r >= 3
            && shape[r - 3..] == [c, 1, 1]
            && shape[..r - 3].iter().all(|&d| d == 1)
            && t.dtype() == DType::F32;
        if !per_channel {
            return Ok(false);
        }
        let mut lanes = vec![0.0; c.div_ceil(b) * b];
        lanes[..c].copy_from_slice(&t.to_f64_vec());
        let Ok(tb) =
            crate::tensor::Tensor::from_f64s(t.dtype(), &[1, c.div_ceil(b), 1, 1, b], &lanes)
        else {
            return Ok(false);
        };
        let k = super::add_const(g, &format!("{}.blocked_{k}", n.name), tb)?;
        inputs.push(Some(k.into()));
    }
    if !blocked {
        return Ok(false);
    }
    restore_plain(g, id, &inputs, n.attrs.clone(), b, c, cx)
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
