//! Gradient rules of the convolutions of any rank and group: the data gradient as a
//! ConvTranspose, the filter gradient as a convolution over the batch.
use super::norm::non_channel_axes;
use super::{graph_err, input, sum_over, Cx, Grads};
use crate::error::{Error, Result};
use crate::ir::{Attr, Attrs, Node, Value};

/// Per-axis window geometry of a Conv or pool, with every dim static.
pub(super) struct Geometry {
    pub(super) kernel: Vec<i64>,
    pub(super) strides: Vec<i64>,
    pub(super) dilations: Vec<i64>,
    /// Explicit pads [begin..., end...] (auto_pad resolved).
    pub(super) pads: Vec<i64>,
    pub(super) input: Vec<i64>,
    pub(super) output: Vec<i64>,
}

impl Geometry {
    pub(super) fn new(
        attrs: &Attrs,
        kernel: Vec<i64>,
        input: Vec<i64>,
        output: Vec<i64>,
    ) -> Result<Self> {
        let k = kernel.len();
        let per_axis = |name: &str, n: usize, d: i64| -> Result<Vec<i64>> {
            match attrs.ints(name).map_err(graph_err)? {
                Some(v) if v.len() == n => Ok(v.to_vec()),
                Some(v) => Err(Error::Graph(format!(
                    "{name} has {} values, {n} needed",
                    v.len()
                ))),
                None => Ok(vec![d; n]),
            }
        };
        let strides = per_axis("strides", k, 1)?;
        let dilations = per_axis("dilations", k, 1)?;
        let mut pads = per_axis("pads", 2 * k, 0)?;
        match attrs.string_or("auto_pad", "NOTSET").map_err(graph_err)? {
            "NOTSET" => {}
            "VALID" => pads = vec![0; 2 * k],
            same @ ("SAME_UPPER" | "SAME_LOWER") => {
                // As the op resolves it: the output is ⌈n / stride⌉.
                for i in 0..k {
                    let ext = (kernel[i] - 1) * dilations[i] + 1;
                    let o = (input[i] + strides[i] - 1) / strides[i];
                    let total = ((o.max(1) - 1) * strides[i] + ext - input[i]).max(0);
                    let small = total / 2;
                    (pads[i], pads[i + k]) = if same == "SAME_UPPER" {
                        (small, total - small)
                    } else {
                        (total - small, small)
                    };
                }
            }
            other => return Err(Error::Graph(format!("unknown auto_pad '{other}'"))),
        }
        Ok(Geometry {
            kernel,
            strides,
            dilations,
            pads,
            input,
            output,
        })
    }

    /// The attributes of the transposed convolution that spreads each output position
    /// back over its window, sized exactly like the input: it crops (pads) or extends
    /// (output_padding) the end of its full output as needed.
    pub(super) fn transpose_attrs(&self, group: i64) -> Result<Attrs> {
        let k = self.kernel.len();
        let (mut pads, mut extra) = (vec![0; 2 * k], vec![0; k]);
        for i in 0..k {
            let full = (self.output[i] - 1) * self.strides[i]
                + (self.kernel[i] - 1) * self.dilations[i]
                + 1;
            let begin = self.pads[i];
            pads[i] = begin;
            pads[i + k] = (full - begin - self.input[i]).max(0);
            extra[i] = (self.input[i] + begin - full).max(0);
            if extra[i] >= self.strides[i].max(self.dilations[i]) {
                return Err(Error::Graph(format!(
                    "axis {i}: the window geometry leaves {} trailing input positions unused",
                    extra[i]
                )));
            }
        }
        Ok(Attrs::new()
            .with("strides", Attr::Ints(self.strides.clone()))
            .with("dilations", Attr::Ints(self.dilations.clone()))
            .with("pads", Attr::Ints(pads))
            .with("output_padding", Attr::Ints(extra))
            .with("group", Attr::Int(group)))
    }
}

/// Static dims `from..` of `v`, as i64, or an error naming what needs them.
pub(super) fn fixed_from(cx: &Cx, v: Value, from: usize, what: &str) -> Result<Vec<i64>> {
    let t = cx.ty(v);
    (from..t.rank())
        .map(|i| {
            t.shape
                .dim(i)
                .fixed()
                .map(|d| d as i64)
                .ok_or_else(|| Error::Graph(format!("the rule needs static {what}, got {t}")))
        })
        .collect()
}

/// Conv of any spatial rank and group: the data gradient is the transposed
/// convolution of `gy` with the same weights and group; the filter gradient a
/// convolution of the input with `gy` as the filter (batch and channels swapped, strides
/// and dilations swapped, the groups kept apart by folding them into the channels),
/// cropped to the kernel; the bias gradient `gy` summed over all but the channels.
pub(super) fn conv(cx: &mut Cx, node: &Node, y: Value, gy: Value) -> Result<Grads> {
    let none = Attrs::new();
    let (xv, w) = (input(node, 0)?, input(node, 1)?);
    let r = cx.ty(xv).rank();
    if r < 3 {
        return Err(Error::Graph("X must be [N, C, D1, ...]".into()));
    }
    let group = node.attrs.int_or("group", 1).map_err(graph_err)?;
    let geo = Geometry::new(
        &node.attrs,
        fixed_from(cx, w, 2, "kernel dims")?,
        fixed_from(cx, xv, 2, "spatial dims")?,
        fixed_from(cx, y, 2, "spatial dims")?,
    )?;
    let dx = cx.op("ConvTranspose", &[gy, w], geo.transpose_attrs(group)?)?;
    let spatial: Vec<i64> = (2..r as i64).collect();
    let mut swap: Vec<i64> = vec![1, 0];
    swap.extend(&spatial);
    let perm = |p: Vec<i64>| Attrs::new().with("perm", Attr::Ints(p));
    let (xs, gs) = if group == 1 {
        (
            cx.op("Transpose", &[xv], perm(swap.clone()))?,
            cx.op("Transpose", &[gy], perm(swap.clone()))?,
        )
    } else {
        // x [N, G·Cg, sp] → [Cg, G·N, sp]; gy [N, G·Mg, osp] → [G·Mg, N, osp]: group g
        // of the filter-gradient convolution pairs x's group g with gy's.
        let c = fixed_from(cx, xv, 1, "channels")?[0];
        let m = fixed_from(cx, w, 0, "output channels")?[0];
        let (cg, mg) = (c / group, m / group);
        let split = |a: i64, b: i64, sp: &[i64]| {
            let mut s = vec![-1, a, b];
            s.extend(sp);
            s
        };
        let rest: Vec<i64> = (3..r as i64 + 1).collect();
        let s = cx.ints(&split(group, cg, &geo.input))?;
        let xs = cx.op("Reshape", &[xv, s], none.clone())?;
        let xs = cx.op(
            "Transpose",
            &[xs],
            perm([vec![2, 1, 0], rest.clone()].concat()),
        )?;
        let s = cx.ints(&[vec![cg, -1], geo.input.clone()].concat())?;
        let xs = cx.op("Reshape", &[xs, s], none.clone())?;
        let s = cx.ints(&split(group, mg, &geo.output))?;
        let gs = cx.op("Reshape", &[gy, s], none.clone())?;
        let gs = cx.op("Transpose", &[gs], perm([vec![1, 2, 0], rest].concat()))?;
        let s = cx.ints(&[vec![m, -1], geo.output.clone()].concat())?;
        let gs = cx.op("Reshape", &[gs, s], none.clone())?;
        (xs, gs)
    };
    let filt = Attrs::new()
        .with("strides", Attr::Ints(geo.dilations.clone()))
        .with("dilations", Attr::Ints(geo.strides.clone()))
        .with("pads", Attr::Ints(geo.pads.clone()))
        .with("group", Attr::Int(group));
    let dw = cx.op("Conv", &[xs, gs], filt)?;
    let (starts, ends, axes) = (
        cx.ints(&vec![0; geo.kernel.len()])?,
        cx.ints(&geo.kernel)?,
        cx.ints(&spatial)?,
    );
    let dw = cx.op("Slice", &[dw, starts, ends, axes], none)?;
    let dw = cx.op("Transpose", &[dw], perm(swap))?;
    let mut out = vec![Some(dx), Some(dw)];
    if node.inputs.get(2).copied().flatten().is_some() {
        let a: Vec<i64> = non_channel_axes(r);
        out.push(Some(sum_over(cx, gy, &a, false)?));
    }
    Ok(out)
}
