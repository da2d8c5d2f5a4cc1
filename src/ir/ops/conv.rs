//! Convolutions: Conv and ConvTranspose over 1-D, 2-D and 3-D (any rank, in fact), with
//! groups, strides, dilations and explicit or automatic padding, as ONNX defines them.
//! The window geometry here is shared with the pools.
use crate::ir::ops::{InPlace, Origin};
use ndarray::{ArrayD, Dimension, IxDyn};

use super::util::{out, same_dtype};
use super::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::{AttrKind, Attrs, Dim, Shape, TensorType};
use crate::tensor::Tensor;

/// How a window slides along one spatial axis.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    pub kernel: usize,
    pub stride: usize,
    pub dilation: usize,
    pub pad_begin: usize,
    pub pad_end: usize,
}

impl Window {
    fn extent(&self) -> usize {
        // Saturating: absurd attributes make a window no input can hold, not an overflow.
        (self.kernel - 1)
            .saturating_mul(self.dilation)
            .saturating_add(1)
    }

    /// The number of window positions over an input of size `n`; with `ceil`, a last
    /// partial window counts if it starts inside the input or its left padding.
    pub(crate) fn outputs(&self, n: usize, ceil: bool) -> Result<usize, String> {
        let padded = n
            .saturating_add(self.pad_begin)
            .saturating_add(self.pad_end);
        if padded < self.extent() {
            return Err(format!(
                "the window ({} with dilation {}) is larger than the padded input ({padded})",
                self.kernel, self.dilation
            ));
        }
        let span = padded - self.extent();
        let mut o = if ceil {
            span.div_ceil(self.stride)
        } else {
            span / self.stride
        } + 1;
        if ceil && (o - 1).saturating_mul(self.stride) >= n.saturating_add(self.pad_begin) {
            o -= 1;
        }
        Ok(o)
    }

    /// The input coordinate of kernel tap `k` at output position `o`, if inside.
    pub(crate) fn source(&self, o: usize, k: usize, n: usize) -> Option<usize> {
        let p = o
            .saturating_mul(self.stride)
            .saturating_add(k.saturating_mul(self.dilation)) as i64
            - self.pad_begin as i64;
        (0..n as i64).contains(&p).then_some(p as usize)
    }
}

/// Steps a row-major multi-index within `extents`, the last axis fastest, back to all
/// zeros after the last index.
fn next_index(index: &mut [usize], extents: &[usize]) {
    for d in (0..index.len()).rev() {
        index[d] += 1;
        if index[d] < extents[d] {
            return;
        }
        index[d] = 0;
    }
}

/// Reads `name` (ints) with one value per spatial axis, each at least `min`, or
/// `default` for each.
fn per_axis(
    attrs: &Attrs,
    name: &str,
    k: usize,
    default: usize,
    min: usize,
) -> Result<Vec<usize>, String> {
    match attrs.ints(name)? {
        None => Ok(vec![default; k]),
        Some(v) if v.len() == k => v
            .iter()
            .map(|&x| {
                usize::try_from(x)
                    .ok()
                    .filter(|&x| x >= min)
                    .ok_or_else(|| format!("{name} must be >= {min}, got {x}"))
            })
            .collect(),
        Some(v) => Err(format!("{name} has {} values, {k} needed", v.len())),
    }
}

/// The windows of an op with `kernel` over spatial dims `input` (None where unknown):
/// strides, dilations, pads and auto_pad applied.
pub(crate) fn windows(
    attrs: &Attrs,
    kernel: &[usize],
    input: &[Option<usize>],
) -> Result<Vec<Window>, String> {
    let k = kernel.len();
    let strides = per_axis(attrs, "strides", k, 1, 1)?;
    let dilations = per_axis(attrs, "dilations", k, 1, 1)?;
    let auto_pad = attrs.string_or("auto_pad", "NOTSET")?;
    if auto_pad != "NOTSET" && attrs.ints("pads")?.is_some() {
        return Err(format!("pads given with auto_pad {auto_pad}"));
    }
    let pads = per_axis(attrs, "pads", 2 * k, 0, 0)?;
    let mut out = vec![];
    for i in 0..k {
        if kernel[i] == 0 {
            return Err("kernel dims must be >= 1".into());
        }
        let mut w = Window {
            kernel: kernel[i],
            stride: strides[i],
            dilation: dilations[i],
            pad_begin: pads[i],
            pad_end: pads[i + k],
        };
        match auto_pad {
            "NOTSET" | "VALID" => {}
            "SAME_UPPER" | "SAME_LOWER" => {
                if let Some(n) = input[i] {
                    let o = n.div_ceil(w.stride);
                    let total = ((o.max(1) - 1) * w.stride + w.extent()).saturating_sub(n);
                    let small = total / 2;
                    (w.pad_begin, w.pad_end) = if auto_pad == "SAME_UPPER" {
                        (small, total - small)
                    } else {
                        (total - small, small)
                    };
                }
            }
            other => {
                return Err(format!(
                    "auto_pad '{other}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID"
                ))
            }
        }
        out.push(w);
    }
    Ok(out)
}

/// The kernel shape: `kernel_shape` if given (checked against W's), else W's spatial dims.
fn kernel_of(attrs: &Attrs, w: &TensorType) -> Result<Vec<usize>, String> {
    let from_w: Option<Vec<usize>> = w.shape.axes[2..].iter().map(|a| a.dim.fixed()).collect();
    match (attrs.ints("kernel_shape")?, from_w) {
        (Some(k), Some(fw)) => {
            let k: Vec<usize> = k.iter().map(|&x| x.max(0) as usize).collect();
            if k != fw {
                return Err(format!(
                    "kernel_shape {k:?} does not match W's spatial dims {fw:?}"
                ));
            }
            Ok(k)
        }
        (Some(k), None) => Ok(k.iter().map(|&x| x.max(0) as usize).collect()),
        (None, Some(fw)) => Ok(fw),
        (None, None) => Err("W's spatial dims must be static (or give kernel_shape)".into()),
    }
}

/// Checks the operands common to Conv and ConvTranspose; returns (spatial rank, group).
fn check_operands(cx: &InferCtx<'_>, op: &str) -> Result<(usize, usize), String> {
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    if !x.dtype.is_float() {
        return Err(format!("X must be a float type, got {}", x.dtype));
    }
    same_dtype(op, &[x, w])?;
    if x.rank() < 3 || w.rank() != x.rank() {
        return Err(format!(
            "X must be [N, C, D1, ...] and W of the same rank, got {x} and {w}"
        ));
    }
    let group = cx.attrs.int_or("group", 1)?;
    if group < 1 {
        return Err(format!("group must be >= 1, got {group}"));
    }
    Ok((x.rank() - 2, group as usize))
}

fn bias_check(cx: &InferCtx<'_>, m: &Dim, x: &TensorType) -> Result<(), String> {
    if let Some(b) = cx.opt_input(2) {
        same_dtype("Conv", &[x, b])?;
        let ok = b.rank() == 1
            && (b.shape.dim(0) == m || b.shape.dim(0).fixed().is_none() || m.fixed().is_none());
        if !ok {
            return Err(format!("B must be [{m}], got {b}"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- Conv

struct Conv;

/// The geometry attributes of every convolution op (Conv, ConvInteger, the fused forms).
pub(super) const CONV_ATTRS: [AttrSpec; 6] = [
    AttrSpec::opt("auto_pad", AttrKind::String, "NOTSET"),
    AttrSpec::opt("dilations", AttrKind::Ints, "1 per axis"),
    AttrSpec::opt("group", AttrKind::Int, "1"),
    AttrSpec::opt("kernel_shape", AttrKind::Ints, "W's spatial dims"),
    AttrSpec::opt("pads", AttrKind::Ints, "0 per side"),
    AttrSpec::opt("strides", AttrKind::Ints, "1 per axis"),
];

const CONV: OpSchema = OpSchema {
    name: "Conv",
    family: "conv",
    inputs: &["X", "W", "B?"],
    outputs: &["Y"],
    attrs: &CONV_ATTRS,
    doc: "Cross-correlation of X [N, C, D1, ...] with W [M, C/group, k1, ...], plus B [M].",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

fn spatial(x: &TensorType) -> Vec<Option<usize>> {
    x.shape.axes[2..].iter().map(|a| a.dim.fixed()).collect()
}

impl Op for Conv {
    fn schema(&self) -> &OpSchema {
        &CONV
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (k, group) = check_operands(cx, "Conv")?;
        let (x, w) = (cx.input(0)?, cx.input(1)?);
        let (c, m, cg) = (x.shape.dim(1), w.shape.dim(0), w.shape.dim(1));
        if let (Some(c), Some(cg)) = (c.fixed(), cg.fixed()) {
            if c != cg * group {
                return Err(format!(
                    "X has {c} channels, W expects {cg} x group {group}"
                ));
            }
        }
        if let Some(m) = m.fixed() {
            if m % group != 0 {
                return Err(format!(
                    "group {group} does not divide W's {m} output channels"
                ));
            }
        }
        bias_check(cx, m, x)?;
        let kernel = kernel_of(cx.attrs, w)?;
        let input = spatial(x);
        let wins = windows(cx.attrs, &kernel, &input)?;
        let mut axes = vec![
            x.shape.axes[0].clone(),
            crate::ir::Axis {
                dim: m.clone(),
                name: None,
            },
        ];
        for i in 0..k {
            let dim = match input[i] {
                Some(n) => Dim::Fixed(wins[i].outputs(n, false)?),
                None => cx.fresh_dim(0, i + 2),
            };
            axes.push(crate::ir::Axis { dim, name: None });
        }
        Ok(out(x.dtype, Shape { axes }))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (xt, wt) = (cx.input(0)?, cx.input(1)?);
        let (x, w) = (xt.to_f64_array(), wt.to_f64_array());
        let b = cx.opt_input(2).map(|t| t.to_f64_vec());
        let group = cx.attrs.int_or("group", 1)? as usize;
        let (n, c) = (x.shape()[0], x.shape()[1]);
        let (m, cg) = (w.shape()[0], w.shape()[1]);
        if c != cg * group || m % group != 0 {
            return Err(format!(
                "channels: X {:?}, W {:?}, group {group}",
                x.shape(),
                w.shape()
            ));
        }
        let kernel = w.shape()[2..].to_vec();
        let input: Vec<usize> = x.shape()[2..].to_vec();
        let wins = windows(
            cx.attrs,
            &kernel,
            &input.iter().map(|&v| Some(v)).collect::<Vec<_>>(),
        )?;
        let outs: Vec<usize> = input
            .iter()
            .zip(&wins)
            .map(|(&i, w)| w.outputs(i, false))
            .collect::<Result<_, _>>()?;
        let mut shape = vec![n, m];
        shape.extend(&outs);
        let mg = m / group;
        // Per spatial axis, the input index of each (output index, tap), or None in the
        // padding. Then per output position the taps that land in the input, as (input
        // offset, tap), and per output element the plain sum: channels outer, those taps
        // in row-major order.
        let sources: Vec<Vec<Option<usize>>> = (0..kernel.len())
            .map(|d| {
                (0..outs[d])
                    .flat_map(|o| (0..kernel[d]).map(move |t| (o, t)))
                    .map(|(o, t)| wins[d].source(o, t, input[d]))
                    .collect()
            })
            .collect();
        let (x, w) = (x.as_standard_layout(), w.as_standard_layout());
        let (x, w) = (
            x.as_slice().expect("standard layout"),
            w.as_slice().expect("standard layout"),
        );
        let taps: usize = kernel.iter().product();
        let in_size: usize = input.iter().product();
        let out_size: usize = outs.iter().product();
        let mut y = vec![0.0; n * m * out_size];
        let mut position = vec![0usize; kernel.len()];
        let mut tap = vec![0usize; kernel.len()];
        let mut inside: Vec<(usize, usize)> = Vec::with_capacity(taps);
        for p in 0..out_size {
            inside.clear();
            tap.fill(0);
            for t in 0..taps {
                let mut offset = Some(0);
                for d in 0..kernel.len() {
                    let src = sources[d][position[d] * kernel[d] + tap[d]];
                    offset = offset.zip(src).map(|(o, s)| o * input[d] + s);
                }
                if let Some(o) = offset {
                    inside.push((o, t));
                }
                next_index(&mut tap, &kernel);
            }
            for ni in 0..n {
                for mi in 0..m {
                    let g = mi / mg;
                    let mut acc = b.as_ref().map_or(0.0, |b| b[mi]);
                    for ci in 0..cg {
                        let x_channel = (ni * c + g * cg + ci) * in_size;
                        let w_channel = (mi * cg + ci) * taps;
                        for &(o, t) in &inside {
                            acc += x[x_channel + o] * w[w_channel + t];
                        }
                    }
                    y[(ni * m + mi) * out_size + p] = acc;
                }
            }
            next_index(&mut position, &outs);
        }
        let y = ArrayD::from_shape_vec(IxDyn(&shape), y).map_err(|e| e.to_string())?;
        Ok(vec![Tensor::from_f64_array(xt.dtype(), y)])
    }
}

// ---------------------------------------------------------------- ConvTranspose

struct ConvTranspose;

const CONV_TRANSPOSE_ATTRS: &[AttrSpec] = &[
    AttrSpec::opt("auto_pad", AttrKind::String, "NOTSET"),
    AttrSpec::opt("dilations", AttrKind::Ints, "1 per axis"),
    AttrSpec::opt("group", AttrKind::Int, "1"),
    AttrSpec::opt("kernel_shape", AttrKind::Ints, "W's spatial dims"),
    AttrSpec::opt("output_padding", AttrKind::Ints, "0 per axis"),
    AttrSpec::opt("output_shape", AttrKind::Ints, "computed"),
    AttrSpec::opt("pads", AttrKind::Ints, "0 per side"),
    AttrSpec::opt("strides", AttrKind::Ints, "1 per axis"),
];

const CONV_TRANSPOSE: OpSchema = OpSchema {
    name: "ConvTranspose",
    family: "conv",
    inputs: &["X", "W", "B?"],
    outputs: &["Y"],
    attrs: CONV_TRANSPOSE_ATTRS,
    doc: "The transpose (gradient) of Conv: X [N, C, D1, ...], W [C, M/group, k1, ...], \
          output size s*(in-1) + output_padding + (k-1)*d + 1 - pads, or output_shape \
          with the padding split as ONNX says.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// Per spatial axis: (output size, pad_begin) for input size `n`.
fn transpose_geometry(
    attrs: &Attrs,
    kernel: &[usize],
    input: &[usize],
) -> Result<Vec<(usize, usize)>, String> {
    let k = kernel.len();
    let strides = per_axis(attrs, "strides", k, 1, 1)?;
    let dil = per_axis(attrs, "dilations", k, 1, 1)?;
    let opad = per_axis(attrs, "output_padding", k, 0, 0)?;
    let auto_pad = attrs.string_or("auto_pad", "NOTSET")?;
    let out_shape = attrs.ints("output_shape")?;
    if let Some(s) = out_shape {
        if s.len() != k {
            return Err(format!(
                "output_shape has {} values for {k} spatial axes",
                s.len()
            ));
        }
    }
    let pads = per_axis(attrs, "pads", 2 * k, 0, 0)?;
    let mut geo = vec![];
    for i in 0..k {
        let full = strides[i]
            .checked_mul(input[i].max(1) - 1)
            .and_then(|v| v.checked_add(opad[i]))
            .and_then(|v| v.checked_add(kernel[i].checked_sub(1)?.checked_mul(dil[i])?))
            .and_then(|v| v.checked_add(1))
            .ok_or("the output size overflows: strides, dilations or kernel are too large")?;
        if opad[i] >= strides[i].max(dil[i]) {
            return Err(format!(
                "output_padding {} must be below the stride or dilation",
                opad[i]
            ));
        }
        let target = match (out_shape, auto_pad) {
            (Some(s), _) => Some(s[i].max(0) as usize),
            (None, "SAME_UPPER" | "SAME_LOWER") => Some(input[i] * strides[i]),
            (None, "NOTSET" | "VALID") => None,
            (None, other) => {
                return Err(format!(
                    "auto_pad '{other}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID"
                ))
            }
        };
        geo.push(match target {
            Some(t) => {
                let total = full.checked_sub(t).ok_or_else(|| {
                    format!("output_shape {t} is larger than the full output {full}")
                })?;
                let begin = if auto_pad == "SAME_UPPER" {
                    total / 2
                } else {
                    total - total / 2
                };
                (t, begin)
            }
            None => {
                let (b, e) = (pads[i], pads[i + k]);
                let o = full
                    .checked_sub(b + e)
                    .ok_or_else(|| format!("pads {b}+{e} exceed the output {full}"))?;
                (o, b)
            }
        });
    }
    Ok(geo)
}

impl Op for ConvTranspose {
    fn schema(&self) -> &OpSchema {
        &CONV_TRANSPOSE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let (k, group) = check_operands(cx, "ConvTranspose")?;
        let (x, w) = (cx.input(0)?, cx.input(1)?);
        if let (Some(c), Some(wc)) = (x.shape.dim(1).fixed(), w.shape.dim(0).fixed()) {
            if c != wc {
                return Err(format!("X has {c} channels, W's first dim is {wc}"));
            }
            if c % group != 0 {
                return Err(format!(
                    "group {group} does not divide the {c} input channels"
                ));
            }
        }
        let m = match w.shape.dim(1).fixed() {
            Some(mg) => Dim::Fixed(mg * group),
            None => cx.fresh_dim(0, 1),
        };
        bias_check(cx, &m, x)?;
        let kernel = kernel_of(cx.attrs, w)?;
        let input = spatial(x);
        let mut axes = vec![
            x.shape.axes[0].clone(),
            crate::ir::Axis { dim: m, name: None },
        ];
        let known: Option<Vec<usize>> = input.iter().copied().collect();
        let geo = known
            .map(|i| transpose_geometry(cx.attrs, &kernel, &i))
            .transpose()?;
        for i in 0..k {
            let dim = match &geo {
                Some(g) => Dim::Fixed(g[i].0),
                None => cx.fresh_dim(0, i + 2),
            };
            axes.push(crate::ir::Axis { dim, name: None });
        }
        Ok(out(x.dtype, Shape { axes }))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let (xt, wt) = (cx.input(0)?, cx.input(1)?);
        let (x, w) = (xt.to_f64_array(), wt.to_f64_array());
        let group = cx.attrs.int_or("group", 1)? as usize;
        let (n, c) = (x.shape()[0], x.shape()[1]);
        let mg = w.shape()[1];
        if w.shape()[0] != c || c % group != 0 {
            return Err(format!(
                "channels: X {:?}, W {:?}, group {group}",
                x.shape(),
                w.shape()
            ));
        }
        let kernel = w.shape()[2..].to_vec();
        let input = x.shape()[2..].to_vec();
        let geo = transpose_geometry(cx.attrs, &kernel, &input)?;
        let k = kernel.len();
        let strides = per_axis(cx.attrs, "strides", k, 1, 1)?;
        let dil = per_axis(cx.attrs, "dilations", k, 1, 1)?;
        let mut shape = vec![n, mg * group];
        shape.extend(geo.iter().map(|g| g.0));
        let mut y = ArrayD::<f64>::zeros(IxDyn(&shape));
        if let Some(b) = cx.opt_input(2) {
            let b = b.to_f64_vec();
            for (idx, v) in y.indexed_iter_mut() {
                *v = b[idx[1]];
            }
        }
        let cg = c / group;
        let mut yi = vec![0; 2 + k];
        for (xi, &xv) in x.indexed_iter() {
            let g = xi[1] / cg;
            for mi in 0..mg {
                'taps: for tap in ndarray::indices(IxDyn(&kernel)) {
                    for d in 0..k {
                        let p = xi[2 + d]
                            .saturating_mul(strides[d])
                            .saturating_add(tap[d].saturating_mul(dil[d]))
                            as i64
                            - geo[d].1 as i64;
                        if p < 0 || p >= geo[d].0 as i64 {
                            continue 'taps;
                        }
                        yi[2 + d] = p as usize;
                    }
                    yi[0] = xi[0];
                    yi[1] = g * mg + mi;
                    let mut wi = vec![xi[1], mi];
                    wi.extend(tap.slice());
                    y[IxDyn(&yi)] += xv * w[IxDyn(&wi)];
                }
            }
        }
        Ok(vec![Tensor::from_f64_array(xt.dtype(), y)])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(Conv), leak(ConvTranspose)]
}
