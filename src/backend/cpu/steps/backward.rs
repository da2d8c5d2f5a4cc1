//! The ops backward graphs are built from that the other families do not cover:
//! `ConvTranspose` (Conv's data gradient), `ScatterElements` (MaxPool's gradient),
//! comparisons, `Where` and `Cast` (masks and one-hots), `SoftmaxCrossEntropyLoss`,
//! `Slice` (the crop of a filter gradient) and `ConstantOfShape` (zeros to scatter into).
use crate::backend::cpu::isa;
use crate::backend::cpu::kernels::conv_transpose::{conv_transpose, ConvTransposeShape};
use crate::backend::cpu::kernels::loss::{softmax_cross_entropy, LossReduction};
use crate::backend::cpu::kernels::pool_indices::max_pool_tiles;
use crate::backend::cpu::kernels::scatter::{scatter_elements, ScatterPlan, ScatterReduce};
use crate::backend::cpu::kernels::select::{cast, compare, compare_select, select, CmpOp, Walk};
use crate::backend::cpu::program::{Cx, Kernel, Loc, Slot};
use crate::ir::ops::fused::{self, Arg};
use crate::ir::ops::shape::slice::{slice_plan, slice_range};
use crate::ir::shape::norm_axis;
use crate::ir::DType;

use super::Build;

enum Bwd {
    ConvTranspose {
        shape: ConvTransposeShape,
        x: Slot,
        w: Slot,
        bias: Option<Slot>,
        scratch: Loc,
    },
    Scatter {
        plan: ScatterPlan,
        reduce: ScatterReduce,
        data: Slot,
        /// The data is a constant of zeros (MaxPool's gradient): fill, do not copy.
        zeros: bool,
        indices: Slot,
        updates: Slot,
    },
    Compare {
        op: CmpOp,
        walk: Walk,
        a: Slot,
        b: Slot,
    },
    Where {
        walk: Walk,
        cond: Slot,
        x: Slot,
        y: Slot,
    },
    Cast {
        x: Slot,
    },
    /// A strided copy: the output's dims, and per output axis the input's stride
    /// times the slice's step; the input offset of the first element.
    Slice {
        x: Slot,
        dims: Vec<usize>,
        strides: Vec<isize>,
        base: usize,
    },
    /// MaxPool with Indices over non-overlapping windows.
    MaxPoolIndices {
        x: Slot,
        indices: Slot,
        planes: usize,
        hw: [usize; 2],
        kernel: [usize; 2],
    },
    /// `ConstantOfShape`: the output filled with one element's bytes.
    Fill {
        element: Vec<u8>,
    },
    /// A `Fused` body `Where(a op b, x, y)`.
    CompareSelect {
        op: CmpOp,
        walk: Walk,
        operands: [Slot; 4],
    },
    SoftmaxCrossEntropy {
        classes: usize,
        reduction: LossReduction,
        ignore_index: Option<i64>,
        scores: Slot,
        labels: Slot,
        /// The log_prob output, or scratch when nothing reads it.
        log_prob: Loc,
    },
}

struct BwdStep {
    what: Bwd,
    y: Slot,
}

/// Element types the comparisons and selects handle.
fn plain_dtype(d: DType) -> bool {
    matches!(d, DType::F32 | DType::I32 | DType::I64)
}

/// Element types `Cast` converts between.
fn cast_dtype(d: DType) -> bool {
    matches!(
        d,
        DType::F32 | DType::F64 | DType::I32 | DType::I64 | DType::Bool
    )
}

pub fn build(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    let y = b.outs[0].clone();
    let what = match b.node.op.as_str() {
        "ConvTranspose" => conv_transpose_step(b)?,
        "ScatterElements" => scatter_step(b)?,
        "Where" => {
            let (Some(c), Some(x), Some(yv)) = (b.input(0), b.input(1), b.input(2)) else {
                return Ok(None);
            };
            if c.dtype != DType::Bool || !plain_dtype(x.dtype) || yv.dtype != x.dtype {
                return Ok(None);
            }
            let walk = Walk::new(&[&c.shape, &x.shape, &yv.shape], &y.shape).ok_or_else(|| {
                format!(
                    "{:?}, {:?}, {:?} do not broadcast to {:?}",
                    c.shape, x.shape, yv.shape, y.shape
                )
            })?;
            Some(Bwd::Where {
                walk,
                cond: c.clone(),
                x: x.clone(),
                y: yv.clone(),
            })
        }
        "Cast" => {
            let Some(x) = b.input(0) else { return Ok(None) };
            if !cast_dtype(x.dtype) || !cast_dtype(y.dtype) || x.elements() != y.elements() {
                return Ok(None);
            }
            Some(Bwd::Cast { x: x.clone() })
        }
        "SoftmaxCrossEntropyLoss" => loss_step(b)?,
        "Fused" => fused_compare_select(b)?,
        "Slice" => slice_step(b)?,
        "ConstantOfShape" => {
            let v = b.node.attrs.float_or("value", 0.0)?;
            let t = crate::tensor::Tensor::from_f64s(y.dtype, &[1], &[v])?;
            Some(Bwd::Fill {
                element: t.to_le_bytes(),
            })
        }
        op => match CmpOp::from_op(op) {
            Some(cmp) => {
                let (Some(a), Some(bb)) = (b.input(0), b.input(1)) else {
                    return Ok(None);
                };
                if !plain_dtype(a.dtype) || bb.dtype != a.dtype || y.dtype != DType::Bool {
                    return Ok(None);
                }
                let walk = Walk::new(&[&a.shape, &bb.shape], &y.shape).ok_or_else(|| {
                    format!(
                        "{:?} and {:?} do not broadcast to {:?}",
                        a.shape, bb.shape, y.shape
                    )
                })?;
                Some(Bwd::Compare {
                    op: cmp,
                    walk,
                    a: a.clone(),
                    b: bb.clone(),
                })
            }
            None => None,
        },
    };
    Ok(what.map(|what| Box::new(BwdStep { what, y }) as Box<dyn Kernel>))
}

/// MaxPool with Indices over tiling windows; tried before the pooling family, whose
/// general kernel also writes Indices but walks each window tap by tap.
pub fn build_max_pool_indices(b: &Build) -> Result<Option<Box<dyn Kernel>>, String> {
    if b.node.op != "MaxPool" {
        return Ok(None);
    }
    let y = b.outs[0].clone();
    Ok(max_pool_indices_step(b)?.map(|what| Box::new(BwdStep { what, y }) as Box<dyn Kernel>))
}

fn conv_transpose_step(b: &Build) -> Result<Option<Bwd>, String> {
    let attrs = &b.node.attrs;
    if !b.all_f32()
        || attrs.string_or("auto_pad", "NOTSET")? != "NOTSET"
        || attrs.get("output_shape").is_some()
    {
        return Ok(None);
    }
    let (Some(x), Some(w), y) = (b.input(0), b.input(1), &b.outs[0]) else {
        return Ok(None);
    };
    if x.shape.len() != 4 || w.shape.len() != 4 || y.shape.len() != 4 {
        return Ok(None);
    }
    let pair = |name: &str, default: usize| -> Result<[usize; 2], String> {
        match attrs.ints(name)? {
            Some(&[a, b]) => Ok([a as usize, b as usize]),
            Some(v) => Err(format!("{name} {v:?} is not 2-D")),
            None => Ok([default; 2]),
        }
    };
    let pads = match attrs.ints("pads")? {
        Some(&[t, l, bo, r]) => [t as usize, l as usize, bo as usize, r as usize],
        Some(v) => return Err(format!("pads {v:?} is not 2-D")),
        None => [0; 4],
    };
    let groups = attrs.int_or("group", 1)? as usize;
    let shape = ConvTransposeShape {
        n: x.shape[0],
        c: x.shape[1],
        h: x.shape[2],
        w: x.shape[3],
        m: y.shape[1],
        kh: w.shape[2],
        kw: w.shape[3],
        oh: y.shape[2],
        ow: y.shape[3],
        strides: pair("strides", 1)?,
        pad_top: pads[0],
        pad_left: pads[1],
        dilations: pair("dilations", 1)?,
        groups,
    };
    shape.check()?;
    if w.shape[0] != shape.c || w.shape[1] * groups != shape.m {
        return Err(format!(
            "W {:?} does not map {} channels to {} in {groups} groups",
            w.shape, shape.c, shape.m
        ));
    }
    // The output size the attributes give (output_padding included) must be Y's.
    let opad = pair("output_padding", 0)?;
    let full = |i: usize, a: usize, k: usize| {
        shape.strides[a] * (i.max(1) - 1) + opad[a] + shape.dilations[a] * (k - 1) + 1
    };
    let (fh, fw) = (full(shape.h, 0, shape.kh), full(shape.w, 1, shape.kw));
    if fh != shape.oh + pads[0] + pads[2] || fw != shape.ow + pads[1] + pads[3] {
        return Err(format!(
            "output {:?} is not the {fh}×{fw} full result less pads {pads:?}",
            y.shape
        ));
    }
    Ok(Some(Bwd::ConvTranspose {
        shape,
        x: x.clone(),
        w: w.clone(),
        bias: b.input(2).cloned(),
        scratch: b.scratch(shape.scratch_len() * 4),
    }))
}

/// A `Fused` node whose body is a comparison of two inputs and a `Where` choosing
/// between two inputs by it (the fused form of Relu's gradient); other bodies are not
/// this family's.
fn fused_compare_select(b: &Build) -> Result<Option<Bwd>, String> {
    let y = &b.outs[0];
    if !b.all_f32() || b.outs.len() != 1 {
        return Ok(None);
    }
    let Some(ins) = b.ins.iter().cloned().collect::<Option<Vec<Slot>>>() else {
        return Ok(None);
    };
    let body = fused::body(&b.node.attrs, ins.len())?;
    let [cmp, pick] = body.as_slice() else {
        return Ok(None);
    };
    let Some(op) = CmpOp::from_op(&cmp.op) else {
        return Ok(None);
    };
    let input = |a: &Option<Arg>| match a {
        Some(Arg::Input(k)) => ins.get(*k).cloned(),
        _ => None,
    };
    let (Some(a), Some(bb)) = (
        cmp.args.first().and_then(input),
        cmp.args.get(1).and_then(input),
    ) else {
        return Ok(None);
    };
    if pick.op != "Where" || pick.args.first() != Some(&Some(Arg::Step(0))) {
        return Ok(None);
    }
    let (Some(x), Some(yv)) = (
        pick.args.get(1).and_then(input),
        pick.args.get(2).and_then(input),
    ) else {
        return Ok(None);
    };
    let walk = Walk::new(&[&a.shape, &bb.shape, &x.shape, &yv.shape], &y.shape)
        .ok_or_else(|| format!("the fused operands do not broadcast to {:?}", y.shape))?;
    Ok(Some(Bwd::CompareSelect {
        op,
        walk,
        operands: [a, bb, x, yv],
    }))
}

/// MaxPool whose Indices output is used (a trained CNN's), over plain NCHW windows
/// that tile the image: kernel = strides, no pads, no dilation, floor mode. The others
/// are the pooling family's.
fn max_pool_indices_step(b: &Build) -> Result<Option<Bwd>, String> {
    let attrs = &b.node.attrs;
    let (Some(x), [y, indices]) = (b.input(0), b.outs) else {
        return Ok(None);
    };
    let used = b.g.outputs().iter().any(|o| o.value == b.id.out(1))
        || b.g
            .nodes()
            .iter()
            .any(|n| n.inputs.contains(&Some(b.id.out(1))));
    if !used
        || x.dtype != DType::F32
        || y.dtype != DType::F32
        || indices.dtype != DType::I64
        || x.shape.len() != 4
        || attrs.int_or("block", 0)? != 0
        || attrs.int_or("storage_order", 0)? != 0
        || attrs.int_or("ceil_mode", 0)? != 0
        || attrs.string_or("auto_pad", "NOTSET")? != "NOTSET"
    {
        return Ok(None);
    }
    let kernel = match attrs.ints("kernel_shape")? {
        Some(&[a, b]) if a > 0 && b > 0 => [a as usize, b as usize],
        _ => return Ok(None),
    };
    let tiles = attrs
        .ints("strides")?
        .is_some_and(|s| s == [kernel[0] as i64, kernel[1] as i64])
        && attrs
            .ints("pads")?
            .is_none_or(|p| p.iter().all(|&v| v == 0))
        && attrs
            .ints("dilations")?
            .is_none_or(|d| d.iter().all(|&v| v == 1));
    let hw = [x.shape[2], x.shape[3]];
    if !tiles || hw[0] < kernel[0] || hw[1] < kernel[1] {
        return Ok(None);
    }
    let want = [x.shape[0], x.shape[1], hw[0] / kernel[0], hw[1] / kernel[1]];
    if y.shape != want || indices.shape != want {
        return Err(format!("outputs {:?} are not {want:?}", y.shape));
    }
    Ok(Some(Bwd::MaxPoolIndices {
        x: x.clone(),
        indices: indices.clone(),
        planes: x.shape[0] * x.shape[1],
        hw,
        kernel,
    }))
}

/// `Slice` with constant starts, ends, axes and steps (the interpreter's plan and
/// clamping).
fn slice_step(b: &Build) -> Result<Option<Bwd>, String> {
    let Some(x) = b.input(0) else { return Ok(None) };
    let y = &b.outs[0];
    let konst = |k: usize| -> Option<Option<Vec<i64>>> {
        match b.input(k) {
            None => Some(None),
            Some(_) => b.constant(k).map(|t| Some(t.to_i64_vec())),
        }
    };
    let (Some(Some(starts)), Some(Some(ends)), Some(axes), Some(steps)) =
        (konst(1), konst(2), konst(3), konst(4))
    else {
        return Ok(None);
    };
    let r = x.shape.len();
    let plan = slice_plan(r, &starts, &ends, axes.as_deref(), steps.as_deref())?;
    let mut in_strides = vec![1usize; r];
    for a in (0..r.saturating_sub(1)).rev() {
        in_strides[a] = in_strides[a + 1] * x.shape[a + 1];
    }
    let mut dims = x.shape.clone();
    let mut strides: Vec<isize> = in_strides.iter().map(|&s| s as isize).collect();
    let mut base = 0usize;
    for (axis, bounds) in plan.into_iter().enumerate() {
        let Some((start, end, step)) = bounds else {
            continue;
        };
        let range = slice_range(x.shape[axis], start, end, step)?;
        dims[axis] = range.len;
        if range.len > 0 {
            base += range.start as usize * in_strides[axis];
        }
        strides[axis] = in_strides[axis] as isize * range.step as isize;
    }
    if dims != y.shape || x.dtype != y.dtype {
        return Err(format!(
            "slicing {:?} gives {dims:?}, not {:?}",
            x.shape, y.shape
        ));
    }
    Ok(Some(Bwd::Slice {
        x: x.clone(),
        dims,
        strides,
        base,
    }))
}

fn scatter_step(b: &Build) -> Result<Option<Bwd>, String> {
    let (Some(data), Some(indices), Some(updates)) = (b.input(0), b.input(1), b.input(2)) else {
        return Ok(None);
    };
    if data.dtype != DType::F32
        || updates.dtype != DType::F32
        || !matches!(indices.dtype, DType::I64 | DType::I32)
    {
        return Ok(None);
    }
    let Some(reduce) = ScatterReduce::from_attr(b.node.attrs.string_or("reduction", "none")?)
    else {
        return Ok(None);
    };
    let axis = norm_axis(b.node.attrs.int_or("axis", 0)?, data.shape.len())?;
    if updates.shape != indices.shape {
        return Err(format!(
            "updates {:?} and indices {:?} differ",
            updates.shape, indices.shape
        ));
    }
    let plan = ScatterPlan::new(&data.shape, &indices.shape, axis)?;
    let zeros = b
        .constant(0)
        .is_some_and(|t| t.to_f64_vec().iter().all(|&v| v == 0.0));
    Ok(Some(Bwd::Scatter {
        plan,
        reduce,
        data: data.clone(),
        zeros,
        indices: indices.clone(),
        updates: updates.clone(),
    }))
}

fn loss_step(b: &Build) -> Result<Option<Bwd>, String> {
    let (Some(scores), Some(labels)) = (b.input(0), b.input(1)) else {
        return Ok(None);
    };
    // Weights and [N, C, d...] scores (classes not innermost) run on the fallback.
    if b.input(2).is_some()
        || scores.dtype != DType::F32
        || scores.shape.len() != 2
        || !matches!(labels.dtype, DType::I64 | DType::I32)
        || b.outs.iter().any(|s| s.dtype != DType::F32)
    {
        return Ok(None);
    }
    let attrs = &b.node.attrs;
    let Some(reduction) = LossReduction::from_attr(attrs.string_or("reduction", "mean")?) else {
        return Ok(None);
    };
    let log_prob = match b.outs.get(1) {
        Some(s) => s.loc,
        None => b.scratch(scores.bytes()),
    };
    Ok(Some(Bwd::SoftmaxCrossEntropy {
        classes: scores.shape[1],
        reduction,
        ignore_index: attrs.int("ignore_index")?,
        scores: scores.clone(),
        labels: labels.clone(),
        log_prob,
    }))
}

/// Runs `$body` with `$T` the Rust type of the dtype `$d` (f32, i32 or i64).
macro_rules! with_plain {
    ($d:expr, $T:ident => $body:expr) => {
        match $d {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            _ => {
                type $T = i64;
                $body
            }
        }
    };
}

/// Runs `$body` with `$T` the Rust type `Cast` uses for the dtype `$d`.
macro_rules! with_cast {
    ($d:expr, $T:ident => $body:expr) => {
        match $d {
            DType::F32 => {
                type $T = f32;
                $body
            }
            DType::F64 => {
                type $T = f64;
                $body
            }
            DType::I32 => {
                type $T = i32;
                $body
            }
            DType::I64 => {
                type $T = i64;
                $body
            }
            _ => {
                type $T = u8;
                $body
            }
        }
    };
}

impl Kernel for BwdStep {
    unsafe fn run(&self, cx: &Cx) -> Result<(), String> {
        // SAFETY: callers uphold this unsafe fn's contract: pointers valid for the lengths
        // used, and the CPU features it is compiled for.
        unsafe {
            let pool = cx.pool;
            let y = cx.ptr(self.y.loc);
            match &self.what {
                Bwd::ConvTranspose {
                    shape,
                    x,
                    w,
                    bias,
                    scratch,
                } => {
                    let bias = bias.as_ref().map(|s| cx.f32(s));
                    let scratch = cx.ptr(*scratch) as *mut f32;
                    conv_transpose(
                        isa::isa(),
                        pool,
                        shape,
                        cx.f32(x),
                        cx.f32(w),
                        bias,
                        y as *mut f32,
                        scratch,
                    );
                }
                Bwd::Scatter {
                    plan,
                    reduce,
                    data,
                    zeros,
                    indices,
                    updates,
                } => {
                    let out = std::slice::from_raw_parts_mut(y as *mut f32, self.y.elements());
                    if *zeros {
                        out.fill(0.0);
                    } else if cx.ptr(data.loc) != y {
                        std::ptr::copy_nonoverlapping(cx.f32(data), out.as_mut_ptr(), out.len());
                    }
                    let upd = std::slice::from_raw_parts(cx.f32(updates), updates.elements());
                    let ip = cx.ptr(indices.loc);
                    let n = indices.elements();
                    match indices.dtype {
                        DType::I32 => {
                            let idx = std::slice::from_raw_parts(ip as *const i32, n);
                            scatter_elements(plan, *reduce, idx, upd, out)?
                        }
                        _ => {
                            let idx = std::slice::from_raw_parts(ip as *const i64, n);
                            scatter_elements(plan, *reduce, idx, upd, out)?
                        }
                    }
                }
                Bwd::Compare { op, walk, a, b } => {
                    let out = std::slice::from_raw_parts_mut(y, self.y.elements());
                    with_plain!(a.dtype, T => {
                        let a = std::slice::from_raw_parts(cx.ptr(a.loc) as *const T, a.elements());
                        let b = std::slice::from_raw_parts(cx.ptr(b.loc) as *const T, b.elements());
                        compare(*op, walk, a, b, out, pool)
                    })
                }
                Bwd::Where {
                    walk,
                    cond,
                    x,
                    y: yv,
                } => {
                    with_plain!(x.dtype, T => select(
                        walk,
                        cx.ptr(cond.loc),
                        cx.ptr(x.loc) as *const T,
                        cx.ptr(yv.loc) as *const T,
                        y as *mut T,
                        pool,
                    ))
                }
                Bwd::Cast { x } => {
                    let n = x.elements();
                    if x.dtype == self.y.dtype {
                        if cx.ptr(x.loc) != y {
                            std::ptr::copy_nonoverlapping(cx.ptr(x.loc), y, x.bytes());
                        }
                    } else {
                        with_cast!(x.dtype, S => with_cast!(self.y.dtype, D => {
                            cast(cx.ptr(x.loc) as *const S, y as *mut D, n, pool)
                        }))
                    }
                }
                Bwd::Slice {
                    x,
                    dims,
                    strides,
                    base,
                } => {
                    let es = x.dtype.size_in_bytes();
                    let r = dims.len();
                    let total = self.y.elements();
                    if r == 0 || total == 0 {
                        std::ptr::copy_nonoverlapping(cx.ptr(x.loc), y, self.y.bytes());
                        return Ok(());
                    }
                    let inner = dims[r - 1];
                    let src = cx.ptr(x.loc).add(base * es) as *const u8;
                    for row in 0..total / inner {
                        let (mut rest, mut off) = (row, 0isize);
                        for a in (0..r - 1).rev() {
                            off += (rest % dims[a]) as isize * strides[a];
                            rest /= dims[a];
                        }
                        let (s, d) = (src.offset(off * es as isize), y.add(row * inner * es));
                        if strides[r - 1] == 1 {
                            std::ptr::copy_nonoverlapping(s, d, inner * es);
                        } else {
                            for i in 0..inner {
                                let from = s.offset(i as isize * strides[r - 1] * es as isize);
                                std::ptr::copy_nonoverlapping(from, d.add(i * es), es);
                            }
                        }
                    }
                }
                Bwd::MaxPoolIndices {
                    x,
                    indices,
                    planes,
                    hw,
                    kernel,
                } => {
                    let xs = std::slice::from_raw_parts(cx.f32(x), x.elements());
                    let ys = std::slice::from_raw_parts_mut(y as *mut f32, self.y.elements());
                    let is = std::slice::from_raw_parts_mut(
                        cx.ptr(indices.loc) as *mut i64,
                        indices.elements(),
                    );
                    max_pool_tiles(xs, *planes, *hw, *kernel, ys, is, pool)
                }
                Bwd::Fill { element } => {
                    let out = std::slice::from_raw_parts_mut(y, self.y.bytes());
                    if element.iter().all(|&b| b == 0) {
                        out.fill(0);
                    } else {
                        for chunk in out.chunks_exact_mut(element.len()) {
                            chunk.copy_from_slice(element);
                        }
                    }
                }
                Bwd::CompareSelect { op, walk, operands } => compare_select(
                    *op,
                    walk,
                    operands.each_ref().map(|s| cx.f32(s)),
                    y as *mut f32,
                    pool,
                ),
                Bwd::SoftmaxCrossEntropy {
                    classes,
                    reduction,
                    ignore_index,
                    scores,
                    labels,
                    log_prob,
                } => {
                    let s = std::slice::from_raw_parts(cx.f32(scores), scores.elements());
                    let lp = std::slice::from_raw_parts_mut(cx.ptr(*log_prob) as *mut f32, s.len());
                    let loss = std::slice::from_raw_parts_mut(y as *mut f32, self.y.elements());
                    let n = labels.elements();
                    let isa = isa::isa();
                    match labels.dtype {
                        DType::I32 => {
                            let l = std::slice::from_raw_parts(cx.ptr(labels.loc) as *const i32, n);
                            softmax_cross_entropy(
                                isa,
                                s,
                                l,
                                *classes,
                                *reduction,
                                *ignore_index,
                                lp,
                                loss,
                                pool,
                            )?
                        }
                        _ => {
                            let l = std::slice::from_raw_parts(cx.ptr(labels.loc) as *const i64, n);
                            softmax_cross_entropy(
                                isa,
                                s,
                                l,
                                *classes,
                                *reduction,
                                *ignore_index,
                                lp,
                                loss,
                                pool,
                            )?
                        }
                    }
                }
            }
            Ok(())
        }
    }
    fn can_fail(&self) -> bool {
        // Indices and labels out of range are run-time errors.
        matches!(
            self.what,
            Bwd::Scatter { .. } | Bwd::SoftmaxCrossEntropy { .. }
        )
    }
    fn kind(&self) -> &'static str {
        match self.what {
            Bwd::ConvTranspose { .. } => "conv-transpose",
            Bwd::Scatter { .. } => "scatter",
            Bwd::Compare { .. } => "compare",
            Bwd::Where { .. } => "where",
            Bwd::Cast { .. } => "cast",
            Bwd::CompareSelect { .. } => "compare-select",
            Bwd::Slice { .. } => "slice",
            Bwd::Fill { .. } => "fill",
            Bwd::MaxPoolIndices { .. } => "pool-indices",
            Bwd::SoftmaxCrossEntropy { .. } => "softmax-xent",
        }
    }
}
