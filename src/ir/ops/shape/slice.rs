//! Slice, Pad, Tile, CenterCropPad: each output element comes from one input element
//! (or a fill).
use super::{const_ints, fresh_all};
use crate::ir::ops::util::out;
use crate::ir::ops::util::remap;
use crate::ir::ops::{leak, AttrSpec, EvalCtx, InferCtx, Op, OpSchema};
use crate::ir::ops::{InPlace, Origin};
use crate::ir::shape::norm_axis;
use crate::ir::{AttrKind, Dim, Shape, TensorType};
use crate::match_tensor;
use crate::tensor::{Elem, Tensor};

// ---------------------------------------------------------------- Slice

struct Slice;

const SLICE: OpSchema = OpSchema {
    name: "Slice",
    family: "shape",
    inputs: &["data", "starts", "ends", "axes?", "steps?"],
    outputs: &["output"],
    attrs: &[],
    doc: "Takes start:end:step along each listed axis; negative indices count from the end \
          and out-of-range ones clamp, as in ONNX.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// One axis' plan: the first index, the step and the count.
#[derive(Clone, Copy)]
pub(crate) struct Range1 {
    pub start: i64,
    pub step: i64,
    pub len: usize,
}

/// ONNX's clamping of one axis of size `d` sliced `start:end:step`.
pub(crate) fn slice_range(d: usize, start: i64, end: i64, step: i64) -> Result<Range1, String> {
    if step == 0 {
        return Err("steps must not be 0".into());
    }
    let d = d as i64;
    let fix = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
    let (s, e) = (fix(start), fix(end));
    let (s, e) = if step > 0 {
        (s.clamp(0, d), e.clamp(0, d))
    } else {
        (s.clamp(0, d - 1), e.clamp(-1, d - 1))
    };
    let len = if step > 0 && e > s {
        (e - s + step - 1) / step
    } else if step < 0 && s > e {
        (s - e + (-step) - 1) / (-step)
    } else {
        0
    };
    Ok(Range1 {
        start: s,
        step,
        len: len as usize,
    })
}

/// (start, end, step) as given for one axis.
type Bounds = (i64, i64, i64);

/// Per axis of a rank-`rank` tensor, the bounds given for it, if any.
pub(crate) fn slice_plan(
    rank: usize,
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Result<Vec<Option<Bounds>>, String> {
    let n = starts.len();
    if ends.len() != n || axes.is_some_and(|a| a.len() != n) || steps.is_some_and(|s| s.len() != n)
    {
        return Err("starts, ends, axes and steps must have the same length".into());
    }
    let mut plan = vec![None; rank];
    for k in 0..n {
        let axis = match axes {
            Some(a) => norm_axis(a[k], rank)?,
            None if k < rank => k,
            None => return Err(format!("{n} starts for rank {rank}")),
        };
        if plan[axis].is_some() {
            return Err(format!("axis {axis} is sliced twice"));
        }
        plan[axis] = Some((starts[k], ends[k], steps.map_or(1, |s| s[k])));
    }
    Ok(plan)
}

impl Op for Slice {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &SLICE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        cx.input(1)?;
        cx.input(2)?;
        let vals = [(1, "starts"), (2, "ends"), (3, "axes"), (4, "steps")]
            .map(|(i, w)| const_ints(cx, i, w));
        let [starts, ends, axes, steps] = vals;
        let (starts, ends, axes, steps) = (starts?, ends?, axes?, steps?);
        let known = |i: usize, v: &Option<Vec<i64>>| cx.opt_input(i).is_none() || v.is_some();
        let mut shape = x.shape.clone();
        match (starts, ends) {
            (Some(s), Some(e)) if known(3, &axes) && known(4, &steps) => {
                let plan = slice_plan(x.rank(), &s, &e, axes.as_deref(), steps.as_deref())?;
                for (i, p) in plan.iter().enumerate() {
                    let Some((s, e, st)) = *p else { continue };
                    shape.axes[i].dim = match x.shape.dim(i) {
                        Dim::Fixed(d) => Dim::Fixed(slice_range(*d, s, e, st)?.len),
                        Dim::Sym(_) => cx.fresh_dim(0, i),
                    };
                }
            }
            _ => {
                fresh_all(&mut shape, cx);
            }
        }
        Ok(out(x.dtype, shape))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let ints = |i: usize| cx.opt_input(i).map(|t| t.to_i64_vec());
        let (s, e) = (cx.input(1)?.to_i64_vec(), cx.input(2)?.to_i64_vec());
        let plan = slice_plan(x.rank(), &s, &e, ints(3).as_deref(), ints(4).as_deref())?;
        let ranges: Vec<Range1> = plan
            .iter()
            .zip(x.shape())
            .map(|(p, &d)| match *p {
                Some((s, e, st)) => slice_range(d, s, e, st),
                None => Ok(Range1 {
                    start: 0,
                    step: 1,
                    len: d,
                }),
            })
            .collect::<Result<_, _>>()?;
        let shape: Vec<usize> = ranges.iter().map(|r| r.len).collect();
        let y = match_tensor!(x, a => remap(a, &shape, Elem::from_i64(0), |idx, src| {
            src.extend(idx.iter().zip(&ranges).map(|(&o, r)| (r.start + o as i64 * r.step) as usize));
            true
        }));
        Ok(vec![y])
    }
}

// ---------------------------------------------------------------- Pad

struct Pad;

const PAD: OpSchema = OpSchema {
    name: "Pad",
    family: "shape",
    inputs: &["data", "pads", "constant_value?", "axes?"],
    outputs: &["output"],
    attrs: &[AttrSpec::opt("mode", AttrKind::String, "constant")],
    doc: "Pads (or, with negative pads, crops) each axis: pads = [begin_0, ..., end_0, \
          ...]; mode constant, reflect, edge or wrap.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// Pad's mode.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Mode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

pub(crate) fn mode(s: &str) -> Result<Mode, String> {
    Ok(match s {
        "constant" => Mode::Constant,
        "reflect" => Mode::Reflect,
        "edge" => Mode::Edge,
        "wrap" => Mode::Wrap,
        m => {
            return Err(format!(
                "mode '{m}' is not one of constant, reflect, edge, wrap"
            ))
        }
    })
}

/// (begin, end) per axis.
pub(crate) fn pad_plan(
    rank: usize,
    pads: &[i64],
    axes: Option<&[i64]>,
) -> Result<Vec<(i64, i64)>, String> {
    let axes: Vec<usize> = match axes {
        Some(a) => a
            .iter()
            .map(|&a| norm_axis(a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!(
            "pads has {} values; {} axes need {}",
            pads.len(),
            axes.len(),
            2 * axes.len()
        ));
    }
    let mut plan = vec![(0, 0); rank];
    for (k, &a) in axes.iter().enumerate() {
        plan[a] = (pads[k], pads[k + axes.len()]);
    }
    Ok(plan)
}

/// The input index an output index `o` of a padded axis reads, or `None` for the fill.
pub(crate) fn pad_source(o: usize, begin: i64, d: usize, mode: Mode) -> Option<usize> {
    let i = o as i64 - begin;
    let d = d as i64;
    if (0..d).contains(&i) {
        return Some(i as usize);
    }
    Some(match mode {
        Mode::Constant => return None,
        Mode::Edge => i.clamp(0, d - 1),
        Mode::Wrap => i.rem_euclid(d),
        Mode::Reflect if d == 1 => 0,
        Mode::Reflect => {
            let p = i.rem_euclid(2 * (d - 1));
            if p >= d {
                2 * (d - 1) - p
            } else {
                p
            }
        }
    } as usize)
}

impl Op for Pad {
    fn schema(&self) -> &OpSchema {
        &PAD
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        mode(cx.attrs.string_or("mode", "constant")?)?;
        if let Some(c) = cx.opt_input(2) {
            if c.dtype != x.dtype || c.num_elements().is_some_and(|n| n != 1) {
                return Err(format!(
                    "constant_value must be one {} value, got {c}",
                    x.dtype
                ));
            }
        }
        let pads = const_ints(cx, 1, "pads")?;
        let axes = const_ints(cx, 3, "axes")?;
        let mut shape = x.shape.clone();
        match pads {
            Some(p) if cx.opt_input(3).is_none() || axes.is_some() => {
                let plan = pad_plan(x.rank(), &p, axes.as_deref())?;
                for (i, &(b, e)) in plan.iter().enumerate() {
                    if (b, e) == (0, 0) {
                        continue;
                    }
                    shape.axes[i].dim = match shape.dim(i) {
                        Dim::Fixed(d) => {
                            let n = (*d as i64)
                                .checked_add(b)
                                .and_then(|n| n.checked_add(e))
                                .unwrap_or(-1);
                            Dim::Fixed(
                                usize::try_from(n)
                                    .map_err(|_| format!("axis {i} would have size {n}"))?,
                            )
                        }
                        Dim::Sym(_) => cx.fresh_dim(0, i),
                    };
                }
            }
            _ => {
                fresh_all(&mut shape, cx);
            }
        }
        Ok(out(x.dtype, shape))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let m = mode(cx.attrs.string_or("mode", "constant")?)?;
        let axes = cx.opt_input(3).map(|t| t.to_i64_vec());
        let plan = pad_plan(x.rank(), &cx.input(1)?.to_i64_vec(), axes.as_deref())?;
        let mut shape = vec![];
        for (i, (&d, &(b, e))) in x.shape().iter().zip(&plan).enumerate() {
            let n = (d as i64)
                .checked_add(b)
                .and_then(|n| n.checked_add(e))
                .unwrap_or(-1);
            if n < 0 {
                return Err(format!("axis {i} would have size {n}"));
            }
            if d == 0 && n > 0 && m != Mode::Constant {
                return Err(format!(
                    "cannot {m:?}-pad the empty axis {i}",
                    m = cx.attrs.string_or("mode", "")?
                ));
            }
            shape.push(n as usize);
        }
        crate::ir::ops::util::check_size(&shape)?;
        let fill = cx
            .opt_input(2)
            .map(|c| c.to_f64_vec())
            .and_then(|v| v.first().copied())
            .unwrap_or(0.0);
        let y = match_tensor!(x, a => remap(a, &shape, Elem::from_f64(fill), |idx, src| {
            for ((&o, &(b, _)), &d) in idx.iter().zip(&plan).zip(x.shape()) {
                match pad_source(o, b, d, m) {
                    Some(i) => src.push(i),
                    None => return false,
                }
            }
            true
        }));
        Ok(vec![y])
    }
}

// ---------------------------------------------------------------- Tile

struct Tile;

const TILE: OpSchema = OpSchema {
    name: "Tile",
    family: "shape",
    inputs: &["input", "repeats"],
    outputs: &["output"],
    attrs: &[],
    doc: "Repeats the input `repeats[i]` times along axis i.",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

fn check_repeats(r: &[i64], rank: usize) -> Result<(), String> {
    if r.len() != rank {
        return Err(format!("repeats has {} values for rank {rank}", r.len()));
    }
    if let Some(bad) = r.iter().find(|&&v| v < 0) {
        return Err(format!("repeats must be >= 0, got {bad}"));
    }
    Ok(())
}

impl Op for Tile {
    fn takes(&self) -> crate::ir::ops::Takes {
        crate::ir::ops::Takes::MovedStrings
    }
    fn schema(&self) -> &OpSchema {
        &TILE
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        cx.input(1)?;
        let mut shape: Shape = x.shape.clone();
        match const_ints(cx, 1, "repeats")? {
            Some(r) => {
                check_repeats(&r, x.rank())?;
                for (i, a) in shape.axes.iter_mut().enumerate() {
                    a.dim = match (&a.dim, r[i]) {
                        (_, 1) => a.dim.clone(),
                        (Dim::Fixed(d), n) => Dim::Fixed(d * n as usize),
                        (Dim::Sym(_), _) => cx.fresh_dim(0, i),
                    };
                }
            }
            None => {
                fresh_all(&mut shape, cx);
            }
        }
        Ok(out(x.dtype, shape))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let r = cx.input(1)?.to_i64_vec();
        check_repeats(&r, x.rank())?;
        let shape: Vec<usize> = x
            .shape()
            .iter()
            .zip(&r)
            .map(|(&d, &n)| d.checked_mul(n as usize).ok_or("repeats overflow"))
            .collect::<Result<_, _>>()?;
        crate::ir::ops::util::check_size(&shape)?;
        let y = match_tensor!(x, a => remap(a, &shape, Elem::from_i64(0), |idx, src| {
            src.extend(idx.iter().zip(x.shape()).map(|(&o, &d)| o % d));
            true
        }));
        Ok(vec![y])
    }
}

// ---------------------------------------------------------------- CenterCropPad

struct CenterCropPad;

const CENTER_CROP_PAD: OpSchema = OpSchema {
    name: "CenterCropPad",
    family: "shape",
    inputs: &["input_data", "shape"],
    outputs: &["output_data"],
    attrs: &[AttrSpec::opt("axes", AttrKind::Ints, "all axes")],
    doc: "Crops or zero-pads each of `axes` to `shape`, centred (an odd difference puts \
          the extra element at the end).",
    in_place: InPlace::No,
    origin: Origin::Onnx,
};

/// The axes CenterCropPad resizes.
fn crop_axes(cx_attrs: &crate::ir::Attrs, rank: usize) -> Result<Vec<usize>, String> {
    match cx_attrs.ints("axes")? {
        None => Ok((0..rank).collect()),
        Some(a) => a.iter().map(|&x| norm_axis(x, rank)).collect(),
    }
}

impl Op for CenterCropPad {
    fn schema(&self) -> &OpSchema {
        &CENTER_CROP_PAD
    }

    fn infer(&self, cx: &InferCtx<'_>) -> Result<Vec<TensorType>, String> {
        let x = cx.input(0)?;
        let axes = crop_axes(cx.attrs, x.rank())?;
        let mut shape: Shape = x.shape.clone();
        match const_ints(cx, 1, "shape")? {
            Some(t) if t.len() != axes.len() => {
                return Err(format!(
                    "shape has {} values for {} axes",
                    t.len(),
                    axes.len()
                ))
            }
            Some(t) => {
                for (&a, &n) in axes.iter().zip(&t) {
                    let n = usize::try_from(n).map_err(|_| format!("shape has {n}"))?;
                    shape.axes[a].dim = Dim::Fixed(n);
                    shape.axes[a].name = None;
                }
            }
            None => {
                for &a in &axes {
                    shape.axes[a].dim = cx.fresh_dim(0, a);
                    shape.axes[a].name = None;
                }
            }
        }
        Ok(out(x.dtype, shape))
    }

    fn eval(&self, cx: &EvalCtx<'_>) -> Result<Vec<Tensor>, String> {
        let x = cx.input(0)?;
        let target = cx.input(1)?.to_i64_vec();
        let axes = crop_axes(cx.attrs, x.rank())?;
        if target.len() != axes.len() || target.iter().any(|&n| n < 0) {
            return Err(format!("shape {target:?} must give {} sizes", axes.len()));
        }
        let mut shape = x.shape().to_vec();
        // Where output index 0 of each axis reads the input: past the cropped margin,
        // or before the input by the padded one.
        let mut offset = vec![0i64; x.rank()];
        for (&a, &n) in axes.iter().zip(&target) {
            let d = shape[a] as i64;
            offset[a] = if n <= d { (d - n) / 2 } else { -((n - d) / 2) };
            shape[a] = n as usize;
        }
        crate::ir::ops::util::check_size(&shape)?;
        let dims = x.shape().to_vec();
        let y = match_tensor!(x, a => remap(a, &shape, Elem::from_i64(0), |idx, src| {
            for (k, &o) in idx.iter().enumerate() {
                let p = o as i64 + offset[k];
                if p < 0 || p >= dims[k] as i64 {
                    return false;
                }
                src.push(p as usize);
            }
            true
        }));
        Ok(vec![y])
    }
}

pub(crate) fn ops() -> Vec<&'static dyn Op> {
    vec![leak(Slice), leak(Pad), leak(Tile), leak(CenterCropPad)]
}
